"""Per-round accounting checked by exact enumeration (aggregator/ledger/privacy_ledger.py, "What a
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
from aggregator.accountant.history import epsilon_total_rounds
from aggregator.ledger.privacy_ledger import PrivacyLedger
from broker.core.effects import is_manifest
from broker.core.machine import Admitted, BatchMaker, CoreConfig, Effect, Released, ShufflerCore
from edge.codec import decode_batch, decode_manifest
from edge.spec import MechanismSpec

View = tuple[tuple[int, ...], ...]
Law = dict[View, Fraction]


def krr(k: int, p: Fraction, x: int) -> list[Fraction]:
    """k-ary randomised response with ``e^eps0 = p``: the law of the report of input x."""
    norm = p + k - 1
    return [p / norm if y == x else 1 / norm for y in range(k)]


def slice_sizes(n: int, slices: int) -> list[int]:
    """The shuffler's cut (broker/core/release.py): near-equal consecutive pieces."""
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
        round=0,
        shard="g0s0",
        release_id=bytes(16),
        batches=[(b"a" * 16, 2), (b"b" * 16, 1)],
        sources=[(0, 60)],
    )
    ledger.record_manifest(
        round=0,
        shard="g0s1",
        release_id=b"\x01" * 16,
        batches=[(b"c" * 16, 2)],
        sources=[(0, 60)],
    )
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


Release = tuple[int, list[tuple[bytes, list[int]]], tuple[object, ...]]
"""A release of the real core: its round, its batches ``(batch_id, seeds)``, its manifest."""


def _run_shuffler(
    config: CoreConfig, script: Sequence[tuple[float, str, int, int, int]]
) -> tuple[list[Release], list[str]]:
    """Drive the real shuffler core (broker/core/machine.py) through ``script`` as the service does
    (``("report", token, round, seed)``: accepted, applied piece by piece and released
    early when due; ``("tick", ...)``: its effects applied in order) and return every
    release and every rejection reason."""
    ids = itertools.count(1)
    maker = BatchMaker(
        shuffle=list.reverse,  # any permutation: only who is in which release matters here
        new_batch_id=lambda: next(ids).to_bytes(16, "big"),
        seal=lambda batch: batch,
        seal_manifest=lambda manifest: manifest,
    )
    core = ShufflerCore(config)
    releases: list[Release] = []
    rejected: list[str] = []

    def apply(effect: Effect) -> None:
        core.apply(effect)
        if isinstance(effect, Released):
            batches: list[tuple[bytes, list[int]]] = []
            manifest: tuple[object, ...] = ()
            for message in effect.messages:
                if is_manifest(message):
                    manifest = tuple(decode_manifest(message))
                    continue
                _, round_, batch_id, seeds, _ = decode_batch(message)
                assert round_ == effect.round
                batches.append((batch_id, seeds))
            releases.append((effect.round, batches, manifest))

    for now, kind, token, round_, seed in script:
        if kind == "tick":
            for effect in core.tick(now, maker):
                apply(effect)
            continue
        admitted = core.accept(now, token, (config.fingerprint, round_, seed, 0))
        if not isinstance(admitted, Admitted):
            rejected.append(admitted)
            continue
        for piece in core.pieces(admitted):
            apply(piece)
            early = core.release_early(piece.round, maker)
            if early is not None:
                apply(early)
    return releases, rejected


_X, _A, _B, _C = 1, 2, 3, 4  # device tokens
_CARRY_SCRIPTS: dict[str, tuple[dict[str, float | int], list[tuple[float, str, int, int, int]]]] = {
    # round 0 holds X alone and is carried into round 1; round 1's pool (X's round-0 report,
    # A, B) reaches release_size and leaves early; X's round-1 report and C leave at its end
    "early release after a carry": (
        {"release_size": 3},
        [
            (5.0, "report", _X, 0, 100),
            (12.0, "tick", 0, 0, 0),
            (13.0, "report", _A, 1, 200),
            (13.5, "report", _B, 1, 300),
            (15.0, "report", _X, 1, 101),
            (16.0, "report", _C, 1, 400),
            (21.0, "tick", 0, 0, 0),
        ],
    ),
}


@pytest.mark.parametrize("scenario", sorted(_CARRY_SCRIPTS))
def test_a_carried_report_and_a_fresh_one_in_two_releases_of_one_round(scenario: str) -> None:
    """The ``carry`` policy (the default) moves a small pool into the next round's pool, and
    the batch bears that round's number. A round whose pool leaves in more than one release
    (``release_size``) can then hold a device's carried report in one release and its fresh
    report in another: two releases labelled with one round, while no release bears the
    round the carried report was sent in. The manifests list the rounds the reports were
    sent in, and the ledger charges each of them: its epsilon_total must cover the device's
    exact epsilon over both releases (3-ary randomised response, which attains the blanket
    bound of s = 1, t = 3; every dataset of the others, every neighbouring pair of the
    device's inputs)."""
    spec = MechanismSpec(mechanism="collision", d=3, s=1, t=3, epsilon=math.log(2))
    overrides, script = _CARRY_SCRIPTS[scenario]
    config = CoreConfig(
        fingerprint=spec.fingerprint_int,
        t=spec.t,
        round_seconds=10,
        min_batch=2,
        max_batch=4,
        max_skew=0.0,
        round_policy="carry",
        **overrides,  # type: ignore[arg-type]
    )
    releases, rejected = _run_shuffler(config, script)
    assert rejected == []
    ledger = PrivacyLedger(spec, delta=0.01)
    with_x = []  # (size, seeds of X) of each release holding a report of X
    for round_, batches, manifest in releases:
        _fp, _round, release_id, entries, sources = manifest
        assert isinstance(release_id, bytes)
        assert entries == [(batch_id, len(seeds)) for batch_id, seeds in batches]
        outcome = ledger.record_manifest(
            round=round_,
            shard="",
            release_id=release_id,
            batches=[(batch_id, len(seeds)) for batch_id, seeds in batches],
            sources=[(r, length) for r, length, _count in sources],  # type: ignore[attr-defined]
        )
        assert outcome == "recorded"
        seeds = [seed for _, batch_seeds in batches for seed in batch_seeds]
        if {100, 101} & set(seeds):
            with_x.append((len(seeds), sorted({100, 101} & set(seeds))))
    # what the shuffler did: X is in two releases, and both bear round 1
    assert [round_ for round_, _, _ in releases] == [1, 1]
    assert [seeds for _, seeds in with_x] == [[100], [101]]
    # the manifests say the first release holds a report of round 0 and two of round 1
    assert [manifest[4] for _, _, manifest in releases] == [[(0, 10, 1), (1, 10, 2)], [(1, 10, 2)]]
    assert ledger.rounds() == {2: 1, 3: 1}  # rounds 0 (at 3 reports) and 1 (at 2)
    others = [size - 1 for size, _ in with_x]  # the other devices beside X in each release
    k, p = 3, Fraction(spec.exp_epsilon)
    for delta in (0.05, 0.01):
        ledger_total = epsilon_total_rounds(spec, ledger.rounds(), delta=delta)
        worst = 0.0
        for first in itertools.combinations_with_replacement(range(k), others[0]):
            for second in itertools.combinations_with_replacement(range(k), others[1]):
                for x, x_prime in itertools.permutations(range(k), 2):
                    one = release_law([krr(k, p, x), *(krr(k, p, o) for o in first)], 1)
                    one_p = release_law([krr(k, p, x_prime), *(krr(k, p, o) for o in first)], 1)
                    two = release_law([krr(k, p, x), *(krr(k, p, o) for o in second)], 1)
                    two_p = release_law([krr(k, p, x_prime), *(krr(k, p, o) for o in second)], 1)
                    view, view_p = product(one, two), product(one_p, two_p)
                    worst = max(worst, exact_epsilon(view, view_p, delta))
        assert worst <= ledger_total, (scenario, delta, ledger.rounds(), worst, ledger_total)


def test_a_late_report_of_a_released_round_is_refused() -> None:
    """The other way a round could leave in two releases: a report of a round whose pool
    has left. A released round is closed (broker/core/release.py), so it is ``round_too_old``."""
    spec = MechanismSpec(mechanism="collision", d=3, s=1, t=3, epsilon=math.log(2))
    config = CoreConfig(
        fingerprint=spec.fingerprint_int,
        t=spec.t,
        round_seconds=10,
        min_batch=2,
        max_batch=4,
        max_skew=0.0,
        late_seconds=5.0,
    )
    releases, rejected = _run_shuffler(
        config,
        [
            (13.0, "report", _A, 1, 200),
            (14.0, "report", _X, 1, 100),
            (21.0, "tick", 0, 0, 0),
            (22.0, "report", _B, 1, 101),  # within late_seconds, but round 1 has left
            (24.0, "tick", 0, 0, 0),
        ],
    )
    assert [round_ for round_, _, _ in releases] == [1]
    assert rejected == ["round_too_old"]
