"""Calibration: the local budget that meets a central privacy target over a horizon.

Given ``n`` reports per round (the smallest release of a round: the whole fleet, or the
worst shard), a device reporting in every one of ``rounds`` rounds, and a target
``(epsilon_total, delta)`` for the composed central privacy of a device over the horizon,
:func:`calibrate` picks the local ``epsilon0`` (with the MSE-optimal ``t`` for it, unless
``t`` is fixed) that minimises the closed-form MSE of the estimates while meeting the target.

The plan is made with exactly the accounting the aggregator's ledger applies
(:func:`aggregator.accountant.history.epsilon_total_rounds`: one participation per round,
composed at its accounting size), so a deployment that runs as planned reports exactly the
planned ``epsilon_total``, never more.

Why this is the MSE-optimal choice: for a fixed mechanism the closed-form per-report MSE
(:mod:`edge.theory`) falls as ``epsilon0`` grows, so the best plan is the largest
``epsilon0`` whose ``epsilon_total`` meets the target. It is found by bisection on
``log epsilon0``; only values at which the ledger's ``epsilon_total`` was evaluated and
found ``<= target`` are returned, so the plan meets the target whatever the shape of
``epsilon0 -> epsilon_total`` (the MSE-optimal ``t`` changes in steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, get_args

from aggregator.accountant._checks import check_delta, check_n, check_real
from aggregator.accountant.history import epsilon_total_rounds
from aggregator.accountant.record import amplify_spec
from edge.errors import SpecError
from edge.spec import MechanismSpec
from edge.theory import Mechanism

__all__ = ["CalibrationTarget", "Plan", "calibrate"]

EPSILON0_MIN: Final = 1e-3
EPSILON0_MAX: Final = 10.0
"""The search range of the local budget (below 1e-3 nothing useful is estimated; a spec whose
integer weights would overflow at large budgets counts as out of range)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrationTarget:
    """What to calibrate for: ``mechanism`` (``"coco"`` or ``"collision"``) on ``d``-dimensional
    ``s``-sparse vectors, ``n`` reports per round, a device in each of ``rounds`` rounds, and
    the target ``(epsilon_total, delta)`` over that horizon; ``t`` fixes the output domain
    (``None``: the MSE-optimal ``t`` of each candidate ``epsilon0``)."""

    mechanism: Mechanism
    d: int
    s: int
    n: int
    rounds: int
    epsilon_total: float
    delta: float
    t: int | None = None

    def __post_init__(self) -> None:
        if self.mechanism not in get_args(Mechanism):
            raise ValueError(f"mechanism must be coco or collision, got {self.mechanism!r}")
        check_n(self.n)
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1, got {self.rounds!r}")
        target = check_real("epsilon_total", self.epsilon_total)
        if target <= 0:
            raise ValueError(f"epsilon_total must be > 0, got {target}")
        check_delta(self.delta)

    def spec(self, epsilon0: float) -> MechanismSpec:
        """The deployment spec for a candidate local budget (validates d, s and t)."""
        return MechanismSpec(
            mechanism=self.mechanism,
            d=self.d,
            s=self.s,
            epsilon=epsilon0,
            t=self.t,  # type: ignore[arg-type]  # None selects the MSE-optimal t
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """A calibrated deployment: ``spec`` (its ``epsilon`` is the local budget of one report),
    the certified per-round ``epsilon_central`` (and ``epsilon_central_generic``), the
    verified ``epsilon_total <= target.epsilon_total`` over ``target.rounds`` rounds (as the
    ledger will account them), the
    closed-form per-batch MSE of the mean and frequency estimates (summed over dimensions, ``n``
    reports), and what each device's local ledger spends: ``epsilon0`` per report,
    ``rounds * epsilon0`` over the horizon (basic composition of the local guarantee)."""

    target: CalibrationTarget
    spec: MechanismSpec
    epsilon_central: float
    epsilon_central_generic: float
    epsilon_total: float
    mse_mean: float
    mse_freq: float

    def __post_init__(self) -> None:
        if not self.epsilon_total <= self.target.epsilon_total:
            raise ValueError(
                f"epsilon_total {self.epsilon_total} exceeds the target {self.target.epsilon_total}"
            )

    @property
    def ledger_per_report(self) -> float:
        return self.spec.epsilon

    @property
    def ledger_total(self) -> float:
        return self.target.rounds * self.spec.epsilon

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plan; ``spec`` is a :meth:`MechanismSpec.to_dict` (``coco announce
        --spec`` reads it)."""
        return {
            "mechanism": self.spec.mechanism,
            "d": self.spec.d,
            "s": self.spec.s,
            "t": self.spec.t,
            "epsilon0": self.spec.epsilon,
            "epsilon0_effective": self.spec.epsilon_effective,
            "n": self.target.n,
            "rounds": self.target.rounds,
            "delta": self.target.delta,
            "target_epsilon_total": self.target.epsilon_total,
            "epsilon_central": self.epsilon_central,
            "epsilon_central_generic": self.epsilon_central_generic,
            "epsilon_total": self.epsilon_total,
            "mse_mean": self.mse_mean,
            "mse_freq": self.mse_freq,
            "ledger_epsilon_per_report": self.ledger_per_report,
            "ledger_epsilon_total": self.ledger_total,
            "spec": self.spec.to_dict(),
        }


def _total(target: CalibrationTarget, epsilon0: float) -> tuple[MechanismSpec | None, float]:
    """The spec and its epsilon_total; ``(None, inf)`` where no valid spec exists."""
    try:
        spec = target.spec(epsilon0)
    except SpecError:
        return None, math.inf
    return spec, epsilon_total_rounds(spec, {target.n: target.rounds}, delta=target.delta)


def calibrate(target: CalibrationTarget, *, rtol: float = 2e-3) -> Plan:
    """The MSE-optimal plan meeting ``target`` (module docstring).

    ``epsilon0`` is searched on ``[1e-3, 10]`` to a relative ``rtol``; the returned plan's
    ``epsilon_total`` was evaluated and is ``<= target.epsilon_total``. Raises
    ``ValueError`` if even ``epsilon0 = 1e-3`` misses the target.
    """
    rtol = check_real("rtol", rtol)
    if not 0 < rtol < 1:
        raise ValueError(f"rtol must be in (0, 1), got {rtol}")
    lo, hi = EPSILON0_MIN, EPSILON0_MAX
    best_spec, best_total = _total(target, lo)
    if best_spec is None:
        target.spec(lo)  # raises the SpecError that explains why
    if best_total > target.epsilon_total:
        raise ValueError(
            f"the target epsilon_total={target.epsilon_total} is out of reach: even "
            f"epsilon0={lo} gives {best_total:.6g} over {target.rounds} rounds of {target.n}"
        )
    top_spec, top_total = _total(target, hi)
    if top_total <= target.epsilon_total:
        best_spec, best_total, lo = top_spec, top_total, hi
    while hi / lo > 1 + rtol:
        mid = math.sqrt(lo * hi)
        spec, total = _total(target, mid)
        if total <= target.epsilon_total:
            lo, best_spec, best_total = mid, spec, total
        else:
            hi = mid
    assert best_spec is not None  # lo is only ever moved to a valid spec
    record = amplify_spec(best_spec, n=target.n, delta=target.delta)
    moments = best_spec.moments
    return Plan(
        target=target,
        spec=best_spec,
        epsilon_central=record.epsilon_central,
        epsilon_central_generic=record.epsilon_central_generic,
        epsilon_total=best_total,
        mse_mean=moments.mean_mse(best_spec.d, best_spec.s) / target.n,
        mse_freq=moments.freq_mse(best_spec.d, best_spec.s) / target.n,
    )
