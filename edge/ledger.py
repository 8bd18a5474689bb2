"""A device's local privacy-budget ledger, persisted so that a restart never forgets spending.

Every report a device releases costs the local budget ``spec.epsilon`` of its mechanism
(basic sequential composition: ``k`` reports cost ``k * epsilon``). The ledger keeps the sum
and refuses a charge that would take it over the device's total.

Safety rules, each in the direction that can only *over*-count what was spent:

* :meth:`BudgetLedger.charge` writes the new total to disk (temp file, ``fsync``,
  ``os.replace``, ``fsync`` of the directory) *before* it returns, and the publisher calls it
  *before* it randomises and releases the report. A crash between the two wastes budget; it
  never releases a report the file does not count.
* Sums are exact: every ``epsilon`` is a binary float, hence an exact rational, and the
  ledger adds them as :class:`fractions.Fraction`. ``spent + epsilon <= total`` is decided
  without rounding, so the boundary is exact (``4 x 0.5`` fits a total of ``2.0``) and
  float error can never let the sum creep over the total. (The zero-tolerance comparison is
  the safe side of any tolerance; a sum like ``3 x 0.1`` is slightly *more* than ``0.3`` in
  binary, so the third charge is refused.) The file stores the exact sum as a
  ``"numerator/denominator"`` string and, for people, a float rounded *up*.
* A ledger file that exists but cannot be read or parsed raises :class:`LedgerError` naming
  the file. It is never reset to zero: that would silently hand the device a fresh budget.

File format (UTF-8 JSON)::

    {"version": 1, "total_epsilon": 8.0, "spent_epsilon": 2.5,
     "spent_epsilon_exact": "5/2", "reports": 5}

The ``total_epsilon`` passed to :class:`BudgetLedger` is the policy in force and is written
back to the file; the spent amount is only ever read from the file and increased. One
process at a time may use a ledger file (there is no inter-process lock).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

from edge.errors import CocoError

FORMAT_VERSION = 1


class LedgerError(CocoError):
    """A ledger file that cannot be read, parsed or written; ``path`` names it."""

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message)
        self.path = path


class BudgetExhausted(LedgerError):  # noqa: N818 (the name the protocol docs use)
    """A charge of ``epsilon`` refused because ``spent + epsilon`` would exceed ``total``."""

    def __init__(self, *, path: Path, epsilon: float, spent: float, total: float) -> None:
        super().__init__(
            f"privacy budget exhausted: spent {spent:g} of {total:g}, a report costs {epsilon:g} "
            f"(ledger {path})",
            path=path,
        )
        self.epsilon = epsilon
        self.spent = spent
        self.total = total


def _round_up(value: Fraction) -> float:
    """The smallest float ``>= value`` (so that a displayed spend never under-states)."""
    f = float(value)
    return f if Fraction(f) >= value else math.nextafter(f, math.inf)


def _check_epsilon(name: str, value: float, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")
    return float(value)


class BudgetLedger:
    """The spent local budget of one device, persisted in ``path``.

    A missing file starts a new ledger (and is created at once, so that an unwritable path
    fails at start-up rather than at the first report).
    """

    def __init__(self, path: str | os.PathLike[str], *, total_epsilon: float) -> None:
        self.path = Path(path)
        self._total = Fraction(_check_epsilon("total_epsilon", total_epsilon, allow_zero=True))
        self._spent = Fraction(0)
        self._reports = 0
        if self.path.exists():
            self._load()
        self._save(self._spent, self._reports)

    # -- public surface --------------------------------------------------------------------

    @property
    def total(self) -> float:
        """The total budget in force."""
        return float(self._total)

    @property
    def spent(self) -> float:
        """Budget spent so far (rounded up to a float)."""
        return _round_up(self._spent)

    @property
    def remaining(self) -> float:
        """Budget left (rounded down to a float, never negative)."""
        left = max(self._total - self._spent, Fraction(0))
        f = float(left)
        return f if Fraction(f) <= left else math.nextafter(f, -math.inf)

    @property
    def reports(self) -> int:
        """Reports charged so far."""
        return self._reports

    def can_afford(self, epsilon: float) -> bool:
        """Whether :meth:`charge` of ``epsilon`` would succeed now."""
        eps = _check_epsilon("epsilon", epsilon, allow_zero=False)
        return self._spent + Fraction(eps) <= self._total

    def charge(self, epsilon: float) -> None:
        """Record one report of cost ``epsilon``; durable on disk when this returns.

        Raises :class:`BudgetExhausted` (and records nothing) if the total would be
        exceeded, and :class:`LedgerError` if the file cannot be written (then nothing is
        recorded and the report must not be released).
        """
        eps = _check_epsilon("epsilon", epsilon, allow_zero=False)
        new_spent = self._spent + Fraction(eps)
        if new_spent > self._total:
            raise BudgetExhausted(path=self.path, epsilon=eps, spent=self.spent, total=self.total)
        self._save(new_spent, self._reports + 1)
        self._spent = new_spent
        self._reports += 1

    def __repr__(self) -> str:
        return (
            f"BudgetLedger({str(self.path)!r}, total_epsilon={self.total:g}, "
            f"spent={self.spent:g}, reports={self._reports})"
        )

    # -- persistence -----------------------------------------------------------------------

    def _fail(self, what: str, exc: BaseException | None = None) -> LedgerError:
        detail = f": {exc}" if exc is not None else ""
        return LedgerError(
            f"privacy ledger {self.path} {what}{detail} (refusing to reset it; "
            "fix or remove the file deliberately)",
            path=self.path,
        )

    def _load(self) -> None:
        try:
            data: Any = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise self._fail("cannot be read", exc) from exc
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            raise self._fail(f"is not a version-{FORMAT_VERSION} ledger")
        exact = data.get("spent_epsilon_exact")
        reports = data.get("reports")
        try:
            spent = Fraction(exact) if isinstance(exact, str) else None
        except (ValueError, ZeroDivisionError) as exc:
            raise self._fail("has an invalid spent_epsilon_exact", exc) from exc
        if spent is None or spent < 0:
            raise self._fail(f"has an invalid spent_epsilon_exact {exact!r}")
        if isinstance(reports, bool) or not isinstance(reports, int) or reports < 0:
            raise self._fail(f"has an invalid report count {reports!r}")
        shown = data.get("spent_epsilon")
        if not isinstance(shown, int | float) or shown != _round_up(spent):
            # The human-readable copy disagrees with the exact one: someone edited the file.
            raise self._fail(
                f"is inconsistent (spent_epsilon {shown!r} vs spent_epsilon_exact {exact!r})"
            )
        self._spent = spent
        self._reports = reports

    def _save(self, spent: Fraction, reports: int) -> None:
        payload = json.dumps(
            {
                "version": FORMAT_VERSION,
                "total_epsilon": float(self._total),
                "spent_epsilon": _round_up(spent),
                "spent_epsilon_exact": f"{spent.numerator}/{spent.denominator}",
                "reports": reports,
            },
            sort_keys=True,
        )
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
