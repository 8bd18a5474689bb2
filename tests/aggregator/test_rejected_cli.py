"""``coco aggregator rejected list | replay`` against a real ``coco aggregator run`` and a real
Mosquitto: a batch older than the retained horizon is kept (``stale_round``), listed offline,
kept again by a requested replay (the horizon did not move), and applied once at a restart with
a longer ``--retention-rounds``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aggregator.service.quarantine_file import replay_request_path
from tests.aggregator.test_service import MIN_BATCH, SIGNER, batch, publish, reports
from tests.aggregator.test_single_writer import coco_run
from tests.conftest import Broker, free_port
from tests.processes import ROOT, coco, env, estimates, service, started, stop, wait_running
from tests.service_http import metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def rejected(checkpoint: Path, command: str) -> str:
    done = coco("aggregator", "rejected", command, "--checkpoint", str(checkpoint), cwd=ROOT,
                env=env(), timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_stale_batch_is_kept_listed_and_applied_once_the_horizon_allows_it(
    mosquitto: Broker, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "state" / "aggregator.json"
    port = free_port()

    def args(retention: int) -> list[str]:
        return coco_run(
            mosquitto, tmp_path, "--batch-public-key", SIGNER.public_key_hex,
            "--checkpoint", str(checkpoint), "--metrics-port", str(port),
            "--checkpoint-interval", "0.5", "--retention-rounds", str(retention),
        )  # fmt: skip

    def sample(name: str) -> float | None:
        return (metrics(port) or {}).get(name)

    recent, old = reports(MIN_BATCH, 1), reports(MIN_BATCH + 7, 2)
    with service(args(5)) as proc:
        started(proc, port)
        asyncio.run(publish(mosquitto, batch(recent, 1, round_=100), batch(old, 2, round_=10)))
        wait_running(lambda: sample("coco_aggregator_quarantined{reason=stale_round}") == 1, proc)
        assert (estimates(port) or {}).get("n") == MIN_BATCH
        assert "requested" in rejected(checkpoint, "replay")
        wait_running(lambda: not replay_request_path(checkpoint).exists(), proc)
        # the horizon did not move: still refused, still kept
        assert sample("coco_aggregator_quarantine_replayed_total{outcome=kept}") == 1
        assert sample("coco_aggregator_quarantined{reason=stale_round}") == 1
        rc, err = stop(proc)
    assert rc == 0, err
    listed = rejected(checkpoint, "list").splitlines()
    assert listed[0].startswith("kept: 1 (untrusted_key 0, unknown_shard 0, wrong_shard 0, "
                                "stale_round 1)"), listed  # fmt: skip
    assert len(listed) == 2
    assert " batch " in listed[1]
    assert "stale_round" in listed[1]

    with service(args(200)) as proc:  # a longer horizon: applied at start, once
        started(proc, port)
        wait_running(lambda: (estimates(port) or {}).get("n") == 2 * MIN_BATCH + 7, proc)
        assert sample("coco_aggregator_quarantined{reason=stale_round}") == 0
        asyncio.run(publish(mosquitto, batch(old, 2, round_=10)))  # re-sent: a duplicate
        wait_running(lambda: sample("coco_aggregator_batches_duplicate_total") == 1, proc)
        rc, err = stop(proc)
    assert rc == 0, err
    assert rejected(checkpoint, "list").startswith("kept: 0 ")
