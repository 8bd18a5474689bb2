"""The label values of the aggregator's metrics: every ``reason`` and ``endpoint`` a counter
can carry, in one bounded set each (pre-created at 0, so that a dashboard's rate of a
reason that never happened is 0, not absent), with what each means.

Apart from :mod:`aggregator.service.metrics`, which registers the metrics, because the
sets are the vocabulary the checks, the docs' tables and the tests share: a new reason is
added here, where its meaning is written once.
"""

from __future__ import annotations

REJECT_REASONS = (
    "unknown_shard",
    "bad_length",
    "bad_signature",
    "untrusted_key",
    "bad_version",
    "bad_kind",
    "bad_count",
    "bad_field",
    "fingerprint_mismatch",
    "empty",
    "below_min_batch",
    "wrong_shard",
    "stale_round",
    "future_round",
    "z_out_of_range",
    "seed_out_of_range",
)
"""Every ``reason`` label of ``coco_aggregator_batches_rejected_total`` (pre-created at 0), in
the order the checks run: ``unknown_shard`` (a topic of no trusted shard: a shard not
announced, or a sharded topic in an unsharded deployment or the other way round),
``bad_length`` (too short to hold a batch and its signature, or a length that does not match
the count), ``bad_signature`` (not sealed by the trusted shuffler key), ``untrusted_key``
(sealed by a key the deployment announced that is not trusted yet: kept in the quarantine,
:mod:`aggregator.service.rejected`), the codec's ``bad_version``, ``bad_kind``,
``bad_count``, ``bad_field``, then ``fingerprint_mismatch`` (another spec), ``empty``,
``below_min_batch``, ``wrong_shard`` (a round its shard's layout does not serve),
``stale_round`` (a round below the retained horizon), ``future_round`` (a round more than
the retained window ahead of the aggregator's clock) and the record checks
``z_out_of_range``, ``seed_out_of_range``. A redelivered or replayed ``batch_id`` is not a
rejection but a duplicate (``coco_aggregator_batches_duplicate_total``)."""
MANIFEST_REJECT_REASONS = (
    "unknown_shard",
    "bad_length",
    "bad_signature",
    "untrusted_key",
    "bad_version",
    "bad_kind",
    "bad_count",
    "bad_field",
    "fingerprint_mismatch",
    "wrong_shard",
    "stale_round",
    "future_round",
    "manifest_mismatch",
    "ledger_conflict",
)
"""Every ``reason`` label of ``coco_aggregator_manifests_rejected_total``: the batch checks
that apply to a manifest (signature under its shard's key with the manifest domain, wire
format, spec, round), and ``manifest_mismatch`` (it disagrees with a batch received: same
``batch_id`` with another count, round or shard; lists a batch twice, or one another
manifest lists, or a count below ``min_batch``). A rejected manifest changes nothing but
the privacy ledger: a ``manifest_mismatch`` was signed by a trusted shuffler, so it is
charged as an extra participation at ``min_batch`` (at its smallest listed count if that is
smaller). ``ledger_conflict``: a verified
release or batch the privacy ledger could not place (it contradicts a record, or a field
is out of range); it is charged the same way (a batch at its own size)."""
RECONCILED = (
    ("manifests", "manifests", "Release manifests accepted."),
    (
        "reports_missing",
        "reports_missing",
        "Reports listed in a manifest whose batch never came within the grace period.",
    ),
    (
        "batches_missing",
        "batches_missing",
        "Batches listed in a manifest that never came within the grace period.",
    ),
    (
        "batches_unlisted",
        "batches_unlisted",
        "Batches of a (shard, round) with manifests, none of which listed them.",
    ),
    ("reports_late", "reports_late", "Reports of batches that came after being counted missing."),
)
"""``(Reconciler.counts field, metric name without prefix and _total, help)``."""
UNACKED_REASONS = ("connection_lost", "unprocessed", "checkpoint_failed", "taken_over")
"""Every ``reason`` label of ``coco_aggregator_batches_unacknowledged_total``: batches whose
PUBACK could not be sent because the connection ended first (``connection_lost``), that were
still queued unread at shutdown (``unprocessed``), whose final checkpoint failed
(``checkpoint_failed``), or that were applied after the last checkpoint of a service whose
session another aggregator took over (``taken_over``: that checkpoint is not written, so
the batches count once, at the new holder). The broker redelivers all of them to the
persistent session."""

BAD_REQUEST_ENDPOINTS = ("series", "estimates")
"""Every ``endpoint`` label of ``coco_aggregator_http_bad_requests_total``."""
