"""The aggregator on a full disk, a real one (a small tmpfs filled and freed, no mocks):
readiness tells the truth while the checkpoint or the privacy ledger cannot be written, and
nothing is lost; a start on a full disk is one line naming the file (issue 27, item 6)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from aggregator.service.service import Aggregator
from tests.aggregator.test_service import (
    MIN_BATCH,
    SIGNER,
    assert_same_estimates,
    batch,
    config,
    moving,
    offline,
    publish,
    reports,
    run,
    with_aggregator,
)
from tests.aggregator.test_single_writer import coco_run
from tests.broker.test_shuffler_state import ready_answer, small_fs
from tests.broker.test_store import fill
from tests.conftest import Broker, free_port
from tests.processes import ROOT, env, error_lines
from tests.waiting import until

__all__ = ["small_fs"]  # the fixture, shared with the shuffler's full-disk test

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_a_full_disk_makes_the_aggregator_not_ready_until_a_checkpoint_is_written(
    mosquitto: Broker, small_fs: Path
) -> None:
    """Batches applied while the disk is full stay unacknowledged; ``/ready`` answers 503
    naming the file that cannot be written, ``coco_aggregator_checkpoint_failing`` is 1
    and ``coco_aggregator_ready`` 0. Space freed: the next checkpoint is written, 200 and
    the gauges back, the PUBACKs sent. A restart finds every batch once and the broker
    redelivers none of them."""
    checkpoint = small_fs / "agg" / "ckpt.json"
    cfg = config(mosquitto, None, checkpoint=checkpoint)
    rs = [reports(MIN_BATCH + i, 400 + i) for i in range(5)]
    registry = CollectorRegistry()

    def gauge(name: str) -> float | None:
        return registry.get_sample_value(name)

    async def body(agg: Aggregator) -> None:
        port = agg.http_port
        assert port is not None

        def answer() -> tuple[int, str]:
            return ready_answer(port)

        await publish(mosquitto, batch(rs[0], 500), batch(rs[1], 501))
        await until(
            lambda: agg.counters.batches == 2 and not agg.acks and agg.generation >= 2,
            progress=moving(agg),
        )
        assert await asyncio.to_thread(answer) == (200, "ready\n")
        assert gauge("coco_aggregator_checkpoint_failing") == 0
        filler = fill(small_fs)
        try:
            await publish(mosquitto, batch(rs[2], 502), batch(rs[3], 503))
            await until(
                lambda: gauge("coco_aggregator_checkpoint_failing") == 1,
                progress=lambda: (agg.counters.batches, agg.generation),
            )
            assert agg.counters.batches == 4  # applied, in memory
            assert len(agg.acks) == 2  # and not acknowledged: the broker keeps them
            status, text = await asyncio.to_thread(answer)
            assert status == 503
            assert text.startswith("not ready: cannot write ")
            assert "No space left on device" in text
            assert str(small_fs / "agg") in text  # the file that cannot be written
            assert len(text.splitlines()) == 1
            assert gauge("coco_aggregator_ready") == 0
            failed_at = agg.generation
        finally:
            filler.unlink()
        await until(
            lambda: gauge("coco_aggregator_checkpoint_failing") == 0,
            progress=lambda: agg.generation,
        )
        assert agg.generation > failed_at
        assert gauge("coco_aggregator_ready") == 1
        assert await asyncio.to_thread(answer) == (200, "ready\n")
        await until(lambda: not agg.acks, progress=lambda: agg.generation)  # PUBACKs out

    run(with_aggregator(cfg, body, registry))

    async def again(agg: Aggregator) -> None:
        assert agg.counters.batches == 4  # all of them in the checkpoint
        await publish(mosquitto, batch(rs[4], 504))  # behind anything redelivered
        await until(lambda: agg.counters.batches == 5, progress=moving(agg))

    agg = run(with_aggregator(cfg, again))
    assert agg.counters.duplicates == 0  # nothing came twice
    assert_same_estimates(agg, offline(*rs))


def test_an_aggregator_started_on_a_full_disk_names_the_file_in_one_line(
    mosquitto: Broker, small_fs: Path, tmp_path: Path
) -> None:
    filler = fill(small_fs)
    checkpoint = small_fs / "agg" / "ckpt.json"
    args = coco_run(mosquitto, tmp_path, "--batch-public-key", SIGNER.public_key_hex)
    args += ["--checkpoint", str(checkpoint), "--metrics-port", str(free_port())]
    done = subprocess.run(
        args, check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert error_lines(done.stderr) == [
        f"error: cannot write {checkpoint}.lock: No space left on device"
    ]
    assert "Traceback" not in done.stderr
    filler.unlink()
