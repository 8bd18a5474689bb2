"""The per-round series' pure core: rows, windows as merges, deltas, replay and compaction."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.estimation.estimators import AggregateState
from aggregator.series.core import Series, compact_records, merge_rows, step_rows
from edge.spec import MechanismSpec

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
R = 10


def batch(rng: np.random.Generator, size: int) -> AggregateState:
    state = AggregateState(SPEC)
    seeds = rng.integers(0, 2**32, size=size, dtype=np.uint64)
    z = rng.integers(0, SPEC.t, size=size)
    state.add(seeds, z)
    return state


def fingerprint(series: Series) -> list[tuple[object, ...]]:
    return [
        (
            r.round,
            r.start,
            r.end,
            r.state.n,
            r.state.sum_u.tolist(),
            r.state.sum_v.tolist(),
            r.batches,
            r.smallest_release,
            r.rounds,
        )
        for r in series.rows()
    ]


batches = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 20), st.booleans()), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None)
@given(batches, st.integers(0, 2**32 - 1))
def test_replaying_committed_deltas_gives_the_same_rows(
    plan: list[tuple[int, int, bool]], seed: int
) -> None:
    """Deltas taken at arbitrary checkpoints, some writes failing (left pending and taken
    again), replayed in a fresh series, compacted or not: the same rows."""
    rng = np.random.default_rng(seed)
    live = Series(SPEC, round_seconds=R, retention=10**9)
    file: list[object] = []
    for round_, size, checkpoint in plan:
        live.add(round_, batch(rng, size), batch_size=size)
        if checkpoint:
            taken = live.take()
            if rng.random() < 0.3:  # the write failed: nothing committed
                continue
            already = {d.seq for d in file}  # type: ignore[attr-defined]
            file += [d for d in taken if d.seq not in already]
            live.committed(taken[-1].seq)
    taken = live.take()
    file += [d for d in taken if d.seq not in {d.seq for d in file}]  # type: ignore[attr-defined]
    live.committed(live.seq)
    assert live.pending == 0
    replayed = Series(SPEC, round_seconds=R, retention=10**9)
    replayed.replay(file)  # type: ignore[arg-type]
    assert fingerprint(replayed) == fingerprint(live)
    compacted = Series(SPEC, round_seconds=R, retention=10**9)
    compacted.replay(compact_records(file, rolled_before=float("-inf"), step=3600))  # type: ignore[arg-type]
    assert fingerprint(compacted) == fingerprint(live)


@settings(max_examples=40, deadline=None)
@given(batches, st.integers(0, 2**32 - 1), st.integers(50, 300))
def test_expiry_in_memory_equals_a_compacted_file(
    plan: list[tuple[int, int, bool]], seed: int, now: int
) -> None:
    rng = np.random.default_rng(seed)
    live = Series(SPEC, round_seconds=R, retention=100, step=60, coarse_retention=10**9)
    for round_, size, _ in plan:
        live.add(round_, batch(rng, size), batch_size=size)
    deltas = live.take()
    live.expire(now)
    again = Series(SPEC, round_seconds=R, retention=100, step=60, coarse_retention=10**9)
    again.replay(compact_records(deltas, rolled_before=now - 100, step=60))
    again.expire(now)
    assert fingerprint(again) == fingerprint(live)
    total = sum(r.state.n for r in live.rows())
    assert total == sum(size for _, size, _ in plan)  # nothing lost in the roll-up
    assert all(
        r.end > now - 100 or (r.rounds >= 1 and (r.end - r.start) == 60) for r in live.rows()
    )


def test_a_window_is_the_merge_of_its_rounds() -> None:
    rng = np.random.default_rng(7)
    series = Series(SPEC, round_seconds=R, retention=10**9)
    one_pass = AggregateState(SPEC)
    for round_ in range(12):
        for size in (5, 9):
            part = batch(rng, size)
            one_pass.merge(part)
            series.add(round_, part, batch_size=size)
    rows = series.rows()
    assert [r.round for r in rows] == list(range(12))
    window = merge_rows(SPEC, rows)
    assert window is not None
    assert window.state.n == one_pass.n == 12 * 14
    assert np.array_equal(window.state.sum_u, one_pass.sum_u)
    assert window.smallest_release == 5
    assert window.batches == 24
    assert window.rounds == 12
    assert [r.round for r in series.newest(3)] == [9, 10, 11]
    assert [(r.start, r.end) for r in series.rows(30, 60)] == [(30, 40), (40, 50), (50, 60)]
    steps = step_rows(SPEC, rows, 60)
    assert [(s.start, s.end, s.rounds, s.state.n) for s in steps] == [
        (0, 60, 6, 6 * 14),
        (60, 120, 6, 6 * 14),
    ]
