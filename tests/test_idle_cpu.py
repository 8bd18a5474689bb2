"""Idle services idle (issue 18): ``coco shuffler`` with no traffic, with its default state
directory (the README's command) and with ``--state-dir``, and ``coco demo --serve`` once
the run is over and it serves the final state. The aggregator's own test is in
tests/aggregator/test_operability.py.

Each measures the CPU time (user + system, ``/proc/<pid>/stat``: tests/cputime.py) of the
real process and of its children (the demo's accountant worker) over an idle window and
bounds it as a share of that window: a CPU ratio, not a wall-clock assertion. A loaded
machine slows a busy process down, it does not make an idle one busier.
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import pytest

from tests.conftest import Broker, free_port
from tests.cputime import IDLE_SHARE, idle_share
from tests.processes import COCO, coco, env, service, wait_running
from tests.service_http import ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DEP = "idle"


def coco_ok(args: list[str], cwd: Path) -> str:
    done = coco(*args, cwd=cwd, env=env(), timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.unhurried  # no wall-clock round: it runs beside the computations (scripts/test)
@pytest.mark.parametrize("layout", ["default-state-dir", "state-dir", "shard"])
def test_an_idle_shuffler_idles(mosquitto: Broker, tmp_path: Path, layout: str) -> None:
    """The README's commands: a batch key, the announcement, then the shuffler with its
    default state directory (``coco-state/<deployment>/shuffler`` under the working
    directory), or with ``--state-dir``; or one shard of a sharded deployment (its lease
    renewed while it idles; docs/operations.md, "Sharded shufflers")."""
    keys = [tmp_path / "batch-key", tmp_path / "batch-key-1"]
    for directory in keys:
        coco_ok(["credentials", "--batch-key-dir", str(directory)], tmp_path)
    announce = [
        "announce", "--deployment", DEP, "--mechanism", "coco", "--d", "6", "--s", "2",
        "--epsilon", "1", "--min-batch", "100", "--delta", "1e-6", "--round-seconds", "10",
        "--broker", mosquitto.url,
    ]  # fmt: skip
    if layout == "shard":
        for directory in keys:
            announce += ["--shard-key", str(directory / "public" / "signing.pub")]
    else:
        announce += ["--batch-public-key", str(keys[0] / "public" / "signing.pub")]
    coco_ok(announce, tmp_path)
    port = free_port()
    args = [*COCO, "shuffler", "--deployment", DEP, "--broker", mosquitto.url]
    args += ["--signing-key", str(keys[0] / "private" / "signing.key")]
    args += ["--metrics-port", str(port)]
    state_dir = tmp_path / "coco-state" / DEP / "shuffler"
    if layout == "state-dir":
        state_dir = tmp_path / "elsewhere"
        args += ["--state-dir", str(state_dir)]
    elif layout == "shard":
        state_dir = tmp_path / "coco-state" / DEP / "shuffler-g0s0"
        args += ["--shard", "g0s0"]
    with service(args, tmp_path) as proc:
        wait_running(lambda: ready(port) == 200, proc, stall=60)
        assert (state_dir / "effects.log").exists()
        used, elapsed = idle_share(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert used / elapsed < IDLE_SHARE, (used, elapsed)


def test_demo_serving_its_final_state_idles(mosquitto: Broker, tmp_path: Path) -> None:
    command = [
        str(Path(sys.executable).with_name("coco")), "demo", "--devices", "300", "--rounds",
        "2", "--min-batch", "100", "--broker", mosquitto.url, "--timeout", "60", "--serve",
    ]  # fmt: skip
    with service(command, tmp_path) as proc:
        assert proc.stderr is not None
        progress = []
        for line in proc.stderr:
            progress.append(line)
            if line.startswith("serving the final estimates at "):
                break
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", progress[-1] if progress else "")
        assert match is not None, "".join(progress)
        assert ready(int(match.group(1))) == 200  # serving, the run over
        used, elapsed = idle_share(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert used / elapsed < IDLE_SHARE, (used, elapsed)
