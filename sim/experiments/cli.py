"""``coco experiment``: regenerate the paper's figures (CSV + PNG) from this code."""

from __future__ import annotations

import typer

experiment_app = typer.Typer(
    help="Reproduce the paper's experiments: CSV and PNG per figure (docs/results.md).",
    no_args_is_help=True,
)
