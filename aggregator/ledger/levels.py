"""What a privacy ledger's records amount to, as immutable values.

:class:`LedgerSnapshot` is what :meth:`~aggregator.ledger.privacy_ledger.PrivacyLedger.compute`
needs of a ledger (picklable: it crosses to the accountant's process,
:mod:`aggregator.ledger.accountant_process`); :class:`PrivacyLevel` is what it returns, the numbers
the service exports; :func:`epsilon_curve` is the certified per-release epsilon over a grid
of sizes, exported beside them (also computed in the accountant's process). Apart from
:class:`~aggregator.ledger.privacy_ledger.PrivacyLedger`, which records releases and changes with
every one, these are the values that cross from the ledger to the process that computes and
the service that shows them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from aggregator.accountant import amplify_spec
from edge.spec import MechanismSpec

__all__ = ["LedgerSnapshot", "PrivacyLevel", "Snapshot", "epsilon_curve"]


@dataclass(frozen=True, kw_only=True, slots=True)
class LedgerSnapshot:
    """What :meth:`~aggregator.ledger.privacy_ledger.PrivacyLedger.compute` needs, immutable and
    picklable.

    ``rounds``: ``{release size: participations}`` (a round's smallest release; sizes are
    exact here, composed at their accounting size). ``smallest`` and ``latest``: the exact
    sizes the per-release epsilons are for (the smallest participation ever, and the newest
    round's). ``generation``: the ledger's generation it was taken at. ``releases``:
    releases and batch-derived records accounted.
    """

    rounds: tuple[tuple[int, int], ...]
    smallest: int | None
    latest: int | None
    generation: int
    releases: int = 0
    ledger: str = ""
    """The id of the ledger it was taken from (random per ledger object): levels computed
    for one ledger are never served for another."""
    periods: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    """Per labelled rolling period, its ``rounds`` (a device present in every round of it)."""

    @property
    def participations(self) -> int:
        return sum(count for _, count in self.rounds)


Snapshot = LedgerSnapshot
"""The name the accountant's process and the service use."""


@dataclass(frozen=True, kw_only=True)
class PrivacyLevel:
    """The exported numbers (``None`` before the first participation)."""

    epsilon_central: dict[str, float | None]
    epsilon_central_generic: dict[str, float | None]
    epsilon_total: float | None
    batches: int
    """Participations composed into ``epsilon_total`` (rounds; with the per-batch API, one
    per batch)."""
    sizes: dict[str, int | None]
    """The release sizes ``smallest`` and ``latest`` the per-release epsilons are for."""
    generation: int = 0
    """The ledger generation this level was computed from (settled while it is current)."""
    releases: int = 0
    epsilon_periods: dict[str, float | None] = field(default_factory=dict)
    """``epsilon_total`` of a device present in every round of each labelled rolling period
    (:meth:`~aggregator.ledger.privacy_ledger.PrivacyLedger.period_rounds`)."""

    def for_sizes(self, *, smallest: int | None, latest: int | None) -> PrivacyLevel:
        """This level with each per-release epsilon kept only where its size is still the
        current one (else ``None``). A level computed before a smaller release arrived
        would otherwise show the larger one's epsilon, an overstatement of privacy, next
        to the smaller size; ``epsilon_total`` is qualified by ``batches`` instead."""
        current = {"smallest": smallest, "latest": latest}
        keep = {label: self.sizes.get(label) == n for label, n in current.items()}
        return PrivacyLevel(
            epsilon_central={k: v if keep[k] else None for k, v in self.epsilon_central.items()},
            epsilon_central_generic={
                k: v if keep[k] else None for k, v in self.epsilon_central_generic.items()
            },
            epsilon_total=self.epsilon_total,
            batches=self.batches,
            sizes=current,
            generation=self.generation,
            releases=self.releases,
            epsilon_periods=self.epsilon_periods,
        )

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "epsilon_central": self.epsilon_central,
            "epsilon_central_generic": self.epsilon_central_generic,
            "epsilon_total": self.epsilon_total,
            "batches_accounted": self.batches,
        }
        if self.epsilon_periods:
            out["epsilon_total_period"] = dict(self.epsilon_periods)
        return out


def epsilon_curve(spec: MechanismSpec, *, delta: float, grid: Sequence[int]) -> dict[int, float]:
    """Certified central epsilon (:func:`amplify_spec`) at each ``n`` of ``grid``.

    About 0.01-0.2 s per point (the largest ``n`` cost most): call it off the event loop.
    """
    return {n: amplify_spec(spec, n=n, delta=delta).epsilon_central for n in grid}
