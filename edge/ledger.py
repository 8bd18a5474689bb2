"""A device's local privacy-budget ledger, persisted so that a restart never forgets spending.

Every report a device releases costs the local budget ``spec.epsilon`` of its mechanism
(basic sequential composition: ``k`` reports cost ``k * epsilon``). The ledger keeps the sums
and refuses a charge that would take them over the device's caps (:mod:`edge.budget`, the
arithmetic): a lifetime cap ``total_epsilon``, a period cap (:class:`~edge.budget.PeriodPolicy`,
e.g. 1.0 per day, periods aligned on Unix time), or both. A refusal by the period cap names
the Unix time the next period starts (``BudgetExhausted.renews_at``); a refusal by the
lifetime cap is for good.

Safety rules, each in the direction that can only *over*-count what was spent:

* :meth:`BudgetLedger.charge` writes the new sums to disk (temp file, ``fsync``,
  ``os.replace``, ``fsync`` of the directory) *before* it returns, and the publisher calls it
  *before* it randomises and releases the report. A crash between the two wastes budget; it
  never releases a report the file does not count.
* Sums are exact: every ``epsilon`` is a binary float, hence an exact rational, and the
  ledger adds them as :class:`fractions.Fraction`. ``spent + epsilon <= cap`` is decided
  without rounding, so the boundary is exact (``4 x 0.5`` fits a cap of ``2.0``) and float
  error can never let the sum creep over the cap. (The zero-tolerance comparison is the safe
  side of any tolerance; a sum like ``3 x 0.1`` is slightly *more* than ``0.3`` in binary, so
  the third charge is refused.) The file stores each exact sum as a
  ``"numerator/denominator"`` string and, for people, a float rounded *up*.
* A clock set back never renews a budget: the file keeps the highest period index charged,
  and a charge dated in an earlier period is charged to that highest one
  (:func:`edge.budget.decide`).
* A ledger file that exists but cannot be read or parsed, fails its checksum, or whose
  fields disagree, raises :class:`LedgerError` naming the file. It is never reset to zero:
  that would silently hand the device a fresh budget.

File format, version 2 (UTF-8 JSON, keys sorted)::

    {"period": 20259, "period_epsilon": 1.0, "period_reports": 2, "period_seconds": 86400,
     "period_spent_epsilon": 1.0, "period_spent_epsilon_exact": "1/1", "reports": 5,
     "sha256": "...", "spent_epsilon": 2.5, "spent_epsilon_exact": "5/2",
     "total_epsilon": 8.0, "version": 2}

``period`` is the highest period index charged, ``period_seconds`` the length it was kept
with (both ``null`` before the first charge under a period policy) and ``period_spent_*`` /
``period_reports`` what that period has spent. ``total_epsilon`` and ``period_epsilon`` are
the caps in force when it was written (``null``: no such cap), for people: the caps a
:class:`BudgetLedger` is opened with are the policy, and the spent amounts are only ever read
from the file and increased. ``sha256`` is the SHA-256 (hex) of the canonical JSON (sorted
keys, no whitespace) of every other key. A version-1 file (lifetime only, no period, no
checksum: ``{"version": 1, "total_epsilon": 8.0, "spent_epsilon": 2.5,
"spent_epsilon_exact": "5/2", "reports": 5}``) is still read, with the same checks as before,
and rewritten as version 2. One process at a time may use a ledger file (there is no
inter-process lock).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeGuard

from edge.budget import (
    MAX_PERIOD_SECONDS,
    BudgetPolicy,
    BudgetState,
    PeriodPolicy,
    Refusal,
    decide,
    exact_epsilon,
    round_up,
)
from edge.errors import CocoError

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)


class LedgerError(CocoError):
    """A ledger file that cannot be read, parsed or written; ``path`` names it."""

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.path = path


class BudgetExhausted(LedgerError):  # noqa: N818 (the name the protocol docs use)
    """A charge of ``epsilon`` refused by a cap: ``kind`` ``"lifetime"`` (for good; ``spent``
    of ``total`` is the lifetime's) or ``"period"`` (``spent`` of ``total`` is the period's;
    the budget renews at Unix time ``renews_at``)."""

    def __init__(self, *, path: Path, epsilon: float, refusal: Refusal) -> None:
        super().__init__(f"{refusal.message(epsilon)} (ledger {path})", path=path)
        self.epsilon = epsilon
        self.kind = refusal.kind
        self.spent = round_up(refusal.spent)
        self.total = float(refusal.cap)
        self.renews_at = refusal.renews_at


def _check_epsilon(name: str, value: float, *, allow_zero: bool) -> Fraction:
    return exact_epsilon(name, value, allow_zero=allow_zero)


def _exact_text(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


def _checksum(fields: dict[str, Any]) -> str:
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class BudgetLedger:
    """The spent local budget of one device, persisted in ``path``.

    ``total_epsilon`` is the lifetime cap and ``period`` the period cap (each ``None`` for
    none; at least one must be given). A missing file starts a new ledger (and is created at
    once, so that an unwritable path fails at start-up rather than at the first report).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        total_epsilon: float | None = None,
        period: PeriodPolicy | None = None,
    ) -> None:
        self.path = Path(path)
        if total_epsilon is None and period is None:
            raise ValueError("a ledger needs a lifetime cap (total_epsilon), a period cap or both")
        total = None
        if total_epsilon is not None:
            total = _check_epsilon("total_epsilon", total_epsilon, allow_zero=True)
        self.policy = BudgetPolicy(total=total, period=period)
        self._state = BudgetState()
        if self.path.exists():
            self._state = self._load()
        self._save(self._state)

    # -- public surface --------------------------------------------------------------------

    @property
    def total(self) -> float:
        """The lifetime cap in force (``inf`` without one)."""
        return math.inf if self.policy.total is None else float(self.policy.total)

    @property
    def period(self) -> PeriodPolicy | None:
        """The period cap in force (``None`` without one)."""
        return self.policy.period

    @property
    def state(self) -> BudgetState:
        """The exact sums as last written."""
        return self._state

    @property
    def spent(self) -> float:
        """Budget spent in the device's life (rounded up to a float)."""
        return round_up(self._state.spent)

    @property
    def remaining(self) -> float:
        """Lifetime budget left (rounded down to a float, never negative; ``inf`` without a
        lifetime cap)."""
        if self.policy.total is None:
            return math.inf
        left = max(self.policy.total - self._state.spent, Fraction(0))
        f = float(left)
        return f if Fraction(f) <= left else math.nextafter(f, -math.inf)

    @property
    def reports(self) -> int:
        """Reports charged so far."""
        return self._state.reports

    def refusal(self, epsilon: float, at: float | None = None) -> Refusal | None:
        """Why a :meth:`charge` of ``epsilon`` at Unix time ``at`` (default: now) would be
        refused, or ``None`` if it would succeed."""
        eps = _check_epsilon("epsilon", epsilon, allow_zero=False)
        outcome = decide(self._state, self.policy, eps, time.time() if at is None else at)
        return outcome if isinstance(outcome, Refusal) else None

    def can_afford(self, epsilon: float, at: float | None = None) -> bool:
        """Whether :meth:`charge` of ``epsilon`` at ``at`` (default: now) would succeed."""
        return self.refusal(epsilon, at) is None

    def charge(self, epsilon: float, at: float | None = None) -> None:
        """Record one report of cost ``epsilon`` made at Unix time ``at`` (default: now; the
        reference publisher gives the start of the report's round); durable on disk when
        this returns.

        Raises :class:`BudgetExhausted` (and records nothing) if a cap would be exceeded, and
        :class:`LedgerError` if the file cannot be written (then nothing is recorded and the
        report must not be released).
        """
        eps = _check_epsilon("epsilon", epsilon, allow_zero=False)
        outcome = decide(self._state, self.policy, eps, time.time() if at is None else at)
        if isinstance(outcome, Refusal):
            raise BudgetExhausted(path=self.path, epsilon=float(eps), refusal=outcome)
        self._save(outcome)
        self._state = outcome

    def __repr__(self) -> str:
        period = self.policy.period
        per = "" if period is None else f", period={float(period.epsilon):g}/{period.seconds}s"
        return (
            f"BudgetLedger({str(self.path)!r}, total_epsilon={self.total:g}{per}, "
            f"spent={self.spent:g}, reports={self.reports})"
        )

    # -- persistence -----------------------------------------------------------------------

    def _fail(self, what: str, exc: BaseException | None = None) -> LedgerError:
        detail = f": {exc}" if exc is not None else ""
        return LedgerError(
            f"privacy ledger {self.path} {what}{detail} (refusing to reset it; "
            "fix or remove the file deliberately)",
            path=self.path,
        )

    def _load(self) -> BudgetState:
        try:
            data: Any = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise self._fail("cannot be read", exc) from exc
        if not isinstance(data, dict) or data.get("version") not in READABLE_VERSIONS:
            raise self._fail(f"is not a version-{FORMAT_VERSION} (or 1) ledger")
        if data["version"] == 1:
            spent, reports = self._sum(data, "spent_epsilon", "reports")
            return BudgetState(spent=spent, reports=reports)
        fields = {k: v for k, v in data.items() if k != "sha256"}
        if data.get("sha256") != _checksum(fields):
            raise self._fail("fails its checksum (sha256): it was damaged or edited")
        spent, reports = self._sum(data, "spent_epsilon", "reports")
        period_spent, period_reports = self._sum(data, "period_spent_epsilon", "period_reports")
        seconds, index = data.get("period_seconds"), data.get("period")
        if seconds is None and index is None:
            if period_spent or period_reports:
                raise self._fail("has period spending without a period")
        elif not (_is_int(seconds) and 0 < seconds <= MAX_PERIOD_SECONDS and _is_int(index)):
            raise self._fail(f"has an invalid period {index!r} of {seconds!r} s")
        elif index < 0:
            raise self._fail(f"has an invalid period {index!r}")
        if period_spent > spent or period_reports > reports:
            raise self._fail("has a period that spent more than the whole ledger")
        return BudgetState(
            spent=spent,
            reports=reports,
            period_seconds=seconds,
            period=index,
            period_spent=period_spent,
            period_reports=period_reports,
        )

    def _sum(self, data: dict[str, Any], key: str, count_key: str) -> tuple[Fraction, int]:
        """The exact amount under ``key``_exact (checked against its float copy ``key``) and
        the count under ``count_key``."""
        exact = data.get(f"{key}_exact")
        count = data.get(count_key)
        try:
            amount = Fraction(exact) if isinstance(exact, str) else None
        except (ValueError, ZeroDivisionError) as exc:
            raise self._fail(f"has an invalid {key}_exact", exc) from exc
        if amount is None or amount < 0:
            raise self._fail(f"has an invalid {key}_exact {exact!r}")
        if not _is_int(count) or count < 0:
            raise self._fail(f"has an invalid {count_key} {count!r}")
        shown = data.get(key)
        if isinstance(shown, bool) or not isinstance(shown, int | float):
            shown = None
        if shown is None or shown != round_up(amount):
            # The human-readable copy disagrees with the exact one: someone edited the file.
            raise self._fail(f"is inconsistent ({key} {shown!r} vs {key}_exact {exact!r})")
        return amount, count

    def _save(self, state: BudgetState) -> None:
        period = self.policy.period
        fields: dict[str, Any] = {
            "version": FORMAT_VERSION,
            "total_epsilon": None if self.policy.total is None else float(self.policy.total),
            "spent_epsilon": round_up(state.spent),
            "spent_epsilon_exact": _exact_text(state.spent),
            "reports": state.reports,
            "period_epsilon": None if period is None else float(period.epsilon),
            "period_seconds": state.period_seconds,
            "period": state.period,
            "period_spent_epsilon": round_up(state.period_spent),
            "period_spent_epsilon_exact": _exact_text(state.period_spent),
            "period_reports": state.period_reports,
        }
        fields["sha256"] = _checksum(fields)
        payload = json.dumps(fields, sort_keys=True)
        directory = self.path.parent
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(payload + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            _fsync_directory(directory)
        except OSError as exc:
            raise self._fail("cannot be written", exc) from exc


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
