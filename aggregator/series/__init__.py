"""Estimates over time: each round's own sufficient statistics, and windows as their merge.

* :mod:`~aggregator.series.core`: the per-round rows (:class:`~aggregator.series.core.Series`),
  their roll-up into coarser steps past the retention, the windows, and the changes a
  checkpoint makes durable (:class:`~aggregator.series.core.Delta`);
* :mod:`~aggregator.series.segment`: those records' bytes in the series file, and the part of
  a file a checkpoint committed;
* :mod:`~aggregator.series.detector`: a change detector on the per-round rows, robust to the
  daily cycle; :mod:`~aggregator.series.cusum` the run lengths of its chart from theory.
* :mod:`~aggregator.series.windows`: durations, windows and ``/series`` queries, checked
  (one-line :class:`~aggregator.series.windows.QueryError`), and the bound on a query's cost.
* :mod:`~aggregator.series.frame`: rows copied as arrays, merged per step or window.
* :mod:`~aggregator.series.documents`: the ``/series`` JSON and CSV, a window's ``/estimates``.

Pure code, no I/O: the service (:mod:`aggregator.service`) keeps the rows on disk and serves
them; ``coco aggregator series`` reads them offline.

May import: ``edge``, :mod:`aggregator.estimation`, numpy, scipy and the standard library.
"""
