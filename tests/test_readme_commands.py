"""The README's pipeline by hand, its command lines in order, run twice in a row.

The lines are read from the README itself (the code block after "# the pipeline by hand"),
so the test breaks when they do. Three things are changed, and only these: every ``coco``
command gets ``--broker`` of this test's own Mosquitto (tests never use the system broker),
the two metrics ports become free ones, and the rounds are 2 s instead of 10 (the same
commands, a shorter wait). Each run must aggregate every report the fleet got acknowledged;
the second run must neither repeat a round (no duplicate) nor lose the first run's state.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests import waiting
from tests.conftest import Broker, free_port
from tests.processes import COCO, ROOT
from tests.service_http import estimates

pytestmark = pytest.mark.integration


def readme_commands() -> list[str]:
    """The README's pipeline-by-hand lines, continuation lines joined, comments dropped."""
    text = (ROOT / "README.md").read_text()
    block = text.split("# the pipeline by hand", 1)[1].split("\n", 1)[1].split("```", 1)[0]
    lines: list[str] = []
    pending = ""
    for raw in block.splitlines():
        line = raw.split("   #", 1)[0].rstrip()
        if not line or line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append((pending + line).strip())
        pending = ""
        if line.startswith("curl"):  # the last line of the pipeline by hand
            break
    return lines


def adapt(line: str, broker: Broker, ports: dict[str, int]) -> tuple[list[str], bool]:
    """``(argv, background)`` of one README line for this test's broker and ports."""
    background = line.endswith("&")
    words = shlex.split(line.rstrip("&").strip())
    assert words[0] == ".venv/bin/coco", line
    words = [*COCO, *words[1:]]
    command = words[len(COCO)]
    if command != "credentials":
        words += ["--broker", broker.url]
    words = [ports["shuffler"] if w == "9109" else w for w in words]  # type: ignore[misc]
    if command == "aggregator":
        words += ["--metrics-port", str(ports["aggregator"])]
    words = ["2" if w == "10" and words[i - 1] == "--round-seconds" else w
             for i, w in enumerate(words)]  # fmt: skip
    return [str(w) for w in words], background


def shuffler_metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def run_once(broker: Broker, workdir: Path, ports: dict[str, int]) -> dict[str, Any]:
    lines = readme_commands()
    assert [shlex.split(line)[1] for line in lines[:-1]] == [
        "credentials",
        "announce",
        "shuffler",
        "aggregator",
        "fleet",
    ]
    assert lines[-1].startswith("curl -s 127.0.0.1:9108/estimates")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    services: list[subprocess.Popen[str]] = []
    logs = []
    try:
        fleet: dict[str, Any] = {}
        for line in lines[:-1]:
            argv, background = adapt(line, broker, ports)
            if background:
                log = (workdir / f"{argv[len(COCO)]}.log").open("a")
                logs.append(log)
                services.append(
                    subprocess.Popen(argv, cwd=workdir, env=env, text=True, stderr=log, stdout=log)
                )
                time.sleep(1.0)  # as a person would wait before the next line
                continue
            done = subprocess.run(
                argv, cwd=workdir, env=env, text=True, capture_output=True, timeout=120, check=False
            )
            assert done.returncode == 0, (line, done.stderr)
            if argv[len(COCO)] == "fleet":
                fleet = json.loads(done.stdout)
        sent = fleet["reports_published"]

        def applied() -> object:
            assert all(s.poll() is None for s in services)
            return (estimates(ports["aggregator"]) or {}).get("n")

        # the last round closes after its end and the skew; the aggregator's n is the progress
        waiting.wait_until(
            lambda: applied() == sent,
            progress=applied,
            stall=60,
            what=f"the aggregator applied {sent}",
            interval=0.5,
        )
        document = estimates(ports["aggregator"])
        assert document is not None
        duplicates = shuffler_metric(
            ports["shuffler"], 'coco_shuffler_reports_rejected_total{reason="duplicate_in_round"}'
        )
        return {"fleet": fleet, "estimates": document, "duplicates": duplicates}
    finally:
        for service in services:
            service.terminate()
        for service in services:
            try:
                service.wait(timeout=30)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait()
        for log in logs:
            log.close()


def test_the_readme_pipeline_by_hand_works_twice_in_a_row(
    mosquitto: Broker, tmp_path: Path
) -> None:
    ports = {"shuffler": free_port(), "aggregator": free_port()}
    first = run_once(mosquitto, tmp_path, ports)
    second = run_once(mosquitto, tmp_path, ports)
    for run in (first, second):
        assert run["fleet"]["reports_published"] == 3000  # 1,000 devices x 3 rounds
        assert run["estimates"]["n"] == 3000
        assert run["estimates"]["batch_size"]["smallest"] == 1000  # whole rounds
        assert run["duplicates"] == 0
    # the second run reused the first one's key and state, and rounds of its own
    assert second["fleet"]["first_round"] > first["fleet"]["last_round"]
    key = (tmp_path / "coco-state" / "lab" / "batch-key" / "public" / "signing.pub").read_text()
    assert first["estimates"]["counters"]["rejected"].get("bad_signature", 0) == 0
    assert len(key.strip()) == 64
