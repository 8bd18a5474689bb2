"""The ``coco aggregator`` service: signed, shuffled batches in over MQTT; estimates, metrics
and the live page out.

Its rules are apart from its I/O:

* :mod:`aggregator.service.core`: what is applied, refused and remembered, with no I/O
  (property-tested; see its docstring);
* the shell, here, around it: :mod:`~aggregator.service.service` (:class:`Aggregator`: the
  wiring and the lifecycle), :mod:`~aggregator.service.intake` (each message through the
  core), :mod:`~aggregator.service.session` (MQTT), :mod:`~aggregator.service.generations`
  and :mod:`~aggregator.service.checkpoint_files` (the checkpoint on disk, PUBACKs after two
  durable generations), :mod:`~aggregator.service.trust` (the pinned key),
  :mod:`~aggregator.service.publishing`, :mod:`~aggregator.service.metrics` and
  :mod:`~aggregator.service.http` (what is shown, and the endpoint),
  :mod:`~aggregator.service.config` and :mod:`~aggregator.service.cli` (``coco aggregator``).

May import: every other package of the aggregator; the core imports none of the shell.
Nothing else of the aggregator imports the service. The shell's modules log as
``aggregator.service`` (the metrics and the endpoint as ``aggregator.service.metrics``),
whatever their module.
"""
