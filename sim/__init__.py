"""Simulation: data models, fleets, the demo, the experiments and the ``coco`` command line.

* :mod:`sim.cli`: the ``coco`` entry point, composed from every component's commands, and
  ``coco simulate`` over :mod:`sim.simulate` (offline: data -> encode -> randomise ->
  estimate, no MQTT);
* :mod:`sim.models`: what simulated devices measure (sparse vectors, sensors, key-value
  pairs), with a known ground truth;
* :mod:`sim.fleet`: ``coco fleet``, simulated devices publishing to a broker;
* :mod:`sim.credentials`: ``coco credentials``, the deployment's MQTT accounts;
* :mod:`sim.demo`: ``coco demo``, the whole pipeline on one machine;
* :mod:`sim.experiments`: ``coco experiment``, the paper's experiments.

Imports: :mod:`sim` sits on top of :mod:`edge`, :mod:`broker` and :mod:`aggregator` and may
import any of them; none of them imports :mod:`sim` (a device, a shuffler or an aggregator
never depends on a simulation). Each subpackage's ``__init__`` says what it may import.
"""
