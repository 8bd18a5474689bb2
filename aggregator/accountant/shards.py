"""How many shards a deployment can afford at a privacy level.

With ``K`` shufflers, each round's ``N`` reports are split by a hash of the device id
(docs/protocol.md, sharding) and each shard's release is a shuffle of its own reports: a
device's guarantee for a round is that of the smallest shard's release
(:mod:`aggregator.ledger.privacy_ledger`). :func:`shard_plan` answers, for ``K = 1, 2, ...``, how
large the worst shard is and what it costs, and the largest ``K`` that meets a target:
``epsilon_central`` per round, or ``epsilon_total`` over ``rounds`` rounds as the ledger
accounts them (:func:`aggregator.accountant.history.epsilon_total_rounds`).
:func:`calibrate_shards` asks the planning question the other way round: for each ``K``,
the local budget that meets an ``epsilon_total`` target with ``K`` shards, and the largest
``K`` whose budget stays above a floor the operator needs for useful estimates.

The worst shard
---------------
Hash-based sharding is not perfectly even. Modelling the hash as a random function, a
shard's count is ``Binomial(N, p_K)`` with ``p_K >= floor(2^32 / K) / 2^32`` (the
protocol's range reduction ``(h K) >> 32`` gives each shard ``floor`` or ``ceil`` of
``2^32 / K`` hash values; the smaller ``p`` is stochastically smaller, so pessimistic). By
a union bound over the ``K`` shards,

    Pr[some shard holds fewer than m reports] <= K Pr[Binomial(N, p_K) <= m - 1],

so ``m_K``, the largest ``m`` with ``K cdf(m - 1) <= q``, is a size every shard reaches
with probability at least ``1 - q`` in a round. ``q = 0`` takes ``floor(N / K)`` instead
(a perfectly even split, an assumption). The margin is per round and per layout seed; the
ledger accounts the sizes that really occur, so a deployment whose shards fall below the
plan sees it in ``epsilon_total``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace
from typing import Any, Final

from scipy import stats

from aggregator.accountant._checks import check_delta, check_real
from aggregator.accountant.calibration import CalibrationTarget, Plan, calibrate
from aggregator.accountant.history import accounting_size, epsilon_total_rounds
from aggregator.accountant.record import amplify_spec
from edge.participation import threshold
from edge.spec import MechanismSpec

__all__ = [
    "MAX_SHARDS",
    "ShardCalibration",
    "ShardPlan",
    "ShardRow",
    "calibrate_shards",
    "shard_plan",
    "worst_shard_size",
]

MAX_SHARDS: Final = 256
"""The protocol's largest shard count (docs/protocol.md)."""
_HASH_VALUES: Final = 2**32


def worst_shard_size(
    devices: int, shards: int, *, imbalance: float, participation: float = 1.0
) -> int:
    """A size every one of ``shards`` shards of ``devices`` reports reaches with probability
    at least ``1 - imbalance`` (module docstring); ``floor(devices / shards)`` for
    ``imbalance = 0``. At least 0.

    With participation sampling (each device reports in a round with probability
    ``threshold(q) / 2^32``, :mod:`edge.participation`, independently of the hash that
    places it), a shard's count is ``Binomial(N, p_K q')``: the same bound with that
    probability. ``imbalance = 0`` then takes the mean ``floor(N q' / K)``, an assumption."""
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be an integer >= 1, got {devices!r}")
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards must be an integer in [1, {MAX_SHARDS}], got {shards!r}")
    imbalance = check_real("imbalance", imbalance)
    if not 0 <= imbalance < 1:
        raise ValueError(f"imbalance must be in [0, 1), got {imbalance}")
    q = threshold(participation) / _HASH_VALUES
    if shards == 1 and q == 1:
        return devices
    if imbalance == 0:
        return math.floor(devices * q / shards)
    p = (_HASH_VALUES // shards) / _HASH_VALUES * q
    level = imbalance / shards
    m = int(stats.binom.ppf(level, devices, p))
    # ppf: the smallest m with cdf(m) >= level; make sure cdf(m - 1) <= level (Boost's
    # inverse is not exact), then that m + 1 does not also qualify
    while m > 0 and stats.binom.cdf(m - 1, devices, p) > level:
        m -= 1
    while stats.binom.cdf(m, devices, p) <= level:
        m += 1
    return m


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardRow:
    """``shards`` shards: the worst shard's ``shard_size``, its certified ``epsilon_central``
    per round, ``epsilon_total`` over the rounds (when the target is a total), and whether
    it ``meets`` the target."""

    shards: int
    shard_size: int
    epsilon_central: float | None
    epsilon_total: float | None
    meets: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "shard_size": self.shard_size,
            "epsilon_central": self.epsilon_central,
            "epsilon_total": self.epsilon_total,
            "meets": self.meets,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardPlan:
    """:func:`shard_plan`'s answer: ``max_affordable`` (0 if even one shard misses the
    target) and one row per ``K`` from 1 up to it, plus the first ``K`` that misses (if
    within ``max_shards``)."""

    devices: int
    delta: float
    imbalance: float
    target_epsilon_central: float | None
    target_epsilon_total: float | None
    rounds: int | None
    max_shards: int
    max_affordable: int
    rows: tuple[ShardRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": self.devices,
            "delta": self.delta,
            "imbalance": self.imbalance,
            "target_epsilon_central": self.target_epsilon_central,
            "target_epsilon_total": self.target_epsilon_total,
            "rounds": self.rounds,
            "max_shards": self.max_shards,
            "max_affordable_shards": self.max_affordable,
            "shards": [row.to_dict() for row in self.rows],
        }


def shard_plan(
    spec: MechanismSpec,
    *,
    devices: int,
    delta: float,
    target_epsilon_central: float | None = None,
    target_epsilon_total: float | None = None,
    rounds: int | None = None,
    imbalance: float = 1e-6,
    max_shards: int = 64,
) -> ShardPlan:
    """The largest ``K <= max_shards`` such that the worst shard of every ``K' <= K`` meets
    the target, and the rows of ``K = 1 ..`` up to the first that misses (module docstring).
    Exactly one target: per round (``target_epsilon_central``) or over ``rounds`` rounds
    (``target_epsilon_total``, one composition per distinct accounting size of the worst
    shard: a few seconds each at 10^6 reports)."""
    delta = check_delta(delta)
    if (target_epsilon_central is None) == (target_epsilon_total is None):
        raise ValueError("give exactly one target: epsilon_central per round or epsilon_total")
    chosen = target_epsilon_central if target_epsilon_total is None else target_epsilon_total
    assert chosen is not None
    target = check_real("target", chosen)
    if target <= 0:
        raise ValueError(f"the target must be > 0, got {target}")
    if target_epsilon_total is not None and (
        isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1
    ):
        raise ValueError(f"a target epsilon_total needs rounds >= 1, got {rounds!r}")
    if not 1 <= max_shards <= MAX_SHARDS:
        raise ValueError(f"max_shards must be in [1, {MAX_SHARDS}], got {max_shards}")
    totals: dict[int, float] = {}  # by accounting size: the ledger composes nothing finer
    rows: list[ShardRow] = []
    for k in range(1, max_shards + 1):
        size = worst_shard_size(devices, k, imbalance=imbalance)
        if size < 1:
            rows.append(
                ShardRow(
                    shards=k, shard_size=size, epsilon_central=None, epsilon_total=None, meets=False
                )
            )
            break
        central = amplify_spec(spec, n=size, delta=delta).epsilon_central
        total = None
        if target_epsilon_total is not None:
            assert rounds is not None
            bucket = accounting_size(size)
            if bucket not in totals:
                totals[bucket] = epsilon_total_rounds(spec, {size: rounds}, delta=delta)
            total = totals[bucket]
            meets = total <= target
        else:
            meets = central <= target
        rows.append(
            ShardRow(
                shards=k, shard_size=size, epsilon_central=central, epsilon_total=total, meets=meets
            )
        )
        if not meets:
            break
    affordable = sum(1 for row in rows if row.meets)
    return ShardPlan(
        devices=devices,
        delta=delta,
        imbalance=imbalance,
        target_epsilon_central=target_epsilon_central,
        target_epsilon_total=target_epsilon_total,
        rounds=rounds,
        max_shards=max_shards,
        max_affordable=affordable,
        rows=tuple(rows),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardCalibration:
    """``calibrate``'s answer for ``shards`` shards: the worst shard's ``shard_size``, the
    ``plan`` made for it (``None`` where the target is out of reach), and whether the plan's
    local budget is at least the operator's floor (``meets``)."""

    shards: int
    shard_size: int
    plan: Plan | None
    meets: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "shard_size": self.shard_size,
            "meets": self.meets,
            "plan": None if self.plan is None else self.plan.to_dict(),
        }


def calibrate_shards(
    target: CalibrationTarget,
    *,
    devices: int,
    imbalance: float,
    max_shards: int,
    min_epsilon0: float,
) -> tuple[int, tuple[ShardCalibration, ...]]:
    """For ``K = 1 ..``: the plan of ``target`` (its ``n`` replaced by the worst shard of
    ``devices`` reports) until a plan's ``epsilon0`` falls below ``min_epsilon0`` (or the
    target is out of reach); returns the largest ``K`` whose plan, and every smaller ``K``'s,
    keeps ``epsilon0 >= min_epsilon0``, and the rows."""
    min_epsilon0 = check_real("min_epsilon0", min_epsilon0)
    if min_epsilon0 <= 0:
        raise ValueError(f"min_epsilon0 must be > 0, got {min_epsilon0}")
    if not 1 <= max_shards <= MAX_SHARDS:
        raise ValueError(f"max_shards must be in [1, {MAX_SHARDS}], got {max_shards}")
    rows: list[ShardCalibration] = []
    for k in range(1, max_shards + 1):
        size = worst_shard_size(devices, k, imbalance=imbalance)
        plan: Plan | None = None
        if size >= 1:
            with contextlib.suppress(ValueError):  # the target is out of reach
                plan = calibrate(replace(target, n=size))
        meets = plan is not None and plan.spec.epsilon >= min_epsilon0
        rows.append(ShardCalibration(shards=k, shard_size=size, plan=plan, meets=meets))
        if not meets:
            break
    return sum(1 for row in rows if row.meets), tuple(rows)
