"""The import layers of docs/architecture.md, checked on every import in the tree.

Every ``import`` and ``from ... import`` statement is read with :mod:`ast` (those inside
functions and ``TYPE_CHECKING`` blocks too, relative ones resolved), so a lazy import cannot
slip past. The rules:

* the packages form layers: ``edge`` at the ground; ``broker`` and ``aggregator`` beside each
  other on it, importing neither each other nor anything above; ``sim`` above them; no
  product package imports ``tests`` or ``bench``;
* a pure core imports no I/O, network, MQTT, metrics or logging library, and none of its
  package's shell modules;
* inside ``aggregator``, each package imports only the packages its ``__init__`` allows
  (aggregator/__init__.py): the estimators, the accountant and the live page nothing else of
  it, the ledger only the accountant and ``durable``, the service's core none of its shell.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("edge", "broker", "aggregator", "sim")

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "edge": ("broker", "aggregator", "sim", "tests", "bench"),
    "broker": ("aggregator", "sim", "tests", "bench"),
    "aggregator": ("broker", "sim", "tests", "bench"),
    "sim": ("tests", "bench"),
}
"""Top-level package -> the top-level packages it must never import."""

IO_LIBRARIES = (
    "asyncio",
    "aiomqtt",
    "gmqtt",
    "paho",
    "socket",
    "http",
    "subprocess",
    "prometheus_client",
    "logging",
    "typer",
)
"""What a pure core must not import: it takes events and returns effects or values."""

LEDGER_SHELL = (
    "aggregator.ledger.ledger_file",
    "aggregator.ledger.accountant_process",
    "aggregator.ledger.privacy_cli",
)

FLEET_SHELL = ("sim.fleet.run", "sim.fleet.pool", "sim.fleet.connection", "sim.fleet.cli")
"""The fleet's modules that connect and publish."""

CORES: dict[str, tuple[str, ...]] = {
    # module (or package prefix) -> the shell modules or packages it must not import
    "edge.device": ("edge.publisher", "edge.publisher_link", "edge.device_cli"),
    "edge.codec": ("edge.publisher", "edge.publisher_link", "edge.device_cli"),
    "edge.participation": ("edge.publisher", "edge.publisher_link", "edge.device_cli"),
    "edge.defaults": ("edge.cli_options", "edge.publisher", "edge.device_cli"),
    "edge.budget": ("edge.ledger", "edge.publisher", "edge.publisher_link", "edge.device_cli"),
    "broker.core": ("broker.store", "broker.service"),
    "aggregator.service.core": (
        "aggregator.service.service",
        "aggregator.service.session",
        "aggregator.service.cli",
    ),
    "aggregator.estimation": ("aggregator.service",),
    "aggregator.accountant": ("aggregator.service",),
    "aggregator.series": ("aggregator.service",),
    "aggregator.ledger.privacy_ledger": ("aggregator.service", *LEDGER_SHELL),
    "aggregator.ledger.participations": ("aggregator.service", *LEDGER_SHELL),
    "aggregator.ledger.levels": ("aggregator.service", *LEDGER_SHELL),
    "aggregator.ledger.records": ("aggregator.service", *LEDGER_SHELL),
    "aggregator.ledger.timeline": ("aggregator.service", *LEDGER_SHELL),
    "aggregator.page.truth": ("aggregator.service",),
    "aggregator.page.series_plot": ("aggregator.service",),
    "sim.fleet.draws": FLEET_SHELL,
    "sim.fleet.reporting": FLEET_SHELL,
}
"""Pure cores, each with the shell modules it must not reach."""

AGGREGATOR_PACKAGES: dict[str, tuple[str, ...]] = {
    # a package of the aggregator -> the only modules of the aggregator it may import
    "aggregator.estimation": ("aggregator.estimation",),
    "aggregator.accountant": ("aggregator.accountant",),
    "aggregator.durable": (),
    "aggregator.series": ("aggregator.series", "aggregator.estimation"),
    "aggregator.page": ("aggregator.page",),
    "aggregator.ledger": ("aggregator.ledger", "aggregator.accountant", "aggregator.durable"),
    "aggregator.service.core": (
        "aggregator.service.core",
        "aggregator.estimation",
        "aggregator.series",
        "aggregator.ledger.privacy_ledger",
        "aggregator.ledger.levels",
    ),
}
"""The aggregator's packages (aggregator/__init__.py and each package's ``__init__``); the
service's shell may import any of them, and none of them the shell."""


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import statement in ``path``."""
    name = module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target
            # ``from package import module`` imports the module too
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(root: Path) -> list[str]:
    found: list[str] = []
    for top in PRODUCT:
        for path in sorted((root / top).rglob("*.py")):
            name = module_name(path, root)
            cores = [c for c in CORES if within(name, c)]
            packages = [p for p in AGGREGATOR_PACKAGES if within(name, p)]
            allowed = AGGREGATOR_PACKAGES[max(packages, key=len)] if packages else ("aggregator",)
            for line, target in imports_of(path, root):
                where = f"{path.relative_to(root)}:{line}"
                found += [
                    f"{where}: {top} imports {target}"
                    for banned in FORBIDDEN[top]
                    if within(target, banned)
                ]
                for core in cores:
                    found += [
                        f"{where}: the core {core} imports {target}"
                        for banned in (*IO_LIBRARIES, *CORES[core])
                        if within(target, banned)
                    ]
                if (
                    within(target, "aggregator")
                    and target != "aggregator"
                    and not any(within(target, a) for a in allowed)
                ):
                    found.append(f"{where}: {max(packages, key=len)} imports {target}")
    return sorted(set(found))


def test_the_tree_keeps_its_layers() -> None:
    assert violations(ROOT) == []


def test_every_core_named_exists() -> None:
    for core in CORES:
        path = ROOT.joinpath(*core.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), core


@pytest.mark.parametrize(
    ("where", "source", "expected"),
    [
        ("edge/x.py", "from aggregator.estimation import estimators\n", "edge imports aggregator"),
        ("broker/x.py", "def f():\n    import sim.cli\n", "broker imports sim.cli"),
        ("aggregator/x.py", "from broker.core import Core\n", "aggregator imports broker"),
        ("sim/x.py", "import tests.waiting\n", "sim imports tests"),
        ("broker/core/machine.py", "import asyncio\n", "the core broker.core imports asyncio"),
        (
            "broker/core/machine.py",
            "from ..service import shuffler\n",
            "imports broker.service.shuffler",
        ),
        (
            "aggregator/accountant/y.py",
            "from ..service import x\n",
            "imports aggregator.service",
        ),
        (
            "aggregator/ledger/y.py",
            "from aggregator.service.config import C\n",
            "aggregator.ledger imports aggregator.service.config",
        ),
        (
            "aggregator/service/core/y.py",
            "def f():\n    from aggregator.service import http\n",
            "aggregator.service.core imports aggregator.service.http",
        ),
        ("aggregator/page/y.py", "import aggregator.estimation\n", "imports aggregator.estimation"),
        ("aggregator/ledger/levels.py", "import typer\n", "the core aggregator.ledger.levels"),
    ],
)
def test_a_forbidden_import_is_found(
    tmp_path: Path, where: str, source: str, expected: str
) -> None:
    for top in PRODUCT:
        (tmp_path / top).mkdir()
    target = tmp_path / where
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(source)
    found = violations(tmp_path)
    assert any(expected in line for line in found), found
