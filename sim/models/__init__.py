"""What simulated devices measure: data models with a known ground truth (simulation only).

* :mod:`~sim.models.synthetic`: the paper's random ``s``-sparse ternary vectors
  (``coco simulate --model sparse``, the experiments and the benchmarks);
* :mod:`~sim.models.sensors`: a multi-channel environmental sensor model
  (:class:`~sim.models.sensors.SensorFleet`: ``coco simulate --model sensors``,
  ``coco demo`` and ``coco fleet --model sensors``);
* :mod:`~sim.models.keyvalue`: a key-value usage model
  (:class:`~sim.models.keyvalue.KeyValueModel`: ``coco fleet --model keyvalue``).

Imports: numpy and :mod:`edge` (the encoders) only; nothing of MQTT, the services or the
rest of :mod:`sim`, which import these models.
"""
