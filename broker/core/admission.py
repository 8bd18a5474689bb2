"""The shuffler core's admission: the round window, and each report admitted or refused.

Admission in two steps
----------------------
:meth:`Admission.offer` checks one report against everything that needs no lookup (the
spec, the round window, the per-round cap) and queues it; :meth:`Admission.settle`
decides every queued report at once: the first report of a device in a round is admitted,
any other is ``duplicate_in_round``. The shell offers the reports of one socket read and
settles them before writing the log and sending their PUBACKs (group commit), so the
duplicate check is a few numpy calls per read, not a lookup per report. A settle must
follow the offers before time passes (:meth:`~broker.core.release.Release.tick` refuses
pending offers).

Rounds (docs/protocol.md, "Rounds")
-----------------------------------
Round ``r`` is Unix time ``[r L, (r + 1) L)`` with ``L = round_seconds``. With ``S =
max_skew`` seconds of tolerated clock error and ``G = late_seconds``, at time ``now`` the
core accepts exactly the rounds

    floor((now - S - G) / L)  <=  r  <=  floor((now + S) / L),   and  (r + 1) L > closed,

where ``closed`` is a Unix time (:class:`~broker.core.effects.Closed`): every round that
ends at or before it is *closed* and accepts nothing more (``round_too_old``). The others
are rejected without changing any state: no report, however hostile its round number,
opens, closes or evicts a round. ``closed`` is a time, not a round number, so it keeps its
meaning when ``round_seconds`` changes between runs
(:meth:`~broker.core.release.Release.reconfigure`).

When a round closes, and how a round that ended while the shuffler was away stays open for
the reports the broker queued for it, is the release's business (:mod:`broker.core.release`).
"""

from __future__ import annotations

import math

import numpy as np

from broker.core.effects import Admitted
from broker.core.state import CoreState, Pending, as_u16, as_u32, as_u64

__all__ = ["Admission"]


class Admission(CoreState):
    """The admission part of :class:`~broker.core.machine.ShufflerCore` (module
    docstring)."""

    def open_rounds(self, now: float) -> tuple[int, int]:
        """``(lowest, highest)`` round accepted at ``now`` (late rounds included)."""
        cfg = self.config
        lowest = math.floor((now - cfg.max_skew - cfg.late_seconds) / cfg.round_seconds)
        return max(lowest, self._closed // cfg.round_seconds), math.floor(
            (now + cfg.max_skew) / cfg.round_seconds
        )

    def offer(self, now: float, token: int, report: tuple[int, int, int, int]) -> str | None:
        """Queue a decoded report ``(fingerprint, round, seed, z)`` of the sender whose
        keyed token is ``token`` (a u64) for :meth:`settle`, or return the reason it is
        rejected now. Nothing but the queue changes."""
        fingerprint, round_, seed, z = report
        if not self._window_from <= now < self._window_until:
            self._window(now)
        cfg = self.config
        if fingerprint != cfg.fingerprint:
            return "unknown_fingerprint"
        if z >= cfg.t:
            return "z_out_of_range"
        if round_ > self._highest:
            return "round_in_future"
        if round_ < self._lowest:
            return "round_too_old"
        pending = self._pending.get(round_)
        if pending is None:
            pending = self._pending[round_] = Pending()
        seen = self._seen.get(round_)
        if (0 if seen is None else seen.count) + len(pending.seeds) >= cfg.max_reports_per_round:
            return "round_full"
        if round_ < self._unended:
            self.late_offers += 1
        pending.tokens.append(token)
        pending.seeds.append(seed)
        pending.zs.append(z)
        self._pending_count += 1
        return None

    def _window(self, now: float) -> None:
        """The round window at ``now`` (module docstring), and the interval of time over
        which it stays the same (the per-report path compares, nothing more)."""
        cfg = self.config
        length, skew, late = cfg.round_seconds, cfg.max_skew, cfg.late_seconds
        self._highest = math.floor((now + skew) / length)
        self._unended = math.floor((now - skew) / length)
        late_bound = math.floor((now - skew - late) / length)
        self._lowest = max(late_bound, self._closed // length)
        self._window_from = now
        self._window_until = min(
            (self._highest + 1) * length - skew,
            (self._unended + 1) * length + skew,
            (late_bound + 1) * length + skew + late,
        )

    @property
    def pending(self) -> int:
        """Reports offered and not yet settled."""
        return self._pending_count

    def settle(self) -> tuple[list[Admitted], int]:
        """The :class:`Admitted` effects of the offered reports (not yet applied), one per
        round, and how many were duplicates (``duplicate_in_round``: a device already seen
        in that round, or seen earlier among these offers, whose first report wins)."""
        if not self._pending:
            return [], 0
        pending, self._pending = self._pending, {}
        self._pending_count = 0
        effects: list[Admitted] = []
        duplicates = 0
        for round_, offered in pending.items():
            tokens = as_u64(offered.tokens)
            order = np.argsort(tokens, kind="stable")  # equal tokens: arrival order
            ranked = tokens[order]
            first = np.ones(ranked.size, dtype=np.bool_)
            first[1:] = ranked[1:] != ranked[:-1]
            seen = self._seen.get(round_)
            if seen is not None:
                first &= ~seen.contains(ranked)
            keep = order[first]
            keep.sort()
            duplicates += int(tokens.size - keep.size)
            if not keep.size:
                continue
            if keep.size == tokens.size:
                effects.append(
                    Admitted(round_, bytes(offered.tokens), bytes(offered.seeds), bytes(offered.zs))
                )
            else:
                effects.append(
                    Admitted(
                        round_,
                        tokens[keep].tobytes(),
                        as_u32(offered.seeds)[keep].tobytes(),
                        as_u16(offered.zs)[keep].tobytes(),
                    )
                )
        return effects, duplicates

    def accept(self, now: float, token: int, report: tuple[int, int, int, int]) -> Admitted | str:
        """One report alone: :meth:`offer` then :meth:`settle` (tests, tools)."""
        reason = self.offer(now, token, report)
        if reason is not None:
            return reason
        effects, _ = self.settle()
        return effects[0] if effects else "duplicate_in_round"
