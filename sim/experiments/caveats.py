"""What the accuracy comparisons do not say on their own: exact budgets and shrinkage.

Two checks of an accuracy run (``accuracy.csv``), each computed from the run's own rows plus
a cheap computation on the same seeded populations (:func:`sim.experiments.accuracy.
population_seed`), written as markdown for docs/results.md
(``coco experiment caveats --update-doc docs/results.md``):

* **Exact budgets.** PrivKV and PCKV-GRR are ``eps``-LDP but spend less: their exact level
  (:attr:`ldp_ratio` of :mod:`sim.experiments.baselines`, audited by enumeration in
  ``tests/sim/experiments/test_baselines_privacy.py``) is ``ln(2 e^eps / (1 + e^(eps/2)))``
  for PrivKV (``e^eps1 2 e^eps2 / (1 + e^eps2)`` with the even split ``eps1 = eps2 = eps/2``)
  and ``ln(1 + (e^eps - 1)/s)`` for PCKV-GRR. Comparing Collision with them at equal
  *exact* budget: PCKV-GRR run at the nominal budget whose exact level is ``eps`` is
  PCKV-AGRR at ``eps`` (its GRR weight ``s (e^eps - 1) + 1``), already in the run; PrivKV is
  run here at the nominal budget :func:`privkv_nominal_for` whose exact level is ``eps``.
* **Shrinkage.** The paper's populations have true means ``m_j`` of order
  ``sqrt(s / (d n))`` (signs +-1 with probability 1/2), so the data-independent answer
  "every mean is 0" has error ``sum_j m_j^2 ~ s/n`` (MSE), and the answer "every item has
  frequency ``s/(2d)``" likewise. They are evaluated on the run's own populations
  (:func:`constant_rows`) and compared with every mechanism's error in each cell: a
  post-processed mechanism that beats no constant has learnt nothing a reviewer can use,
  and a comparison between two such mechanisms ranks their shrinkage, not their estimates.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from sim.experiments.accuracy import Task, error_rows, population_seed, summarise
from sim.experiments.accuracy_report import Key, md_table, pct, row_key
from sim.experiments.baselines import PCKVGRR, PrivKV
from sim.experiments.baselines.base import KVEstimate
from sim.experiments.data import uniform_population

CONSTANT = "constant"
"""Mechanism name of the constant answers in :func:`constant_rows`."""
PRIVKV_EQUAL = "PrivKV (equal exact ε)"
"""Mechanism name of PrivKV run at the nominal budget whose exact level is the cell's ``eps``."""


def exact_level(mechanism: str, *, s: int, epsilon: float) -> float:
    """The exact LDP level ``ln(ldp_ratio)`` that PrivKV or PCKV-GRR spends at budget ``eps``."""
    if mechanism == "PrivKV":
        return math.log(float(PrivKV(d=2 * s, s=s, epsilon=epsilon).ldp_ratio))
    if mechanism == "PCKV-GRR":
        return math.log(float(PCKVGRR(d=2 * s, s=s, epsilon=epsilon).ldp_ratio))
    raise ValueError(f"mechanism must be PrivKV or PCKV-GRR, got {mechanism!r}")


def privkv_nominal_for(epsilon: float) -> float:
    """The nominal budget at which PrivKV (even split) spends exactly ``epsilon`` (bisection on
    its exact level, which increases with the budget; the result's level is ``<= epsilon``)."""
    lo, hi = epsilon, 2.0 * epsilon + 2.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if exact_level("PrivKV", s=1, epsilon=mid) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def extra_rows(
    cells: Iterable[tuple[int, int, int]],
    *,
    epsilons: Sequence[float],
    repeats: int,
    seed: int,
    privkv: bool = True,
) -> list[dict[str, Any]]:
    """Raw rows (as :func:`sim.experiments.accuracy.run_task` writes them) of the constant
    answers and of PrivKV at equal exact budget, on the populations of ``seed``.

    The constant answers are: means 0 and item frequencies ``s/(2d)`` (raw and, identical
    because they lie on the simplex, projected). Their error does not depend on ``eps``; a
    row is written for every ``eps`` so that they compare cell by cell.
    """
    rows: list[dict[str, Any]] = []
    nominal = {eps: privkv_nominal_for(eps) for eps in epsilons}
    for n, d, s in cells:
        for r in range(repeats):
            task0 = Task(n=n, d=d, s=s, epsilon=epsilons[0], repeat=r)
            pop = uniform_population(n, d, s, np.random.default_rng(population_seed(seed, task0)))
            true_freq, true_mean = pop.item_frequencies(), pop.means()
            constant = KVEstimate(freq=np.full((2, d), s / (2 * d)), mean=np.zeros(d))
            for eps in epsilons:
                task = Task(n=n, d=d, s=s, epsilon=eps, repeat=r)
                rows += error_rows(
                    CONSTANT, task, constant, true_freq=true_freq, true_mean=true_mean
                )
                if privkv:
                    mech = PrivKV(d=d, s=s, epsilon=nominal[eps])
                    key = (n, d, s, r, round(eps * 1_000_000), 0x5052)
                    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))
                    est = mech.run(pop.keys, pop.signs, rng)
                    rows += error_rows(
                        PRIVKV_EQUAL, task, est, true_freq=true_freq, true_mean=true_mean
                    )
    return rows


def _index(rows: Iterable[dict[str, Any]]) -> dict[Key, float]:
    return {row_key(r): float(r["mean_ln"]) for r in rows}


def budget_table(epsilons: Sequence[float], ss: Sequence[int]) -> list[str]:
    """Exact levels spent by PrivKV and PCKV-GRR at each nominal ``eps``."""
    rows = [["PrivKV", "any", *[f"{exact_level('PrivKV', s=1, epsilon=e):.3g}" for e in epsilons]]]
    rows += [
        ["PCKV-GRR", str(s), *[f"{exact_level('PCKV-GRR', s=s, epsilon=e):.3g}" for e in epsilons]]
        for s in ss
    ]
    rows += [
        [
            "nominal ε at which PrivKV spends ε",
            "any",
            *[f"{privkv_nominal_for(e):.3g}" for e in epsilons],
        ]
    ]
    return md_table(["mechanism", "s", *[f"ε={e:g}" for e in epsilons]], rows)


def equal_budget_table(
    summary: Sequence[dict[str, Any]], extra: Sequence[dict[str, Any]]
) -> list[str]:
    """Collision's frequency-error reduction against PrivKV and PCKV-GRR, at equal nominal and
    at equal exact budget (mean over the cells of a configuration, min..max)."""
    idx = _index([*summary, *extra])
    configs = sorted({(r["n"], r["d"]) for r in summary}, key=lambda c: (-c[0], c[1]))
    cells = sorted({(r["n"], r["d"], r["s"], r["epsilon"]) for r in summary})
    pairs = [
        ("PrivKV", "PrivKV"),
        ("PrivKV (equal exact ε)", PRIVKV_EQUAL),
        ("PCKV-GRR", "PCKV-GRR"),
        ("PCKV-GRR at equal exact ε (= PCKV-AGRR)", "PCKV-AGRR"),
    ]
    out = []
    for n, d in configs:
        for projected in (0, 1):
            for metric in ("TVE", "MAE"):
                row = [f"n={n:,}, d={d}", metric, "yes" if projected else "no"]
                for _, name in pairs:
                    red = []
                    for cn, cd, s, eps in cells:
                        if (cn, cd) != (n, d):
                            continue
                        a = idx.get(("Collision", n, d, s, eps, "freq", projected, metric))
                        b = idx.get((name, n, d, s, eps, "freq", projected, metric))
                        if a is not None and b is not None:
                            red.append(1 - math.exp(a - b))
                    row.append(pct(red))
                out.append(row)
    head = ["configuration", "metric", "post-processed", *[f"vs {label}" for label, _ in pairs]]
    return md_table(head, out)


def constant_table(
    summary: Sequence[dict[str, Any]], extra: Sequence[dict[str, Any]], *, metric: str
) -> list[str]:
    """Per ``(n, d, s)``: the constant answer's mean error (geometric mean over repetitions)
    and, per ``eps``, the best post-processed mechanism's error divided by it (``> 1``: every
    post-processed mechanism is worse than answering 0) and the best raw one's."""
    idx = _index([*summary, *extra])
    mechs = sorted({r["mechanism"] for r in summary})
    by_cell: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for r in summary:
        by_cell[(r["n"], r["d"], r["s"])].append(r["epsilon"])
    epsilons = sorted({r["epsilon"] for r in summary})
    out = []
    for n, d, s in sorted(by_cell, key=lambda c: (-c[0], c[1], c[2])):
        const = idx.get((CONSTANT, n, d, s, epsilons[0], "mean", 0, metric))
        if const is None:
            continue
        row = [f"n={n:,}, d={d}", str(s), f"{math.exp(const):.3g}"]
        for eps in epsilons:
            cells = []
            for projected in (1, 0):
                errs = [
                    idx[k]
                    for m in mechs
                    if (k := (m, n, d, s, eps, "mean", projected, metric)) in idx
                ]
                cells.append(f"{math.exp(min(errs) - const):.2g}" if errs else "-")
            row.append(" / ".join(cells))
        out.append(row)
    head = ["configuration", "s", f"constant 0: {metric}", *[f"ε={e:g}" for e in epsilons]]
    return md_table(head, out)


def constant_summary(
    summary: Sequence[dict[str, Any]], extra: Sequence[dict[str, Any]]
) -> list[str]:
    """Per target and metric: in how many cells the best mechanism beats the constant answer,
    and the smallest ratio of the best mechanism's error to the constant's over the cells."""
    idx = _index([*summary, *extra])
    mechs = sorted({r["mechanism"] for r in summary})
    cells = sorted({(r["n"], r["d"], r["s"], r["epsilon"]) for r in summary})
    out = []
    for target, metric in (
        ("mean", "MSE"),
        ("mean", "TVE"),
        ("mean", "MAE"),
        ("freq", "TVE"),
        ("freq", "MAE"),
    ):
        for projected in (1, 0):
            ratios = []
            for n, d, s, eps in cells:
                const = idx.get((CONSTANT, n, d, s, eps, target, 0, metric))
                errs = [
                    idx[k]
                    for m in mechs
                    if (k := (m, n, d, s, eps, target, projected, metric)) in idx
                ]
                if const is not None and errs:
                    ratios.append(math.exp(min(errs) - const))
            if not ratios:
                continue
            v = np.asarray(ratios)
            out.append(
                [
                    "means" if target == "mean" else "item frequencies",
                    metric,
                    "yes" if projected else "no",
                    f"{int((v < 1).sum())} of {v.size}",
                    f"{v.min():.3g}",
                    f"{float(np.median(v)):.3g}",
                ]
            )
    head = [
        "target",
        "metric",
        "post-processed",
        "cells where the best mechanism beats the constant",
        "best / constant: min over cells",
        "median",
    ]
    return md_table(head, out)


def render(summary: Sequence[dict[str, Any]], *, seed: int, privkv: bool = True) -> str:
    """The caveats of the run whose summary rows are ``summary`` (its seed: ``seed``)."""
    cells = sorted({(r["n"], r["d"], r["s"]) for r in summary})
    epsilons = sorted({r["epsilon"] for r in summary})
    repeats = max(int(r["repeats"]) for r in summary)
    raw = extra_rows(cells, epsilons=epsilons, repeats=repeats, seed=seed, privkv=privkv)
    extra = summarise(raw)
    ss = sorted({s for _, _, s in cells})
    lines = [
        "**Exact budgets.** Exact LDP level spent at each nominal ε (exact `ldp_ratio` of the "
        "baselines, audited by enumeration), and the nominal ε at which PrivKV spends exactly ε:",
        "",
        *budget_table(epsilons, ss),
        "",
        "**Equal exact ε.** Collision's raw and post-processed frequency-error reduction at "
        "equal nominal and at "
        "equal exact ε (mean over the cells, min..max):",
        "",
        *equal_budget_table(summary, extra),
        "",
    ]
    lines += [
        "**Constant answers.** The constant answers (means 0, item frequencies s/(2d)) against "
        "the best mechanism of each cell, raw and post-processed (the error ratio is the ratio "
        "of geometric means over the repetitions):",
        "",
        *constant_summary(summary, extra),
        "",
    ]
    for metric in ("MSE", "TVE", "MAE"):
        lines += [
            f"**Constant answers, mean {metric}.** The constant answer 0 on the run's populations "
            "(geometric mean over the repetitions), then per ε the best post-processed / best "
            "raw mechanism's error divided by it (above 1: every such mechanism is worse than "
            "answering 0):",
            "",
            *constant_table(summary, extra, metric=metric),
            "",
        ]
    return "\n".join(lines)


BEGIN_MARKER = "<!-- caveats-summary:begin -->"
END_MARKER = "<!-- caveats-summary:end -->"
