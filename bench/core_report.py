"""bench/bench_core.py's results and their report: a method's timings and errors
(:class:`Result`), the table and the ratios it prints, and the machine it ran on."""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Result:
    """Timings (seconds, one entry per timed repeat) and errors of one method."""

    method: str
    n: int
    setup_s: float
    randomise_s: list[float] = field(default_factory=list)
    aggregate_s: list[float] = field(default_factory=list)
    mse: list[float] = field(default_factory=list)
    expected_mse: float = math.nan
    note: str = ""

    @property
    def repeats(self) -> int:
        return len(self.randomise_s)

    @property
    def randomise_median_s(self) -> float:
        return statistics.median(self.randomise_s)

    @property
    def aggregate_median_s(self) -> float:
        return statistics.median(self.aggregate_s)

    @property
    def end_to_end_median_s(self) -> float:
        return statistics.median(
            r + a for r, a in zip(self.randomise_s, self.aggregate_s, strict=True)
        )

    @property
    def randomise_rate(self) -> float:
        return self.n / self.randomise_median_s

    @property
    def aggregate_rate(self) -> float:
        return self.n / self.aggregate_median_s

    @property
    def end_to_end_rate(self) -> float:
        return self.n / self.end_to_end_median_s

    @property
    def end_to_end_rates(self) -> list[float]:
        """End-to-end reports/second of every timed repeat (the spread on a noisy machine)."""
        return [self.n / (r + a) for r, a in zip(self.randomise_s, self.aggregate_s, strict=True)]

    @property
    def mse_mean(self) -> float:
        return statistics.fmean(self.mse)

    @property
    def per_report_mse(self) -> float:
        """``n * MSE``: the sum-over-dimensions variance of one report, comparable across n."""
        return self.n * self.mse_mean

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "n": self.n,
            "repeats": self.repeats,
            "setup_s": self.setup_s,
            "randomise_s": self.randomise_s,
            "aggregate_s": self.aggregate_s,
            "randomise_median_s": self.randomise_median_s,
            "aggregate_median_s": self.aggregate_median_s,
            "end_to_end_median_s": self.end_to_end_median_s,
            "randomise_reports_per_s": self.randomise_rate,
            "aggregate_reports_per_s": self.aggregate_rate,
            "end_to_end_reports_per_s": self.end_to_end_rate,
            "end_to_end_reports_per_s_each_repeat": self.end_to_end_rates,
            "mean_mse_sum_over_dims": self.mse,
            "mean_mse_sum_over_dims_avg": self.mse_mean,
            "expected_mean_mse_sum_over_dims": self.expected_mse,
            "n_times_mse": self.per_report_mse,
            "n_times_expected_mse": self.n * self.expected_mse,
            "note": self.note,
        }


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def table(results: Sequence[Result]) -> str:
    head = (
        f"{'method':<38} {'n':>9} {'reps':>4} {'setup s':>8} {'randomise r/s':>14} "
        f"{'aggregate r/s':>14} {'end-to-end r/s':>15} {'mean MSE':>10} {'expected':>10} "
        f"{'n*MSE':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.method:<38} {r.n:>9,} {r.repeats:>4} {r.setup_s:>8.2f} "
            f"{fmt_rate(r.randomise_rate):>14} {fmt_rate(r.aggregate_rate):>14} "
            f"{fmt_rate(r.end_to_end_rate):>15} {r.mse_mean:>10.4g} {r.expected_mse:>10.4g} "
            f"{r.per_report_mse:>10.4g}"
        )
    lines.append("")
    lines.append("End-to-end r/s of each timed repeat (the machine is shared and noisy):")
    lines.extend(
        f"  {r.method:<38} " + ", ".join(fmt_rate(x) for x in r.end_to_end_rates) for r in results
    )
    return "\n".join(lines)


def ratios(results: dict[str, Result]) -> dict[str, float]:
    out: dict[str, float] = {}
    for ours in ("coco", "collision"):
        for peer in ("olh", "fastlh"):
            a, b = results[ours], results[peer]
            out[f"{ours}_e2e_over_{peer}_e2e"] = a.end_to_end_rate / b.end_to_end_rate
            out[f"{peer}_mse_over_{ours}_mse_per_report"] = b.per_report_mse / a.per_report_mse
    return out


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pure_ldp": version("pure-ldp"),
        "xxhash": version("xxhash"),
        "loadavg_at_end": list(os.getloadavg()),
    }
