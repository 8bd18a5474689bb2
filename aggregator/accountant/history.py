"""How a deployment's history is accounted: one participation per round, composed.

This is the one place where the product decides what ``epsilon_total`` composes. The
aggregator's ledger (:mod:`aggregator.ledger.privacy_ledger`), ``coco privacy --rounds`` and
``coco privacy calibrate`` all call :func:`epsilon_total_rounds`, so a deployment that runs
exactly as it was planned reports exactly the planned number.

Participations
--------------
A device sends at most one report per round, to one shard, and every release (one round's
pool of one shard, shuffled once, maybe cut into slices) is a uniform shuffle of its pool.
So a round is ONE participation of a device, whose level is that of the round's smallest
release (docs/privacy-model.md, "Privacy over time"; the argument is written out in
:mod:`aggregator.ledger.privacy_ledger`). A history is therefore a multiset of release sizes, one
per round: ``{size: rounds}``.

Accounting sizes
----------------
Each participation of ``n`` reports is composed as the blanket pair of
``accounting_size(n)`` reports: ``n`` rounded down to :data:`SIGNIFICANT_BITS`
significant bits (at most 1/16 fewer reports). That is pessimistic: the shuffle of ``n``
reports is a post-processing of the shuffle of ``n' <= n`` of them (add the other
``n - n'`` reports, which do not depend on the target device's input, and shuffle again),
so a pair that dominates the release of ``n'`` dominates the release of ``n``. It keeps
the number of distinct privacy loss distributions at 16 per doubling of the release size:
releases differ in size from round to round, and one distribution per distinct size grew
without bound. A release above :data:`~aggregator.accountant.blanket.MAX_N` reports (the
largest the certified bound is validated for) is composed as one of ``MAX_N``, pessimistic
by the same argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from aggregator.accountant._checks import check_delta
from aggregator.accountant.blanket import MAX_N, BlanketPair, blanket_pair_for_spec
from aggregator.accountant.composition import epsilon_total_counts
from edge.spec import MechanismSpec

__all__ = ["SIGNIFICANT_BITS", "accounting_size", "epsilon_total_rounds"]

SIGNIFICANT_BITS: Final = 5
"""Binary digits kept by :func:`accounting_size` (16 sizes per doubling)."""


def accounting_size(n: int) -> int:
    """``n`` rounded down to :data:`SIGNIFICANT_BITS` significant binary digits (module
    docstring, "Accounting sizes"): ``n`` itself below ``2**SIGNIFICANT_BITS``, else at
    least ``n * 15/16``; at most ``MAX_N``."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"a release size must be an integer, got {n!r}")
    if n < 1:
        raise ValueError(f"a release holds at least one report, got {n}")
    shift = max(0, n.bit_length() - SIGNIFICANT_BITS)
    return min((n >> shift) << shift, MAX_N)


def epsilon_total_rounds(spec: MechanismSpec, rounds: Mapping[int, int], *, delta: float) -> float:
    """Composed central epsilon at ``delta`` of a device in every round of ``rounds``
    (``{release size: number of rounds}``; a round's size is its smallest release).

    Each participation is composed at its :func:`accounting_size`; the result is the
    pessimistic PLD composition of :mod:`aggregator.accountant.composition`.
    """
    delta = check_delta(delta)
    counts: dict[BlanketPair, int] = {}
    for size, count in rounds.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"a number of rounds must be an integer >= 0, got {count!r}")
        if count:
            pair = blanket_pair_for_spec(spec, n=accounting_size(size))
            counts[pair] = counts.get(pair, 0) + count
    if not counts:
        raise ValueError("rounds must hold at least one round")
    return epsilon_total_counts(counts, delta=delta)
