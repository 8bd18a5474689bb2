"""Exact local-DP audit of the baselines.

The discrete baselines expose their exact output law for one user as fractions (their
``e^eps`` is the rational ``floor(e^eps 2^24) / 2^24`` the sampler also uses). For small
``d, s`` every ``s``-sparse ternary input and every output is enumerated: the law sums to 1,
the worst ratio over *any* two inputs equals the mechanism's claimed exact level
(``ldp_ratio``, so the audit would catch a weaker mechanism and the claim is attained), and
that level is at most ``e^eps`` in 60-digit decimal arithmetic. SUCCINCT is audited for
every value of its public signs: its randomised-response branch (``eps <= 2``) exactly like
the discrete baselines, its Laplace branch through its exact sensitivity.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import cached_property
from typing import Any

import pytest

from sim.experiments.baselines import PCKVAGRR, PCKVGRR, PCKVUE, PrivKV, Succinct
from sim.experiments.baselines._common import all_inputs

EPSILONS = [0.1, 0.5, 1.0, 2.0, 5.0]
KINDS: list[type[Any]] = [PrivKV, PCKVUE, PCKVGRR, PCKVAGRR]


def at_most_e_to_the(ratio: Fraction, epsilon: float) -> bool:
    with localcontext() as ctx:
        ctx.prec = 60
        return Decimal(ratio.numerator) / Decimal(ratio.denominator) <= Decimal(epsilon).exp()


def laws(m: Any, d: int, s: int) -> list[Mapping[Any, Fraction]]:
    return [m.exact_distribution(k, v) for k, v in all_inputs(d, s)]


def worst_ratio(all_laws: Sequence[Mapping[Any, Fraction]]) -> Fraction:
    """``max over outputs z and inputs x, x' of P[z | x] / P[z | x']``."""
    outputs = all_laws[0].keys()
    for law in all_laws:
        assert law.keys() == outputs
        assert sum(law.values()) == 1
        assert all(p > 0 for p in law.values())
    return max(max(law[z] for law in all_laws) / min(law[z] for law in all_laws) for z in outputs)


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_exhaustive_worst_ratio_is_the_claimed_level(kind: type[Any], epsilon: float) -> None:
    d, s = 4, 2  # d >= 2s: inputs with disjoint supports exist
    m = kind(d=d, s=s, epsilon=epsilon)
    worst = worst_ratio(laws(m, d, s))
    assert worst == m.ldp_ratio
    assert at_most_e_to_the(worst, epsilon)


@pytest.mark.parametrize("kind", [PrivKV, PCKVGRR, PCKVAGRR], ids=lambda k: k.__name__)
@pytest.mark.parametrize(("d", "s"), [(2, 1), (3, 3), (5, 2), (6, 3)])
def test_other_shapes(kind: type[Any], d: int, s: int) -> None:
    m = kind(d=d, s=s, epsilon=1.0)
    worst = worst_ratio(laws(m, d, s))
    assert worst <= m.ldp_ratio
    assert at_most_e_to_the(worst, 1.0)


def test_pckv_with_longer_padding_stays_private() -> None:
    """ell > s: dummies are sampled; the level only improves."""
    for kind in (PCKVGRR, PCKVAGRR):
        m = kind(d=3, s=1, epsilon=1.0, ell=2)
        worst = worst_ratio(laws(m, 3, 1))
        assert worst == m.ldp_ratio
        assert at_most_e_to_the(worst, 1.0)
    ue = PCKVUE(d=3, s=1, epsilon=1.0, ell=2)
    assert at_most_e_to_the(worst_ratio(laws(ue, 3, 1)), 1.0)


def test_attained_levels_in_closed_form() -> None:
    """PCKV-UE and PCKV-AGRR spend exactly e^eps; PrivKV's sequential split and the
    un-amplified PCKV-GRR spend strictly less (their documented exact levels)."""
    eps = 1.0
    e = PCKVUE(d=4, s=2, epsilon=eps).exp_eps
    assert PCKVUE(d=4, s=2, epsilon=eps).ldp_ratio == e
    assert PCKVAGRR(d=4, s=2, epsilon=eps).ldp_ratio == e
    assert PCKVGRR(d=4, s=2, epsilon=eps).ldp_ratio == 1 + (e - 1) / 2
    pk = PrivKV(d=4, s=2, epsilon=eps)
    assert pk.ldp_ratio == pk.exp_eps1 * 2 * pk.exp_eps2 / (1 + pk.exp_eps2)
    assert pk.ldp_ratio < e


def test_agrr_is_eps_ldp_only_through_its_sampling() -> None:
    """The GRR step of PCKV-AGRR alone runs at eps' = ln(s (e^eps - 1) + 1) > eps; the whole
    randomiser (padding-and-sampling included) is eps-LDP at the nominal eps, exactly."""
    d, s, eps = 5, 2, 1.0
    m = PCKVAGRR(d=d, s=s, epsilon=eps)
    assert m.grr_weight == s * (m.exp_eps - 1) + 1
    assert not at_most_e_to_the(m.grr_weight, eps)  # the GRR kernel's own ratio
    assert worst_ratio(laws(m, d, s)) == m.exp_eps  # the mechanism's: e^eps, attained


def composed_grr_law(m: Any, keys_row: list[int], signs_row: list[int]) -> dict[Any, Fraction]:
    """PCKV-GRR/AGRR's law built step by step, independently of ``exact_distribution``'s
    closed form: every equally likely padded set (each choice of ``ell - s`` distinct dummy
    keys and of their uniform signs), one of its ``ell`` pairs uniformly, then the GRR kernel
    over the ``2 d'`` pairs (``grr_weight`` on the input pair, 1 elsewhere)."""
    s, ell, d = len(keys_row), m.padding, m.d
    pairs = [(k, v) for k in range(m.domain) for v in (1, -1)]
    padded = [
        list(zip(keys_row, signs_row, strict=True)) + list(zip(dummies, dsigns, strict=True))
        for dummies in itertools.combinations(range(d, d + ell), ell - s)
        for dsigns in itertools.product((-1, 1), repeat=ell - s)
    ]
    omega = m.grr_weight + len(pairs) - 1
    law = dict.fromkeys(pairs, Fraction(0))
    for pair_set in padded:
        for sampled in pair_set:
            for z in pairs:
                weight = m.grr_weight if z == sampled else 1
                law[z] += Fraction(1, len(padded) * ell) * weight / omega
    return law


@pytest.mark.parametrize("kind", [PCKVGRR, PCKVAGRR], ids=lambda k: k.__name__)
@pytest.mark.parametrize(("d", "s", "ell"), [(3, 2, 2), (3, 1, 2), (4, 2, 3)])
def test_grr_closed_form_is_sampling_composed_with_the_kernel(
    kind: type[Any], d: int, s: int, ell: int
) -> None:
    """The audited law (a closed form) is the composition the sampler performs, so the
    exact level above is that of padding-and-sampling followed by GRR."""
    m = kind(d=d, s=s, epsilon=1.0, ell=ell)
    for k, v in all_inputs(d, s):
        assert m.exact_distribution(k, v) == composed_grr_law(m, k, v)


class _OverAmplifiedGRR(PCKVGRR):
    """A deliberately broken variant: credits the sampling with s + 1 instead of s."""

    @cached_property
    def grr_weight(self) -> Fraction:
        return (self.padding + 1) * (self.exp_eps - 1) + 1


def test_audit_catches_a_mechanism_weaker_than_claimed() -> None:
    m = _OverAmplifiedGRR(d=4, s=2, epsilon=1.0)
    assert not at_most_e_to_the(worst_ratio(laws(m, 4, 2)), 1.0)


def sign_vectors(d: int) -> list[list[int]]:
    return [list(r) for r in itertools.product((-1, 1), repeat=d)]


SUCCINCT_SHAPES = [(4, 2, 1000), (5, 3, 100_000), (4, 1, 10_000)]


@pytest.mark.parametrize(("d", "s", "n"), SUCCINCT_SHAPES)
@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0])
def test_succinct_randomised_response_exhaustively(d: int, s: int, n: int, epsilon: float) -> None:
    """For every public ``r`` (the server knows it, so privacy must hold for each) the worst
    ratio over every pair of inputs and both outputs is the claimed ``rr_ldp_ratio``, which is
    at most ``e^eps``; it is ``E`` itself (attained) when the clipping range is the RR range,
    and strictly less for ``s = 1`` at ``n = 1e4``, where their RR range ``1.21`` exceeds
    every clipped value."""
    m = Succinct(d=d, s=s, epsilon=epsilon, n=n)
    if not m.uses_randomised_response(n):  # s = 1, n = 1e4: the switch is at eps = 1.65
        assert (s, epsilon) == (1, 2.0)
        return
    inputs = all_inputs(d, s)
    worst = max(
        worst_ratio([m.exact_report_law(k, v, r, n) for k, v in inputs]) for r in sign_vectors(d)
    )
    assert worst == m.rr_ldp_ratio(n)
    assert at_most_e_to_the(worst, epsilon)
    assert (worst == m.exp_eps) == (m.eta(n) == m.rr_range(n))
    assert (worst == m.exp_eps) == (s > 1)


class _WideRatioSuccinct(Succinct):
    """A deliberately broken variant: randomised response at e^(2 eps)."""

    @cached_property
    def exp_eps(self) -> Fraction:
        return Fraction(Decimal(2 * self.epsilon).exp())


def test_audit_catches_a_succinct_weaker_than_claimed() -> None:
    m = _WideRatioSuccinct(d=4, s=2, epsilon=1.0, n=1000)
    law = [m.exact_report_law(k, v, [1, -1, 1, 1], 1000) for k, v in all_inputs(4, 2)]
    assert not at_most_e_to_the(worst_ratio(law), 1.0)


@pytest.mark.parametrize(("d", "s", "n"), SUCCINCT_SHAPES)
@pytest.mark.parametrize("epsilon", [2.5, 5.0, 10.0])
def test_succinct_sensitivity_for_every_public_sign_vector(
    d: int, s: int, n: int, epsilon: float
) -> None:
    """Laplace branch (``eps > 2``). For every public ``r`` any two inputs' clipped values
    differ by at most ``2 eta``, the bound is reached, and ``2 eta / scale <= eps`` exactly:
    the Laplace density ratio is at most ``e^eps``."""
    m = Succinct(d=d, s=s, epsilon=epsilon, n=n)
    assert not m.uses_randomised_response(n)
    eta = Fraction(m.eta(n))
    inputs = all_inputs(d, s)
    widest = Fraction(0)
    for r in sign_vectors(d):
        values = [m.pre_noise_value(k, v, r, n) for k, v in inputs]
        assert all(-eta <= x <= eta for x in values)
        widest = max(widest, max(values) - min(values))
    assert widest == 2 * eta
    assert 2 * eta / Fraction(m.noise_scale(n)) <= Fraction(epsilon)


def test_succinct_clips_below_s_when_n_is_moderate() -> None:
    m = Succinct(d=512, s=16, epsilon=1.0)
    assert m.eta(100_000) < 16  # sqrt(16 ln 1e5) / 2.5 = 5.4: clipping is active
    assert Succinct(d=8, s=1, epsilon=1.0).eta(100_000) == 1.0
