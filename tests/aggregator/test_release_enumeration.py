"""Per-round accounting checked by exact enumeration (aggregator/privacy_ledger.py, "What a
release is, and why a round is one participation").

For tiny fleets the law of what the aggregator sees is enumerated exactly, under every
dataset of the other devices and a pair of neighbouring inputs of the target device:

* a release cut into slices (a uniform permutation of the pool, then consecutive pieces,
  each published as its own batch) has exactly the hockey-stick divergence of the unsliced
  shuffle of the pool (exact rationals), for every ``E = e^eps`` tried;
* a round of several releases (two shards; the target device in one of them) has exactly
  the divergence of the target's release, which is at most that of the round's smallest
  release as the ledger accounts it;
* the ledger's numbers (the blanket bound, and ``epsilon_total`` of one participation per
  round) are never below the true ones, over one round and over two.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from fractions import Fraction

import pytest

from aggregator.accountant import BlanketPair, blanket_delta, epsilon_total_counts
from aggregator.privacy_ledger import PrivacyLedger
from edge.spec import MechanismSpec

View = tuple[tuple[int, ...], ...]
Law = dict[View, Fraction]


def krr(k: int, p: Fraction, x: int) -> list[Fraction]:
    """k-ary randomised response with ``e^eps0 = p``: the law of the report of input x."""
    norm = p + k - 1
    return [p / norm if y == x else 1 / norm for y in range(k)]


def slice_sizes(n: int, slices: int) -> list[int]:
    """The shuffler's cut (broker/core.py): near-equal consecutive pieces."""
    return [(j + 1) * n // slices - j * n // slices for j in range(slices)]


def splits(counts: Sequence[int], sizes: Sequence[int]) -> Iterator[tuple[View, Fraction]]:
    """Every way the multiset ``counts`` falls into consecutive slices of ``sizes`` after a
    uniform permutation, with its probability (sequential multivariate hypergeometric)."""
    if not sizes:
        yield (), Fraction(1)
        return
    size, rest = sizes[0], sizes[1:]
    total = sum(counts)
    for first in itertools.product(*(range(c + 1) for c in counts)):
        if sum(first) != size:
            continue
        weight = Fraction(
            math.prod(math.comb(c, f) for c, f in zip(counts, first, strict=True)),
            math.comb(total, size),
        )
        remaining = [c - f for c, f in zip(counts, first, strict=True)]
        for tail, tail_weight in splits(remaining, rest):
            yield (tuple(first), *tail), weight * tail_weight


def release_law(laws: Sequence[list[Fraction]], slices: int) -> Law:
    """The law of a release of the reports of ``laws`` (one per device), cut into
    ``slices`` batches: the ordered tuple of the slices' count vectors."""
    k, n = len(laws[0]), len(laws)
    unsliced: dict[tuple[int, ...], Fraction] = defaultdict(Fraction)
    for reports in itertools.product(range(k), repeat=n):
        prob = math.prod((law[y] for law, y in zip(laws, reports, strict=True)), start=Fraction(1))
        counts = Counter(reports)
        unsliced[tuple(counts[y] for y in range(k))] += prob
    out: Law = defaultdict(Fraction)
    for count_vector, prob in unsliced.items():
        for view, weight in splits(count_vector, slice_sizes(n, slices)):
            out[view] += prob * weight
    return dict(out)


def hockey(p: Law, q: Law, big_e: Fraction) -> Fraction:
    return sum(
        (
            max(p.get(v, Fraction(0)) - big_e * q.get(v, Fraction(0)), Fraction(0))
            for v in p.keys() | q.keys()
        ),
        Fraction(0),
    )


def product(a: Law, b: Law) -> Law:
    return {(*va, *vb): pa * pb for va, pa in a.items() for vb, pb in b.items()}


E_GRID = [Fraction(1), Fraction(6, 5), Fraction(3, 2), Fraction(2)]


@pytest.mark.parametrize(
    ("k", "p", "n"), [(3, Fraction(2), 4), (3, Fraction(3), 5), (2, Fraction(3), 5)]
)
def test_a_sliced_release_is_exactly_one_shuffle_of_its_pool(k: int, p: Fraction, n: int) -> None:
    pair = BlanketPair(n=n, exp_epsilon0=float(p), s=1, t=k)
    # the view depends on the other devices' inputs only through their multiset
    for others in itertools.combinations_with_replacement(range(k), n - 1):
        for x, x_prime in itertools.permutations(range(k), 2):
            laws = [krr(k, p, x), *(krr(k, p, o) for o in others)]
            laws_prime = [krr(k, p, x_prime), *(krr(k, p, o) for o in others)]
            whole = release_law(laws, 1), release_law(laws_prime, 1)
            for slices in (2, 3):
                if slices > n:
                    continue
                cut = release_law(laws, slices), release_law(laws_prime, slices)
                assert sum(cut[0].values()) == 1
                for big_e in E_GRID:
                    truth = hockey(*whole, big_e)
                    assert hockey(*cut, big_e) == truth  # exactly, in both directions
                    assert hockey(cut[1], cut[0], big_e) == hockey(whole[1], whole[0], big_e)
                    # the ledger's per-release bound covers it (certified, in floats)
                    bound = blanket_delta(pair, epsilon=math.log(big_e))
                    assert bound >= float(truth) * (1 - 1e-12)


def test_a_round_of_two_shards_costs_the_target_release_at_most_the_smallest() -> None:
    """Shard A holds the target device and 2 others (cut into two slices), shard B 2 other
    devices: the view of the round (both releases) has exactly A's divergence, and the bound
    of the round's smallest release (B's 2 reports, what the ledger takes) covers it."""
    k, p = 3, Fraction(2)
    for others_a in itertools.combinations_with_replacement(range(k), 2):
        for other_b in itertools.combinations_with_replacement(range(k), 2):
            b = release_law([krr(k, p, o) for o in other_b], 1)
            for x, x_prime in itertools.permutations(range(k), 2):
                a = release_law([krr(k, p, x), *(krr(k, p, o) for o in others_a)], 2)
                a_prime = release_law([krr(k, p, x_prime), *(krr(k, p, o) for o in others_a)], 2)
                for big_e in E_GRID:
                    round_view = hockey(product(a, b), product(a_prime, b), big_e)
                    assert round_view == hockey(a, a_prime, big_e)
                    smallest = BlanketPair(n=2, exp_epsilon0=float(p), s=1, t=k)
                    assert blanket_delta(smallest, epsilon=math.log(big_e)) >= float(round_view)
    # and the ledger takes the round's smallest release
    ledger = PrivacyLedger(MechanismSpec(mechanism="collision", d=3, s=1, epsilon=1.0), delta=0.1)
    ledger.record_manifest(
        round=0, shard="g0s0", release_id=bytes(16), batches=[(b"a" * 16, 2), (b"b" * 16, 1)]
    )
    ledger.record_manifest(round=0, shard="g0s1", release_id=b"\x01" * 16, batches=[(b"c" * 16, 2)])
    assert ledger.rounds() == {2: 1}


def exact_epsilon(law_p: Law, law_q: Law, delta: float) -> float:
    """The smallest eps with max(H(P||Q), H(Q||P)) <= delta, in floats (bisection)."""
    views = list(law_p.keys() | law_q.keys())
    ps = [float(law_p.get(v, 0)) for v in views]
    qs = [float(law_q.get(v, 0)) for v in views]

    def div(eps: float) -> float:
        e = math.exp(eps)
        return max(
            sum(max(a - e * b, 0.0) for a, b in zip(ps, qs, strict=True)),
            sum(max(b - e * a, 0.0) for a, b in zip(ps, qs, strict=True)),
        )

    lo, hi = 0.0, 10.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if div(mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize("delta", [0.05, 0.01])
def test_the_ledger_epsilon_total_covers_two_rounds_of_sliced_releases(delta: float) -> None:
    """Two rounds, each a release of 4 reports cut into 2 batches: the true epsilon of the
    whole view (every dataset of the others, every neighbouring pair) is at most the
    ledger's one-participation-per-round epsilon_total; counting each batch as a
    participation (the old accounting) is far above both."""
    k, p, n = 3, Fraction(2), 4
    pair = BlanketPair(n=n, exp_epsilon0=float(p), s=1, t=k)
    ledger_total = epsilon_total_counts({pair: 2}, delta=delta)
    worst = 0.0
    for others in itertools.combinations_with_replacement(range(k), n - 1):
        for x, x_prime in itertools.permutations(range(k), 2):
            one = release_law([krr(k, p, x), *(krr(k, p, o) for o in others)], 2)
            one_prime = release_law([krr(k, p, x_prime), *(krr(k, p, o) for o in others)], 2)
            two, two_prime = product(one, one), product(one_prime, one_prime)
            worst = max(worst, exact_epsilon(two, two_prime, delta))
    assert worst <= ledger_total
    per_batch = epsilon_total_counts(
        {BlanketPair(n=2, exp_epsilon0=float(p), s=1, t=k): 4}, delta=delta
    )
    assert per_batch > ledger_total
