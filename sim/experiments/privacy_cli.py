"""``coco experiment amplification`` and ``coco experiment tightness``: the privacy figures.

Thin commands over :func:`sim.experiments.amplification.run_amplification` and
:func:`sim.experiments.tightness_report.run_tightness`. With ``--update-doc`` the markdown summary
the run writes is also pasted into the given file between
``<!-- <name>-summary:begin -->`` and ``<!-- <name>-summary:end -->`` (so the numbers in
docs/results.md are the ones the command computed, never typed by hand).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["amplification", "paste_summary", "tightness"]

DEFAULT_OUT = Path("docs/results")

OutOption = Annotated[
    Path, typer.Option("--out", help="Directory for the CSV, PNG and markdown files.")
]
FullOption = Annotated[
    bool, typer.Option("--full", help="The fine grid (minutes) instead of the quick default.")
]
SeedOption = Annotated[int, typer.Option(help="Seed of the whole run (results depend on it only).")]
QuietOption = Annotated[bool, typer.Option("--quiet", help="No progress on stderr.")]
UpdateDocOption = Annotated[
    Path | None,
    typer.Option(
        help="Also paste the summary into this markdown file, between its "
        "<!-- NAME-summary:begin/end --> markers (NAME: amplification or tightness)."
    ),
]


def _markers(doc: Path, name: str) -> tuple[str, int, int]:
    begin, end = f"<!-- {name}-summary:begin -->", f"<!-- {name}-summary:end -->"
    text = doc.read_text()
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"{doc} has no {begin} ... {end} markers")
    return text, i + len(begin), j


def paste_summary(doc: Path, name: str, summary: str) -> None:
    """Replace the text between ``<!-- {name}-summary:begin/end -->`` in ``doc``.

    Raises ``ValueError`` when the markers are missing or out of order (nothing is written).
    """
    text, i, j = _markers(doc, name)
    doc.write_text(text[:i] + "\n" + summary.rstrip("\n") + "\n" + text[j:])


def _finish(name: str, paths: list[Path], summary_name: str, doc: Path | None, t0: float) -> None:
    if doc is not None:
        paste_summary(doc, name, (paths[0].parent / summary_name).read_text())
    for path in paths:
        typer.echo(str(path))
    typer.echo(f"{name}: {time.monotonic() - t0:.0f} s; {len(paths)} files", err=True)


def amplification(
    out: OutOption = DEFAULT_OUT,
    full: FullOption = False,
    seed: SeedOption = 1,
    update_doc: UpdateDocOption = None,
    quiet: QuietOption = False,
) -> None:
    """Amplification comparison (the paper's Figure "shuffle"): eps0 / epsilon_c vs eps0.

    Certified privacy-blanket bound (reported) and generic stronger clone, the paper's
    mechanism-specific bound (invalid) and the EFMRTT19 / FMT21 closed forms for n in
    {1e4, 1e5} and s in {4, 64}. Deterministic: ``--seed`` is accepted for symmetry with the
    other experiments and unused.
    """
    del seed  # no randomness
    t0 = time.monotonic()
    try:
        if update_doc is not None:
            _markers(update_doc, "amplification")  # fail before the work, not after
        # imported here: scipy and matplotlib are not needed for `--help`
        from sim.experiments.amplification import SUMMARY_NAME, run_amplification  # noqa: PLC0415

        paths = run_amplification(out, full=full, progress=not quiet)
        _finish("amplification", paths, SUMMARY_NAME, update_doc, t0)
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def tightness(
    out: OutOption = DEFAULT_OUT,
    full: FullOption = False,
    seed: SeedOption = 1,
    update_doc: UpdateDocOption = None,
    quiet: QuietOption = False,
) -> None:
    """Tightness audit on the paper's worst-case neighbouring datasets.

    Exact and simulated hockey-stick divergence of the shuffled Collision output on the
    lower-bound theorem's construction, against the certified delta and the paper's
    (uncertified) mechanism-specific delta.
    """
    t0 = time.monotonic()
    try:
        if update_doc is not None:
            _markers(update_doc, "tightness")  # fail before the work, not after
        from sim.experiments.tightness_report import SUMMARY_NAME, run_tightness  # noqa: PLC0415

        paths = run_tightness(out, full=full, seed=seed, progress=not quiet)
        _finish("tightness", paths, SUMMARY_NAME, update_doc, t0)
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
