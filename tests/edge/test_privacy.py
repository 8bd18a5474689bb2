"""Exact local-DP audit of CoCo and Collision.

Every probability is an exact fraction, so the eps-LDP inequality is checked with no
tolerance: for each seed (the hash functions, drawn independently of the input) and each pair
of inputs, ``max_z P[z | x] / P[z | x'] <= E / U``, and ``E / U <= e^eps`` is checked in
60-digit decimal arithmetic.
"""

from __future__ import annotations

import itertools
import random
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from edge import CoCo, Collision, LocalMechanism, device
from edge.spec import exp_eps_weight

GRID = [
    # (mechanism, d, s, epsilon, t); t=None is the MSE-optimal default
    (CoCo, 6, 2, 0.6931471805599453, 6),
    (CoCo, 10, 3, 1.0, 8),
    (CoCo, 12, 4, 0.1, None),
    (CoCo, 8, 3, 5.0, None),
    (CoCo, 40, 6, 2.0, 14),
    (Collision, 6, 2, 0.6931471805599453, 3),
    (Collision, 10, 3, 1.0, 4),
    (Collision, 12, 4, 0.1, None),
    (Collision, 8, 3, 5.0, None),
    (Collision, 40, 6, 2.0, 7),
]


def dense(keys: list[int], signs: list[int], d: int) -> np.ndarray:
    x = np.zeros(d, dtype=np.int64)
    x[keys] = signs
    return x


def random_input(rnd: random.Random, d: int, s: int) -> np.ndarray:
    keys = rnd.sample(range(d), s)
    return dense(keys, [rnd.choice((-1, 1)) for _ in keys], d)


def max_ratio(p: list[Fraction], q: list[Fraction]) -> Fraction:
    return max(a / b for a, b in zip(p, q, strict=True))


def check_distribution(p: list[Fraction], m: LocalMechanism) -> None:
    assert len(p) == m.t
    assert sum(p) == 1
    assert all(v > 0 for v in p)


def colliding_input(m: LocalMechanism, seed: int, d: int, s: int) -> np.ndarray | None:
    """An input whose elements share one bucket (Collision) or one pair (CoCo) as much as
    possible: all s of them where the seed allows, at least two, the rest elsewhere."""
    if isinstance(m, CoCo):
        groups: dict[int, list[int]] = {}
        for j in range(d):
            pair, _ = device.coco_hash(j, seed, m.t // 2)
            groups.setdefault(pair, []).append(j)
        return _largest_group(list(groups.values()), d, s)
    buckets: dict[int, list[int]] = {}
    for j in range(d):
        buckets.setdefault(device.collision_bucket(2 * j + 1, seed, m.t), []).append(j)
    return _largest_group(list(buckets.values()), d, s)


def _largest_group(groups: list[list[int]], d: int, s: int) -> np.ndarray | None:
    best = max(groups, key=len)
    if len(best) < 2:
        return None
    keys = best[:s]
    keys += [j for j in range(d) if j not in keys][: s - len(keys)]
    return dense(keys, [1] * s, d)


def test_weight_never_exceeds_e_to_the_epsilon() -> None:
    with localcontext() as ctx:
        ctx.prec = 60
        for eps in [1e-6, 1e-3, 0.1, 0.5, 0.6931471805599453, 1.0, 2.0, 5.0, 10.0, 20.0]:
            e_w = exp_eps_weight(eps)
            exact = Decimal(eps).exp() * device.WEIGHT_UNIT
            assert e_w <= exact < e_w + 1, eps


@pytest.mark.parametrize(("kind", "d", "s", "eps", "t"), GRID)
def test_random_pairs_satisfy_ldp_exactly(
    kind: type[LocalMechanism], d: int, s: int, eps: float, t: int | None
) -> None:
    m = kind(d=d, s=s, epsilon=eps, t=t)
    bound = Fraction(m.spec.exp_eps_weight, m.spec.unit_weight)
    rnd = random.Random(f"{kind.__name__}-{d}-{s}-{eps}-{t}")
    for _ in range(60):
        seed = rnd.getrandbits(32)
        p = m.exact_probabilities(random_input(rnd, d, s), seed)
        q = m.exact_probabilities(random_input(rnd, d, s), seed)
        check_distribution(p, m)
        check_distribution(q, m)
        assert max_ratio(p, q) <= bound
        assert max_ratio(q, p) <= bound


@pytest.mark.parametrize(("kind", "d", "s", "eps", "t"), GRID)
def test_adversarial_collisions_satisfy_ldp(
    kind: type[LocalMechanism], d: int, s: int, eps: float, t: int | None
) -> None:
    """Fully colliding inputs (the redistribution weight is largest) against inputs with the
    same seed: the worst case of the normaliser argument."""
    m = kind(d=d, s=s, epsilon=eps, t=t)
    bound = Fraction(m.spec.exp_eps_weight, m.spec.unit_weight)
    rnd = random.Random(7)
    found = 0
    worst = Fraction(0)
    for seed in range(400):
        x = colliding_input(m, seed, d, s)
        if x is None:
            continue
        found += 1
        p = m.exact_probabilities(x, seed)
        check_distribution(p, m)
        others = [random_input(rnd, d, s) for _ in range(3)]
        others.append(-x)  # same support, all signs flipped
        for y in others:
            q = m.exact_probabilities(y, seed)
            worst = max(worst, max_ratio(p, q), max_ratio(q, p))
    assert found >= 5, "the search should find fully colliding inputs"
    assert worst <= bound


@pytest.mark.parametrize(("kind", "d", "s", "eps", "t"), GRID)
def test_bound_is_attained(
    kind: type[LocalMechanism], d: int, s: int, eps: float, t: int | None
) -> None:
    """Some pair of inputs moves a bucket from weight E to weight U: the mechanism spends
    exactly its budget E/U, no less (a collision-free input against one that misses its
    buckets, e.g. its sign flip)."""
    m = kind(d=d, s=s, epsilon=eps, t=t)
    bound = Fraction(m.spec.exp_eps_weight, m.spec.unit_weight)
    rnd = random.Random(11)
    for seed in range(200):
        x = random_input(rnd, d, s)
        p = m.exact_probabilities(x, seed)
        for y in (-x, random_input(rnd, d, s)):
            if max_ratio(p, m.exact_probabilities(y, seed)) == bound:
                return
    pytest.fail("no pair of inputs reaches the bound E/U")


@pytest.mark.parametrize("kind", [CoCo, Collision])
def test_exhaustive_small_domain(kind: type[LocalMechanism]) -> None:
    """Every pair of inputs of a tiny domain (d=4, s=2: 24 inputs) under 40 seeds."""
    d, s = 4, 2
    m = kind(d=d, s=s, epsilon=1.0, t=6 if kind is CoCo else 3)
    bound = Fraction(m.spec.exp_eps_weight, m.spec.unit_weight)
    inputs = [
        dense(list(keys), list(signs), d)
        for keys in itertools.combinations(range(d), s)
        for signs in itertools.product((-1, 1), repeat=s)
    ]
    for seed in range(40):
        laws = [m.exact_probabilities(x, seed) for x in inputs]
        for p in laws:
            check_distribution(p, m)
        for p, q in itertools.permutations(laws, 2):
            assert max_ratio(p, q) <= bound


def test_collision_weights_follow_definition() -> None:
    """Definition 1 of the paper, in integer weights: E on hit buckets, the rest even."""
    m = Collision(d=6, s=2, epsilon=0.6931471805599453, t=4)
    for seed in range(50):
        x = dense([2, 4], [1, -1], 6)
        p = m.exact_probabilities(x, seed)
        hit = {device.collision_bucket(5, seed, 4), device.collision_bucket(8, seed, 4)}
        omega = m.spec.omega_weight
        for z in range(4):
            if z in hit:
                assert p[z] == Fraction(m.spec.exp_eps_weight, omega)
            else:
                rest = omega - len(hit) * m.spec.exp_eps_weight
                assert p[z] == Fraction(rest, (4 - len(hit)) * omega)


def test_coco_pairs_always_carry_e_plus_one() -> None:
    """ERRATA item 2: the pair of a non-zero dimension carries (E + U) / Omega."""
    m = CoCo(d=10, s=3, epsilon=0.6931471805599453, t=8)
    rnd = random.Random(3)
    for seed in range(100):
        x = random_input(rnd, 10, 3)
        p = m.exact_probabilities(x, seed)
        for j in np.flatnonzero(x):
            pair, _ = device.coco_hash(int(j), seed, 4)
            assert p[pair] + p[pair + 4] == Fraction(
                m.spec.exp_eps_weight + m.spec.unit_weight, m.spec.omega_weight
            )
