"""docs/architecture.md stays true: its picture is what its source draws, and every module
and test its guarantee table names exists."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_architecture", ROOT / "docs" / "gen_architecture.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def test_the_svg_is_what_its_source_draws() -> None:
    gen = generator()
    committed = (ROOT / "docs" / "architecture.svg").read_text(encoding="utf-8")
    assert committed == gen.render(gen.picture()), "run: .venv/bin/python docs/gen_architecture.py"


def test_the_picture_stays_on_its_canvas() -> None:
    gen = generator()
    picture = gen.picture()
    for box in picture.boxes:
        assert box.x >= 0, box.title
        assert box.x + box.w <= gen.WIDTH, box.title
        assert box.y >= 0, box.title
        assert box.y + box.h <= gen.HEIGHT, box.title
        inside = [
            z
            for z in picture.zones
            if z.x <= box.x
            and box.x + box.w <= z.x + z.w
            and z.y <= box.y
            and box.y + box.h <= z.y + z.h
        ]
        assert len(inside) == 1, f"{box.title} is not inside exactly one trust boundary"


def guarantee_rows() -> list[tuple[str, str, str]]:
    text = DOC.read_text(encoding="utf-8")
    table = text.split("## Where each guarantee is enforced", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("guarantee", "---"):
            rows.append((cells[0], cells[1], cells[2]))
    return rows


def test_the_guarantee_table_names_modules_and_tests_that_exist() -> None:
    rows = guarantee_rows()
    assert len(rows) >= 10
    for guarantee, enforced, proven in rows:
        modules = re.findall(r"`([\w/]+\.py)`", enforced)
        assert modules, f"{guarantee}: no module named"
        for module in modules:
            assert (ROOT / module).is_file(), f"{guarantee}: {module} does not exist"
        tests = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", proven)
        assert tests, f"{guarantee}: no test named"
        for path, name in tests:
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            defined = {
                node.name
                for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            assert name in defined, f"{guarantee}: {path} has no {name}"


def test_the_readme_links_the_architecture_first() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert links[:1] == ["docs/architecture.md"]
