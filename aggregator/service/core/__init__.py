"""The service's rules, with no I/O: what is applied, what is refused, what is remembered.

* :mod:`~aggregator.service.core.machine`: :class:`AggregatorCore`, every decision about a
  batch or a manifest, driven by explicit inputs (the sealed payload, the time);
* :mod:`~aggregator.service.core.rules`: its terms: what a batch must satisfy
  (:class:`CoreRules`), what a check concludes, and how rounds are keyed;
* :mod:`~aggregator.service.core.memory`: the applied batch ids by round, and the batches
  per shard;
* :mod:`~aggregator.service.core.batch_codec`: the batches' wire format as numpy arrays;
* :mod:`~aggregator.service.core.keys`: the trusted anchor (a batch key or shard layouts);
* :mod:`~aggregator.service.core.manifests`: releases reconciled against their batches;
* :mod:`~aggregator.service.core.acks`: PUBACKs held until two checkpoint generations are
  durable;
* :mod:`~aggregator.service.core.checkpoint`: what a checkpoint holds;
* :mod:`~aggregator.service.core.checkpoint_codec`: its text, written, read (versions 1 to 4)
  and checked;
* :mod:`~aggregator.service.core.checkpoint_migration`: a checkpoint of version 3 or older
  (rounds by number) made one of round starts;
* :mod:`~aggregator.service.core.binding`: whether a checkpoint and a privacy ledger file
  belong together (refused at start when not).

Like the shuffler's :mod:`broker.core`, it is property-tested
(tests/aggregator/test_core.py): any interleaving of deliveries, redeliveries, forgeries,
crashes and restarts applies each genuine batch exactly once.

May import: :mod:`aggregator.estimation`, :mod:`aggregator.series`, the ledger's pure modules
(:mod:`aggregator.ledger.privacy_ledger`, :mod:`aggregator.ledger.levels`), ``edge``, numpy
and the standard library, but no I/O: no file, socket, process, thread, lock, clock or log
of its own, no MQTT client, no Prometheus; nothing of the shell (the rest of
:mod:`aggregator.service`). tests/test_layers.py checks its imports.
"""
