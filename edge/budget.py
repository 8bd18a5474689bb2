"""The arithmetic of a device's privacy budget: a lifetime cap, a period cap, or both.

A pure core (no file, no clock): :class:`BudgetState` is what a device's ledger has spent,
:class:`BudgetPolicy` the caps in force, and :func:`decide` answers whether one more report
of cost ``epsilon`` made at Unix time ``at`` fits, returning the state after the charge or a
:class:`Refusal` saying why and when the budget renews. :mod:`edge.ledger` persists the state
(and libcoco's ``coco_ledger.c`` implements the same rules on a device).

Periods are aligned on Unix time: with a period of ``P`` seconds, period ``k`` is
``[k P, (k + 1) P)``. The state keeps the highest period index it has charged in and what
was spent in it. The safe side of every case:

* **A clock set back.** A charge whose period index is lower than the highest one charged is
  charged *as* that highest period (it adds to what that period has spent). A clock set
  back can therefore never renew a budget: a device whose clock ran ahead spent the budget
  of a period it will only reach later, and waits for it to pass.
* **A changed period length.** A state kept with periods of ``P_old`` seconds, read under a
  policy of ``P_new``, carries its period's spending over to the new period holding the
  *last second* of the old period: nothing spent in the old period is forgotten before the
  old period is over.
* **Exact sums.** Amounts are :class:`~fractions.Fraction` (every float is an exact
  rational): ``spent + epsilon <= cap`` is decided without rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from fractions import Fraction

from edge.durations import format_duration, seconds_of

MAX_PERIOD_SECONDS = 366 * 86_400
"""The longest period accepted (a year): longer periods are a lifetime cap in disguise."""


def parse_period(text: str) -> int:
    """Seconds of a duration written ``<n><unit>``, unit ``s``, ``m``, ``h`` or ``d`` (``1h``,
    ``1d``, ``7d``; :mod:`edge.durations`); :class:`ValueError` for anything else, a zero
    period or one over a year."""
    seconds = seconds_of(text, require_unit=True)
    if not seconds:
        raise ValueError(f"a period is a whole number and a unit s, m, h or d (1d), got {text!r}")
    if seconds > MAX_PERIOD_SECONDS:
        raise ValueError(f"a period is at most 366d, got {text!r}")
    return seconds


format_period = format_duration


def exact_epsilon(name: str, value: float, *, allow_zero: bool) -> Fraction:
    """``value`` as an exact rational, if it is a finite number ``> 0`` (or ``>= 0``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
    return Fraction(float(value))


@dataclass(frozen=True)
class PeriodPolicy:
    """At most ``epsilon`` per period of ``seconds`` seconds, periods aligned on Unix time."""

    epsilon: Fraction
    seconds: int

    def __post_init__(self) -> None:
        if not 0 < self.seconds <= MAX_PERIOD_SECONDS or self.epsilon < 0:
            raise ValueError(f"invalid period policy {self.epsilon} per {self.seconds} s")

    @classmethod
    def of(cls, epsilon: float, period: str | int) -> PeriodPolicy:
        """From a float epsilon and a period (``"1d"`` or seconds)."""
        seconds = parse_period(period) if isinstance(period, str) else period
        if isinstance(seconds, bool) or not isinstance(seconds, int):
            raise ValueError(f"period must be whole seconds, got {period!r}")
        if not 0 < seconds <= MAX_PERIOD_SECONDS:
            raise ValueError(f"period must be in [1, {MAX_PERIOD_SECONDS}] s, got {seconds}")
        return cls(exact_epsilon("period epsilon", epsilon, allow_zero=True), seconds)

    def index(self, at: float) -> int:
        """The period holding Unix time ``at``."""
        return math.floor(at) // self.seconds  # floor(at / P) == floor(floor(at) / P), exactly

    def start(self, index: int) -> int:
        """Unix time at which period ``index`` starts."""
        return index * self.seconds


@dataclass(frozen=True)
class BudgetPolicy:
    """The caps in force: ``total`` over the device's life, ``period`` per period (each
    ``None`` for no such cap)."""

    total: Fraction | None = None
    period: PeriodPolicy | None = None


@dataclass(frozen=True)
class BudgetState:
    """What a device has spent: in its life, and in the highest period it charged in
    (``period`` its index, ``period_seconds`` its length; both ``None`` before any charge
    under a period policy)."""

    spent: Fraction = Fraction(0)
    reports: int = 0
    period_seconds: int | None = None
    period: int | None = None
    period_spent: Fraction = Fraction(0)
    period_reports: int = 0

    def under(self, policy: PeriodPolicy) -> BudgetState:
        """This state read under ``policy``'s period length (module doc: a changed length
        carries the spending to the new period holding the old one's last second)."""
        if self.period is None or self.period_seconds is None:
            return self
        if self.period_seconds == policy.seconds:
            return self
        last_second = (self.period + 1) * self.period_seconds - 1
        return replace(self, period_seconds=policy.seconds, period=policy.index(last_second))


@dataclass(frozen=True)
class Refusal:
    """Why a charge does not fit: ``kind`` ``"lifetime"`` (for good) or ``"period"`` (until
    ``renews_at``, the Unix time the next period starts; ``None`` when a report costs more
    than a whole period's budget, so it never fits); ``spent`` of ``cap`` so far."""

    kind: str
    spent: Fraction
    cap: Fraction
    renews_at: int | None

    def message(self, epsilon: float) -> str:
        """One line for people."""
        if self.renews_at is None and self.kind == "period":
            return (
                f"a report costs {epsilon:g}, more than the period's budget "
                f"{float(self.cap):g}: it never fits"
            )
        if self.renews_at is None:
            return (
                f"privacy budget exhausted: spent {round_up(self.spent):g} of {float(self.cap):g}, "
                f"a report costs {epsilon:g}"
            )
        when = datetime.fromtimestamp(self.renews_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        spent, cap = round_up(self.spent), float(self.cap)
        return (
            f"privacy budget of this period spent: {spent:g} of {cap:g}, "
            f"a report costs {epsilon:g}; the next period starts at {when}"
        )


def decide(
    state: BudgetState, policy: BudgetPolicy, epsilon: Fraction, at: float
) -> BudgetState | Refusal:
    """The state after one charge of ``epsilon`` (``> 0``) at Unix time ``at``, or why not.

    The lifetime cap is checked first: a device past it is done for good, whatever its
    period says. Under a period policy the charge goes to ``max(period of at, highest
    period charged)``.
    """
    if epsilon <= 0:
        raise ValueError(f"a charge must be > 0, got {epsilon}")
    if policy.total is not None and state.spent + epsilon > policy.total:
        return Refusal("lifetime", state.spent, policy.total, None)
    after = replace(state, spent=state.spent + epsilon, reports=state.reports + 1)
    period = policy.period
    if period is None:
        return after
    current = state.under(period)
    index = period.index(at)
    if current.period is not None and index <= current.period:
        index = current.period  # the same period, or a clock set back: never renews
        period_spent, period_reports = current.period_spent, current.period_reports
    else:
        period_spent, period_reports = Fraction(0), 0
    if epsilon > period.epsilon:  # never fits, whatever the period: no renewal to wait for
        return Refusal("period", period_spent, period.epsilon, None)
    if period_spent + epsilon > period.epsilon:
        return Refusal("period", period_spent, period.epsilon, period.start(index + 1))
    return replace(
        after,
        period_seconds=period.seconds,
        period=index,
        period_spent=period_spent + epsilon,
        period_reports=period_reports + 1,
    )


def round_up(value: Fraction) -> float:
    """The smallest float ``>= value`` (so that a displayed spend never under-states)."""
    f = float(value)
    return f if Fraction(f) >= value else math.nextafter(f, math.inf)


def periods_meeting(window_seconds: int, period_seconds: int) -> int:
    """The most periods of ``period_seconds`` (aligned on Unix time) that one aligned window
    ``[k W, (k + 1) W)`` of ``window_seconds`` meets: ``floor((W + P - g - 1) / P) + 1`` with
    ``g = gcd(W, P)`` (``W / P`` when ``P`` divides ``W``, 1 when ``W`` divides ``P``).

    The window starts ``r = k W mod P`` seconds into a period, ``r`` a multiple of ``g`` up
    to ``P - g``, and meets ``floor((r + W - 1) / P) + 1`` periods."""
    if window_seconds < 1 or period_seconds < 1:
        raise ValueError("window and period must be >= 1 s")
    g = math.gcd(window_seconds, period_seconds)
    return (window_seconds + period_seconds - g - 1) // period_seconds + 1


def most_reports(policy: PeriodPolicy, epsilon: Fraction, window_seconds: int) -> int:
    """The most reports of cost ``epsilon`` a device under ``policy`` charges to the periods
    that one aligned window of ``window_seconds`` meets (each period holds at most
    ``floor(policy.epsilon / epsilon)``): what the window's reports cannot exceed, since a
    report is charged to the period holding the start of its round."""
    return (policy.epsilon // epsilon) * periods_meeting(window_seconds, policy.seconds)


def within_announced(
    own: PeriodPolicy | None, announced: PeriodPolicy | None, epsilon: Fraction
) -> PeriodPolicy | None:
    """The period cap a device runs with: its own (the operator's) when it is no looser than
    the announced one, the announced one when the operator gave none; :class:`ValueError`
    (one line) for an own cap that lets more reports of cost ``epsilon`` into an announced
    period than the announced cap does (:func:`most_reports`)."""
    if announced is None or own is None:
        return own if announced is None else announced
    allowed = announced.epsilon // epsilon
    mine = most_reports(own, epsilon, announced.seconds)
    if mine > allowed:
        raise ValueError(
            f"the period cap {float(own.epsilon):g} per {format_period(own.seconds)} allows "
            f"{mine} reports in a period of the deployment's policy "
            f"({float(announced.epsilon):g} per {format_period(announced.seconds)}, at most "
            f"{allowed}): give a cap no looser, or none to follow the announcement"
        )
    return own
