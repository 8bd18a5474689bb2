"""The per-round series as a PNG (``coco aggregator plot``) and the simulation truth beside
it (:mod:`aggregator.page.truth`), from documents built by hand."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from typer.testing import CliRunner

from aggregator.page.series_plot import SeriesPlotError, series_figure
from aggregator.page.truth import TruthError, TruthQuery, parse_query, parse_truth
from sim.cli import app

R = 10
FIRST = 170_000_000  # round numbers: Unix time FIRST * R


def series_document(rounds: int = 6, dims: tuple[int, ...] = (0, 2)) -> dict[str, Any]:
    """A /series document as SERIES.md describes it: the means follow a cosine, the
    interval +-0.05 around them, one round without reports (nulls)."""
    rows = []
    for k in range(rounds):
        r = FIRST + k
        mean: list[float | None] = [round(0.3 * math.cos(k + j), 6) for j in dims]
        lo = [None if m is None else m - 0.05 for m in mean]
        hi = [None if m is None else m + 0.05 for m in mean]
        n = 500
        if k == 3:  # a round with no reports
            mean, lo, hi, n = [None] * len(dims), [None] * len(dims), [None] * len(dims), 0
        est = {"n": n, "confidence": 0.95, "mean": mean, "mean_lo": lo, "mean_hi": hi}
        rows.append([r, r * R, (r + 1) * R, n, 1, n or None, est])
    return {
        "columns": ["round", "start", "end", "n", "batches", "smallest_release", "estimates"],
        "rows": rows,
        "dims": list(dims),
        "step": "round",
        "round_seconds": R,
        "confidence": 0.95,
        "spec": {"mechanism": "coco", "d": 3, "s": 1, "epsilon": 1.0},
    }


def truth_file_document(rounds: int = 6, d: int = 3) -> dict[str, Any]:
    """A ground-truth file as ``coco fleet --ground-truth`` writes it (the fields used)."""
    return {
        "simulation_only": True,
        "note": "SIMULATION ONLY",
        "spec": {"d": d},
        "seed": 1,
        "model": "sensors",
        "round_seconds": R,
        "day_seconds": 60,
        "runs": [],
        "overall": {},
        "rounds": [
            {
                "round": FIRST + k,
                "n": 500,
                "mean": [0.3 * math.cos(k + j) + 0.01 for j in range(d)],
                "freq": [0.5] * d,
                "total": [0] * d,
                "present": [0] * d,
            }
            for k in range(rounds)
        ],
    }


def test_the_figure_draws_estimate_band_and_simulation_truth() -> None:
    series = series_document()
    table = parse_truth(truth_file_document())
    truth = table.select(TruthQuery(0.0, 2e10, (0, 2)))
    fig = series_figure(series, [2, 0], truth, names={0: "temperature"})
    axes = fig.get_axes()
    assert len(axes) == 2
    mids = [datetime.fromtimestamp((r[1] + r[2]) / 2, UTC) for r in series["rows"]]
    for ax, p in ((axes[0], 1), (axes[1], 0)):  # dims 2 then 0: positions 1 and 0
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {"estimate (per round)", "simulation truth"}
        est = lines["estimate (per round)"]
        assert list(np.asarray(est.get_xdata(), dtype=object)) == mids
        expected = [np.nan if r[6]["mean"][p] is None else r[6]["mean"][p] for r in series["rows"]]
        np.testing.assert_allclose(
            np.asarray(est.get_ydata(), dtype=float), np.array(expected)
        )  # NaN: a gap
        assert lines["simulation truth"].get_linestyle() == "--"
        np.testing.assert_allclose(
            np.asarray(lines["simulation truth"].get_ydata(), dtype=float),
            np.array([row[4][p] for row in truth["rows"]]),
        )
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert [b.get_label() for b in bands] == ["95% interval"]
        # the band spans mean - 0.05 .. mean + 0.05 where there is an interval
        y = np.concatenate([np.asarray(path.vertices)[:, 1] for path in bands[0].get_paths()])
        present = [m for m in expected if not math.isnan(m)]
        assert y.min() == pytest.approx(min(present) - 0.05)
        assert y.max() == pytest.approx(max(present) + 0.05)
        box = ax.get_legend()
        assert box is not None
        legend = [t.get_text() for t in box.get_texts()]
        assert "simulation truth" in legend
    assert axes[1].get_ylabel() == "temperature (x0)"
    assert axes[0].get_ylabel() == "mean of x2"


def test_a_dimension_the_document_does_not_hold_is_refused() -> None:
    with pytest.raises(SeriesPlotError, match=r"holds no dimension 1 \(dims \[0, 2\]\)"):
        series_figure(series_document(), [1])
    with pytest.raises(SeriesPlotError, match="no column 'estimates'"):
        series_figure({"columns": ["round", "start", "end"], "rows": [], "dims": [0]}, [0])
    with pytest.raises(SeriesPlotError, match="no dimension to plot"):
        series_figure(series_document(), [])


def test_the_plot_command_writes_a_png_from_files(tmp_path: Path) -> None:
    series = tmp_path / "series.json"
    series.write_text(json.dumps(series_document()))
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps(truth_file_document()))
    out = tmp_path / "out.png"
    result = CliRunner().invoke(
        app,
        [
            *("aggregator", "plot", "--series", str(series), "--dims", "0,2"),
            *("--truth", str(truth), "-o", str(out)),
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"wrote {out}: 6 rows, dims 0,2, with the simulation truth"
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (900, 560)  # 9 x (2.4 * 2 + 0.8) inches at 100 dpi
    for argv, message in [
        (["--series", str(series), "--dims", "1"], "holds no dimension 1"),
        (["--series", str(series), "--dims", "x"], "--dims must be comma-separated"),
        (["--series", str(tmp_path / "none.json")], "--series"),
        (["--series", str(series), "--truth", str(series)], "not a ground-truth document"),
        ([], "give exactly one of --url and --series"),
        (["--url", "ftp://x", "--series", str(series)], "give exactly one of"),
        (["--url", "ftp://x"], "--url must be http(s)://host:port"),
    ]:
        result = CliRunner().invoke(app, ["aggregator", "plot", *argv, "-o", str(out)])
        assert result.exit_code == 1, argv
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("error: ")
        assert message in lines[0], lines


def test_truth_documents_and_queries_are_checked() -> None:
    doc = truth_file_document(rounds=4)
    table = parse_truth(doc)
    assert (table.round_seconds, table.day_seconds, table.d) == (R, 60, 3)
    start = FIRST * R
    answer = table.select(parse_query(f"from={start + R}&to={start + 3 * R}&dims=1", now=0, d=3))
    assert answer["simulation_only"] is True
    assert answer["dims"] == [1]
    assert [row[:4] for row in answer["rows"]] == [
        [FIRST + 1, start + R, start + 2 * R, 500],
        [FIRST + 2, start + 2 * R, start + 3 * R, 500],
    ]  # end in (from, to], as /series
    assert answer["rows"][0][4] == [doc["rounds"][1]["mean"][1]]
    assert len(table.select(parse_query("", now=start + 2 * R, d=3))["rows"]) == 2  # to = now
    for query, message in [
        ("from=x", "from: not a number"),
        ("from=5&to=4", "from 5 is after to 4"),
        ("dims=3", "no dimension 3"),
        ("dims=0,-1", "not a dimension index"),
        ("to=nan", "not a finite number"),
        ("step=1h", "unknown parameter 'step'"),
        ("dims=0&dims=1", "given twice"),
    ]:
        with pytest.raises(TruthError, match=message):
            parse_query(query, now=1e9, d=3)
    for bad, message in [
        ({"rounds": []}, "not a ground-truth document"),
        ({**doc, "round_seconds": 0}, "round_seconds must be an integer >= 1"),
        ({**doc, "rounds": [*doc["rounds"], doc["rounds"][0]]}, "a round appears twice"),
        ({**doc, "rounds": [{**doc["rounds"][0], "mean": [1.0]}]}, "freq must be a list of 1"),
        ({**doc, "rounds": [{**doc["rounds"][0], "mean": ["a", 1, 2]}]}, "finite number or null"),
        ({**doc, "rounds": [{**doc["rounds"][0], "n": -1}]}, "n must be an integer >= 0"),
    ]:
        with pytest.raises(TruthError, match=message):
            parse_truth(bad)
    assert parse_truth({**doc, "rounds": []}).d == 3  # no rounds yet: d from the spec
