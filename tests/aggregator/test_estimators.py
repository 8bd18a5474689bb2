"""Streaming estimators: exactness of the kernel, unbiasedness and variance against theory.

Statistical tests are seeded; tolerances are k standard errors where the standard error comes
from the closed-form variances of :mod:`edge.theory` (or, for averages of squared errors,
from the spread of the trials). K_ONE is for a single statistic; K_MANY is Bonferroni-sized
for the few hundred per-dimension statistics of a test.
"""

from __future__ import annotations

import json
from statistics import NormalDist

import numpy as np
import pytest

from aggregator.estimation.estimators import AggregateState, estimate
from aggregator.estimation.intervals import fieller_interval
from aggregator.estimation.projection import project_to_simplex
from edge import CoCo, Collision, LocalMechanism, MechanismSpec, ReportError, device
from edge.encoders import KeyValueEncoder, SensorEncoder
from sim.models.synthetic import random_sparse, sparse_totals

K_ONE = 4.0
K_MANY = 5.0


def scalar_sums(
    spec: MechanismSpec, seeds: np.ndarray, z: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Slow reference: a = [H(j+) = z], b = [H(j-) = z] from the device's own hash functions."""
    sum_u = np.zeros(spec.d, dtype=np.int64)
    sum_v = np.zeros(spec.d, dtype=np.int64)
    half = spec.t // 2
    for seed, zi in zip(seeds.tolist(), z.tolist(), strict=True):
        for j in range(spec.d):
            if spec.mechanism == "coco":
                pair, h2 = device.coco_hash(j, seed, half)
                a = device.coco_position(pair, h2, +1, half) == zi
                b = device.coco_position(pair, h2, -1, half) == zi
            else:
                a = device.collision_bucket(2 * j + 1, seed, spec.t) == zi
                b = device.collision_bucket(2 * j, seed, spec.t) == zi
            sum_u[j] += int(a) - int(b)
            sum_v[j] += int(a) + int(b)
    return sum_u, sum_v


def reports(
    m: LocalMechanism, n: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys, signs = random_sparse(n, m.d, m.s, rng)
    seeds, z = m.randomise_sparse(keys, signs, rng)
    return keys, signs, seeds, z


@pytest.mark.parametrize("kind", [CoCo, Collision])
def test_kernel_matches_the_scalar_reference(kind: type[LocalMechanism]) -> None:
    m = kind(d=37, s=5, epsilon=1.0)
    _, _, seeds, z = reports(m, 300, seed=1)
    state = AggregateState(m.spec)
    state.add(seeds, z)
    ref_u, ref_v = scalar_sums(m.spec, seeds, z)
    assert np.array_equal(state.sum_u, ref_u)
    assert np.array_equal(state.sum_v, ref_v)
    assert state.n == 300


@pytest.mark.parametrize("kind", [CoCo, Collision])
@pytest.mark.parametrize(("d", "n"), [(260, 700), (5, 1500)])
def test_kernel_across_chunks_and_byte_lanes_matches_the_scalar_reference(
    kind: type[LocalMechanism], d: int, n: int
) -> None:
    # d = 260: chunks of 504 rows (two chunks here, the second partial), each counted in
    # byte lanes of 255 + 249 rows; rows padded from 260 to 264 columns. d = 5: one chunk
    # of 1,500 rows, counted with one sum (many short rows).
    m = kind(d=d, s=2, epsilon=1.0)
    _, _, seeds, z = reports(m, n, seed=5)
    state = AggregateState(m.spec)
    state.add(seeds, z)
    state.add(seeds[:17], z[:17])  # the same reused buffers, a short batch
    ref_u, ref_v = scalar_sums(
        m.spec, np.concatenate([seeds, seeds[:17]]), np.concatenate([z, z[:17]])
    )
    assert np.array_equal(state.sum_u, ref_u)
    assert np.array_equal(state.sum_v, ref_v)


def test_estimates_to_dict_matches_a_scalar_reference() -> None:
    m = CoCo(d=40, s=3, epsilon=1.0)
    _, _, seeds, z = reports(m, 2000, seed=6)
    state = AggregateState(m.spec)
    state.add(seeds[:40], z[:40])  # few reports: some freq <= 0, so NaN conditional means
    est = state.estimate()
    assert np.isnan(est.cond_mean).any()
    document = est.to_dict()
    for name in ("mean", "mean_se", "freq", "freq_se", "cond_mean", "cond_mean_se"):
        want = [None if not np.isfinite(x) else float(x) for x in getattr(est, name)]
        assert document[name] == want, name
        assert all(v is None or type(v) is float for v in document[name])
    assert document["freq_interval"] == ["score" if b else "normal" for b in est.freq_score]
    assert json.loads(json.dumps(document)) == document
    assert AggregateState(m.spec).estimate().to_dict()["mean"] == [None] * 40
    assert AggregateState(m.spec).estimate().to_dict()["freq_interval"] == ["normal"] * 40


@pytest.mark.parametrize("kind", [CoCo, Collision])
def test_order_chunking_and_merging_give_identical_estimates(kind: type[LocalMechanism]) -> None:
    m = kind(d=64, s=4, epsilon=0.8)
    _, _, seeds, z = reports(m, 5000, seed=2)
    one = AggregateState(m.spec)
    one.add(seeds, z)
    perm = np.random.default_rng(3).permutation(seeds.size)
    chunked = AggregateState(m.spec)
    for part in np.array_split(perm, 7):
        chunked.add(seeds[part], z[part])
    left, right = AggregateState(m.spec), AggregateState(m.spec)
    left.add(seeds[:1234], z[:1234])
    right.add(seeds[1234:], z[1234:])
    right.merge(left)
    for other in (chunked, right):
        assert other.n == one.n
        assert np.array_equal(other.sum_u, one.sum_u)
        assert np.array_equal(other.sum_v, one.sum_v)
        a, b = one.estimate(), other.estimate()
        assert np.array_equal(a.mean, b.mean)
        assert np.array_equal(a.freq_se, b.freq_se)


def test_state_memory_does_not_grow_with_n() -> None:
    m = CoCo(d=32, s=4, epsilon=1.0)
    state = AggregateState(m.spec)
    sizes = []
    for n in (10, 10_000, 100_000):
        _, _, seeds, z = reports(m, n, seed=n)
        state.add(seeds, z)
        sizes.append(sum(v.nbytes for v in vars(state).values() if isinstance(v, np.ndarray)))
    assert sizes[0] == sizes[-1] == 2 * 8 * 32


def test_checkpoint_round_trip() -> None:
    m = Collision(d=20, s=3, epsilon=2.0)
    _, _, seeds, z = reports(m, 2000, seed=4)
    state = AggregateState(m.spec)
    state.add(seeds, z)
    restored = AggregateState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored.spec == state.spec
    assert np.array_equal(restored.estimate().mean, state.estimate().mean)
    bad = {**state.to_dict(), "sum_u": [0] * 19}
    with pytest.raises(ReportError, match="do not match"):
        AggregateState.from_dict(bad)


def test_bad_reports_are_rejected_atomically() -> None:
    m = CoCo(d=16, s=2, epsilon=1.0)
    state = AggregateState(m.spec)
    state.add([1, 2], [0, 1])
    before = (state.n, state.sum_u.copy(), state.sum_v.copy())
    with pytest.raises(
        ReportError, match=f"z must be in \\[0, {m.t}\\); report 1 has z={m.t}"
    ) as exc:
        state.add([5, 6, 7], [0, m.t, 1])
    assert exc.value.reason == "z_out_of_range"
    with pytest.raises(ReportError) as exc:
        state.add([-1], [0])
    assert exc.value.reason == "seed_out_of_range"
    with pytest.raises(ReportError) as exc:
        state.add([1, 2], [0])
    assert exc.value.reason == "shape"
    with pytest.raises(ReportError) as exc:
        state.merge(AggregateState(MechanismSpec(mechanism="coco", d=16, s=2, epsilon=2.0)))
    assert exc.value.reason == "spec_mismatch"
    assert state.n == before[0]
    assert np.array_equal(state.sum_u, before[1])
    assert np.array_equal(state.sum_v, before[2])
    state.add([], [])
    assert state.n == before[0]


def test_no_reports_give_nan() -> None:
    est = AggregateState(CoCo(d=4, s=1, epsilon=1.0).spec).estimate()
    assert est.n == 0
    assert np.isnan(est.mean).all()
    assert np.isnan(est.freq_se).all()


@pytest.mark.parametrize("kind", [CoCo, Collision])
def test_estimates_are_unbiased_with_the_closed_form_variance(kind: type[LocalMechanism]) -> None:
    """One fixed dataset, many independent randomisations: the average estimate is within
    K_MANY standard errors of the truth for every dimension, where the standard error is
    sqrt(Var / trials) with Var the closed form; the spread of the estimates matches Var."""
    m = kind(d=24, s=4, epsilon=1.0)
    n, trials = 400, 600
    rng = np.random.default_rng(5)
    # Uneven frequencies so both the zero and non-zero variance terms matter.
    keys = np.stack(
        [rng.choice(24, size=4, replace=False, p=np.linspace(1, 3, 24) / 48) for _ in range(n)]
    )
    signs = np.where(rng.random((n, 4)) < 0.7, 1, -1).astype(np.int8)
    total, present = sparse_totals(keys, signs, 24)
    mean_true, freq_true = total / n, present / n
    means, freqs = [], []
    for _ in range(trials):
        state = AggregateState(m.spec)
        state.add(*m.randomise_sparse(keys, signs, rng))
        est = state.estimate()
        means.append(est.mean)
        freqs.append(est.freq)
    mo = m.spec.moments
    var_mean = np.array([mo.mean_variance(f) for f in freq_true]) / n
    var_freq = np.array([mo.freq_variance(f) for f in freq_true]) / n
    for got, truth, var in ((means, mean_true, var_mean), (freqs, freq_true, var_freq)):
        arr = np.array(got)
        assert np.all(np.abs(arr.mean(axis=0) - truth) <= K_MANY * np.sqrt(var / trials))
        # Sample variance against the closed form: its relative SE is about sqrt(2/trials).
        ratio = arr.var(axis=0, ddof=1) / var
        assert np.all(np.abs(ratio - 1) <= K_MANY * np.sqrt(2 / trials))


GRID = [(16, 2, 0.5), (64, 4, 1.0), (128, 8, 0.5), (32, 8, 2.0), (64, 1, 1.0)]


@pytest.mark.parametrize("kind", [CoCo, Collision])
@pytest.mark.parametrize(("d", "s", "eps"), GRID)
def test_mse_matches_the_closed_form(
    kind: type[LocalMechanism], d: int, s: int, eps: float
) -> None:
    """Average over trials of the summed squared error, for fresh random data each trial:
    within K_ONE standard errors (from the trials' spread) and within 5% of theory."""
    m = kind(d=d, s=s, epsilon=eps)
    n, trials = 200, 400
    rng = np.random.default_rng(d * 1000 + s)
    mse_mean, mse_freq = [], []
    for _ in range(trials):
        keys, signs = random_sparse(n, d, s, rng)
        total, present = sparse_totals(keys, signs, d)
        state = AggregateState(m.spec)
        state.add(*m.randomise_sparse(keys, signs, rng))
        est = state.estimate()
        mse_mean.append(np.sum((est.mean - total / n) ** 2))
        mse_freq.append(np.sum((est.freq - present / n) ** 2))
    mo = m.spec.moments
    for got, theory in ((mse_mean, mo.mean_mse(d, s) / n), (mse_freq, mo.freq_mse(d, s) / n)):
        arr = np.array(got)
        se = arr.std(ddof=1) / np.sqrt(trials)
        assert abs(arr.mean() - theory) <= K_ONE * se
        assert abs(arr.mean() / theory - 1) < 0.05


def test_coco_beats_collision_for_means() -> None:
    """CoCo's mean MSE at its best t is about 15% below Collision's at its own best t
    (d=128, s=8, eps=0.5; the paper's headline), in closed form and in simulation."""
    coco = CoCo(d=128, s=8, epsilon=0.5)
    coll = Collision(d=128, s=8, epsilon=0.5)
    a = coco.spec.moments.mean_mse(128, 8)
    b = coll.spec.moments.mean_mse(128, 8)
    assert 0.10 < 1 - a / b < 0.20
    rng = np.random.default_rng(6)
    n, trials = 500, 150
    errs: dict[str, list[float]] = {"coco": [], "collision": []}
    for _ in range(trials):
        keys, signs = random_sparse(n, 128, 8, rng)
        total, _ = sparse_totals(keys, signs, 128)
        for m in (coco, coll):
            state = AggregateState(m.spec)
            state.add(*m.randomise_sparse(keys, signs, rng))
            errs[m.spec.mechanism].append(float(np.sum((state.estimate().mean - total / n) ** 2)))
    diff = np.array(errs["collision"]) - np.array(errs["coco"])
    # The paired difference is positive by more than K_ONE standard errors.
    assert diff.mean() > K_ONE * diff.std(ddof=1) / np.sqrt(trials)


@pytest.mark.parametrize("kind", [CoCo, Collision])
def test_confidence_intervals_cover_at_their_level(kind: type[LocalMechanism]) -> None:
    m = kind(d=16, s=4, epsilon=1.0)
    n, trials, level = 3000, 300, 0.9
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(trials):
        keys, signs = random_sparse(n, 16, 4, rng)
        total, _ = sparse_totals(keys, signs, 16)
        state = AggregateState(m.spec)
        state.add(*m.randomise_sparse(keys, signs, rng))
        est = state.estimate(confidence=level)
        covered += int(np.sum(np.abs(est.mean - total / n) <= est.mean_halfwidth))
    count = trials * 16
    assert est.z_score == pytest.approx(NormalDist().inv_cdf(0.95))
    assert abs(covered / count - level) <= K_ONE * np.sqrt(level * (1 - level) / count)


def test_projection_lands_on_the_simplex_and_helps() -> None:
    v = np.array([0.5, -0.2, 0.9, 0.1])
    p = project_to_simplex(v)
    assert p.min() >= 0
    assert p.sum() == pytest.approx(1.0)
    assert np.allclose(project_to_simplex(p), p)
    with pytest.raises(ValueError, match="NaN"):
        project_to_simplex([0.1, np.nan])
    # Post-processing lowers the total squared error on sparse data at small n.
    m = CoCo(d=64, s=2, epsilon=0.5)
    rng = np.random.default_rng(8)
    raw, proj = [], []
    for _ in range(40):
        keys = np.tile([3, 9], (300, 1))
        signs = np.tile([1, -1], (300, 1)).astype(np.int8)
        state = AggregateState(m.spec)
        state.add(*m.randomise_sparse(keys, signs, rng))
        truth = np.zeros(64)
        truth[[3, 9]] = [1, -1]
        raw.append(np.sum((estimate(state).mean - truth) ** 2))
        projected = estimate(state, projection=True)
        assert projected.projected
        proj.append(np.sum((projected.mean - truth) ** 2))
    assert np.mean(proj) < np.mean(raw)


def test_key_value_pipeline_recovers_frequencies_and_conditional_means() -> None:
    enc = KeyValueEncoder(d=6, s=3)
    m = CoCo(d=enc.mechanism_d, s=3, epsilon=2.0)
    rng = np.random.default_rng(9)
    n = 40_000
    value = np.array([0.8, -0.5, 0.0, 0.3, -0.9, 0.6])
    holds = rng.random((n, 6)) < np.array([0.5, 0.3, 0.2, 0.1, 0.05, 0.4])
    holds[:, 5] &= holds.sum(axis=1) <= 3  # keep at most 3 keys: no overflow sampling
    holds = holds & (np.cumsum(holds, axis=1) <= 3)
    batch = [{int(j): float(value[j]) for j in np.flatnonzero(row)} for row in holds]
    keys, signs = enc.encode_batch(batch, rng)
    state = AggregateState(m.spec)
    state.add(*m.randomise_sparse(keys, signs, rng))
    est = state.estimate()
    freq_true = holds.mean(axis=0)
    assert np.all(np.abs(est.freq[:6] - freq_true) <= K_MANY * est.freq_se[:6])
    assert np.all(np.abs(est.cond_mean[:6] - value) <= K_MANY * est.cond_mean_se[:6])


def test_sensor_pipeline_recovers_physical_means() -> None:
    enc = SensorEncoder(lo=(-20.0, 0.0, 950.0, 0.0), hi=(50.0, 100.0, 1050.0, 5000.0), s=2)
    m = Collision(d=4, s=2, epsilon=1.0)
    rng = np.random.default_rng(10)
    n = 50_000
    centre = np.array([21.0, 45.0, 1013.0, 300.0])
    readings = np.clip(centre + rng.normal(0, [5, 10, 8, 200], size=(n, 4)), enc.lo, enc.hi)
    keys, signs = enc.encode_batch(readings, rng)
    state = AggregateState(m.spec)
    state.add(*m.randomise_sparse(keys, signs, rng))
    est = state.estimate()
    mean, se = enc.decode_mean(est.mean, est.mean_se, n=n)
    # The SE includes the encoding's variance (docs/maths.md, "Sensor means").
    assert np.all(np.abs(mean - readings.mean(axis=0)) <= K_MANY * se)


def test_fieller_interval_is_the_hull_of_the_accepted_thetas() -> None:
    """Against brute force: the thetas of a fine grid of [-1, 1] that the z-test accepts."""
    rng = np.random.default_rng(11)
    k = 400
    mean = rng.normal(0, 0.3, k)
    freq = rng.normal(0.2, 0.3, k)
    var_mean = rng.uniform(0.001, 0.2, k)
    var_freq = rng.uniform(0.001, 0.2, k)
    cov_unit = rng.uniform(-0.5, 0.5, k) * np.sqrt(var_mean * var_freq)
    z = 1.96
    lo, hi = fieller_interval(
        mean, freq, var_mean=var_mean, var_freq=var_freq, cov_unit=cov_unit, z=z
    )
    theta = np.linspace(-1, 1, 40_001)[:, None]
    accepted = (mean - theta * freq) ** 2 <= z**2 * (
        var_mean + theta**2 * (var_freq - 2 * cov_unit)
    )
    some = accepted.any(axis=0)
    assert np.array_equal(np.isnan(lo), ~some)
    assert np.isnan(hi[~some]).all()
    first = theta[np.argmax(accepted, axis=0), 0]
    last = theta[len(theta) - 1 - np.argmax(accepted[::-1], axis=0), 0]
    step = 2 / 40_000
    assert np.all(np.abs(lo[some] - first[some]) <= step)
    assert np.all(np.abs(hi[some] - last[some]) <= step)
    # The draws reach every shape: empty, all of [-1, 1], bounded, two pieces.
    gaps = (accepted[:-1] & ~accepted[1:]).sum(axis=0)
    assert (~some).any()
    assert ((lo == -1) & (hi == 1)).any()
    assert ((lo > -1) & (hi < 1)).any()
    assert (gaps[some & (hi == 1)] >= 1).any()


def test_conditional_intervals_exist_where_the_conditional_mean_does_not() -> None:
    """A dimension no report holds has freq near 0: cond_mean is often undefined (NaN), its
    interval is not, and it is [-1, 1] or inside it."""
    m = Collision(d=8, s=2, epsilon=0.5)
    rng = np.random.default_rng(12)
    keys = np.tile([0, 1], (2000, 1))
    signs = np.tile([1, -1], (2000, 1)).astype(np.int8)
    state = AggregateState(m.spec)
    state.add(*m.randomise_sparse(keys, signs, rng))
    est = state.estimate()
    assert np.isnan(est.cond_mean[2:]).any()
    finite = np.isfinite(est.cond_mean_lo)
    assert finite[2:].any()
    assert np.all(est.cond_mean_lo[finite] >= -1)
    assert np.all(est.cond_mean_hi[finite] <= 1)
    assert np.all(est.cond_mean_lo[finite] <= est.cond_mean_hi[finite])


def test_projected_estimates_have_no_standard_errors_and_keep_the_raw_intervals() -> None:
    m = CoCo(d=16, s=2, epsilon=1.0)
    _, _, seeds, z = reports(m, 3000, seed=13)
    state = AggregateState(m.spec)
    state.add(seeds, z)
    raw, proj = estimate(state), estimate(state, projection=True)
    assert not raw.projected
    assert proj.projected
    for name in ("mean_se", "freq_se", "cond_mean_se"):
        assert np.isnan(getattr(proj, name)).all()
        assert np.isfinite(getattr(raw, name)).any()
    for name in ("mean_lo", "mean_hi", "freq_lo", "freq_hi", "cond_mean_lo", "cond_mean_hi"):
        assert np.array_equal(getattr(proj, name), getattr(raw, name), equal_nan=True)
    assert np.allclose(raw.mean_halfwidth, raw.z_score * raw.mean_se)
    assert np.allclose(raw.mean_lo + raw.mean_halfwidth, raw.mean)
    assert np.allclose(raw.freq_halfwidth, raw.z_score * raw.freq_se)
    doc = proj.to_dict()
    assert doc["mean_se"] == [None] * 16
    assert set(doc) == {
        "n", "confidence", "projected",
        "mean", "mean_se", "mean_lo", "mean_hi",
        "freq", "freq_se", "freq_lo", "freq_hi",
        "cond_mean", "cond_mean_se", "cond_mean_lo", "cond_mean_hi",
        "freq_interval",
    }  # fmt: skip
