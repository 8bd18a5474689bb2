"""Estimates over time: each round's own sufficient statistics, and windows as their merge.

* :mod:`~aggregator.series.core`: the per-round rows (:class:`~aggregator.series.core.Series`),
  their roll-up into coarser steps past the retention, the windows, and the changes a
  checkpoint makes durable (:class:`~aggregator.series.core.Delta`);
* :mod:`~aggregator.series.segment`: those records' bytes in the series file, and the part of
  a file a checkpoint committed;
* :mod:`~aggregator.series.durations`: durations as operators write them (``15m``, ``7d``).

Pure code, no I/O: the service (:mod:`aggregator.service`) keeps the rows on disk and serves
them; ``coco aggregator series`` reads them offline.

May import: ``edge``, :mod:`aggregator.estimation`, numpy and the standard library.
"""
