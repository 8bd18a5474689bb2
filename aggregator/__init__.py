"""The aggregator: streaming estimators, the shuffle privacy accountant, the privacy ledger,
the ``coco aggregator`` service and its live page.

One package per concept; each imports only the packages listed before it (and ``edge``,
numpy and the standard library), never one after it; tests/test_layers.py checks it.

* :mod:`aggregator.estimation`: the estimators, a library (imports nothing of the
  aggregator).
* :mod:`aggregator.accountant`: the shuffle privacy accountant, pure maths (imports nothing
  of the aggregator; scipy and dp-accounting).
* :mod:`aggregator.durable`: files replaced whole or not at all (standard library only).
* :mod:`aggregator.ledger`: what the releases cost the devices: the privacy ledger, its
  file, the accountant's process and ``coco privacy`` (the accountant and ``durable``).
* :mod:`aggregator.page`: the live page and its data (imports nothing of the aggregator).
* :mod:`aggregator.service`: the service, its I/O-free core (:mod:`aggregator.service.core`)
  apart from its shell (anything above).
"""
