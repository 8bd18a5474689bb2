"""The quarantine's replay (no I/O): every kept message through the core's checks again.

After the trusted anchor changed (``coco aggregator trust``), after a restart (another
configuration) or on an operator's request (``coco aggregator rejected replay``), each entry of
:attr:`AggregatorCore.quarantine <aggregator.service.core.machine.AggregatorCore.quarantine>`,
oldest first, takes the path a delivery takes
(:meth:`~aggregator.service.core.machine.AggregatorCore.check`, ``partial``, ``apply``;
:meth:`~aggregator.service.core.machine.AggregatorCore.manifest`'s checks), so
the batch ids, the ledger, the series and the manifests apply it exactly once:

* applied, or found applied already (``duplicate``): *retired* (kept in the file until two
  checkpoint generations hold its effect: :mod:`aggregator.service.core.quarantine`);
* refused again for a reason kept (the key still not trusted, the round still outside the
  horizon): stays, with that reason;
* refused for another reason (it no longer verifies under any announced key, say): discarded
  and counted (``discarded``), never applied.

Rejections of a replay are not counted again in ``batches_rejected``: they were counted once,
when the message came.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregator.service.core.rules import RejectedError

if TYPE_CHECKING:
    from aggregator.service.core.machine import AggregatorCore

__all__ = ["replay"]


def replay(core: AggregatorCore, *, now: float) -> dict[str, int]:
    """Replay every kept message (module docs): the outcomes by name (``applied``,
    ``duplicate``, ``accepted`` for a manifest, ``kept``, ``discarded``)."""
    outcomes: dict[str, int] = {}
    quarantine = core.quarantine
    for entry in quarantine:
        key = entry.key
        try:
            if entry.kind == "manifest":
                outcome = core.manifest_checked(entry.payload, now=now, shard=entry.shard)
            else:
                batch = core.check(entry.payload, now=now, shard=entry.shard)
                applied = batch is not None and core.apply(batch, core.partial(batch), now=now)
                outcome = "applied" if applied else "duplicate"
            quarantine.retire(key)
        except RejectedError as rejected:
            if rejected.keep:
                quarantine.rekeep(key, rejected.reason)
                outcome = "kept"
            else:
                quarantine.discard(key)
                outcome = "discarded"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    if outcomes:
        core.dirty = core.changed = True
    return outcomes
