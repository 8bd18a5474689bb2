"""The project's reference tables (docs/reference/, docs/reference.md): the accountant
recomputes them, and they agree with the independent tables next to the repository.

The independent tables (``../shared/reference``, a separate implementation) are not part of
a clone: :func:`tests.aggregator.reference.reference_rows` skips those comparisons with the
reason where they are absent, and fails them under ``CI=true``.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.aggregator.reference import ROOT, docs_rows, reference_rows

Row = dict[str, str]


def generator() -> ModuleType:
    """``docs/gen_reference.py``, imported from its path (docs/ is not a package)."""
    path = ROOT / "docs" / "gen_reference.py"
    spec = importlib.util.spec_from_file_location("gen_reference", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def number(text: str) -> float | None:
    return None if text == "NA" else float(text)


def close(a: str, b: str, *, rel: float) -> bool:
    if a == b:
        return True
    x, y = number(a), number(b)
    if x is None or y is None:
        return x is y
    return math.isclose(x, y, rel_tol=rel, abs_tol=1e-15)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["amplification.tsv", "amplification-blanket.tsv", "composition-blanket.tsv"]
)
def test_the_accountant_recomputes_the_documented_tables(name: str) -> None:
    """Every row, every column, to 1e-6 relative: the files print ten digits of searches run
    to 1e-9 or finer, so a platform's last digits pass and any change a reader would see
    fails (then rerun ``docs/gen_reference.py``)."""
    gen = generator()
    columns, rows = gen.TABLES[name]
    produce: Callable[[], Iterator[Row]] = rows
    documented = docs_rows(name)
    computed = list(produce())
    assert len(computed) == len(documented)
    assert list(documented[0]) == list(columns)
    for want, got in zip(documented, computed, strict=True):
        for column in columns:
            assert close(want[column], got[column], rel=1e-6), (column, want, got)


def _key(row: Row, *names: str) -> tuple[float, ...]:
    return tuple(round(float(row[name]), 12) for name in names)


def test_generic_bound_agrees_with_the_independent_table() -> None:
    """The generic stronger-clone bound within 3e-7 of the independent values (their
    stated precision is about 1e-7) and never more than 1e-6 below (both are upper ends of
    search brackets); the closed forms and the clone probability to 1e-9."""
    ours = {_key(r, "eps0", "n", "delta"): r for r in docs_rows("amplification.tsv")}
    theirs = {_key(r, "eps0", "n", "delta"): r for r in reference_rows("amplification.tsv")}
    assert set(ours) == set(theirs)
    for key, ref in theirs.items():
        row = ours[key]
        got, want = float(row["eps_c_stronger_clone"]), float(ref["eps_c_stronger_clone"])
        assert abs(got - want) <= 3e-7 + 1e-9, (key, got, want)
        for column in ("eps_c_fmt21_closed_form", "eps_c_efmrtt19", "alpha_clone"):
            assert close(row[column], ref[column], rel=1e-9), (key, column)


def test_blanket_bound_agrees_with_the_independent_table() -> None:
    """The blanket bound within 1e-6 relative of the independent values (rounded to 7
    digits), the generic one too, and the lower bound where both have it."""
    names = ("eps0", "s", "t", "n")
    ours = {(r["mechanism"], *_key(r, *names)): r for r in docs_rows("amplification-blanket.tsv")}
    theirs = reference_rows("amplification-blanket.tsv")
    assert len(theirs) == len(ours)
    for ref in theirs:
        row = ours[(ref["mechanism"], *_key(ref, *names))]
        for column in ("eps_c_blanket", "eps_c_generic"):
            assert close(row[column], ref[column], rel=1e-6), (column, row, ref)
        if row["eps_c_lower"] != "NA":
            assert close(row["eps_c_lower"], ref["eps_c_lower"], rel=1e-6), (row, ref)
            assert float(row["eps_c_lower"]) <= float(row["eps_c_blanket"])


def test_composition_agrees_with_the_independent_table() -> None:
    """Within 1% (both pessimistic PLD compositions, discretised differently)."""
    names = ("eps0", "s", "t", "n", "rounds")
    ours = {_key(r, *names): r for r in docs_rows("composition-blanket.tsv")}
    theirs = reference_rows("composition-blanket.tsv")
    assert len(theirs) == len(ours)
    for ref in theirs:
        row = ours[_key(ref, *names)]
        assert close(row["eps_total"], ref["eps_total"], rel=0.01), (row, ref)


def test_a_missing_independent_table_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Outside CI it skips with the reason; with ``CI=true`` it fails, saying where the table
    is expected."""
    from tests.aggregator import reference  # noqa: PLC0415

    monkeypatch.setattr(reference, "REFERENCE_DIR", tmp_path / "absent")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"\.\./shared/reference/amplification"):
        reference.reference_rows("amplification.tsv")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: the comparison must run"):
        reference.reference_rows("amplification.tsv")
