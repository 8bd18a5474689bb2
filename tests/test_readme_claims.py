"""The README's claims about the privacy level match what the project computes.

Section "The privacy level reported" states the saving of the certified blanket bound
against the generic stronger-clone bound in a table (per mechanism setting and eps0, for
batches of n = 1,000 to 10^6), and a few numbers its own examples print. Everything is read
from the README and recomputed with the accountant (the CLI's JSON where the README shows a
command), so a changed number or a changed accountant breaks the test.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from aggregator.accountant import amplify_spec
from edge import MechanismSpec
from sim.cli import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SECTION = README.split("## The privacy level reported\n", 1)[1].split("\n## ")[0]
ROW = re.compile(r"^\| (CoCo|Collision), d = (\d+), s = (\d+), δ = ([0-9.e-]+)[^|]*\|(.*)\|$")
CELL = re.compile(r"^(\d+)(?:-(\d+))?%$")
ALL_N = (1_000, 10_000, 1_000_000)

pytestmark = pytest.mark.slow


def saving(spec: MechanismSpec, n: int, delta: float) -> float:
    """Percent by which ``epsilon_central`` is below ``epsilon_central_generic``."""
    record = amplify_spec(spec, n=n, delta=delta)
    return 100 * (1 - record.epsilon_central / record.epsilon_central_generic)


def run_json(argv: list[str]) -> Any:
    result = CliRunner().invoke(app, [*argv, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def table() -> list[tuple[MechanismSpec, float, list[tuple[float, tuple[int, ...], str]]]]:
    """``(spec, delta, [(eps0, ns, cell)])`` per row of the README's table."""
    lines = [line for line in SECTION.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    columns = []
    for cell in header:
        eps0 = float(re.findall(r"ε0 = ([0-9.]+)", cell)[0])
        ns = tuple(n for n in ALL_N if n >= 10_000) if "n >= 10^4" in cell else ALL_N
        columns.append((eps0, ns))
    rows = []
    for line in lines[2:]:
        match = ROW.match(line)
        assert match, line
        mechanism, d, s, delta, rest = match.groups()
        cells = [c.strip() for c in rest.split("|")]
        assert len(cells) == len(columns), line
        spec_of = {
            eps0: MechanismSpec(mechanism=mechanism.lower(), d=int(d), s=int(s), epsilon=eps0)  # type: ignore[arg-type]
            for eps0, _ in columns
        }
        rows.append(
            (
                spec_of[columns[0][0]],
                float(delta),
                [(eps0, ns, cell) for (eps0, ns), cell in zip(columns, cells, strict=True)],
            )
        )
        for eps0, _ in columns:
            assert spec_of[eps0].t > 0
    assert len(rows) == 3
    return rows


def test_the_saving_table_is_what_the_accountant_computes() -> None:
    """Each cell, 'a%' or 'a-b%', holds every computed saving of its row and column to the
    nearest percent (n = 1,000, 10^4 and 10^6, or 10^4 and 10^6 where the column says so)."""
    for spec0, delta, cells in table():
        for eps0, ns, cell in cells:
            spec = MechanismSpec(mechanism=spec0.mechanism, d=spec0.d, s=spec0.s, epsilon=eps0)
            match = CELL.match(cell)
            assert match, cell
            lo = int(match.group(1))
            hi = int(match.group(2) or lo)
            for n in ns:
                got = saving(spec, n, delta)
                assert lo - 0.5 <= got <= hi + 0.5, (spec, n, got, cell)


def test_the_readme_privacy_example_falls_in_the_table() -> None:
    """The README's first ``coco privacy`` command line (CoCo, d = 128, s = 8, eps0 = 1),
    run as written (plus --json): its savings are in the table's cell, 20%."""
    block = README.split("## Command line", 1)[1]
    line = next(ln for ln in block.splitlines() if ln.startswith(".venv/bin/coco privacy "))
    argv = shlex.split(line)[1:]
    rows = run_json(argv)
    assert [row["n"] for row in rows] == [10_000, 1_000_000]
    assert (rows[0]["mechanism"], rows[0]["d"], rows[0]["s"]) == ("coco", 128, 8)
    assert rows[0]["epsilon_local"] == 1.0
    assert rows[0]["delta"] == 1e-8
    cell = "| CoCo, d = 128, s = 8, δ = 1e-8 (the examples above) | 12% | 20% |"
    assert cell in SECTION
    for row in rows:
        got = 100 * (1 - row["epsilon_central"] / row["epsilon_central_generic"])
        assert 19.5 <= got <= 20.5, row


def test_the_numbers_the_examples_print() -> None:
    command = "coco privacy --mechanism coco --epsilon 0.5 --s 8 --d 128 --delta 1e-8 --n 1000"
    assert f"`{command}`" in " ".join(SECTION.split())
    script = " ".join((ROOT / "scripts" / "demo").read_text().replace("\\\n", " ").split())
    assert f'"$coco" {command[5:]} --n 10000' in script  # a row of scripts/demo's command
    row = run_json(shlex.split(command)[1:])  # one --n: one object
    said = " ".join(SECTION.split())
    assert f"{row['epsilon_central']:.4f} against {row['epsilon_central_generic']:.4f}" in said
    demo = amplify_spec(MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0), n=1000, delta=1e-6)
    assert f"{demo.epsilon_central:.4f} against {demo.epsilon_central_generic:.4f}" in said
    at_4 = [
        saving(MechanismSpec(mechanism=m, d=d, s=s, epsilon=4.0), 1000, delta)  # type: ignore[arg-type]
        for m, d, s, delta in (("coco", 128, 8, 1e-8), ("collision", 128, 8, 1e-8))
    ]
    assert "53-54% (d = 128)" in said
    assert all(52.5 <= v <= 54.5 for v in at_4), at_4
    small = saving(MechanismSpec(mechanism="coco", d=6, s=2, epsilon=4.0), 1000, 1e-6)
    assert "or 27% (d = 6)" in said
    assert 26.5 <= small <= 27.5, small
