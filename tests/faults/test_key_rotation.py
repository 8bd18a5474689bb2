"""The batch key rotated exactly as docs/operations.md says, while a fleet runs: nothing
acknowledged is lost, nothing counted twice.

The stack of tests/faults/stack.py (real Mosquitto, ``coco shuffler``, ``coco aggregator run
--checkpoint``, ``coco fleet --acked-log`` and the independent recorder, which verifies each
batch under the old or the new key). At a random moment of the fleet's rounds: a new key is
created, announced (the aggregator refuses it: ERROR, counted, recorded), the shuffler is
restarted with it, a while later the operator runs ``coco aggregator trust
--accept-announced``. Every batch the new key signed before the trust command is refused as
``untrusted_key`` and kept (acknowledged to the broker, so never redelivered: before the
quarantine, each one was lost), then applied once the key is trusted. Then the checks of
tests/faults/test_exactly_once.py: acknowledged == aggregated + held, exactly; the
checkpoint's sums equal the recorder's batches, each once; the per-round series too; and
``coco aggregator rejected list`` shows nothing left kept.
"""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest

from aggregator.service.checkpoint_files import load_checkpoint
from edge.batch_auth import load_or_create_signing_key
from edge.batch_auth import public_key_hex as key_hex
from tests.faults.stack import Stack, reconcile, run_case, running_stack
from tests.processes import coco, wait_until
from tests.service_http import metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def kept(stack: Stack) -> float | None:
    samples = metrics(stack.aggregator_port) or {}
    return samples.get("coco_aggregator_quarantined{reason=untrusted_key}")


def rotate(stack: Stack, _rng: random.Random) -> None:
    """docs/operations.md, "Rotating the batch key", step by step."""
    assert stack.recorder is not None
    new_dir = stack.workdir / "new-key"
    new_dir.mkdir(mode=0o700)
    new_key = new_dir / "signing.key"
    public = key_hex(load_or_create_signing_key(new_key))
    stack.recorder.also_verify(public)
    # 1. announce the new key: the running aggregator refuses it (and records it)
    stack.announce(public)
    wait_until(
        lambda: (
            (metrics(stack.aggregator_port) or {}).get(
                "coco_aggregator_announcements_refused_total"
            )
            == 1
        ),
        60,
        what="the aggregator to refuse the new key",
    )
    # 2. restart the shuffler with the new key (same state directory)
    assert stack.shuffler.stop(signal.SIGTERM) == 0, stack.shuffler.output()[-2000:]
    stack.shuffler = stack.shuffler_process(
        "shuffler-new-key", stack.state_dir, signing_key=new_key
    )
    stack.start_shuffler()
    # what it releases now is signed by a key the aggregator does not trust yet: kept
    wait_until(lambda: (kept(stack) or 0) > 0, 60, what="a batch of the new key to be kept")
    # 3. the operator checks the refused key and accepts it
    shown = coco("aggregator", "trust", "--checkpoint", str(stack.checkpoint), timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"refused: {public}" in shown.stdout
    accepted = coco(
        "aggregator", "trust", "--checkpoint", str(stack.checkpoint), "--accept-announced",
        timeout=60,
    )  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr
    assert f"new: {public}" in accepted.stdout
    wait_until(lambda: kept(stack) == 0, 60, what="the kept batches to be applied")


def test_a_key_rotation_as_documented_loses_nothing_with_a_fleet_running(tmp_path: Path) -> None:
    with running_stack(tmp_path) as stack:
        outcome = run_case(stack, "key-rotation", rotate)
        reconcile(stack, outcome)
        checkpoint = load_checkpoint(stack.checkpoint)
        refused = checkpoint.counters.rejected
        assert set(refused) == {"untrusted_key"}, refused  # no bad_signature: nothing lost
        print(f"batches kept, then applied once trusted: {refused['untrusted_key']}")
        listed = coco("aggregator", "rejected", "list", "--checkpoint", str(stack.checkpoint))
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.startswith("kept: 0 "), listed.stdout
