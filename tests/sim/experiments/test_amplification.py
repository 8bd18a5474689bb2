"""The amplification comparison (paper, Figure "shuffle"): values, files and the command."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from aggregator.accountant import generic_clone_probability
from sim.experiments.amplification import (
    COLUMNS,
    compute_row,
    compute_rows,
    delta_for_n,
    eps0_grid,
    run_amplification,
    write_csv,
    write_plot,
    write_summary,
)
from sim.experiments.privacy_cli import amplification, paste_summary

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Rows of the independent reference table amplification.tsv (generic stronger clone; FMT21;
# EFMRTT19; docs/reference.md), stated to a precision of about 1e-7 in eps and to agree with
# Wang et al.'s reference implementation to within 3e-7.
REFERENCE = [
    # eps0, n, eps_c_stronger_clone, fmt21, efmrtt19
    (0.5, 10_000, 0.01166958931, 0.08222984784, 0.19097892),
    (1.0, 10_000, 0.02967993492, 0.1888523468, None),
    (2.0, 100_000, 0.03012699248, 0.1796225001, None),
    (4.5, 100_000, 0.1443836322, 0.6349750768, None),
]
REFERENCE_TOL = 3e-7


@pytest.mark.parametrize(("eps0", "n", "generic", "fmt21", "efmrtt19"), REFERENCE)
def test_rows_reproduce_the_reference_table(
    eps0: float, n: int, generic: float, fmt21: float, efmrtt19: float | None
) -> None:
    row = compute_row(n=n, s=4, epsilon0=eps0, delta=delta_for_n(n))
    assert row.delta == pytest.approx(n**-1.1, rel=1e-12)
    assert abs(row.eps_c_generic - generic) <= REFERENCE_TOL
    assert row.fmt21 == pytest.approx(fmt21, abs=1e-9)
    if efmrtt19 is None:
        assert row.efmrtt19 is None
    else:
        assert row.efmrtt19 == pytest.approx(efmrtt19, abs=1e-8)
    ratio = row.values()[COLUMNS.index("ratio_generic")]
    assert ratio == pytest.approx(eps0 / generic, rel=REFERENCE_TOL / generic)


@pytest.mark.parametrize("s", [4, 64])
@pytest.mark.parametrize("eps0", [0.1, 1.0, 3.0, 5.0])
def test_mechanism_row_uses_the_figure_t_and_the_clone_probability(s: int, eps0: float) -> None:
    row = compute_row(n=10_000, s=s, epsilon0=eps0, delta=1e-6)
    assert row.t == math.floor(s * math.exp(eps0) + 2 * s - 1)  # Figure "shuffle" caption
    assert row.clone_mechanism == pytest.approx(s / (s * math.exp(eps0) + row.t - s))
    assert row.clone_generic == generic_clone_probability(eps0)
    assert row.clone_mechanism < row.clone_generic
    # a smaller clone probability gives a smaller (uncertified) epsilon
    assert 0 < row.eps_c_mechanism < row.eps_c_generic < eps0
    assert row.saving == pytest.approx(1 - row.eps_c_mechanism / row.eps_c_generic)
    # the certified blanket bound sits between the paper's (invalid) pair and the generic one
    assert row.eps_c_mechanism <= row.eps_c_blanket <= row.eps_c_generic
    assert row.saving_blanket == pytest.approx(1 - row.eps_c_blanket / row.eps_c_generic)


def test_grids() -> None:
    full, quick = eps0_grid(full=True), eps0_grid(full=False)
    assert full[0] == 0.1
    assert full[-1] == 5.0
    assert len(full) == 50
    assert set(quick) <= set(full)
    assert quick[0] == 0.1
    assert quick[-1] == 5.0


def test_files_of_a_tiny_run(tmp_path: Path) -> None:
    rows = compute_rows(ns=(1000,), sparsities=(4, 64), eps0s=[0.5, 2.0])
    csv_path = write_csv(rows, tmp_path / "a.csv")
    with csv_path.open() as fh:
        table = list(csv.reader(fh))
    assert tuple(table[0]) == COLUMNS
    assert len(table) == 1 + 4
    parsed = dict(zip(COLUMNS, table[1], strict=True))
    assert parsed["n"] == "1000"
    assert float(parsed["eps_c_generic"]) == rows[0].eps_c_generic
    assert parsed["eps_c_efmrtt19"] == ""  # None (its value would exceed eps0) -> empty
    png = write_plot(rows, tmp_path / "a.png")
    assert png.read_bytes()[:8] == PNG_MAGIC
    summary = write_summary(rows, tmp_path / "a.md").read_text()
    assert "| 1e+03 | 4 |" in summary
    assert "| 1e+03 | 64 |" in summary


def test_the_command_writes_the_files_and_pastes_the_summary(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(amplification)
    doc = tmp_path / "results.md"
    doc.write_text(
        "intro\n<!-- amplification-summary:begin -->\nold\n<!-- amplification-summary:end -->\n"
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["--out", str(out), "--quiet", "--update-doc", str(doc)])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == ["amplification.csv", "amplification.png", "amplification_summary.md"]
    text = doc.read_text()
    assert "old" not in text
    assert (out / "amplification_summary.md").read_text().strip() in text
    assert text.startswith("intro\n")


def test_paste_summary_refuses_a_doc_without_markers(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("no markers\n")
    with pytest.raises(ValueError, match="markers"):
        paste_summary(doc, "amplification", "table")
    assert doc.read_text() == "no markers\n"


def test_run_amplification_returns_what_it_wrote(tmp_path: Path) -> None:
    paths = run_amplification(tmp_path, full=False, progress=False)
    assert [p.name for p in paths] == [
        "amplification.csv",
        "amplification.png",
        "amplification_summary.md",
    ]
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
