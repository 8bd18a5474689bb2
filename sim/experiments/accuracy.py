"""The accuracy experiments of the paper (section "Experiments"): a seeded grid runner.

A grid is a set of ``(n, d)`` configurations crossed with sparsities ``s``, budgets ``eps``
and repetitions. One *task* is ``(n, d, s, eps, repeat)``: it draws the population of
``(n, d, s, repeat)`` (:func:`sim.experiments.data.uniform_population`; the same population
for every ``eps`` and mechanism of that repeat, so comparisons are paired), runs every
mechanism on it once and measures every metric of :mod:`sim.experiments.metrics`.

Randomness: the population of a task comes from ``SeedSequence(seed, spawn_key=(n, d, s,
repeat))`` and each mechanism's randomness from ``SeedSequence(seed, spawn_key=(n, d, s,
repeat, round(eps * 1e6), crc32(name)))``. Results therefore depend only on the seed and the
cell, not on the grid around it, the order of tasks or the number of worker processes.

Outputs (in ``out``): ``accuracy-raw.csv`` (one row per repeat and metric),
``accuracy.csv`` (one row per cell and metric: the paper's statistic, the mean of the natural
logarithm over repetitions, with its standard error, and the plain mean with its standard
error), ``accuracy-timing.csv`` (seconds per mechanism run), the figures of
:mod:`sim.experiments.plots` and ``accuracy-summary.md`` (:mod:`sim.experiments.accuracy_report`).
"""

from __future__ import annotations

import csv
import math
import multiprocessing
import sys
import time
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from numpy.typing import NDArray

from edge import CocoError
from sim.experiments.baselines.base import KVEstimate
from sim.experiments.data import uniform_population
from sim.experiments.mechanisms import TRule, registry
from sim.experiments.metrics import estimate_errors
from sim.experiments.names import PAPER_ORDER

RAW_FIELDS = (
    "mechanism",
    "n",
    "d",
    "s",
    "epsilon",
    "repeat",
    "target",
    "projected",
    "metric",
    "value",
)
SUMMARY_FIELDS = (
    "mechanism",
    "n",
    "d",
    "s",
    "epsilon",
    "target",
    "projected",
    "metric",
    "repeats",
    "mean_ln",
    "se_ln",
    "geo_mean",
    "mean",
    "se",
)
TIMING_FIELDS = ("mechanism", "n", "d", "s", "epsilon", "repeat", "seconds")
PAPER_EPSILONS = (0.001, 0.01, 0.1, 0.2, 0.4, 0.8, 1.0, 1.5, 2.0)
"""The budgets listed in the paper's section "Experiments"."""


@dataclass(frozen=True, kw_only=True)
class Grid:
    """The cells to run: ``configs`` (pairs ``(n, d)``) x ``ss`` x ``epsilons``, ``repeats``
    times each, for ``mechanisms`` (names of :func:`sim.experiments.mechanisms.registry`)."""

    configs: tuple[tuple[int, int], ...]
    ss: tuple[int, ...]
    epsilons: tuple[float, ...]
    repeats: int
    mechanisms: tuple[str, ...] = PAPER_ORDER

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if not (self.configs and self.ss and self.epsilons and self.mechanisms):
            raise ValueError("a grid needs at least one configuration, s, epsilon and mechanism")
        for n, d in self.configs:
            if n < 1 or d < 1:
                raise ValueError(f"need n >= 1 and d >= 1, got n={n}, d={d}")
            for s in self.ss:
                if not 1 <= s <= d:
                    raise ValueError(f"need 1 <= s <= d, got s={s}, d={d}")
        for eps in self.epsilons:
            if not (eps > 0 and math.isfinite(eps)):
                raise ValueError(f"epsilon must be > 0, got {eps}")

    def tasks(self) -> list[Task]:
        """Every task, the most expensive (largest ``n d``) first for load balance."""
        out = [
            Task(n=n, d=d, s=s, epsilon=eps, repeat=r)
            for n, d in self.configs
            for s in self.ss
            for eps in self.epsilons
            for r in range(self.repeats)
        ]
        out.sort(key=lambda t: (-t.n * t.d, -t.s, t.epsilon, t.repeat))
        return out

    def describe(self) -> str:
        configs = ", ".join(f"(n={n}, d={d})" for n, d in self.configs)
        return (
            f"{configs}; s in {list(self.ss)}; eps in {list(self.epsilons)}; "
            f"{self.repeats} repetition(s); {len(self.mechanisms)} mechanisms"
        )


PAPER_CONFIGS: tuple[tuple[int, int], ...] = ((100_000, 256), (100_000, 512), (10_000, 256))
"""The ``(n, d)`` pairs of the paper's figures."""

FULL_GRID = Grid(
    configs=((100_000, 256), (100_000, 512), (10_000, 256), (10_000, 512)),
    ss=(4, 8, 16, 32),
    epsilons=PAPER_EPSILONS,
    repeats=100,
)
"""The paper's grid: n in {1e4, 1e5} x d in {256, 512} x s x every listed eps, 100 repeats."""

QUICK_GRID = Grid(
    configs=PAPER_CONFIGS,
    ss=(4, 8, 16, 32),
    epsilons=(0.1, 0.2, 0.4, 0.8, 1.0, 1.5, 2.0),
    repeats=3,
)
"""The default: every configuration of the paper's figures and every budget from 0.1 to 2,
three repetitions (a few minutes; docs/results.md)."""


@dataclass(frozen=True, kw_only=True, order=True)
class Task:
    """One population and one budget: every mechanism of the grid runs once on it."""

    n: int
    d: int
    s: int
    epsilon: float
    repeat: int


def _eps_key(epsilon: float) -> int:
    return round(epsilon * 1_000_000)


def _name_key(name: str) -> int:
    return zlib.crc32(name.encode())


def population_seed(seed: int, task: Task) -> np.random.SeedSequence:
    """The seed of the population of ``(n, d, s, repeat)`` (shared by every ``eps``)."""
    return np.random.SeedSequence(seed, spawn_key=(task.n, task.d, task.s, task.repeat))


def mechanism_seed(seed: int, task: Task, name: str) -> np.random.SeedSequence:
    """The seed of mechanism ``name``'s randomness in ``task``."""
    key = (task.n, task.d, task.s, task.repeat, _eps_key(task.epsilon), _name_key(name))
    return np.random.SeedSequence(seed, spawn_key=key)


@dataclass(frozen=True)
class TaskResult:
    task: Task
    rows: list[dict[str, Any]]
    timings: list[dict[str, Any]]
    skipped: list[str] = field(default_factory=list)


def run_task(task: Task, *, seed: int, mechanisms: Sequence[str], t_rule: TRule) -> TaskResult:
    """Run every mechanism once on the population of ``task`` and measure its errors."""
    factories = registry(t_rule)
    pop = uniform_population(
        task.n, task.d, task.s, np.random.default_rng(population_seed(seed, task))
    )
    true_freq, true_mean = pop.item_frequencies(), pop.means()
    cell = {"n": task.n, "d": task.d, "s": task.s, "epsilon": task.epsilon}
    rows: list[dict[str, Any]] = []
    timings: list[dict[str, Any]] = []
    skipped: list[str] = []
    for name in mechanisms:
        try:
            mech = factories[name](task.d, task.s, task.epsilon)
        except (ValueError, CocoError) as exc:
            skipped.append(
                f"{name} at n={task.n}, d={task.d}, s={task.s}, eps={task.epsilon}: {exc}"
            )
            continue
        rng = np.random.default_rng(mechanism_seed(seed, task, name))
        start = time.perf_counter()
        est = mech.run(pop.keys, pop.signs, rng)
        seconds = time.perf_counter() - start
        timings.append({"mechanism": name, **cell, "repeat": task.repeat, "seconds": seconds})
        rows += error_rows(name, task, est, true_freq=true_freq, true_mean=true_mean)
    return TaskResult(task, rows, timings, skipped)


def error_rows(
    name: str,
    task: Task,
    estimate: KVEstimate,
    *,
    true_freq: NDArray[np.float64],
    true_mean: NDArray[np.float64],
) -> list[dict[str, Any]]:
    """The raw CSV rows (:data:`RAW_FIELDS`) of every metric of ``estimate`` in ``task``."""
    cell = {"n": task.n, "d": task.d, "s": task.s, "epsilon": task.epsilon}
    return [
        {
            "mechanism": name,
            **cell,
            "repeat": task.repeat,
            "target": rec.target,
            "projected": int(rec.projected),
            "metric": rec.metric,
            "value": rec.value,
        }
        for rec in estimate_errors(estimate, true_freq=true_freq, true_mean=true_mean, s=task.s)
    ]


class Progress:
    """Completed tasks, elapsed time and an estimate of the time left, on ``stream``."""

    def __init__(self, total: int, *, stream: TextIO | None, label: str = "accuracy") -> None:
        self.total = total
        self.done = 0
        self.stream = stream
        self.label = label
        self.start = time.perf_counter()
        self._last_print = -1.0
        self._tty = bool(stream is not None and stream.isatty())

    def advance(self) -> None:
        self.done += 1
        if self.stream is None:
            return
        now = time.perf_counter() - self.start
        final = self.done == self.total
        if not final and now - self._last_print < (0.5 if self._tty else 10.0):
            return
        self._last_print = now
        left = now / self.done * (self.total - self.done)
        line = (
            f"{self.label}: {self.done}/{self.total} tasks ({100 * self.done / self.total:.0f}%)"
            f", {_clock(now)} elapsed, ~{_clock(left)} left"
        )
        if self._tty:
            self.stream.write("\r" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m}:{s:02d}"


def run_grid(
    grid: Grid,
    *,
    seed: int,
    jobs: int = 1,
    t_rule: TRule = "optimal",
    progress: bool = True,
) -> list[TaskResult]:
    """Run every task of ``grid`` (``jobs`` worker processes), in task order."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    known = registry(t_rule)
    unknown = [m for m in grid.mechanisms if m not in known]
    if unknown:
        raise ValueError(f"unknown mechanism(s) {unknown}; available: {sorted(known)}")
    tasks = grid.tasks()
    bar = Progress(len(tasks), stream=sys.stderr if progress else None)
    kwargs: dict[str, Any] = {"seed": seed, "mechanisms": grid.mechanisms, "t_rule": t_rule}
    results: list[TaskResult] = []
    if jobs == 1:
        for task in tasks:
            results.append(run_task(task, **kwargs))
            bar.advance()
    else:
        # spawn: workers start clean (no forked threads or locks from the parent).
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = [pool.submit(run_task, task, **kwargs) for task in tasks]
            for fut in as_completed(futures):
                results.append(fut.result())
                bar.advance()
    results.sort(key=lambda r: r.task)
    return results


def summarise(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell and metric: mean and standard error of ``ln(value)`` and of ``value``."""
    groups: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for r in rows:
        key = tuple(r[f] for f in SUMMARY_FIELDS[:8])
        groups[key].append(float(r["value"]))
    order = {name: i for i, name in enumerate(PAPER_ORDER)}
    out = []
    for key, values in groups.items():
        v = np.asarray(values)
        with np.errstate(divide="ignore"):
            logs = np.log(v)
        k = v.size
        se_ln = float(logs.std(ddof=1) / math.sqrt(k)) if k > 1 else math.nan
        se = float(v.std(ddof=1) / math.sqrt(k)) if k > 1 else math.nan
        mean_ln = float(logs.mean())
        out.append(
            {
                **dict(zip(SUMMARY_FIELDS[:8], key, strict=True)),
                "repeats": k,
                "mean_ln": mean_ln,
                "se_ln": se_ln,
                "geo_mean": math.exp(mean_ln),
                "mean": float(v.mean()),
                "se": se,
            }
        )
    out.sort(
        key=lambda r: (
            -r["n"],
            r["d"],
            r["target"],
            r["metric"],
            r["projected"],
            r["s"],
            r["epsilon"],
            order.get(r["mechanism"], len(order)),
            r["mechanism"],
        )
    )
    return out


def write_csv(path: Path, fields: Sequence[str], rows: Iterable[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields), lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _fmt(r[k]) for k in fields})
    return path


def _fmt(value: Any) -> Any:
    # Seven significant digits: far below the repetitions' standard errors, half the size.
    if isinstance(value, float):
        return f"{value:.7g}" if math.isfinite(value) else "nan"
    return value


_INT_FIELDS = {"n", "d", "s", "repeat", "projected", "repeats"}
_STR_FIELDS = {"mechanism", "target", "metric"}


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV written by :func:`write_csv`, with numbers parsed."""
    out = []
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            row: dict[str, Any] = {}
            for k, v in r.items():
                if k in _STR_FIELDS:
                    row[k] = v
                elif k in _INT_FIELDS:
                    row[k] = int(v)
                else:
                    row[k] = float(v)
            out.append(row)
    return out


@dataclass(frozen=True, kw_only=True)
class AccuracyRun:
    """What :func:`run_accuracy` wrote and how long it took."""

    paths: list[Path]
    seconds: float
    skipped: list[str]


def run_accuracy(
    out: Path,
    *,
    grid: Grid = QUICK_GRID,
    seed: int = 1,
    jobs: int = 1,
    t_rule: TRule = "optimal",
    progress: bool = True,
    plots: bool = True,
    command: str = "coco experiment accuracy",
    update_doc: Path | None = None,
) -> AccuracyRun:
    """Run ``grid`` and write the CSVs, the figures and the markdown summary into ``out``.

    ``update_doc``: also paste the summary (image links relative to it) into that markdown
    file between its ``accuracy-summary`` markers (:func:`accuracy_report.paste_into`).
    """
    # Imported here: matplotlib is slow to import and every `coco` command imports this module.
    from sim.experiments import accuracy_report  # noqa: PLC0415
    from sim.experiments import plots as plotting  # noqa: PLC0415

    if update_doc is not None:
        accuracy_report.check_markers(update_doc)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results = run_grid(grid, seed=seed, jobs=jobs, t_rule=t_rule, progress=progress)
    seconds = time.perf_counter() - start
    raw = [r for res in results for r in res.rows]
    timing = [r for res in results for r in res.timings]
    skipped = [m for res in results for m in res.skipped]
    summary = summarise(raw)
    paths = [
        write_csv(out / "accuracy-raw.csv", RAW_FIELDS, raw),
        write_csv(out / "accuracy.csv", SUMMARY_FIELDS, summary),
        write_csv(out / "accuracy-timing.csv", TIMING_FIELDS, timing),
    ]
    figures = plotting.plot_all(summary, out, t_rule=t_rule) if plots else []
    paths += figures
    meta = accuracy_report.RunInfo(
        command=command,
        grid=grid,
        seed=seed,
        jobs=jobs,
        t_rule=t_rule,
        seconds=seconds,
        skipped=tuple(skipped),
    )
    summary_md = out / "accuracy-summary.md"
    summary_md.write_text(
        accuracy_report.render(summary, timing, meta, figures=figures, image_dir=out, doc_dir=out)
    )
    paths.append(summary_md)
    if update_doc is not None:
        text = accuracy_report.render(
            summary, timing, meta, figures=figures, image_dir=out, doc_dir=update_doc.parent
        )
        accuracy_report.paste_into(update_doc, text)
    return AccuracyRun(paths=paths, seconds=seconds, skipped=skipped)


def with_overrides(
    grid: Grid,
    *,
    repeats: int | None = None,
    mechanisms: Sequence[str] | None = None,
    ns: Sequence[int] | None = None,
    ds: Sequence[int] | None = None,
    ss: Sequence[int] | None = None,
    epsilons: Sequence[float] | None = None,
) -> Grid:
    """``grid`` with some axes replaced. Replacing ``ns`` or ``ds`` crosses the given values
    with the other axis's values of ``grid`` (every pair)."""
    changes: dict[str, Any] = {}
    if ns or ds:
        new_ns = list(ns or dict.fromkeys(n for n, _ in grid.configs))
        new_ds = list(ds or dict.fromkeys(d for _, d in grid.configs))
        changes["configs"] = tuple((n, d) for n in new_ns for d in new_ds)
    if ss:
        changes["ss"] = tuple(ss)
    if epsilons:
        changes["epsilons"] = tuple(epsilons)
    if repeats is not None:
        changes["repeats"] = repeats
    if mechanisms:
        changes["mechanisms"] = tuple(mechanisms)
    # One replace: the grid validates the combination, not each intermediate step.
    return replace(grid, **changes)
