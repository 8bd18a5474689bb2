"""Which keys the aggregator trusts, and for which topics and rounds (no I/O).

What is trusted is one *anchor* string, pinned as a whole (:mod:`aggregator.service.trust`):

* an unsharded deployment: the shuffler's batch key, 64 lowercase hex digits; its batches
  come on ``coco/v1/<dep>/batches`` and its manifests on ``.../manifests``;
* a sharded deployment (:mod:`edge.shards`): the announced layouts as compact JSON (a list,
  so it starts with ``[``). Shard ``L``'s batches come on ``.../batches/<L>`` and verify
  under ``L``'s key, with ``L`` in the signed text; a batch is accepted only for a round of
  ``L``'s layout (``[from_round, the next layout's from_round)``).

A message on a topic of no trusted shard (a shard not announced, a sharded topic in an
unsharded deployment or the other way round) is ``unknown_shard``; one of a round its shard
does not serve is ``wrong_shard``.
"""

from __future__ import annotations

import json

from edge.batch_auth import BatchVerifier
from edge.errors import CocoError, SpecError
from edge.shards import ShardPlan

__all__ = ["TrustedKeys", "anchor_of", "describe_anchor", "is_anchor"]

_HEX = frozenset("0123456789abcdef")


def anchor_of(key: str | None, plan: ShardPlan | None) -> str:
    """The anchor of a batch key or of announced layouts (exactly one of them)."""
    if (key is None) == (plan is None):
        raise ValueError("trust one batch key or one set of shard layouts")
    if plan is not None:
        return json.dumps(plan.to_json(), sort_keys=True, separators=(",", ":"))
    assert key is not None
    return key


def is_anchor(value: object) -> bool:
    """Whether ``value`` is a valid anchor (a key, or layouts as JSON text)."""
    if not isinstance(value, str):
        return False
    try:
        TrustedKeys(value, "check")
    except (CocoError, ValueError):
        return False
    return True


def describe_anchor(anchor: str) -> str:
    """A one-line description: the key, or ``shards g0s0=<key>,...``."""
    if not anchor.startswith("["):
        return anchor
    plan = ShardPlan.from_json(json.loads(anchor))
    shards = ",".join(
        f"{label}={layout.keys[i]}"
        for layout in plan.layouts
        for i, label in enumerate(layout.labels)
    )
    return f"shards {shards}"


class TrustedKeys:
    """The verifiers of one anchor (module docs)."""

    def __init__(self, anchor: str, deployment: str) -> None:
        self.anchor = anchor
        self.deployment = deployment
        self.plan: ShardPlan | None = None
        self._verifiers: dict[str | None, BatchVerifier] = {}
        if anchor.startswith("["):
            try:
                self.plan = ShardPlan.from_json(json.loads(anchor))
            except ValueError as exc:
                raise SpecError(f"the trusted shard layouts are not valid: {exc}") from None
            for layout in self.plan.layouts:
                for index, label in enumerate(layout.labels):
                    self._verifiers[label] = BatchVerifier(layout.keys[index], deployment, label)
        else:
            if len(anchor) != 64 or not set(anchor) <= _HEX:
                raise SpecError(
                    f"a batch public key is 64 lowercase hex digits, got {anchor[:70]!r}"
                )
            self._verifiers[None] = BatchVerifier(anchor, deployment)

    @property
    def sharded(self) -> bool:
        return self.plan is not None

    @property
    def labels(self) -> tuple[str, ...]:
        """The trusted shard labels (empty for an unsharded deployment): bounded by the
        announced layouts, so they may label metrics."""
        return () if self.plan is None else self.plan.labels

    def verifier(self, shard: str | None) -> BatchVerifier | None:
        """The verifier of the topic's shard (``None`` for the unsharded topic); ``None``
        if no trusted key belongs to that topic."""
        return self._verifiers.get(shard)

    def serves(self, shard: str | None, round_: int) -> bool:
        """Whether shard ``shard``'s key may sign a batch of ``round_``."""
        if self.plan is None or shard is None:
            return True
        return self.plan.serves(shard, round_)
