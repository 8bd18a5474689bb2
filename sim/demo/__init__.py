"""``coco demo``: the whole pipeline on one machine, devices -> shuffler -> aggregator, and
the private estimates beside the (simulation-only) ground truth.

1. **Broker** (:mod:`~sim.demo.brokers`): ``--broker URL`` > a local Mosquitto > the
   embedded amqtt broker (:mod:`~sim.demo.embedded_broker`: MQTT 3.1.1 only, small fleets).
   Every run has its own deployment name, so runs never interfere.
2. **Services** (:mod:`~sim.demo.pipeline`): a shuffler and an aggregator run in-process as
   asyncio tasks, each with its own ``CollectorRegistry``; the spec announcement is
   published retained (and cleared at the end).
3. **Fleet** (:mod:`~sim.demo.publisher`): sensor readings
   (:class:`~sim.models.sensors.SensorFleet`), encoded and randomised, each device's report
   on its own ingress topic over a few shared MQTT connections, round ``k`` in the ``k``-th
   wall-clock round.
4. **Live page** (``--serve``): one HTTP server on 127.0.0.1 serves the aggregator's page,
   ``/metrics`` and ``/estimates`` during the run and the final state afterwards.
5. **Accounting** (:mod:`~sim.demo.report`): every report sent is aggregated, rejected,
   dropped, still buffered or counted as unaccounted (0 in a healthy run); the result
   document (``--json``) and the table printed.

:mod:`~sim.demo.config` holds what a run is given and leaves behind; :mod:`~sim.demo.cli`
the command, which :mod:`sim.cli` registers.

Imports: :mod:`edge`, :mod:`broker` and :mod:`aggregator` (the demo runs all three) and
:mod:`sim.models`; nothing else of :mod:`sim`. This file imports nothing, so that
``coco --help`` loads only typer from here (:mod:`sim.demo.cli`). The simulated devices'
ids appear only in ingress topics; nothing here logs or prints them.
"""
