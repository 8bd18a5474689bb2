"""The estimators: what the shuffled reports say about the fleet, as a library.

* :mod:`~aggregator.estimation.estimators`: the streaming sums of reports
  (:class:`~aggregator.estimation.estimators.AggregateState`), the unbiased estimates they
  give (one state, or many rows at once), and their confidence intervals;
* :mod:`~aggregator.estimation.intervals`: the intervals themselves (normal quantile, the
  score interval of small frequencies, Fieller's set of a conditional mean);
* :mod:`~aggregator.estimation.projection`: the projection onto the simplex (the paper's
  post-processing of item frequencies).

They change with the mechanisms' maths (:mod:`edge.theory`, docs/maths.md), never with how
batches arrive: the service (:mod:`aggregator.service`), the experiments (:mod:`sim`) and
the benchmarks use them alike.

May import: ``edge``, numpy and the standard library; nothing else of the aggregator.
"""
