"""The layout of every ``coco ... --help``: nothing cut at any width, 80 columns included.

typer draws the options as a rich table whose cells end a line with "…" where a word is
wider than its column: at 80 columns that cut defaults (``[default: mqtt://127.0.0.1:1…``),
environment variables and option names. :func:`install` makes every cell fold such a word
onto the next line instead, the first time a help is drawn (rich is imported then, not for
every command's start). The columns keep rich's widths: where the option names, a negative
form and a type cannot all fit beside the help text (``coco fleet``'s
``--credentials-secret-file``), a name is folded too, whole over two lines.

typer has no setting for this, so its table and column classes are replaced by subclasses
(:mod:`typer.rich_utils` looks them up by name when it draws); tests/sim/test_cli_help.py
checks every command's help at 80 columns, so a typer that draws otherwise fails there.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand, TyperGroup

_installed = False


def _fold_tables() -> None:
    """Swap typer's ``Table`` and ``Columns`` for the folding ones (once)."""
    global _installed  # noqa: PLW0603 (one switch for the process)
    if _installed:
        return
    from rich.columns import Columns  # noqa: PLC0415 (only when a help is drawn)
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415
    from typer import rich_utils  # noqa: PLC0415

    class FoldingTable(Table):
        """A table whose cells fold a word wider than their column, never cut it."""

        def add_row(self, *renderables: Any, **kwargs: Any) -> None:
            super().add_row(*renderables, **kwargs)
            for column in self.columns:
                column.overflow = "fold"

    class FoldingColumns(Columns):
        """The pieces of one option's help (text, env var, default), folded, never cut."""

        def __init__(self, renderables: Any = None, *args: Any, **kwargs: Any) -> None:
            for renderable in renderables or ():
                if isinstance(renderable, Text):
                    renderable.overflow = "fold"
            super().__init__(renderables, *args, **kwargs)

    setattr(rich_utils, "Table", FoldingTable)  # noqa: B010 (not exported: typer's own name)
    setattr(rich_utils, "Columns", FoldingColumns)  # noqa: B010
    _installed = True


def install() -> None:
    """Have every typer command fold its help instead of cutting it (the entry point calls
    this once; drawing a help then swaps the table classes)."""
    for cls in (TyperCommand, TyperGroup):
        original = cls.format_help
        if getattr(original, "_coco_folding", False):
            continue

        def format_help(self: Any, ctx: Any, formatter: Any, _original: Any = original) -> None:
            _fold_tables()
            _original(self, ctx, formatter)

        format_help._coco_folding = True  # type: ignore[attr-defined]
        cls.format_help = format_help  # type: ignore[method-assign]
