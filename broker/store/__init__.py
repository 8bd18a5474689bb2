"""The shuffler's durable state: what survives a crash, and how it is read back.

Owns the write-ahead log of the core's effects and the state directory holding it
(:mod:`broker.store.wal`), the log's file format (:mod:`broker.store.records`), its
acknowledged end (:mod:`broker.store.mark`), reading it back and telling a torn write from
damage (:mod:`broker.store.reading`), the reader of version-1 logs
(:mod:`broker.store.logv1`) and the salvage of a damaged log, ``coco shuffler repair``
(:mod:`broker.store.repair`).

May import: :mod:`broker.core` (the effects it writes; repair replays them through the
core), ``edge``'s errors, the standard library's files and logging. Never
:mod:`broker.service` or an MQTT client: the store knows nothing of the network.
"""
