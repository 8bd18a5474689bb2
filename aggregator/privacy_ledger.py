"""What the batches applied so far cost in central privacy: per batch and over time.

:class:`PrivacyLedger` records the size of every batch the aggregator applies and turns the
record into the numbers the service exports:

* ``epsilon_central`` of the smallest and the latest batch: the certified blanket bound
  (:func:`aggregator.accountant.amplify_spec`), the guarantee of every report in such a
  batch;
* ``epsilon_central_generic``: the stronger-clone value beside it, for comparison;
* ``epsilon_total``: the composed central epsilon at ``delta`` of a device present in
  *every* batch applied (:func:`aggregator.accountant.epsilon_total_batches`, a pessimistic
  PLD composition of each batch's dominating pair). A device reports once per round, so it
  is in at most one batch of a round; counting it in every batch is the worst case.

Accounting sizes
----------------
``epsilon_total`` composes, for a batch of ``n`` reports, the dominating pair of a batch
of ``accounting_size(n)`` reports: ``n`` rounded down to :data:`SIGNIFICANT_BITS`
significant bits (at most 1/16 fewer reports). That is pessimistic: the shuffle of ``n``
reports is a post-processing of the shuffle of ``n' <= n`` of them (add the other
``n - n'`` reports, which do not depend on the target device's input, and shuffle again),
so a pair that dominates the batch of ``n'`` dominates the batch of ``n``, and PLD
composition of dominating pairs stays a certified bound. It keeps the number of distinct
privacy loss distributions at 16 per doubling of the batch size: whole-round batches differ
in size from round to round, and one distribution per distinct size (2-3 s of CPU each at
d = 512, rebuilt at each power of two of the batch count) grew without bound (100 batches
of distinct sizes took the accountant over ten minutes of CPU). The per-batch
``epsilon_central`` values stay exact: they are computed for the exact sizes.

Computing these costs from milliseconds to about a second (a new batch size needs a fresh
bound or privacy loss distribution), so the service calls :meth:`PrivacyLedger.compute`
in its accountant's process (:mod:`aggregator.accountant_process`), never on its event
loop; the ledger itself is plain data, with no I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from aggregator.accountant import amplify_spec, blanket_pair_for_spec, epsilon_total_batches
from edge.spec import MechanismSpec

__all__ = ["SIGNIFICANT_BITS", "PrivacyLedger", "PrivacyLevel", "Snapshot", "accounting_size"]

SIGNIFICANT_BITS = 5
"""Binary digits kept by :func:`accounting_size` (16 sizes per doubling)."""


def accounting_size(n: int) -> int:
    """``n`` rounded down to :data:`SIGNIFICANT_BITS` significant binary digits (module
    docstring, "Accounting sizes"): ``n`` itself below ``2**SIGNIFICANT_BITS``, else at
    least ``n * 15/16``."""
    if n < 1:
        raise ValueError(f"a batch holds at least one report, got {n}")
    shift = max(0, n.bit_length() - SIGNIFICANT_BITS)
    return (n >> shift) << shift


Snapshot = tuple[tuple[tuple[int, int], ...], int | None]
"""``((size, count), ...)`` sorted by size, and the latest batch's size: what
:meth:`PrivacyLedger.compute` needs, immutable and picklable."""


@dataclass(frozen=True, kw_only=True)
class PrivacyLevel:
    """The exported numbers (``None`` before the first batch)."""

    epsilon_central: dict[str, float | None]
    epsilon_central_generic: dict[str, float | None]
    epsilon_total: float | None
    batches: int
    sizes: dict[str, int | None]
    """The batch sizes ``smallest`` and ``latest`` the per-batch epsilons are for."""

    def for_sizes(self, *, smallest: int | None, latest: int | None) -> PrivacyLevel:
        """This level with each per-batch epsilon kept only where its batch size is still
        the current one (else ``None``). A level computed before a smaller batch arrived
        would otherwise show the larger batch's epsilon, an overstatement of privacy, next
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
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "epsilon_central": self.epsilon_central,
            "epsilon_central_generic": self.epsilon_central_generic,
            "epsilon_total": self.epsilon_total,
            "batches_accounted": self.batches,
        }


class PrivacyLedger:
    """Batch sizes applied, and the central privacy they amount to (module docstring)."""

    def __init__(self, spec: MechanismSpec, *, delta: float) -> None:
        self.spec = spec
        self.delta = delta
        self.sizes: Counter[int] = Counter()
        self.latest: int | None = None
        self._per_batch: dict[int, tuple[float, float]] = {}

    def record(self, size: int) -> None:
        """One batch of ``size`` reports was applied."""
        self.sizes[size] += 1
        self.latest = size

    def restore(self, sizes: dict[int, int], latest: int | None) -> None:
        self.sizes = Counter({int(n): int(c) for n, c in sizes.items() if c > 0})
        self.latest = latest

    @property
    def smallest(self) -> int | None:
        return min(self.sizes) if self.sizes else None

    def snapshot(self) -> Snapshot:
        """An immutable copy to hand to :meth:`compute` in another thread."""
        return tuple(sorted(self.sizes.items())), self.latest

    def per_batch(self, n: int) -> tuple[float, float]:
        """``(blanket, generic)`` central epsilon of one batch of ``n`` (cached)."""
        cached = self._per_batch.get(n)
        if cached is None:
            record = amplify_spec(self.spec, n=n, delta=self.delta)
            cached = (record.epsilon_central, record.epsilon_central_generic)
            self._per_batch[n] = cached
        return cached

    def compute(self, snapshot: Snapshot) -> PrivacyLevel:
        """The numbers of ``snapshot`` (:meth:`snapshot`); thread-safe for one caller."""
        sizes, latest = snapshot
        smallest = sizes[0][0] if sizes else None
        central: dict[str, float | None] = {}
        generic: dict[str, float | None] = {}
        for label, n in (("smallest", smallest), ("latest", latest)):
            blanket, clone = (None, None) if n is None else self.per_batch(n)
            central[label], generic[label] = blanket, clone
        total = None
        if sizes:
            pairs = [
                blanket_pair_for_spec(self.spec, n=accounting_size(n))
                for n, count in sizes
                for _ in range(count)
            ]
            total = epsilon_total_batches(pairs=pairs, delta=self.delta)
        return PrivacyLevel(
            epsilon_central=central,
            epsilon_central_generic=generic,
            epsilon_total=total,
            batches=sum(count for _, count in sizes),
            sizes={"smallest": smallest, "latest": latest},
        )
