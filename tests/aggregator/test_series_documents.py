"""The series' read side, pure: query parsing, frames, /series documents, window documents."""

from __future__ import annotations

import json
import math
import urllib.parse
from typing import Literal

import numpy as np
import pytest

from aggregator.estimation.estimators import AggregateState, Estimates, estimate_rows
from aggregator.series.core import RoundRow, Series, merge_rows, step_rows
from aggregator.series.documents import (
    COLUMNS,
    CSV_FIELDS,
    ESTIMATE_FIELDS,
    series_csv,
    series_document,
    series_json,
    window_document,
)
from aggregator.series.frame import Frame
from aggregator.series.windows import (
    MAX_CELLS,
    MAX_WINDOWS,
    QueryError,
    SeriesQuery,
    check_cells,
    parse_duration,
    parse_series_query,
    parse_window,
    parse_windows,
)
from edge.spec import MechanismSpec

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
R = 60
NOW = 1_700_000_000.0


def batch(rng: np.random.Generator, size: int, spec: MechanismSpec = SPEC) -> AggregateState:
    state = AggregateState(spec)
    state.add(rng.integers(0, 2**32, size=size, dtype=np.uint64), rng.integers(0, spec.t, size))
    return state


def filled(seed: int = 1, rounds: int = 40) -> Series:
    """A series of ``rounds`` rounds ending before NOW, 1-3 batches each, some rounds empty."""
    rng = np.random.default_rng(seed)
    series = Series(SPEC, round_seconds=R, retention=10**9)
    first = int(NOW) // R - rounds
    for r in range(first, first + rounds):
        if rng.random() < 0.15:
            continue
        for _ in range(int(rng.integers(1, 4))):
            size = int(rng.integers(3, 60))
            series.add(r, batch(rng, size), batch_size=size)
    return series


def params(query: str) -> dict[str, list[str]]:
    return urllib.parse.parse_qs(query, keep_blank_values=True)


# -- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("1h", 3600), ("24h", 86400), ("7d", 604800), ("3600", 3600)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds
    assert parse_window(text).seconds == seconds


def test_round_windows_and_the_configured_set() -> None:
    assert parse_window("r10").rounds == 10
    assert [w.spec for w in parse_windows(["1h", "r5"])] == ["1h", "r5"]
    with pytest.raises(QueryError, match="twice"):
        parse_windows(["1h", "1h"])
    with pytest.raises(QueryError, match=f"at most {MAX_WINDOWS}"):
        parse_windows([f"{k}m" for k in range(1, MAX_WINDOWS + 2)])


@pytest.mark.parametrize(
    "text", ["", "0", "0s", "-5m", "1.5h", "1y", "h", "1 h", "10000000000000d", "r0", "r", "rx"]
)
def test_a_malformed_window_is_one_line(text: str) -> None:
    with pytest.raises(QueryError) as excinfo:
        parse_window(text)
    assert "\n" not in str(excinfo.value)
    assert str(excinfo.value)


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("from=abc", "from 'abc' is not a number"),
        ("to=nan", "finite"),
        ("from=inf", "finite"),
        ("from=-1", "finite"),
        ("from=20&to=10", "after"),
        ("step=0", "between"),
        ("step=5x", "not a duration"),
        ("dims=1,x", "not a dimension index"),
        ("dims=", "not a dimension index"),
        ("dims=6", "unknown dimension 6"),
        ("dims=1,1", "twice"),
        ("dims=-1", "not a dimension index"),
        ("format=xml", "not json or csv"),
        ("frm=1", "unknown parameter"),
        ("from=1&from=2", "given 2 times"),
        ("from=%0A%0Dx", "not a number"),
    ],
)
def test_a_malformed_series_query_is_one_line(query: str, match: str) -> None:
    with pytest.raises(QueryError, match=match) as excinfo:
        parse_series_query(params(query), d=SPEC.d, now=NOW)
    assert "\n" not in str(excinfo.value)
    assert "\r" not in str(excinfo.value)


def test_a_series_query_and_its_defaults() -> None:
    query = parse_series_query(params(""), d=SPEC.d, now=NOW)
    assert query == SeriesQuery(start=0.0, end=NOW, step=None, dims=tuple(range(SPEC.d)))
    query = parse_series_query(
        params("from=10.5&to=99&step=15m&dims=5,0,3&format=csv"), d=SPEC.d, now=NOW
    )
    assert query == SeriesQuery(start=10.5, end=99.0, step=900, dims=(5, 0, 3), format="csv")
    assert parse_series_query(params("step=round"), d=SPEC.d, now=NOW).step is None


def test_the_cost_bound() -> None:
    check_cells(MAX_CELLS, 1)
    check_cells(10_080, 64)  # a week of 60-second rounds at d = 64 fits
    with pytest.raises(QueryError, match="fewer"):
        check_cells(MAX_CELLS // 4 + 1, 4)


# -- estimates of many rows ------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["coco", "collision"])
@pytest.mark.parametrize("signs", [False, True])
def test_estimate_rows_is_each_rows_estimate_bit_for_bit(
    mechanism: Literal["coco", "collision"], signs: bool
) -> None:
    """Small counts (score intervals), an empty row and large ones: the vectorised estimates
    are exactly each state's own."""
    spec = MechanismSpec(mechanism=mechanism, d=16, s=3, epsilon=1.0)
    rng = np.random.default_rng(7)
    states = [
        batch(rng, size, spec) if size else AggregateState(spec) for size in (1, 2, 7, 0, 40, 900)
    ]
    fields = estimate_rows(
        spec,
        np.array([s.n for s in states]),
        np.stack([s.sum_u for s in states]),
        np.stack([s.sum_v for s in states]),
        confidence=0.9,
        signs_from_values=signs,
    )
    for i, state in enumerate(states):
        own = state.estimate(confidence=0.9, signs_from_values=signs)
        for name in ESTIMATE_FIELDS:
            assert np.array_equal(getattr(own, name), fields[name][i], equal_nan=True), name
        assert np.array_equal(own.freq_score, fields["freq_score"][i])
    cols = [3, 0]  # a subset of the dimensions: the same numbers, in that order
    some = estimate_rows(
        spec,
        np.array([s.n for s in states]),
        np.stack([s.sum_u[cols] for s in states]),
        np.stack([s.sum_v[cols] for s in states]),
        confidence=0.9,
        signs_from_values=signs,
    )
    for name in ESTIMATE_FIELDS:
        assert np.array_equal(some[name], fields[name][:, cols], equal_nan=True)


# -- frames -----------------------------------------------------------------------------------


def row_tuple(row: RoundRow) -> tuple[object, ...]:
    return (
        row.round,
        row.start,
        row.end,
        row.rounds,
        row.state.n,
        row.state.sum_u.tolist(),
        row.state.sum_v.tolist(),
        row.batches,
        row.smallest_release,
    )


def frame_tuples(frame: Frame) -> list[tuple[object, ...]]:
    return [
        (
            int(frame.round[i]),
            int(frame.start[i]),
            int(frame.end[i]),
            int(frame.rounds[i]),
            int(frame.n[i]),
            frame.sum_u[i].tolist(),
            frame.sum_v[i].tolist(),
            int(frame.batches[i]),
            frame.smallest_release(i),
        )
        for i in range(len(frame))
    ]


@pytest.mark.parametrize("step", [60, 300, 900, 3600, 7 * 60])
def test_a_stepped_frame_is_step_rows(step: int) -> None:
    rows = filled(seed=step).rows()
    expected = [row_tuple(row) for row in step_rows(SPEC, rows, step)]
    assert frame_tuples(Frame.of(rows, SPEC.d).stepped(step)) == expected


def test_a_frame_copies_its_rows() -> None:
    series = filled()
    frame = Frame.of(series.rows(), SPEC.d)
    before = frame_tuples(frame)
    newest = series.rows()[-1]
    series.add(newest.round, batch(np.random.default_rng(3), 9), batch_size=9)
    assert frame_tuples(frame) == before
    assert frame_tuples(Frame.of([], SPEC.d)) == []


def test_a_windows_sums_are_the_merge_of_its_rows() -> None:
    rows = filled().rows()
    merged = merge_rows(SPEC, rows)
    assert merged is not None
    sums = Frame.of(rows, SPEC.d).sums()
    assert (sums.n, sums.rounds, sums.batches, sums.smallest) == (
        merged.state.n,
        merged.rounds,
        merged.batches,
        merged.smallest_release,
    )
    assert np.array_equal(sums.sum_u, merged.state.sum_u)
    assert np.array_equal(sums.sum_v, merged.state.sum_v)
    assert sums.latest == rows[-1].smallest_release
    assert sum(count for _, count in sums.sizes) == len(rows)
    assert dict(sums.sizes) == {
        size: sum(1 for row in rows if row.smallest_release == size)
        for size in {row.smallest_release for row in rows}
    }
    # one pass over the window's reports gives the same estimate, bit for bit
    assert sums.state(SPEC).estimate().to_dict() == merged.state.estimate().to_dict()


# -- /series ----------------------------------------------------------------------------------


def restricted(estimates: Estimates, dims: list[int]) -> dict[str, object]:
    full = estimates.to_dict()
    for name in (*ESTIMATE_FIELDS, "freq_interval"):
        full[name] = [full[name][j] for j in dims]
    return full


def test_the_series_document_per_round_restricted_to_dims() -> None:
    series = filled()
    rows = series.rows(0, NOW)
    dims = [4, 1]
    query = SeriesQuery(start=0, end=NOW, step=None, dims=tuple(dims))
    doc = series_document(SPEC, Frame.of(rows, SPEC.d), query, round_seconds=R, confidence=0.95)
    assert doc["columns"] == list(COLUMNS)
    assert doc["dims"] == dims
    assert doc["step"] == "round"
    assert doc["round_seconds"] == R
    assert doc["spec"] == SPEC.to_dict()
    assert len(doc["rows"]) == len(rows) > 20
    for out, row in zip(doc["rows"], rows, strict=True):
        head = (*row_tuple(row)[:4], row.state.n, row.batches, row.smallest_release)
        assert out[:7] == list(head)
        assert out[7] == restricted(row.state.estimate(), dims)
    # the encoded answer is that document, valid JSON (no NaN)
    body = b"".join(
        series_json(SPEC, Frame.of(rows, SPEC.d), query, round_seconds=R, confidence=0.95)
    )
    assert json.loads(body) == json.loads(json.dumps(doc))


def test_a_step_row_is_the_merge_of_its_rounds() -> None:
    rows = filled(seed=5).rows()
    query = SeriesQuery(start=0, end=NOW, step=600, dims=tuple(range(SPEC.d)))
    doc = series_document(SPEC, Frame.of(rows, SPEC.d), query, round_seconds=R, confidence=0.95)
    assert doc["step"] == 600
    merged = step_rows(SPEC, rows, 600)
    assert len(doc["rows"]) == len(merged) < len(rows)
    for out, row in zip(doc["rows"], merged, strict=True):
        assert out[0] == min(r.round for r in rows if 600 * (r.start // 600) == row.start)
        assert out[1:3] == [row.start, row.start + 600]
        assert out[7] == row.state.estimate().to_dict()


def test_the_csv() -> None:
    rows = filled(seed=2).rows()
    query = SeriesQuery(start=0, end=NOW, step=None, dims=(2, 0), format="csv")
    lines = "".join(series_csv(SPEC, Frame.of(rows, SPEC.d), query, confidence=0.95)).splitlines()
    header = lines[0].split(",")
    assert header[:7] == list(COLUMNS[:7])
    assert header[7:] == [f"{name}_{j}" for j in (2, 0) for name in CSV_FIELDS]
    assert len(lines) == len(rows) + 1
    for line, row in zip(lines[1:], rows, strict=True):
        cells = line.split(",")
        assert len(cells) == len(header)
        assert [int(c) for c in cells[:7]] == [
            row.round,
            row.start,
            row.end,
            row.rounds,
            row.state.n,
            row.batches,
            row.smallest_release,
        ]
        estimates = row.state.estimate()
        at = 7
        for j in (2, 0):
            for name in CSV_FIELDS:
                value = float(getattr(estimates, name)[j])
                assert cells[at] == ("" if math.isnan(value) else repr(value))
                at += 1


def test_a_query_too_large_is_refused_before_anything_is_written() -> None:
    rows = filled(rounds=5).rows()
    frame = Frame.of(rows, SPEC.d)
    big = Frame(
        round=np.arange(MAX_CELLS // 2 + 1),
        start=np.arange(MAX_CELLS // 2 + 1) * R,
        end=np.arange(1, MAX_CELLS // 2 + 2) * R,
        rounds=np.ones(MAX_CELLS // 2 + 1, dtype=np.int64),
        n=np.ones(MAX_CELLS // 2 + 1, dtype=np.int64),
        batches=np.ones(MAX_CELLS // 2 + 1, dtype=np.int64),
        smallest=np.ones(MAX_CELLS // 2 + 1, dtype=np.int64),
        sum_u=np.zeros((MAX_CELLS // 2 + 1, 2), dtype=np.int64),
        sum_v=np.zeros((MAX_CELLS // 2 + 1, 2), dtype=np.int64),
    )
    query = SeriesQuery(start=0, end=NOW, step=None, dims=(0, 1))
    with pytest.raises(QueryError):
        series_json(SPEC, big, query, round_seconds=R, confidence=0.95)
    with pytest.raises(QueryError):
        series_csv(SPEC, big, query, confidence=0.95)
    assert len(series_document(SPEC, frame, query, round_seconds=R, confidence=0.95)["rows"])


# -- a window's /estimates --------------------------------------------------------------------


def test_the_window_document() -> None:
    rows = filled(seed=9).rows()[-10:]
    sums = Frame.of(rows, SPEC.d).sums()
    merged = merge_rows(SPEC, rows)
    assert merged is not None
    estimates = sums.state(SPEC).estimate()
    base = {"n": 1, "estimates": {}, "epsilon_total": 9.0, "delta": 1e-6, "counters": {"x": 1}}
    window = parse_window("r10")
    pending = window_document(
        base, window=window, start=1.0, end=2.0, sums=sums, estimates=estimates, level=None
    )
    assert pending["n"] == merged.state.n
    assert pending["estimates"] == merged.state.estimate().to_dict()
    assert pending["epsilon_total"] is None
    assert pending["epsilon_pending"] is True
    assert pending["batch_size"] == {
        "smallest": merged.smallest_release,
        "latest": rows[-1].smallest_release,
    }
    assert pending["delta"] == 1e-6
    assert pending["counters"] == {"x": 1}
    assert pending["window"] == {
        "spec": "r10",
        "from": 1.0,
        "to": 2.0,
        "rounds": 10,
        "rows": 10,
        "batches": merged.batches,
        "smallest_release": merged.smallest_release,
        "epsilon_total": None,
    }
    level = {
        "epsilon_central": {"smallest": 2.0, "latest": 1.5},
        "epsilon_central_generic": {"smallest": 3.0, "latest": 2.5},
        "epsilon_total": 4.0,
        "batches_accounted": 10,
    }
    done = window_document(
        base, window=window, start=1.0, end=2.0, sums=sums, estimates=estimates, level=level
    )
    assert done["epsilon_pending"] is False
    assert done["epsilon_total"] == done["window"]["epsilon_total"] == 4.0
    assert done["epsilon_central"] == {"smallest": 2.0, "latest": 1.5}
