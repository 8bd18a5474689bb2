"""The shuffling bridge between devices and the aggregator (``coco shuffler``).

Three packages, each importing only the ones listed before it (tests/test_layers.py checks
the core's rule on every import):

* :mod:`broker.core`: the shuffler's rules as a pure state machine (rounds, admission,
  release, the effects it returns and folds, its state in packed arrays); no I/O;
* :mod:`broker.store`: its durable state (the write-ahead log of the core's effects, the
  state directory, the log's record format, ``coco shuffler repair``);
* :mod:`broker.service`: the running shuffler around them (the MQTT connections, the shard
  lease, metrics, keys, its settings) and its commands, ``coco shuffler`` and
  ``coco announce``.

Loggers
-------
A logger's name is part of what an operator sees (every log line carries it) and filters
on, so it is fixed rather than taken from ``__name__``: "broker.shuffler" for the whole
shell ("broker.shuffler.mqtt" for the ingest's MQTT library), "broker.store",
"broker.repair", "broker.lease", "broker.broker_stats" and "broker.cli".
"""
