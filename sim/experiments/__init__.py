"""``coco experiment``: offline reproduction of the paper's experiments (docs/results.md):
accuracy of Collision, CoCo and the baselines, the amplification comparison and the
empirical tightness audit.

* accuracy: :mod:`~sim.experiments.accuracy` (the seeded grid runner) over
  :mod:`~sim.experiments.data` (populations), :mod:`~sim.experiments.mechanisms` (every
  mechanism behind one protocol, :mod:`~sim.experiments.baselines` among them) and
  :mod:`~sim.experiments.metrics`; its files are :mod:`~sim.experiments.accuracy_report`'s
  and :mod:`~sim.experiments.plots`', what it does not say :mod:`~sim.experiments.caveats`';
* amplification: :mod:`~sim.experiments.amplification`;
* tightness: :mod:`~sim.experiments.tightness` (the worst case's divergences, exact and
  simulated), :mod:`~sim.experiments.tightness_audit` (the audited settings) and
  :mod:`~sim.experiments.tightness_report` (its files);
* the commands: :mod:`~sim.experiments.cli` and :mod:`~sim.experiments.privacy_cli`, with
  :mod:`~sim.experiments.names` for their help.

Imports: :mod:`edge` (the mechanisms), :mod:`aggregator` (the estimators, the projection and
the privacy accountant) and the scientific stack (numpy, scipy, matplotlib); never MQTT,
:mod:`broker` or the rest of :mod:`sim`.
"""
