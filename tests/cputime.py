"""CPU time (user + system) of processes, read from ``/proc/<pid>/stat`` (proc(5); Linux).

One reading for every place that measures it: the progress of a process at work in
tests/waiting.py's waits, the share of a window an idle service spends
(tests/test_idle_cpu.py, tests/aggregator/test_operability.py), and the cost of a bench's
processes (bench/bench_brokers.py, bench/bench_shards.py).
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path

IDLE_SECONDS = 6.0
"""The window over which an idle service's CPU time is measured."""
IDLE_SHARE = 0.1
"""The most CPU time an idle service may use, as a share of the wall-clock interval (the
aggregator used to spin at ~46% of a core without --checkpoint). Generous: a loaded machine
slows a busy process down, it does not make an idle one busier."""


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command (its state first); ``None`` for
    a process that is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _seconds(fields: list[str]) -> float:
    # after the command: state is field 3, utime 14 and stime 15 (proc(5))
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """CPU time process ``pid`` has used so far; ``None`` for one that is gone."""
    fields = stat_fields(pid)
    return None if fields is None else _seconds(fields)


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = stat_fields(int(stat.parent.name))
        if fields is not None:
            children[int(fields[1])].append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def tree_cpu_seconds(*pids: int) -> float:
    """CPU time of the processes ``pids`` and their live descendants, summed."""
    total = 0.0
    for root in pids:
        for pid in process_tree(root):
            fields = stat_fields(pid)
            if fields is not None:  # else gone meanwhile
                total += _seconds(fields)
    return total


def idle_share(pid: int, *, descendants: bool = True) -> tuple[float, float]:
    """CPU seconds process ``pid`` (and its descendants, unless ``descendants=False``) used
    over a window of :data:`IDLE_SECONDS`, and the window: a CPU ratio, not a wall-clock
    assertion."""

    def used() -> float:
        seconds = tree_cpu_seconds(pid) if descendants else cpu_seconds(pid)
        assert seconds is not None, f"process {pid} is gone"
        return seconds

    before, start = used(), time.monotonic()
    time.sleep(IDLE_SECONDS)  # the window measured, not a wait for anything
    spent, elapsed = used() - before, time.monotonic() - start
    print(f"idle: {spent:.3f} s of CPU in {elapsed:.2f} s")
    return spent, elapsed
