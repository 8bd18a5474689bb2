"""The aggregator's packages import only what their docstrings allow (aggregator/__init__.py
and each package's ``__init__``): the estimators, the accountant and the live page nothing
else of the aggregator, the ledger nothing of the service, the service's core no I/O and
nothing of its shell. Read from the source: every import, lazy and type-only ones too."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted((ROOT / "aggregator").rglob("*.py"))

NO_IO = frozenset({
    "asyncio", "concurrent", "fcntl", "http", "io", "logging", "multiprocessing", "os",
    "select", "selectors", "shutil", "signal", "socket", "sqlite3", "subprocess", "tempfile",
    "threading", "time", "urllib",
})  # fmt: skip
"""Standard modules of files, sockets, processes, threads, clocks and logs."""


@dataclass(frozen=True)
class Rule:
    own: tuple[str, ...]
    """The modules of the aggregator it may import (and their submodules)."""
    others: frozenset[str] | None
    """The packages outside the aggregator and the standard library it may import (``None``:
    any)."""
    banned: frozenset[str] = frozenset()
    """The modules of the standard library it may not import."""


NUMPY = frozenset({"edge", "numpy"})
PURE_LEDGER = ("aggregator.ledger.privacy_ledger", "aggregator.ledger.levels")
RULES = {
    "aggregator": Rule(("aggregator",), None),  # the service's shell, below
    "aggregator.estimation": Rule(("aggregator.estimation",), NUMPY),
    "aggregator.accountant": Rule(
        ("aggregator.accountant",), NUMPY | {"scipy", "dp_accounting", "mpmath"}
    ),
    "aggregator.durable": Rule((), frozenset()),
    "aggregator.page": Rule(("aggregator.page",), NUMPY),
    "aggregator.ledger": Rule(
        ("aggregator.ledger", "aggregator.accountant", "aggregator.durable"),
        frozenset({"edge", "typer"}),
    ),
    # a ledger names itself with os.urandom: no other I/O
    **dict.fromkeys(
        PURE_LEDGER,
        Rule((*PURE_LEDGER, "aggregator.accountant"), frozenset({"edge"}), NO_IO - {"os"}),
    ),
    "aggregator.service.core": Rule(
        ("aggregator.service.core", "aggregator.estimation", *PURE_LEDGER), NUMPY, NO_IO
    ),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def rule_of(module: str) -> Rule:
    return RULES[max((p for p in RULES if within(module, (p,))), key=len)]


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, wherever the statement is."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            assert node.module is not None
            for alias in node.names:  # a submodule, or a name of the module
                submodule = f"{node.module}.{alias.name}"
                out.add(submodule if is_module(submodule) else node.module)
    return out


def not_allowed(module: str, names: set[str]) -> set[str]:
    rule = rule_of(module)
    wrong = set()
    for name in names:
        top = name.split(".")[0]
        if top == "aggregator":
            if not within(name, rule.own):
                wrong.add(name)
        elif top in sys.stdlib_module_names:
            if top in rule.banned:
                wrong.add(name)
        elif rule.others is not None and top not in rule.others:
            wrong.add(name)
    return wrong


def test_every_module_is_read() -> None:
    names = {module_name(p) for p in MODULES}
    assert {"aggregator.service.core.rules", "aggregator.ledger.privacy_ledger"} <= names
    assert len(names) > 30


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_a_module_imports_what_its_package_allows(path: Path) -> None:
    module = module_name(path)
    assert not (wrong := not_allowed(module, imported(path))), f"{module} imports {sorted(wrong)}"


def test_nothing_outside_the_service_imports_it() -> None:
    for path in MODULES:
        module = module_name(path)
        if not within(module, ("aggregator.service",)):
            assert not {n for n in imported(path) if within(n, ("aggregator.service",))}, module


def test_the_rules_catch_what_they_forbid() -> None:
    assert not_allowed("aggregator.service.core.rules", {"asyncio", "aggregator.service.http"}) == {
        "asyncio",
        "aggregator.service.http",
    }
    assert not_allowed("aggregator.ledger.ledger_file", {"aggregator.service.core.keys"})
    assert not_allowed("aggregator.estimation.estimators", {"scipy"}) == {"scipy"}
    assert not_allowed("aggregator.service.service", {"asyncio", "aiomqtt"}) == set()
