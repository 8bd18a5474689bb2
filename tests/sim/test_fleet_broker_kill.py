"""``coco fleet`` through a ``kill -9`` of its broker and a restart (issue 18: 200 ERROR
lines "max number of failed connection attempts", 400 of 1,000 reports not sent, the
progress saying "connected 200/200", exit status 0).

A real Mosquitto, killed with SIGKILL while the fleet runs 2 s rounds, and started again on
the same port. A subscriber of its own (reconnecting) records every report the broker
delivered. The moments are chosen by what the fleet and the subscriber show, never by the
clock: the kill once two whole rounds were delivered; the restart once the fleet's progress
shows no device connected and its one line for a round says reports were not sent; the
stop (SIGINT) once two whole rounds after the restart were delivered.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edge.codec import decode_report
from edge.spec import MechanismSpec
from sim.fleet.cli import EXIT_NOT_SENT
from tests import waiting
from tests.conftest import Broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DEPLOYMENT = "kill-9"
DEVICES = 50
ROUND_SECONDS = 2
WAIT = 120.0
"""Generous: every wait ends as soon as its condition holds."""

Record = tuple[int, int, int]  # (round, seed, z)


class Subscriber:
    """Every report delivered on the deployment's ingress topics, by round; subscribes
    again after each reconnection and remembers the round of its latest SUBACK."""

    def __init__(self, broker: Broker) -> None:
        self.lock = threading.Lock()
        self.received: dict[int, set[tuple[int, int]]] = {}
        self.subscribed_in: int | None = None
        self.client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2)
        self.client.reconnect_delay_set(1, 1)
        self.client.on_connect = lambda client, *_: client.subscribe(
            f"coco/v1/{DEPLOYMENT}/ingress/+", qos=1
        )
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()

    def _on_subscribe(self, *_: Any) -> None:
        with self.lock:
            self.subscribed_in = int(time.time() // ROUND_SECONDS)

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        _, _, round_, seed, z = decode_report(msg.payload)
        with self.lock:
            self.received.setdefault(round_, set()).add((seed, z))

    def whole_rounds(self, after: int | None = None) -> list[int]:
        """Rounds (after round ``after``) from which every device's report was delivered."""
        with self.lock:
            return sorted(
                r
                for r, reports in self.received.items()
                if len(reports) == DEVICES and (after is None or r > after)
            )

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class Lines:
    """The lines a process writes on a pipe, collected by a thread as they come."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def any(self, pattern: str, since: int = 0) -> bool:
        """Whether a line from the ``since``-th on matches ``pattern``."""
        return any(re.search(pattern, line) for line in list(self.lines)[since:])


def wait_for(what: str, condition: Callable[[], bool], proc: subprocess.Popen[str]) -> None:
    """Until ``condition``; fails when the fleet exits, or when its CPU time stands still
    for ``WAIT`` s (tests/waiting.py)."""

    def holds() -> bool:
        assert proc.poll() is None, f"the fleet exited while waiting for {what}"
        return condition()

    waiting.wait_until(
        holds,
        progress=lambda: waiting.cpu_seconds(proc.pid),
        stall=WAIT,
        what=what,
        interval=0.05,
    )


@dataclass
class Run:
    """What a fleet run through a broker kill left: its exit status, summary and stderr
    lines, the subscriber, and the rounds it saw whole before the kill and after."""

    returncode: int
    summary: dict[str, Any]
    log: list[str]
    subscriber: Subscriber
    before: list[int]
    back: int


def run_through_a_kill(broker: Broker, tmp_path: Path) -> Run:
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC.to_dict()))
    acked_log = tmp_path / "acked.txt"
    subscriber = Subscriber(broker)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-c", "from sim.cli import main; main()", "fleet"),
            *("--deployment", DEPLOYMENT, "--broker", broker.url),
            *("--spec", str(spec_file), "--round-seconds", str(ROUND_SECONDS)),
            *("--devices", str(DEVICES), "--rounds", "0", "--seed", "5"),
            *("--acked-log", str(acked_log), "--ground-truth", str(tmp_path / "truth.json")),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    assert proc.stderr is not None
    assert proc.stdout is not None
    stderr = Lines(proc.stderr)
    try:
        wait_for("two whole rounds", lambda: len(subscriber.whole_rounds()) >= 2, proc)
        before = subscriber.whole_rounds()[:2]
        wait_for(
            "their acknowledgements",
            lambda: acked_log.exists() and len(acked_log.read_text().splitlines()) >= 2 * DEVICES,
            proc,
        )
        killed = len(stderr.lines)
        broker.kill()
        gone = rf"^connected 0/{DEVICES}\b"
        wait_for("no device connected", lambda: stderr.any(gone, killed), proc)
        lost = r"sim\.fleet: round \d+: \d+ of"
        wait_for("a round not sent", lambda: stderr.any(lost, killed), proc)
        restarted = len(stderr.lines)
        broker.start()
        wait_for("the subscriber back", lambda: subscriber.subscribed_in is not None, proc)
        with subscriber.lock:
            back = subscriber.subscribed_in
        assert back is not None
        wait_for(
            "two rounds after the restart", lambda: len(subscriber.whole_rounds(back)) >= 2, proc
        )
        back_all = rf"^connected {DEVICES}/{DEVICES} "
        wait_for("all connected again", lambda: stderr.any(back_all, restarted), proc)
        proc.send_signal(signal.SIGINT)
        returncode = proc.wait(timeout=WAIT)
        stdout = proc.stdout.read()  # the summary only: it fits in the pipe
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subscriber.stop()
        stderr.thread.join(timeout=WAIT)
        proc.stdout.close()
        proc.stderr.close()
    return Run(returncode, json.loads(stdout), stderr.lines, subscriber, before, back)


def test_the_fleet_reconnects_after_a_broker_kill_and_exits_non_zero_for_what_it_lost(
    mosquitto: Broker, tmp_path: Path
) -> None:
    run = run_through_a_kill(mosquitto, tmp_path)
    summary, log = run.summary, run.log

    # Exit status and the summary: how many were not sent, and why.
    assert run.returncode == EXIT_NOT_SENT, "\n".join(log[-20:])
    not_sent = summary["reports_not_sent"]
    assert not_sent == sum(summary["publish_failures"].values()) > 0
    reasons = ", ".join(f"{k} {v}" for k, v in summary["publish_failures"].items() if v)
    assert log[-1].startswith(
        f"error: {not_sent} of {not_sent + summary['reports_published']} reports were not sent "
        f"({reasons}); connections lost {DEVICES}, failed connection attempts "
    ), log[-1]
    assert summary["connections_lost"] == DEVICES  # each connection, once, by the kill
    assert summary["connect_failures"]["network"] > 0  # tried again while the broker was down
    assert summary["connected_at_end"] == DEVICES

    # No flood: no ERROR line, gmqtt silent, at most one line per round, no device id.
    assert not [line for line in log if " ERROR " in line or "gmqtt" in line]
    per_round = Counter(re.findall(r"sim\.fleet: round (\d+):", "\n".join(log)))
    assert per_round
    assert max(per_round.values()) == 1
    assert not [line for line in log if "dev-0" in line]
    # The progress showed the devices connected as they were: all, none, all again.
    progress = [line for line in log if line.startswith("connected ")]
    counts = [int(line.split()[1].split("/")[0]) for line in progress]
    assert counts.index(0) < len(counts) - 1 - counts[::-1].index(DEVICES)
    assert f"connected 0/{DEVICES} ({DEVICES} reconnecting)" in "\n".join(progress)

    # Published = acknowledged: one line per acknowledged report, each counted once, and
    # in the rounds the subscriber saw whole (before the kill; after the restart but
    # before the round the fleet was stopped in) exactly what the broker delivered.
    acked: list[Record] = []
    for line in (tmp_path / "acked.txt").read_text().splitlines():
        round_, seed, z = map(int, line.split())
        acked.append((round_, seed, z))
    assert len(acked) == len(set(acked)) == summary["reports_published"]
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert truth["overall"]["n"] == summary["reports_published"]
    after = [r for r in run.subscriber.whole_rounds(run.back) if r < summary["last_round"]]
    assert after
    for round_ in [*run.before, *after]:
        assert {(s, z) for r, s, z in acked if r == round_} == run.subscriber.received[round_]
