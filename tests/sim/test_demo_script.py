"""``scripts/demo``'s pipeline step (the README's quick start) on a machine without Mosquitto.

The step is read from the script itself, so the test breaks when the script changes. It must
run unconditionally (no "skipped: no mosquitto"): without a Mosquitto binary ``coco demo``
falls back to the embedded broker by itself. Here the embedded broker is forced with
``--embedded-broker`` (so the test is the same on machines with and without Mosquitto) and
``--json`` is added to read the accounting. No time is asserted: the README states a
measured time, the test only that the run completes and accounts for every report.
"""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from sim.demo.brokers import EMBEDDED_BROKER_KIND, EMBEDDED_DEFAULT_DEVICES
from tests.processes import COCO, ROOT

SCRIPT = ROOT / "scripts" / "demo"


def pipeline_step() -> list[str]:
    """The script's ``coco demo`` command line (continuation lines joined), without the
    optional ``--broker`` from ``COCO_BROKER``."""
    text = SCRIPT.read_text()
    joined = text.replace("\\\n", " ")
    lines = [ln.strip() for ln in joined.splitlines() if ln.strip().startswith('"$coco" demo')]
    assert len(lines) == 1, lines
    words = shlex.split(lines[0].replace('${COCO_BROKER:+--broker "$COCO_BROKER"}', ""))
    assert words[:2] == ["$coco", "demo"], words
    return words[2:]


def test_the_pipeline_step_runs_whether_or_not_mosquitto_exists() -> None:
    text = SCRIPT.read_text()
    assert "skipped" not in text
    assert "command -v mosquitto" not in text
    # the step is the script's last command, outside any condition
    last = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert last[-2].startswith('"$coco" demo'), last[-2:]
    assert "--devices" not in pipeline_step()  # coco demo sizes the fleet for its broker


@pytest.mark.integration  # a whole pipeline in real time
def test_the_pipeline_step_on_the_embedded_broker_accounts_for_every_report() -> None:
    args = [*pipeline_step(), "--embedded-broker", "--json"]
    done = subprocess.run(
        [*COCO, "demo", *args], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout[done.stdout.index("{") :])
    assert doc["broker"].startswith(f"{EMBEDDED_BROKER_KIND} at mqtt://127.0.0.1:")
    assert doc["devices"] == EMBEDDED_DEFAULT_DEVICES  # the default fleet, reduced (a note)
    assert f"to {EMBEDDED_DEFAULT_DEVICES} devices" in doc["note"]
    assert doc["reports_sent"] == EMBEDDED_DEFAULT_DEVICES * doc["rounds"] == 3000
    accounted = (
        doc["reports_aggregated"]
        + doc["reports_rejected"]
        + doc["reports_dropped"]
        + doc["reports_buffered"]
    )
    assert accounted == doc["reports_sent"], doc  # the whole document: a rare 2x was seen
    assert doc["reports_unaccounted"] == 0
    assert doc["reports_rejected"] == 0, doc["reports_rejected_by_reason"]
    assert doc["batches"] >= 1
    assert doc["epsilon_central"] is not None
    assert doc["epsilon_central"] <= doc["epsilon_central_generic"]
