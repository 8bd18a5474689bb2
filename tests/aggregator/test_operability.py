"""What an operator meets first, on real ``coco aggregator run`` processes: readiness, an
idle service that idles, a busy port, scrapers that hang up, a snapshot URL without its
path (issue 18's aggregator rows, issue 19 item 5)."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from aggregator.service.http import MetricsServer
from tests.aggregator.test_service import SIGNER, SPEC
from tests.aggregator.test_single_writer import coco_run
from tests.conftest import MOSQUITTO, Broker, free_port
from tests.cputime import IDLE_SHARE, idle_share
from tests.processes import (
    COCO,
    ROOT,
    env,
    error_lines,
    service,
    stop,
    wait_running,
)
from tests.service_http import ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KEY = ["--batch-public-key", SIGNER.public_key_hex]


def metric_lines(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_ready_only_once_subscribed_and_no_counter_before_recovery(tmp_path: Path) -> None:
    """No broker yet: the service is up, recovered, not subscribed: /ready 503, the gauge
    0. The broker comes: 200 and 1. Before recovery /metrics shows the gauge alone."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed")
    broker = Broker(tmp_path, free_port())
    port = free_port()
    args = coco_run(broker, tmp_path, *KEY, "--metrics-port", str(port), "--checkpoint")
    args += [str(tmp_path / "ckpt.json")]
    with service(args) as proc:
        wait_running(lambda: ready(port) == 503, proc)
        assert "coco_aggregator_ready 0.0" in metric_lines(port)
        broker.start()
        try:
            wait_running(lambda: ready(port) == 200, proc)
            assert "coco_aggregator_ready 1.0" in metric_lines(port)
            broker.stop()
            wait_running(lambda: ready(port) == 503, proc)
            rc, err = stop(proc)
        finally:
            broker.stop()
    assert rc == 0, err

    server = MetricsServer(
        host="127.0.0.1",
        port=0,
        registry=CollectorRegistry(),
        estimates=lambda: {"n": 0},
        ready=lambda: False,
        recovered=lambda: False,
    )
    server.start()
    try:
        assert ready(server.port) == 503
        lines = metric_lines(server.port)
        assert lines == ["coco_aggregator_ready 0.0"]
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/estimates", timeout=5)
        info.value.close()
        assert info.value.code == 503
    finally:
        server.stop()


@pytest.mark.parametrize("checkpoint", [False, True], ids=["no-checkpoint", "checkpoint"])
def test_an_idle_service_idles(mosquitto: Broker, tmp_path: Path, checkpoint: bool) -> None:
    port = free_port()
    extra = ["--checkpoint", str(tmp_path / "ckpt.json")] if checkpoint else []
    with service(coco_run(mosquitto, tmp_path, *KEY, "--metrics-port", str(port), *extra)) as proc:
        wait_running(lambda: ready(port) == 200, proc)
        time.sleep(2.0)  # the first privacy level and the epsilon curve, computed at start
        used, elapsed = idle_share(proc.pid, descendants=False)
        rc, err = stop(proc)
    assert rc == 0, err
    assert used / elapsed < IDLE_SHARE, (used, elapsed)


def test_a_busy_metrics_port_is_one_line_naming_it(mosquitto: Broker, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            coco_run(mosquitto, tmp_path, *KEY, "--metrics-port", str(port)),
            check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1
    assert error_lines(done.stderr) == [
        f"error: port {port} on 127.0.0.1 is in use: choose another with --metrics-port "
        "(COCO_METRICS_PORT)"
    ]
    assert "Traceback" not in done.stderr


def test_scrapers_that_hang_up_leave_no_traceback_and_snapshot_finds_estimates(
    mosquitto: Broker, tmp_path: Path
) -> None:
    port = free_port()
    with service(coco_run(mosquitto, tmp_path, *KEY, "--metrics-port", str(port))) as proc:
        wait_running(lambda: ready(port) == 200, proc)
        for _ in range(40):  # ask, then reset the connection before reading the answer
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        snapshot = [*COCO, "aggregator", "snapshot", "--url"]
        base = subprocess.run(
            [*snapshot, f"http://127.0.0.1:{port}"],
            check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        wrong = subprocess.run(
            [*snapshot, f"http://127.0.0.1:{port}/metrics"],
            check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert ready(port) == 200  # still serving
        rc, err = stop(proc)
    assert rc == 0, err
    assert "Traceback" not in err
    assert "BrokenPipeError" not in err
    assert "ConnectionResetError" not in err
    assert base.returncode == 0, base.stderr
    assert json.loads(base.stdout)["n"] == 0
    assert wrong.returncode == 1
    assert error_lines(wrong.stderr) == [
        f"error: http://127.0.0.1:{port}/metrics is not an aggregator's /estimates document; "
        "give --url http://host:port/estimates"
    ]


def test_channels_name_the_dimensions_or_are_refused_in_one_line(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """``--channels FILE``: /estimates carries each channel's mean in its unit; a bad file
    is one line naming it."""
    bad = tmp_path / "bad.json"
    bad.write_text('[{"name": "t", "unit": "C", "lo": 1, "hi": 0}]')
    done = subprocess.run(
        coco_run(mosquitto, tmp_path, *KEY, "--channels", str(bad)),
        check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert error_lines(done.stderr) == [
        f"error: --channels {bad}: channel t: range [1.0, 0.0] is empty"
    ]
    good = tmp_path / "channels.json"
    names = [f"ch{j}" for j in range(SPEC.d)]
    good.write_text(json.dumps([{"name": n, "unit": "V", "lo": 0, "hi": 5} for n in names]))
    port = free_port()
    args = coco_run(mosquitto, tmp_path, *KEY, "--metrics-port", str(port), "--channels")
    with service([*args, str(good)]) as proc:
        wait_running(lambda: ready(port) == 200, proc)
        url = f"http://127.0.0.1:{port}/estimates"
        with urllib.request.urlopen(url, timeout=5) as response:
            doc = json.loads(response.read())
        rc, err = stop(proc)
    assert rc == 0, err
    assert [c["name"] for c in doc["channels"]] == names
    assert {c["unit"] for c in doc["channels"]} == {"V"}
    assert all(c["value"] is None for c in doc["channels"])  # no report yet
