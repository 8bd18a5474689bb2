"""The privacy ledger: what the shufflers' releases cost the devices in central privacy,
recorded, kept, computed and planned.

* :mod:`~aggregator.ledger.privacy_ledger`: :class:`PrivacyLedger`, the record of every
  release and the central privacy it amounts to, per period and in all, plain data with no
  I/O (its docstring holds the argument for one participation per source round);
* :mod:`~aggregator.ledger.participations`: the records it is built on, recorded
  idempotently, compacted, renumbered and dated;
* :mod:`~aggregator.ledger.records`: what it records (release and batch records, the
  participations they charge, their digest) and the checks on every field;
* :mod:`~aggregator.ledger.levels`: the values that cross from it, immutable: the snapshot
  the accountant's process computes from, the :class:`PrivacyLevel` it returns, and
  :func:`~aggregator.ledger.levels.epsilon_curve`;
* :mod:`~aggregator.ledger.ledger_file`: the ledger's own checksummed file, apart from the
  estimates' checkpoint;
* :mod:`~aggregator.ledger.curve_file`: the certified curve's points per accounting size,
  kept beside the ledger across a restart (a checked cache: never a different result);
* :mod:`~aggregator.ledger.accountant_process`: the low-priority worker process the numbers
  are computed in;
* :mod:`~aggregator.ledger.privacy_cli`: ``coco privacy`` (and ``calibrate``), the same
  accounting offline, to plan a deployment. It lives here rather than in
  :mod:`aggregator.accountant`, which is pure maths with no I/O and whose package imports
  scipy (``coco privacy --help`` must not).

They change together when the accounting changes (what a participation is, how rounds
compose, what is exported). The service records into the ledger, saves it and shows its
levels; the ledger knows nothing of the service.

May import: :mod:`aggregator.accountant`, :mod:`aggregator.durable`, ``edge``, typer (the
command line), numpy and scipy (the accountant's own: the curve file pins their versions)
and the standard library; nothing of :mod:`aggregator.service`. Its pure modules
(``privacy_ledger``, ``participations``, ``records``, ``levels``) do no I/O: the service's core
uses them.
"""
