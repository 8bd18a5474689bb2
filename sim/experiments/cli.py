"""``coco experiment``: regenerate the paper's figures (CSV + PNG) from this code."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from sim.experiments.names import PAPER_ORDER
from sim.experiments.privacy_cli import amplification, tightness

experiment_app = typer.Typer(
    help="Reproduce the paper's experiments: CSV and PNG per figure (docs/results.md).",
    no_args_is_help=True,
    add_completion=False,
)

experiment_app.command("amplification")(amplification)
experiment_app.command("tightness")(tightness)

DEFAULT_OUT = Path("docs/results")


class TRuleOption(StrEnum):
    optimal = "optimal"
    paper = "paper"


OutOption = Annotated[
    Path, typer.Option("--out", help="Directory for the CSV, PNG and markdown files.")
]
FullOption = Annotated[
    bool,
    typer.Option(
        "--full",
        help="The paper's whole grid with 100 repetitions (hours; see docs/results.md) "
        "instead of the quick default.",
    ),
]
SeedOption = Annotated[int, typer.Option(help="Seed of the whole run (results depend on it only).")]
JobsOption = Annotated[
    int, typer.Option(help="Worker processes (results do not depend on it).", min=1)
]
QuietOption = Annotated[bool, typer.Option("--quiet", help="No progress on stderr.")]


@experiment_app.command("accuracy")
def accuracy(
    out: OutOption = DEFAULT_OUT,
    full: FullOption = False,
    seed: SeedOption = 1,
    repeats: Annotated[
        int | None,
        typer.Option(help="Repetitions per cell (default: 3 quick, 100 full).", min=1),
    ] = None,
    jobs: JobsOption = 1,
    mechanism: Annotated[
        list[str] | None,
        typer.Option(
            "--mechanism",
            help=f"Run only these (repeatable; default: all of {', '.join(PAPER_ORDER)}).",
        ),
    ] = None,
    n: Annotated[
        list[int] | None, typer.Option("--n", help="Only these numbers of users (repeatable).")
    ] = None,
    d: Annotated[list[int] | None, typer.Option("--d", help="Only these dimensions.")] = None,
    s: Annotated[list[int] | None, typer.Option("--s", help="Only these sparsities.")] = None,
    epsilon: Annotated[
        list[float] | None, typer.Option("--epsilon", help="Only these budgets.")
    ] = None,
    t_rule: Annotated[
        TRuleOption,
        typer.Option(help="Collision/CoCo output size t: MSE-optimal or the paper's rule."),
    ] = TRuleOption.optimal,
    update_doc: Annotated[
        Path | None,
        typer.Option(
            help="Also paste the summary into this markdown file, between its "
            "<!-- accuracy-summary:begin/end --> markers."
        ),
    ] = None,
    quiet: QuietOption = False,
) -> None:
    """Accuracy of Collision, CoCo and the paper's baselines (the paper's figures).

    Frequency and mean estimation errors (TVE, MAE, MSE; with and without the simplex
    projection) over the paper's grid: CSV, one PNG per paper figure and a markdown summary
    that checks the paper's claims.
    """
    _accuracy(
        out=out,
        full=full,
        seed=seed,
        repeats=repeats,
        jobs=jobs,
        mechanism=mechanism,
        n=n,
        d=d,
        s=s,
        epsilon=epsilon,
        t_rule=t_rule,
        update_doc=update_doc,
        quiet=quiet,
    )


CsvOption = Annotated[
    Path, typer.Option(help="The summary CSV of an accuracy run (its accuracy.csv).")
]


@experiment_app.command("figures")
def figures(
    csv: CsvOption = DEFAULT_OUT / "accuracy.csv",
    out: Annotated[
        Path | None, typer.Option(help="Directory for the PNGs (default: the CSV's directory).")
    ] = None,
    t_rule: Annotated[
        TRuleOption,
        typer.Option(help="The t rule the CSV was run with (for the closed-form ratio line)."),
    ] = TRuleOption.optimal,
) -> None:
    """Redraw the accuracy figures from an existing accuracy.csv, without rerunning the grid."""
    # Imported here: matplotlib is slow to import and every `coco` command imports this module.
    from sim.experiments.accuracy import read_csv  # noqa: PLC0415
    from sim.experiments.plots import plot_all  # noqa: PLC0415

    target = out if out is not None else csv.parent
    try:
        rows = read_csv(csv)
        target.mkdir(parents=True, exist_ok=True)
        paths = plot_all(rows, target, t_rule=t_rule.value)
    except (ValueError, OSError, KeyError) as exc:
        typer.echo(f"error: cannot redraw the figures of {csv}: {exc}", err=True)
        raise typer.Exit(1) from None
    for path in paths:
        typer.echo(str(path))


@experiment_app.command("caveats")
def caveats(
    csv: CsvOption = DEFAULT_OUT / "accuracy.csv",
    seed: Annotated[
        int, typer.Option(help="The seed the CSV was run with (its populations are redrawn).")
    ] = 1,
    update_doc: Annotated[
        Path | None,
        typer.Option(
            help="Paste the tables into this markdown file, between its "
            "<!-- caveats-summary:begin/end --> markers, instead of printing them."
        ),
    ] = None,
) -> None:
    """Exact budgets of PrivKV and PCKV-GRR, Collision against them at equal exact epsilon,
    and the constant answers (means 0) against every mechanism, for an accuracy run."""
    # Imported here: the experiments' modules are slow to import.
    from sim.experiments import accuracy_report  # noqa: PLC0415
    from sim.experiments import caveats as caveats_report  # noqa: PLC0415
    from sim.experiments.accuracy import read_csv  # noqa: PLC0415

    markers = {"begin": caveats_report.BEGIN_MARKER, "end": caveats_report.END_MARKER}
    try:
        if update_doc is not None:
            accuracy_report.check_markers(update_doc, **markers)
        text = caveats_report.render(read_csv(csv), seed=seed)
        if update_doc is None:
            typer.echo(text)
        else:
            accuracy_report.paste_into(update_doc, text, **markers)
    except (ValueError, OSError, KeyError) as exc:
        typer.echo(f"error: caveats of {csv}: {exc}", err=True)
        raise typer.Exit(1) from None


UpdateDocOption = Annotated[
    Path | None,
    typer.Option(
        help="Also paste each summary into this markdown file, between its "
        "<!-- NAME-summary:begin/end --> markers (NAME: accuracy, amplification, tightness)."
    ),
]


@experiment_app.command("all")
def all_experiments(
    out: OutOption = DEFAULT_OUT,
    full: FullOption = False,
    seed: SeedOption = 1,
    jobs: JobsOption = 1,
    update_doc: UpdateDocOption = None,
    quiet: QuietOption = False,
) -> None:
    """Every experiment: accuracy, amplification, tightness (docs/results.md)."""
    _accuracy(out=out, full=full, seed=seed, jobs=jobs, update_doc=update_doc, quiet=quiet)
    amplification(out=out, full=full, seed=seed, update_doc=update_doc, quiet=quiet)
    tightness(out=out, full=full, seed=seed, update_doc=update_doc, quiet=quiet)


def _accuracy(
    *,
    out: Path,
    full: bool,
    seed: int,
    jobs: int,
    quiet: bool,
    update_doc: Path | None,
    repeats: int | None = None,
    mechanism: list[str] | None = None,
    n: list[int] | None = None,
    d: list[int] | None = None,
    s: list[int] | None = None,
    epsilon: list[float] | None = None,
    t_rule: TRuleOption = TRuleOption.optimal,
) -> None:
    # not for --help: the experiments bring numpy and the baselines
    from sim.experiments.accuracy import (  # noqa: PLC0415
        FULL_GRID,
        QUICK_GRID,
        run_accuracy,
        with_overrides,
    )

    try:
        grid = with_overrides(
            FULL_GRID if full else QUICK_GRID,
            repeats=repeats,
            mechanisms=mechanism,
            ns=n,
            ds=d,
            ss=s,
            epsilons=epsilon,
        )
        axes = {"--n": n, "--d": d, "--s": s, "--epsilon": epsilon, "--mechanism": mechanism}
        command = _command_line(
            out=out,
            full=full,
            seed=seed,
            repeats=repeats,
            jobs=jobs,
            axes=axes,
            t_rule=t_rule.value,
            update_doc=update_doc,
        )
        result = run_accuracy(
            out,
            grid=grid,
            seed=seed,
            jobs=jobs,
            t_rule=t_rule.value,
            progress=not quiet,
            command=command,
            update_doc=update_doc,
        )
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    for path in result.paths:
        typer.echo(str(path))
    typer.echo(f"accuracy: {result.seconds:.0f} s; {len(result.paths)} files in {out}", err=True)


def _command_line(
    *,
    out: Path,
    full: bool,
    seed: int,
    repeats: int | None,
    jobs: int,
    axes: Mapping[str, Sequence[object] | None],
    t_rule: str,
    update_doc: Path | None,
) -> str:
    """The options of this run as a command that reproduces it (recorded in the summary)."""
    parts = ["coco experiment accuracy"]
    if full:
        parts.append("--full")
    parts.append(f"--out {os.fspath(out)}")
    parts.append(f"--seed {seed}")
    if repeats is not None:
        parts.append(f"--repeats {repeats}")
    for flag, values in axes.items():
        parts.extend(f"{flag} {v}" for v in values or [])
    if t_rule != "optimal":
        parts.append(f"--t-rule {t_rule}")
    if jobs != 1:
        parts.append(f"--jobs {jobs}")
    if update_doc is not None:
        parts.append(f"--update-doc {os.fspath(update_doc)}")
    return " ".join(parts)
