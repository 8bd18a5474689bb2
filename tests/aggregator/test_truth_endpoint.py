"""``GET /truth`` (SIMULATION ONLY, ``coco aggregator run --truth FILE``): the fleet's
ground-truth file served beside the estimates, read again when it changes; a missing or bad
file a one-line 404 and a malformed query a one-line 400, counted, never a crash."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry

from aggregator.service.http import MetricsServer
from aggregator.service.truth_file import TruthFile
from tests.aggregator.test_series_plot import FIRST, R, truth_file_document


def get(port: int, target: str) -> tuple[int, str, str]:
    """Status, content type and body of ``GET target``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{target}", timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_truth_is_served_from_the_file_as_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "truth.json"
    registry = CollectorRegistry()
    server = MetricsServer(
        host="127.0.0.1",
        port=0,
        registry=registry,
        estimates=dict,
        truth=TruthFile(path, registry=registry).answer,
    )
    server.start()
    try:
        port = server.port

        def rejected(reason: str) -> float | None:
            return registry.get_sample_value(
                "coco_aggregator_truth_requests_rejected_total", {"reason": reason}
            )

        assert rejected("no_truth") == rejected("query") == 0
        status, kind, body = get(port, "/truth")
        assert (status, kind) == (404, "text/plain; charset=utf-8")
        assert body == f"no simulation truth: {path} cannot be read (No such file or directory)\n"
        assert rejected("no_truth") == 1

        path.write_text(json.dumps(truth_file_document(rounds=3)))
        status, kind, body = get(port, f"/truth?dims=2&from={FIRST * R}")
        assert (status, kind) == (200, "application/json")
        doc = json.loads(body)
        assert doc["simulation_only"] is True
        assert doc["dims"] == [2]
        assert [row[0] for row in doc["rows"]] == [FIRST, FIRST + 1, FIRST + 2]

        # the fleet rewrites the file after a round: renamed over it, read again
        new = tmp_path / "new.json"
        new.write_text(json.dumps(truth_file_document(rounds=4)))
        os.replace(new, path)
        doc = json.loads(get(port, "/truth?dims=0,1")[2])
        assert [row[0] for row in doc["rows"]] == [FIRST + k for k in range(4)]
        assert doc["rows"][3][4] == truth_file_document(rounds=4)["rounds"][3]["mean"][:2]

        for target, message in [
            ("/truth?dims=7", "bad /truth query: dims: no dimension 7 (the truth has 3)\n"),
            ("/truth?from=9&to=1", "bad /truth query: from 9 is after to 1\n"),
            ("/truth?window=1h", "bad /truth query: unknown parameter 'window' (from, to, dims)\n"),
        ]:
            assert get(port, target) == (400, "text/plain; charset=utf-8", message)
        assert rejected("query") == 3

        path.write_text("{not json")
        status, _, body = get(port, "/truth")
        assert (status, body) == (404, f"no simulation truth: {path} is not JSON\n")
        path.write_text(json.dumps({"rounds": []}))
        status, _, body = get(port, "/truth")
        assert status == 404
        assert body.startswith(f"no simulation truth: {path} is not a ground-truth file")
        assert rejected("no_truth") == 3
        assert get(port, "/estimates")[0] == 200  # nothing else harmed
    finally:
        server.stop()


def test_without_a_truth_file_truth_is_a_404_of_one_line() -> None:
    server = MetricsServer(host="127.0.0.1", port=0, registry=CollectorRegistry(), estimates=dict)
    server.start()
    try:
        status, _, body = get(server.port, "/truth?dims=0")
        assert status == 404
        assert body == (
            "no simulation truth: the aggregator was started without --truth (simulation only)\n"
        )
    finally:
        server.stop()
