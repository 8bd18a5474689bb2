"""``coco experiment accuracy`` through typer: help, a tiny run, clear errors."""

from __future__ import annotations

import csv
from pathlib import Path

from typer.testing import CliRunner

from sim.cli import app

runner = CliRunner()


def test_help_lists_the_grid_options() -> None:
    result = runner.invoke(app, ["experiment", "accuracy", "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--full", "--out", "--seed", "--repeats", "--jobs", "--update-doc"):
        assert option in result.output


def test_the_group_has_every_experiment() -> None:
    result = runner.invoke(app, ["experiment", "--help"])
    assert result.exit_code == 0, result.output
    for command in ("accuracy", "amplification", "tightness", "all"):
        assert command in result.output
    result = runner.invoke(app, ["experiment", "all", "--help"])
    assert result.exit_code == 0, result.output
    assert "--update-doc" in result.output


def test_tiny_run_writes_every_output(tmp_path: Path) -> None:
    out = tmp_path / "res"
    args = ["experiment", "accuracy", "--out", str(out), "--quiet", "--repeats", "1"]
    args += ["--n", "300", "--d", "16", "--s", "2", "--epsilon", "1"]
    args += ["--mechanism", "Collision", "--mechanism", "CoCo", "--mechanism", "SUCCINCT"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "accuracy-summary.md").exists()
    assert list(out.glob("accuracy-*.png"))
    with (out / "accuracy.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["mechanism"] for r in rows} == {"Collision", "CoCo", "SUCCINCT"}
    cells = {(int(r["n"]), int(r["d"]), int(r["s"]), float(r["epsilon"])) for r in rows}
    assert cells == {(300, 16, 2, 1.0)}
    summary = (out / "accuracy-summary.md").read_text()
    # The summary names the command that regenerates it.
    assert f"coco experiment accuracy --out {out} --seed 1 --repeats 1 --n 300" in summary


def test_bad_options_are_one_line_errors(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["experiment", "accuracy", "--out", str(tmp_path), "--mechanism", "Nope"]
    )
    assert result.exit_code == 1
    assert "unknown mechanism" in result.output
    result = runner.invoke(
        app, ["experiment", "accuracy", "--out", str(tmp_path), "--s", "999", "--d", "16"]
    )
    assert result.exit_code == 1
    assert "s <= d" in result.output


def test_figures_redraws_the_pngs_from_a_csv(tmp_path: Path) -> None:
    out = tmp_path / "res"
    args = ["experiment", "accuracy", "--out", str(out), "--quiet", "--repeats", "2"]
    args += ["--n", "300", "--d", "16", "--s", "2", "--epsilon", "0.5", "--epsilon", "1"]
    args += ["--mechanism", "Collision", "--mechanism", "CoCo"]
    assert runner.invoke(app, args).exit_code == 0
    again = tmp_path / "again"
    result = runner.invoke(
        app, ["experiment", "figures", "--csv", str(out / "accuracy.csv"), "--out", str(again)]
    )
    assert result.exit_code == 0, result.output
    drawn = sorted(p.name for p in again.glob("accuracy-*.png"))
    assert drawn
    assert drawn == sorted(p.name for p in out.glob("accuracy-*.png"))


def test_figures_of_a_missing_csv_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["experiment", "figures", "--csv", str(tmp_path / "no.csv")])
    assert result.exit_code == 1
    assert "no.csv" in result.output
