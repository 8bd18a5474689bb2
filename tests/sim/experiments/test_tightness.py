"""The tightness audit: the reduction to counts, the exact sums, the simulation, the accountant.

The reduction is checked against exhaustive enumeration of the real Collision randomiser
(edge.Collision, exact output laws under real seeds): the theorem's hash family is realised
by keeping only seeds under which the three inputs' hash images are pairwise disjoint.
"""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import typer
from scipy import stats
from typer.testing import CliRunner

from aggregator.accountant import generic_clone_probability, hockey_stick
from edge import Collision, device
from sim.experiments.privacy_cli import tightness
from sim.experiments.tightness import (
    WorstCase,
    _estimate,
    class_laws,
    epsilon_at,
    exact_divergences,
    monte_carlo,
    sample_counts,
)
from sim.experiments.tightness_audit import Setting
from sim.experiments.tightness_report import run_tightness
from tests.aggregator.test_shuffle_brute_force import canonical_ids, divergence, shuffled_law

EPS_FRACTIONS = [0.1, 0.3, 0.5, 0.7, 0.9]


def _dense(d: int, entries: dict[int, int]) -> np.ndarray:
    x = np.zeros(d, dtype=np.int64)
    for j, b in entries.items():
        x[j] = b
    return x


def _elements(x: np.ndarray) -> list[int]:
    return [int(2 * j + (1 if x[j] > 0 else 0)) for j in np.flatnonzero(x)]


def _disjoint_seeds(m: Collision, xs: list[np.ndarray], count: int) -> list[int]:
    """The first ``count`` seeds under which the images of ``xs`` are pairwise disjoint."""
    need = sum(len(_elements(x)) for x in xs)
    seeds: list[int] = []
    seed = 0
    while len(seeds) < count:
        buckets = {device.collision_bucket(y, seed, m.t) for x in xs for y in _elements(x)}
        if len(buckets) == need:
            seeds.append(seed)
        seed += 1
    return seeds


def _class_of(m: Collision, xs: list[np.ndarray], seeds: list[int]) -> np.ndarray:
    """Class (0: H(Y_x1), 1: H(Y_x1'), 2: H(Y_x*), 3: elsewhere) of each (seed, z) outcome."""
    out = np.full(len(seeds) * m.t, 3, dtype=np.int64)
    for i, seed in enumerate(seeds):
        for c, x in enumerate(xs):
            for y in _elements(x):
                out[i * m.t + device.collision_bucket(y, seed, m.t)] = c
    return out


Case = tuple[int, int, float, int, int, dict[int, int], dict[int, int], dict[int, int]]
CASES: list[Case] = [
    # d, s, eps0, t, n, x1, x1', x*
    (2, 1, 1.0, 4, 3, {0: 1}, {0: -1}, {1: 1}),
    (4, 2, 2.0, 7, 2, {0: 1, 1: 1}, {0: -1, 1: -1}, {2: 1, 3: 1}),
]


@pytest.mark.parametrize("case", CASES)
def test_counts_are_sufficient_and_exact_sums_match_enumeration(case: Case) -> None:
    d, s, eps0, t, n, e1, e1p, estar = case
    m = Collision(d=d, s=s, epsilon=eps0, t=t)
    xs = [_dense(d, e1), _dense(d, e1p), _dense(d, estar)]
    seeds = _disjoint_seeds(m, xs, 6)
    laws = [np.concatenate([m.probabilities(x, sd) for sd in seeds]) / len(seeds) for x in xs]
    classes = _class_of(m, xs, seeds)
    wc = WorstCase.from_spec(m.spec, n=n)
    # one report: its class law is the module's table
    for law, expected in zip(laws, class_laws(wc), strict=True):
        got = np.bincount(classes, weights=law, minlength=4)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)
    ids = canonical_ids(len(classes), n)
    p = shuffled_law([laws[0], *[laws[2]] * (n - 1)], ids)
    q = shuffled_law([laws[1], *[laws[2]] * (n - 1)], ids)
    # the pair of counts (N1, N2) of every shuffled outcome, and the class counts
    grid = np.indices((len(classes),) * n).reshape(n, -1)
    cls = classes[grid]
    n1, n2, n3 = ((cls == c).sum(axis=0) for c in range(3))
    pair_id = np.zeros(ids.size, dtype=np.int64)
    pair_id[ids] = n1 * (n + 1) + n2
    full_id = np.zeros(ids.size, dtype=np.int64)
    full_id[ids] = (n1 * (n + 1) + n2) * (n + 1) + n3
    p_pair, q_pair = (np.bincount(pair_id, weights=v, minlength=(n + 1) ** 2) for v in (p, q))
    p_full, q_full = (np.bincount(full_id, weights=v, minlength=(n + 1) ** 3) for v in (p, q))
    a = wc.clone_probability
    for eps in (f * wc.epsilon0 for f in EPS_FRACTIONS):
        pair, view = exact_divergences(wc, eps)
        true_view = divergence(p, q, eps)
        assert view == pytest.approx(true_view, rel=1e-9, abs=1e-14)
        # sufficiency: the class counts lose nothing of the shuffled view
        assert divergence(p_full, q_full, eps) == pytest.approx(true_view, rel=1e-9, abs=1e-14)
        # the pair of counts is the stronger-clone pair with clone probability s/Omega
        assert divergence(p_pair, q_pair, eps) == pytest.approx(pair, rel=1e-9, abs=1e-14)
        mech = hockey_stick(eps, n=n, epsilon0=wc.epsilon0, clone_probability=a)
        assert mech == pytest.approx(pair, rel=1e-8, abs=1e-15)
        assert true_view >= pair - 1e-14  # data processing


@pytest.mark.parametrize(
    ("n", "s", "eps0"),
    [(2, 1, 2.0), (5, 4, 2.0), (20, 4, 3.0), (100, 1, 2.0), (1000, 4, 1.0), (3000, 16, 3.0)],
)
def test_certified_delta_bounds_the_exact_divergence(n: int, s: int, eps0: float) -> None:
    """A real check of the accountant: the shuffled view of the construction never exceeds
    the certified (generic) delta; the exact pair agrees with the accountant's pair."""
    st = Setting(n=n, s=s, epsilon0=eps0)
    wc = st.worst_case
    generic = generic_clone_probability(wc.epsilon0)
    for eps in np.linspace(0.02, 0.98, 13) * wc.epsilon0:
        pair, view = exact_divergences(wc, float(eps))
        certified = hockey_stick(float(eps), n=n, epsilon0=wc.epsilon0, clone_probability=generic)
        assert certified >= view
        assert view >= pair * (1 - 1e-12)
        mech = hockey_stick(
            float(eps), n=n, epsilon0=wc.epsilon0, clone_probability=wc.clone_probability
        )
        # the accountant adds <= 2e-24 of tail mass and ~1e-9 relative slack
        assert pair <= mech * (1 + 1e-12) + 1e-23
        assert mech <= pair * (1 + 1e-7) + 1e-22


def test_the_construction_exceeds_the_paper_bound() -> None:
    """Pinned finding: with N3 kept, the lower-bound construction's shuffled view is more
    distinguishable than the paper's Theorem "Amplification Upper Bounds" allows."""
    wc = Setting(n=5, s=4, epsilon0=2.0).worst_case
    pair, view = exact_divergences(wc, 1.2)
    assert view > 1.3 * pair
    assert pair == pytest.approx(
        hockey_stick(1.2, n=5, epsilon0=wc.epsilon0, clone_probability=wc.clone_probability),
        rel=1e-8,
    )


def test_simulation_converges_to_the_exact_divergence() -> None:
    """Seeded: each estimate is unbiased with the stated standard error; k = 5 standard
    errors (two-sided normal tail 6e-7 per point, 12 points)."""
    wc = Setting(n=20, s=4, epsilon0=3.0).worst_case
    grid = [f * wc.epsilon0 for f in (0.1, 0.25, 0.4, 0.5, 0.6, 0.75)]
    pair_mc, view_mc = monte_carlo(wc, grid, runs=200_000, rng=np.random.default_rng(7))
    for eps, pmc, vmc in zip(grid, pair_mc, view_mc, strict=True):
        pair, view = exact_divergences(wc, eps)
        assert abs(vmc.estimate - view) <= 5 * vmc.stderr
        assert abs(pmc.estimate - pair) <= 5 * pmc.stderr
        assert vmc.lower <= vmc.estimate <= vmc.upper
        assert vmc.stderr > 0


def test_simulated_counts_have_the_multinomial_law() -> None:
    """The sampled class counts match their exact marginal means within 5 standard errors."""
    wc = WorstCase.for_collision(n=50, s=2, t=9, epsilon0=1.0)
    first, second, other = class_laws(wc)
    runs = 100_000
    for changed, law in ((0, first), (1, second)):
        counts = sample_counts(wc, changed=changed, runs=runs, rng=np.random.default_rng(3))
        assert (counts.sum(axis=1) == wc.n).all()
        mean = law + (wc.n - 1) * other
        var = law * (1 - law) + (wc.n - 1) * other * (1 - other)
        z = (counts.mean(axis=0) - mean) / np.sqrt(var / runs)
        assert np.all(np.abs(z) <= 5)


def test_epsilon_at_inverts_a_monotone_divergence() -> None:
    wc = Setting(n=1000, s=4, epsilon0=1.0).worst_case
    eps = epsilon_at(lambda e: exact_divergences(wc, e)[0], epsilon0=wc.epsilon0, delta=1e-5)
    assert exact_divergences(wc, eps)[0] <= 1e-5 < exact_divergences(wc, eps - 1e-6)[0]


def test_confidence_bounds_are_clopper_pearson() -> None:
    """lower = P_lo - e^eps Q_hi, upper = P_hi - e^eps Q_lo, each an exact (Clopper-Pearson)
    interval at confidence 1 - (1 - level)/2, computed here by scipy's binomtest."""
    level, runs, hits_p, hits_q, eps = 0.99, 10_000, 3_000, 1_000, 1.0
    got = _estimate(hits_p, hits_q, runs, eps, level)
    ci_p = stats.binomtest(hits_p, runs).proportion_ci(1 - (1 - level) / 2, method="exact")
    ci_q = stats.binomtest(hits_q, runs).proportion_ci(1 - (1 - level) / 2, method="exact")
    e = math.exp(eps)
    assert got.lower == pytest.approx(ci_p.low - e * ci_q.high, rel=1e-9)
    assert got.upper == pytest.approx(ci_p.high - e * ci_q.low, rel=1e-9)
    assert got.estimate == pytest.approx(0.3 - e * 0.1)
    assert got.stderr == pytest.approx(math.sqrt((0.21 + e * e * 0.09) / runs))


def test_run_writes_csv_pngs_and_summary(tmp_path: Path) -> None:
    settings = (Setting(n=5, s=4, epsilon0=2.0), Setting(n=200, s=4, epsilon0=1.0))
    paths = run_tightness(
        tmp_path, full=False, seed=1, progress=False, settings=settings, points=3, runs=2000
    )
    names = [p.name for p in paths]
    assert names == [
        "tightness.csv",
        "tightness.png",
        "tightness_excess.png",
        "tightness_summary.md",
    ]
    with paths[0].open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 6
    for key in (
        "setting",
        "epsilon",
        "delta_certified_generic",
        "delta_certified_blanket",
        "delta_mechanism_uncertified",
        "divergence_view_exact",
        "mc_view_lower",
        "certified_holds",
        "blanket_holds",
    ):
        assert key in rows[0]
    assert all(r["certified_holds"] == "True" for r in rows)
    assert all(r["blanket_holds"] == "True" for r in rows)
    for r in rows:  # the blanket bound is the tighter certified one, above the paper's delta
        assert float(r["delta_certified_blanket"]) <= float(r["delta_certified_generic"])
        assert float(r["delta_certified_blanket"]) >= float(r["delta_mechanism_uncertified"])
    assert all(math.isfinite(float(r["mc_view_estimate"])) for r in rows)
    for png in paths[1:3]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = paths[3].read_text()
    assert "n=5 s=4 t=36 eps0=2" in summary
    assert "n=200 s=4 t=17 eps0=1" in summary
    again = run_tightness(
        tmp_path / "again",
        full=False,
        seed=1,
        progress=False,
        settings=settings,
        points=3,
        runs=2000,
    )
    assert again[0].read_text() == paths[0].read_text()  # seeded


def test_the_command_checks_the_doc_markers_before_working(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(tightness)
    doc = tmp_path / "results.md"
    doc.write_text("no markers here\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["--out", str(out), "--quiet", "--update-doc", str(doc)])
    assert result.exit_code == 1
    assert "markers" in result.output
    assert not out.exists()


def test_worst_case_validation() -> None:
    with pytest.raises(ValueError, match="t >= 3s"):
        WorstCase.for_collision(n=10, s=4, t=11, epsilon0=1.0)
    with pytest.raises(ValueError, match="n must be"):
        WorstCase.for_collision(n=1, s=1, t=3, epsilon0=1.0)
    m = Collision(d=4, s=1, epsilon=1.0, t=4)
    wc = WorstCase.from_spec(m.spec, n=3)
    assert wc.exp_epsilon0 == m.spec.exp_epsilon
    assert wc.clone_probability == pytest.approx(m.spec.clone_probability)
    assert list(itertools.accumulate(class_laws(wc)[0]))[-1] == pytest.approx(1.0)
