"""The markdown summary of an accuracy run: figures, and the paper's claims checked in numbers.

Every number in it is computed here from the run's rows, so docs/results.md can include the
summary as written (``coco experiment accuracy --update-doc docs/results.md``) instead of
copying numbers by hand.

A *reduction* of mechanism A against B in one cell ``(n, d, s, eps)`` is
``1 - exp(mean_ln(A) - mean_ln(B))``: one minus the ratio of the geometric means of the error
over repetitions, the paper's statistic. Tables give its mean over the cells (``s`` x ``eps``)
of a configuration, with the smallest and largest cell in brackets.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge import device
from edge.spec import exp_eps_weight
from edge.theory import Mechanism, optimal_t, paper_t
from sim.experiments.accuracy import FULL_GRID, Grid
from sim.experiments.mechanisms import ProductMechanism, TRule
from sim.experiments.names import PAPER_ORDER
from sim.experiments.plots import Figure, figures_for

BASELINES_WITH_ITEMS = ("PrivKV", "PCKV-UE", "PCKV-GRR", "PCKV-AGRR")
Cell = tuple[int, int, int, float]
Key = tuple[str, int, int, int, float, str, int, str]


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """How the rows were produced (printed at the top of the summary)."""

    command: str
    grid: Grid
    seed: int
    jobs: int
    t_rule: TRule
    seconds: float
    skipped: tuple[str, ...] = ()


def row_key(r: dict[str, Any]) -> Key:
    """``(mechanism, n, d, s, eps, target, projected, metric)`` of a summary row."""
    return (
        r["mechanism"],
        r["n"],
        r["d"],
        r["s"],
        r["epsilon"],
        r["target"],
        int(r["projected"]),
        r["metric"],
    )


class _Table:
    """Summary rows indexed by (mechanism, n, d, s, eps, target, projected, metric)."""

    def __init__(self, rows: Iterable[dict[str, Any]]) -> None:
        self.by_key: dict[Key, dict[str, Any]] = {row_key(r): r for r in rows}
        self.mechanisms = {k[0] for k in self.by_key}
        self.configs = sorted({(k[1], k[2]) for k in self.by_key}, key=lambda c: (-c[0], c[1]))

    def cells(self, n: int, d: int) -> list[tuple[int, float]]:
        return sorted({(k[3], k[4]) for k in self.by_key if (k[1], k[2]) == (n, d)})

    def log_error(
        self, mech: str, cell: Cell, target: str, projected: int, metric: str
    ) -> float | None:
        n, d, s, eps = cell
        r = self.by_key.get((mech, n, d, s, eps, target, projected, metric))
        return None if r is None else float(r["mean_ln"])

    def cell_reductions(
        self,
        a: str,
        b: Sequence[str],
        *,
        n: int,
        d: int,
        target: str,
        metric: str,
        projected: int,
        projected_b: Sequence[int] | None = None,
    ) -> list[tuple[int, float, float]]:
        """``(s, eps, reduction)`` of ``a`` against the best (lowest error) of ``b``, for
        every cell of ``(n, d)`` where both have a result."""
        out = []
        pb = projected_b if projected_b is not None else [projected] * len(b)
        for s, eps in self.cells(n, d):
            la = self.log_error(a, (n, d, s, eps), target, projected, metric)
            lbs = [
                self.log_error(m, (n, d, s, eps), target, p, metric)
                for m, p in zip(b, pb, strict=True)
            ]
            present = [x for x in lbs if x is not None]
            if la is None or not present:
                continue
            out.append((s, eps, 1.0 - math.exp(la - min(present))))
        return out

    def reductions(self, a: str, b: Sequence[str], **cell: Any) -> list[float]:
        """Per-cell reduction of ``a`` against the best of ``b`` (:meth:`cell_reductions`)."""
        return [r for _, _, r in self.cell_reductions(a, b, **cell)]


def pct(values: Sequence[float]) -> str:
    """``mean% (min..max)`` of fractions, or ``-`` for none."""
    if not values:
        return "-"
    v = np.asarray(values)
    return f"{100 * v.mean():.0f}% ({100 * v.min():.0f}..{100 * v.max():.0f})"


def _config(n: int, d: int) -> str:
    return f"n={n:,}, d={d}"


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table's lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _frequency_claim(tab: _Table) -> list[str]:
    baselines = [m for m in BASELINES_WITH_ITEMS if m in tab.mechanisms]
    if "Collision" not in tab.mechanisms or not baselines:
        return ["(needs Collision and at least one of " + ", ".join(BASELINES_WITH_ITEMS) + ")"]
    rows = []
    for n, d in tab.configs:
        for projected in (1, 0):
            for metric in ("TVE", "MAE"):
                cells = [
                    pct(
                        tab.reductions(
                            "Collision",
                            [b],
                            n=n,
                            d=d,
                            target="freq",
                            metric=metric,
                            projected=projected,
                        )
                    )
                    for b in baselines
                ]
                best = pct(
                    tab.reductions(
                        "Collision",
                        baselines,
                        n=n,
                        d=d,
                        target="freq",
                        metric=metric,
                        projected=projected,
                    )
                )
                post = "yes" if projected else "no"
                rows.append([_config(n, d), metric, post, *cells, best])
    return md_table(
        ["configuration", "metric", "post-processed", *[f"vs {b}" for b in baselines], "vs best"],
        rows,
    )


def _coco_claim(tab: _Table) -> list[str]:
    if not {"CoCo", "Collision"} <= tab.mechanisms:
        return ["(needs CoCo and Collision)"]
    rows = []
    for n, d in tab.configs:
        cells = []
        for projected in (0, 1):
            for metric in ("TVE", "MAE", "MSE"):
                cells.append(
                    pct(
                        tab.reductions(
                            "CoCo",
                            ["Collision"],
                            n=n,
                            d=d,
                            target="mean",
                            metric=metric,
                            projected=projected,
                        )
                    )
                )
        rows.append([_config(n, d), *cells])
    head = [f"{m} {p}" for p in ("raw", "post-processed") for m in ("TVE", "MAE", "MSE")]
    return md_table(["configuration", *head], rows)


def _coco_by_eps(tab: _Table, t_rule: TRule) -> list[str]:
    """CoCo's raw mean-MSE reduction against Collision per eps: measured and closed form."""
    if not {"CoCo", "Collision"} <= tab.mechanisms:
        return []
    n, d = tab.configs[0]
    measured: dict[float, list[float]] = defaultdict(list)
    theory: dict[float, list[float]] = defaultdict(list)
    cells = tab.cell_reductions(
        "CoCo", ["Collision"], n=n, d=d, target="mean", metric="MSE", projected=0
    )
    for s, eps, reduction in cells:
        measured[eps].append(reduction)
        coco = ProductMechanism("coco", d=d, s=s, epsilon=eps, t_rule=t_rule).spec
        coll = ProductMechanism("collision", d=d, s=s, epsilon=eps, t_rule=t_rule).spec
        theory[eps].append(1 - coco.moments.mean_mse(d, s) / coll.moments.mean_mse(d, s))
    epsilons = sorted(measured)
    return [
        f"By ε at {_config(n, d)}: raw mean MSE, mean over s, measured and closed form "
        "(edge/theory.py):",
        "",
        *md_table(
            ["ε", *[f"{e:g}" for e in epsilons]],
            [
                ["measured", *[f"{100 * np.mean(measured[e]):.0f}%" for e in epsilons]],
                ["closed form", *[f"{100 * np.mean(theory[e]):.0f}%" for e in epsilons]],
            ],
        ),
    ]


def _mean_vs_existing(tab: _Table) -> list[str]:
    existing = [m for m in (*BASELINES_WITH_ITEMS, "SUCCINCT") if m in tab.mechanisms]
    ours = [m for m in ("Collision", "CoCo") if m in tab.mechanisms]
    if not existing or not ours:
        return ["(needs Collision or CoCo and at least one existing mechanism)"]
    rows = []
    for n, d in tab.configs:
        for mech in ours:
            cells = []
            for projected in (0, 1):
                for metric in ("TVE", "MAE"):
                    # SUCCINCT has no projected variant: compare with its raw estimate.
                    pb = [0 if b == "SUCCINCT" else projected for b in existing]
                    red = tab.reductions(
                        mech,
                        existing,
                        n=n,
                        d=d,
                        target="mean",
                        metric=metric,
                        projected=projected,
                        projected_b=pb,
                    )
                    cells.append(pct(red))
            rows.append([_config(n, d), mech, *cells])
    head = ["TVE raw", "MAE raw", "TVE post-processed", "MAE post-processed"]
    return md_table(["configuration", "mechanism", *head], rows)


def _succinct_by_eps(tab: _Table) -> list[str]:
    if not {"SUCCINCT", "Collision"} <= tab.mechanisms:
        return ["(needs SUCCINCT and Collision)"]
    n, d = tab.configs[0]
    by_eps: dict[float, list[float]] = defaultdict(list)
    by_s: dict[int, list[float]] = defaultdict(list)
    cells = tab.cell_reductions(
        "Collision", ["SUCCINCT"], n=n, d=d, target="mean", metric="MAE", projected=0
    )
    for s, eps, reduction in cells:
        by_eps[eps].append(reduction)
        by_s[s].append(reduction)
    lines = [f"{_config(n, d)}, mean MAE without post-processing, Collision against SUCCINCT:", ""]
    lines += md_table(
        ["ε", *[f"{e:g}" for e in sorted(by_eps)]],
        [["reduction (mean over s)", *[pct(by_eps[e]).split(" ")[0] for e in sorted(by_eps)]]],
    )
    lines += [""]
    lines += md_table(
        ["s", *[str(s) for s in sorted(by_s)]],
        [["reduction (mean over ε)", *[pct(by_s[s]).split(" ")[0] for s in sorted(by_s)]]],
    )
    return lines


def _ratio_table(
    tab: _Table, pairs: list[tuple[tuple[int, int], tuple[int, int]]], expect: str
) -> list[str]:
    mechs = [m for m in PAPER_ORDER if m in tab.mechanisms]
    rows = []
    for (n1, d1), (n2, d2) in pairs:
        for target in ("freq", "mean"):
            for projected in (1, 0):
                cells = []
                for mech in mechs:
                    # SUCCINCT has no projected variant: its raw error in both rows.
                    p = 0 if mech == "SUCCINCT" else projected
                    ratios = []
                    for s, eps in tab.cells(n1, d1):
                        la = tab.log_error(mech, (n1, d1, s, eps), target, p, "TVE")
                        lb = tab.log_error(mech, (n2, d2, s, eps), target, p, "TVE")
                        if la is not None and lb is not None:
                            ratios.append(math.exp(la - lb))
                    cells.append(f"{np.mean(ratios):.2f}" if ratios else "-")
                label = f"{_config(n1, d1)} / {_config(n2, d2)}"
                rows.append([label, target, "yes" if projected else "no", *cells])
    return [
        f"Expected by the paper: {expect}. Mean over the cells (s x ε) of the ratio of "
        "geometric-mean TVEs.",
        "",
        *md_table(["ratio of TVE", "target", "post-processed", *mechs], rows),
    ]


def _scaling(tab: _Table) -> list[str]:
    configs = set(tab.configs)
    out: list[str] = []
    d_pairs = [((n, 512), (n, 256)) for n, d in tab.configs if d == 256 and (n, 512) in configs]
    n_pairs = [
        ((10_000, d), (100_000, d))
        for n, d in tab.configs
        if n == 100_000 and (10_000, d) in configs
    ]
    if d_pairs:
        out += ["Dimension (TVE grows like √d):", ""]
        out += _ratio_table(tab, d_pairs, "√2 ≈ 1.41")
        out += [""]
    if n_pairs:
        out += ["Users (TVE falls like 1/√n):", ""]
        out += _ratio_table(tab, n_pairs, "√10 ≈ 3.16")
    return out or ["(needs two configurations that differ in n or d only)"]


def _theory_check(tab: _Table, t_rule: TRule) -> list[str]:
    rows = []
    for mech in ("Collision", "CoCo"):
        if mech not in tab.mechanisms:
            continue
        kind: Mechanism = "collision" if mech == "Collision" else "coco"
        for n, d in tab.configs:
            ratios = []
            for s, eps in tab.cells(n, d):
                r = tab.by_key.get((mech, n, d, s, eps, "mean", 0, "MSE"))
                if r is None:
                    continue
                spec = ProductMechanism(kind, d=d, s=s, epsilon=eps, t_rule=t_rule).spec
                theory = spec.moments.mean_mse(d, s) / n
                ratios.append(float(r["mean"]) / theory)
            if ratios:
                v = np.asarray(ratios)
                rows.append(
                    [mech, _config(n, d), f"{v.mean():.3f}", f"{v.min():.3f}..{v.max():.3f}"]
                )
    if not rows:
        return ["(needs Collision or CoCo)"]
    return md_table(
        ["mechanism", "configuration", "measured / closed form (mean)", "range over cells"], rows
    )


def _t_table(tab: _Table) -> list[str]:
    ss = sorted({s for n, d in tab.configs for s, _ in tab.cells(n, d)})
    epsilons = sorted({e for n, d in tab.configs for _, e in tab.cells(n, d)})
    if not ss:
        return []
    d = max(d for _, d in tab.configs)
    rows = []
    kinds: tuple[tuple[Mechanism, str], ...] = (("collision", "Collision"), ("coco", "CoCo"))
    for kind, label in kinds:
        for s in ss:
            cells = []
            for eps in epsilons:
                w = exp_eps_weight(eps)
                t_opt = optimal_t(kind, d=d, s=s, exp_eps_weight=w, unit=device.WEIGHT_UNIT)
                t_pap = paper_t(kind, s=s, exp_eps=math.exp(eps))
                cells.append(f"{t_opt} ({t_pap})")
            rows.append([label, str(s), *cells])
    return md_table(["mechanism", "s", *[f"ε={e:g}" for e in epsilons]], rows)


def _timing(timing: list[dict[str, Any]], meta: RunInfo) -> list[str]:
    per: dict[tuple[str, int, int, int], list[float]] = defaultdict(list)
    for r in timing:
        per[(r["mechanism"], r["n"], r["d"], r["s"])].append(float(r["seconds"]))
    if not per:
        return []
    mean = {k: float(np.mean(v)) for k, v in per.items()}
    rows = []
    mechs = [m for m in PAPER_ORDER if any(k[0] == m for k in mean)]
    configs = sorted({(k[1], k[2]) for k in mean}, key=lambda c: (-c[0], c[1]))
    for n, d in configs:
        cells = []
        for m in mechs:
            v = [mean[k] for k in mean if k[:3] == (m, n, d)]
            cells.append(f"{np.mean(v):.3f}" if v else "-")
        rows.append([_config(n, d), *cells])
    lines = md_table(["seconds per run (mean over s, ε)", *mechs], rows)
    full = estimate_seconds(mean, FULL_GRID, mechanisms=mechs)
    measured = sum(float(r["seconds"]) for r in timing)
    lines += [
        "",
        f"This run: {meta.seconds:.0f} s wall clock with {meta.jobs} worker process(es) "
        f"({measured:.0f} s inside the mechanisms).",
        f"Full grid (`--full`: {FULL_GRID.describe()}), estimated from these per-run timings "
        f"(scaled by n·d where a configuration was not run): {full / 3600:.1f} CPU-hours inside "
        f"the mechanisms, about {full / 3600 / 2:.1f} h wall clock with `--jobs 2` on an idle "
        "2-core machine (population draws and metrics add a few percent).",
    ]
    return lines


def estimate_seconds(
    mean: dict[tuple[str, int, int, int], float], grid: Grid, *, mechanisms: Sequence[str]
) -> float:
    """CPU seconds of ``grid`` from mean seconds per run keyed ``(mechanism, n, d, s)``.

    Unmeasured ``(n, d)`` scale a measured one of the same mechanism and ``s`` by ``n d``
    (the product mechanisms' aggregation is ``O(n d)``); unmeasured ``s`` take the nearest.
    """
    total = 0.0
    for mech in mechanisms:
        known = [k for k in mean if k[0] == mech]
        if not known:
            continue
        for n, d in grid.configs:
            for s in grid.ss:
                per = mean.get((mech, n, d, s))
                if per is None:
                    k = min(
                        known, key=lambda k: (abs(k[3] - s), abs(math.log(k[1] * k[2] / (n * d))))
                    )
                    per = mean[k] * (n * d) / (k[1] * k[2])
                total += per * len(grid.epsilons) * grid.repeats
    return total


def render(
    rows: list[dict[str, Any]],
    timing: list[dict[str, Any]],
    meta: RunInfo,
    *,
    figures: Sequence[Path],
    image_dir: Path,
    doc_dir: Path,
) -> str:
    """The summary as markdown; image links are relative to ``doc_dir``."""
    tab = _Table(rows)
    written = {p.name for p in figures}
    lines = [
        f"Generated by `{meta.command}` (seed {meta.seed}, t rule `{meta.t_rule}`): "
        f"{meta.grid.describe()}. Statistic: mean of ln(error) over the repetitions, as in the "
        "paper; figures show its exponential (the geometric mean) with 95% confidence intervals "
        "(Student t over the repetitions) and, below, CoCo's error over Collision's with the "
        "closed-form ratio.",
        "",
    ]
    if meta.skipped:
        lines += ["Skipped cells (the mechanism rejected its parameters):", ""]
        lines += [f"- {m}" for m in sorted(set(meta.skipped))]
        lines += [""]
    lines += ["#### Figures", ""]
    rel = Path(os.path.relpath(image_dir, doc_dir))
    for fig in figures_for(tab.configs):
        if fig.filename in written:
            lines += [_figure_md(fig, rel), ""]
    lines += [
        "#### Frequency estimation: Collision's error reduction against PrivKV and PCKV",
        "",
        'Paper: Collision "on average reduces more than 60% errors" (n=100,000, d=256, '
        "post-processed TVE/MAE).",
        "",
        *_frequency_claim(tab),
        "",
        "#### Mean estimation: CoCo's error reduction against Collision",
        "",
        'Paper: CoCo "further reduce[s] more than 15% error compared to the Collision".',
        "",
        *_coco_claim(tab),
        "",
        *_coco_by_eps(tab, meta.t_rule),
        "",
        "#### Mean estimation: reduction against the best existing mechanism in each cell",
        "",
        'Paper: "the Collision mechanism outperforms existing approaches by about 30% in almost '
        'all settings". Existing: PrivKV, PCKV-UE, PCKV-GRR, PCKV-AGRR and SUCCINCT (always '
        "without post-processing, which it does not have).",
        "",
        *_mean_vs_existing(tab),
        "",
        "#### SUCCINCT against ε and s",
        "",
        'Paper: SUCCINCT "is less competitive when privacy budget ε or sparsity s is '
        'relatively large".',
        "",
        *_succinct_by_eps(tab),
        "",
        "#### Scaling with d and n",
        "",
        *_scaling(tab),
        "",
        "#### Collision and CoCo against their closed-form error",
        "",
        "Measured mean MSE (sum over dimensions, without post-processing, mean over "
        "repetitions) divided by the exact closed form of edge/theory.py; 1 means unbiased "
        "estimates with the predicted variance.",
        "",
        *_theory_check(tab, meta.t_rule),
        "",
        "#### Output domain size t",
        "",
        "t used (MSE-optimal, the product's default) and, in brackets, the paper's rule of "
        f"thumb, at d={max(d for _, d in tab.configs) if tab.configs else '-'} "
        "(the optimum barely depends on d).",
        "",
        *_t_table(tab),
        "",
        "#### Running time",
        "",
        *_timing(timing, meta),
        "",
    ]
    return "\n".join(lines)


def _figure_md(fig: Figure, rel: Path) -> str:
    path = (rel / fig.filename).as_posix()
    if path.startswith("./"):
        path = path[2:]
    return f"![{fig.caption}]({path})  \n*{fig.caption}*"


BEGIN_MARKER = "<!-- accuracy-summary:begin -->"
END_MARKER = "<!-- accuracy-summary:end -->"


def check_markers(doc: Path, *, begin: str = BEGIN_MARKER, end: str = END_MARKER) -> None:
    """Raise ``ValueError`` unless ``doc`` exists and has the markers ``begin``, ``end`` in
    order (by default the accuracy summary's)."""
    try:
        text = doc.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read {doc}: {exc}") from exc
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"{doc} has no {begin} ... {end} region to update")


def paste_into(
    doc: Path, summary: str, *, begin: str = BEGIN_MARKER, end: str = END_MARKER
) -> None:
    """Replace the text between ``begin`` and ``end`` (by default :data:`BEGIN_MARKER` and
    :data:`END_MARKER`) of ``doc``.

    Only that region changes, so other sections of a shared document stay untouched.
    """
    check_markers(doc, begin=begin, end=end)
    text = doc.read_text()
    start, stop = text.find(begin), text.find(end)
    head = text[: start + len(begin)]
    doc.write_text(head + "\n" + summary.rstrip("\n") + "\n" + text[stop:])
