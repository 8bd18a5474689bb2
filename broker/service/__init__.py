"""The running shuffler: the shell around the core and the store, and its commands.

Owns :class:`~broker.service.shuffler.Shuffler` and its parts (the ingest connection,
:mod:`broker.service.ingesting` and :mod:`broker.service.ingest`; the publishing one,
:mod:`broker.service.publishing`; a shard's lease and retirement,
:mod:`broker.service.sharding` and :mod:`broker.service.lease`; what they share,
:mod:`broker.service.shell`), its settings (:mod:`broker.service.config`), the batch signing
key (:mod:`broker.service.keys`), its metrics and Mosquitto's (:mod:`broker.service.metrics`,
:mod:`broker.service.broker_stats`), and the commands ``coco shuffler``
(:mod:`broker.service.cli`) and ``coco announce`` (:mod:`broker.service.announce_cli`).

May import: :mod:`broker.core`, :mod:`broker.store`, ``edge``, the MQTT clients, the metrics
library and typer. Nothing else in ``broker`` imports it; ``sim`` (the ``coco`` command
line, ``coco demo``) does. The commands import the MQTT clients, numpy and the crypto
library only when they run, never for ``--help``.
"""
