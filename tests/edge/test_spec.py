"""MechanismSpec: validation, derived integers, the default t, the fingerprint."""

from __future__ import annotations

import math
from typing import Any

import pytest

from edge import MechanismSpec, SpecError
from edge.theory import Mechanism, moments, optimal_t, paper_t


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mechanism": "rappor"}, "mechanism must be one of"),
        ({"d": 0}, "d must be in"),
        ({"d": 2.5}, "d must be an integer, got 2.5"),
        ({"s": 0}, "s must be in"),
        ({"s": 200}, "s must be in \\[1, d=128\\], got 200"),
        ({"epsilon": 0}, "epsilon must be in \\(0, 20\\], got 0"),
        ({"epsilon": -1.0}, "got -1.0"),
        ({"epsilon": float("nan")}, "got nan"),
        ({"epsilon": 21}, "got 21"),
        ({"epsilon": 10**400}, "epsilon must be in \\(0, 20\\]"),
        ({"epsilon": True}, "epsilon must be a number"),
        ({"epsilon": 1e-9}, "too small to represent"),
        ({"t": 17}, "coco needs an even t >= 2s \\+ 2 \\(s=8\\), got t=17"),
        ({"t": 16}, "got t=16"),
        ({"mechanism": "collision", "t": 8}, "collision needs t > s \\(s=8\\), got t=8"),
        ({"t": 70000}, "t must be at most 65535"),
        ({"hash_version": 2}, "hash_version 2 is not supported"),
        ({"s": 128, "d": 128, "epsilon": 20.0}, "overflow 2\\^53"),
    ],
)
def test_invalid_specs_name_the_value(kwargs: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"mechanism": "coco", "d": 128, "s": 8, "epsilon": 0.5}
    with pytest.raises(SpecError, match=message):
        MechanismSpec(**{**base, **kwargs})


def test_spec_is_frozen_and_keyword_only() -> None:
    spec = MechanismSpec(mechanism="coco", d=16, s=2, epsilon=1.0)
    with pytest.raises(AttributeError):
        spec.t = 10  # type: ignore[misc]
    with pytest.raises(TypeError):
        MechanismSpec("coco", 16, 2, 1.0)  # type: ignore[call-arg]


@pytest.mark.parametrize("mechanism", ["coco", "collision"])
@pytest.mark.parametrize(
    ("d", "s", "eps"), [(128, 8, 0.5), (512, 16, 1.0), (32, 1, 2.0), (64, 32, 0.1)]
)
def test_default_t_minimises_the_closed_form_mean_mse(
    mechanism: str, d: int, s: int, eps: float
) -> None:
    spec = MechanismSpec(mechanism=mechanism, d=d, s=s, epsilon=eps)  # type: ignore[arg-type]
    best = spec.moments.mean_mse(d, s)
    step = 2 if mechanism == "coco" else 1
    t_min = 2 * s + 2 if mechanism == "coco" else s + 1
    for t in range(t_min, 6 * spec.t + 50, step):
        other = moments(
            mechanism,  # type: ignore[arg-type]
            s=s,
            t=t,
            exp_eps_weight=spec.exp_eps_weight,
            unit=spec.unit_weight,
        ).mean_mse(d, s)
        assert best <= other
    assert spec.t == optimal_t(
        mechanism,  # type: ignore[arg-type]
        d=d,
        s=s,
        exp_eps_weight=spec.exp_eps_weight,
        unit=spec.unit_weight,
    )


def test_default_t_is_no_worse_than_the_papers_rule() -> None:
    mechanisms: tuple[Mechanism, ...] = ("coco", "collision")
    for mechanism in mechanisms:
        for eps in (0.1, 0.5, 1.0, 2.0, 4.0):
            spec = MechanismSpec(mechanism=mechanism, d=256, s=8, epsilon=eps)
            rule = paper_t(mechanism, s=8, exp_eps=spec.exp_epsilon)
            other = MechanismSpec(mechanism=mechanism, d=256, s=8, epsilon=eps, t=rule)
            assert spec.moments.mean_mse(256, 8) <= other.moments.mean_mse(256, 8)


def test_derived_integers() -> None:
    spec = MechanismSpec(mechanism="coco", d=128, s=8, epsilon=0.5, t=24)
    assert spec.unit_weight == 2**24
    assert spec.exp_eps_weight == math.floor(math.exp(0.5) * 2**24)
    assert spec.omega_weight == 8 * (spec.exp_eps_weight + 2**24) + (24 - 16) * 2**24
    assert spec.epsilon_effective <= spec.epsilon
    assert spec.epsilon - spec.epsilon_effective < 1e-7


def test_clone_probability_follows_errata_item_4() -> None:
    spec = MechanismSpec(mechanism="collision", d=64, s=8, epsilon=1.0, t=40)
    e = spec.exp_epsilon
    assert spec.clone_probability == pytest.approx(8 / (8 * e + 40 - 8), rel=1e-12)
    assert spec.clone_probability <= 1 / (e + 1)
    # t < 2s: the mechanism-specific value would exceed 1/(e^eps + 1); the generic one is used.
    small_t = MechanismSpec(mechanism="collision", d=64, s=8, epsilon=1.0, t=12)
    assert small_t.clone_probability == pytest.approx(1 / (e + 1), rel=1e-12)
    # Binary randomised response: s = 1, t = 2 is exactly the generic value.
    rr = MechanismSpec(mechanism="collision", d=1, s=1, epsilon=1.0, t=2)
    assert rr.clone_probability == pytest.approx(1 / (rr.exp_epsilon + 1), rel=1e-15)


def test_fingerprint_is_stable_and_sensitive() -> None:
    spec = MechanismSpec(mechanism="coco", d=128, s=8, epsilon=0.5)
    assert spec.fingerprint == MechanismSpec(mechanism="coco", d=128, s=8, epsilon=0.5).fingerprint
    assert len(spec.fingerprint) == 8
    assert int(spec.fingerprint, 16) == spec.fingerprint_int
    variants = [
        MechanismSpec(mechanism="collision", d=128, s=8, epsilon=0.5, t=spec.t),
        MechanismSpec(mechanism="coco", d=129, s=8, epsilon=0.5, t=spec.t),
        MechanismSpec(mechanism="coco", d=128, s=7, epsilon=0.5, t=spec.t),
        MechanismSpec(mechanism="coco", d=128, s=8, epsilon=0.51, t=spec.t),
        MechanismSpec(mechanism="coco", d=128, s=8, epsilon=0.5, t=spec.t + 2),
    ]
    assert len({spec.fingerprint, *(v.fingerprint for v in variants)}) == 6


def test_dict_round_trip_and_tamper_check() -> None:
    spec = MechanismSpec(mechanism="collision", d=40, s=4, epsilon=2.0)
    assert MechanismSpec.from_dict(spec.to_dict()) == spec
    tampered = {**spec.to_dict(), "exp_eps_weight": spec.exp_eps_weight + 1}
    with pytest.raises(SpecError, match="exp_eps_weight"):
        MechanismSpec.from_dict(tampered)
    with pytest.raises(SpecError, match="missing the field 'd'"):
        MechanismSpec.from_dict({"mechanism": "coco", "s": 1, "epsilon": 1.0, "t": 4})
