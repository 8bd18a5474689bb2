"""Estimates over time: each round's own sufficient statistics, and windows as their merge.

* :mod:`~aggregator.series.core`: the per-round rows (:class:`~aggregator.series.core.Series`),
  their roll-up into coarser steps past the retention, the windows, and the changes a
  checkpoint makes durable (:class:`~aggregator.series.core.Delta`).
* :mod:`~aggregator.series.detector`: a change detector on the per-round rows, robust to the
  daily cycle; :mod:`~aggregator.series.cusum` the run lengths of its chart from theory.

Pure code, no I/O: the service (:mod:`aggregator.service`) keeps the rows on disk and serves
them; ``coco aggregator series`` reads them offline.

May import: ``edge``, :mod:`aggregator.estimation`, numpy, scipy and the standard library.
"""
