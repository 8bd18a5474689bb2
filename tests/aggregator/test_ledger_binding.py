"""The checkpoint and the privacy ledger name each other, so that neither can be swapped or
rolled back silently (aggregator.service.core.binding): a ledger deleted, put back from an
older copy or of another deployment is refused, as is a checkpoint of another deployment;
a ledger ahead by one write (a kill -9 between the two writes) and the fallback to the
previous checkpoint generation are accepted; files from before the binding still load.

Real files throughout; the kill -9 is a real process killed between its two writes, the
refusal of ``coco aggregator run`` a real process."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from aggregator.ledger.ledger_file import ledger_path_for, previous_path, read_ledger
from aggregator.service.checkpoint_files import load_checkpoint, write_checkpoint
from aggregator.service.checkpoint_files import previous_path as checkpoint_previous
from aggregator.service.publishing import snapshot_from_checkpoint
from aggregator.service.service import Aggregator
from edge.errors import CocoError
from tests.aggregator.test_batch_rules import agg_config
from tests.aggregator.test_service import (
    DELTA,
    DEPLOYMENT,
    MIN_BATCH,
    SHUFFLER_KEY,
    SIGNER,
    SPEC,
    batch,
    reports,
)
from tests.processes import COCO, ROOT, env, error_lines


def run(tmp_path: Path, rounds: list[int], **kwargs: Any) -> tuple[int, int, float | None]:
    """Start an aggregator on ``tmp_path/ckpt.json``, apply one batch per round, each
    followed by a checkpoint generation, and stop: (n, participations, epsilon_total)."""

    async def main() -> tuple[int, int, float | None]:
        async with Aggregator(agg_config(tmp_path, **kwargs)) as agg:
            for round_ in rounds:
                payload = batch(reports(MIN_BATCH, round_), 100 + round_, round_=round_)
                assert await agg.handle_batch(payload) == "applied"
                await agg.checkpoint()
            return (
                agg.state.n,
                sum(agg.ledger.rounds().values()),
                agg.snapshot()["epsilon_total"],
            )

    return asyncio.run(main())


def refusal(tmp_path: Path, **kwargs: Any) -> str:
    """The one-line error an aggregator on ``tmp_path/ckpt.json`` refuses to start with."""
    with pytest.raises(CocoError) as caught:
        run(tmp_path, [], **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def ledger_files(tmp_path: Path) -> tuple[Path, Path]:
    ledger = ledger_path_for(tmp_path / "ckpt.json")
    return ledger, previous_path(ledger)


def test_a_deleted_ledger_is_refused(tmp_path: Path) -> None:
    run(tmp_path, [10, 11, 12])
    for path in ledger_files(tmp_path):
        path.unlink()
    message = refusal(tmp_path)
    ledger = ledger_files(tmp_path)[0]
    assert f"privacy ledger {ledger} is missing, but checkpoint" in message
    assert "put that file back from a backup" in message
    # nor does the offline snapshot show the epsilon_total of no ledger
    with pytest.raises(CocoError, match="is missing, but checkpoint"):
        snapshot_from_checkpoint(tmp_path / "ckpt.json")


def test_an_older_ledger_copy_put_back_is_refused(tmp_path: Path) -> None:
    ledger, prev = ledger_files(tmp_path)
    run(tmp_path, [10, 11])
    shutil.copy(ledger, tmp_path / "old.ledger")
    run(tmp_path, [12])
    # the older copy, valid and whole, in place of the newest file (its .prev as it was)
    shutil.copy(tmp_path / "old.ledger", ledger)
    message = refusal(tmp_path)
    assert f"privacy ledger {ledger} is older than checkpoint" in message
    # the newest ledger file lost: its previous generation is older than the checkpoint too
    ledger.unlink()
    assert f"privacy ledger {prev} is older than checkpoint" in refusal(tmp_path)


def test_a_checkpoint_or_ledger_of_another_deployment_is_refused(tmp_path: Path) -> None:
    run(tmp_path, [10, 11])
    message = refusal(tmp_path, deployment="fz")
    assert message == (
        f"checkpoint {tmp_path / 'ckpt.json'} is of deployment {DEPLOYMENT!r}, not this "
        f"service's --deployment 'fz'; run with --deployment {DEPLOYMENT} or give this "
        "deployment its own --checkpoint"
    )
    # the checkpoint moved away (a reset): the ledger left behind is the other deployment's
    for name in ("ckpt.json", "ckpt.json.previous"):
        (tmp_path / name).unlink()
    ledger = ledger_files(tmp_path)[0]
    assert f"privacy ledger {ledger} is of deployment {DEPLOYMENT!r}" in refusal(
        tmp_path, deployment="fz"
    )


CRASH = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from pathlib import Path
    import aggregator.service.checkpoint_files as checkpoint_files
    from aggregator.service.service import Aggregator
    from edge.batch_auth import BatchSigner
    from tests.aggregator.test_batch_rules import agg_config
    from tests.aggregator.test_service import DEPLOYMENT, MIN_BATCH, batch, reports

    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(sys.argv[2]))
    signer = BatchSigner(key, DEPLOYMENT)

    def killed(staged, path):  # between the ledger's write and the checkpoint's
        os.kill(os.getpid(), signal.SIGKILL)

    async def main():
        config = agg_config(Path(sys.argv[1]), batch_public_key=signer.public_key_hex)
        async with Aggregator(config) as agg:
            for round_ in (10, 11):
                payload = batch(reports(MIN_BATCH, round_), 100 + round_, round_=round_,
                                signer=signer)
                assert await agg.handle_batch(payload) == "applied"
                if round_ == 11:
                    checkpoint_files.install_checkpoint = killed
                await agg.checkpoint()

    asyncio.run(main())
    """
)


def test_a_kill_between_the_ledger_write_and_the_checkpoint_write_is_accepted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The ledger is written first: a process killed before its checkpoint leaves the ledger
    one write ahead, which is accepted, and its records stand."""
    raw = SHUFFLER_KEY.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    crashed = subprocess.run(
        [sys.executable, "-c", CRASH, str(tmp_path), raw.hex()],
        check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    checkpoint = load_checkpoint(tmp_path / "ckpt.json")
    loaded = read_ledger(ledger_files(tmp_path)[0], spec=SPEC, delta=DELTA)
    assert loaded is not None
    assert loaded.bound is not None
    assert (checkpoint.generation, loaded.bound.generation) == (1, 2)
    with caplog.at_level(logging.INFO, logger="aggregator.service"):
        n, participations, _ = run(tmp_path, [])
    assert (n, participations) == (MIN_BATCH, 2)  # round 11's batch is redelivered
    assert "is ahead of checkpoint generation 1 by one write" in caplog.text


def damage(path: Path) -> None:
    text = path.read_text()
    path.write_text(text.replace('"reports":', '"reports":1', 1))


def test_the_previous_checkpoint_generation_resumes_with_its_ledger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The newest checkpoint damaged: its previous generation resumes, with the newest
    ledger (ahead of it by one write) or, that one damaged too, with the previous ledger
    (the one that generation names)."""
    for case in ("checkpoint", "both"):
        where = tmp_path / case
        where.mkdir()
        _, participations, _ = run(where, [10, 11, 12])
        damage(where / "ckpt.json")
        if case == "both":
            ledger = ledger_files(where)[0]
            ledger.write_text(ledger.read_text()[:-20])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="aggregator.service"):
            n, resumed, _ = run(where, [])
        assert n == 2 * MIN_BATCH  # round 12's batch is redelivered
        assert "resuming from the previous generation 2" in caplog.text
        if case == "checkpoint":  # the ledger of generation 3 holds round 12 already
            assert "is ahead of checkpoint generation 2 by one write" in caplog.text
            assert resumed == participations
        else:  # the ledger generation 2 names; round 12 is recorded again when redelivered
            assert resumed == participations - 1


def test_files_written_before_the_binding_still_load_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, participations, _ = run(tmp_path, [10, 11])
    checkpoint = tmp_path / "ckpt.json"
    ledger, prev = ledger_files(tmp_path)
    # as written before the binding: no 'ledger' in the checkpoint, a version-1 ledger file
    old = dataclasses.replace(load_checkpoint(checkpoint), ledger=None)
    for path in (checkpoint_previous(checkpoint), prev):
        path.unlink()
    write_checkpoint(checkpoint, old)
    checkpoint_previous(checkpoint).unlink()
    content = json.loads(ledger.read_text())["ledger"]
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    document = {
        "format": "coco-privacy-ledger",
        "version": 1,
        "ledger": content,
        "sha256": hashlib.sha256(canonical.encode()).hexdigest(),
    }
    ledger.write_text(json.dumps(document) + "\n")
    assert "ledger" not in json.loads(checkpoint.read_text())
    with caplog.at_level(logging.WARNING, logger="aggregator.service"):
        assert run(tmp_path, []) == (2 * MIN_BATCH, participations, None)
    assert "their binding starts with the next checkpoint" in caplog.text
    assert f"checkpoint {checkpoint} and privacy ledger {ledger} written before" in caplog.text
    # from now on bound: the ledger deleted is refused
    assert load_checkpoint(checkpoint).ledger is not None
    for path in ledger_files(tmp_path):
        path.unlink()
    assert "is missing, but checkpoint" in refusal(tmp_path)


def test_coco_aggregator_run_refuses_a_deleted_ledger_in_one_line(tmp_path: Path) -> None:
    run(tmp_path, [10, 11])
    for path in ledger_files(tmp_path):
        path.unlink()
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC.to_dict()))
    result = subprocess.run(
        [
            *COCO, "aggregator", "run", "--broker", "mqtt://127.0.0.1:1",
            "--deployment", DEPLOYMENT, "--spec", str(spec_file), "--delta", str(DELTA),
            "--min-batch", str(MIN_BATCH), "--batch-public-key", SIGNER.public_key_hex,
            "--checkpoint", str(tmp_path / "ckpt.json"),
        ],
        check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1, result.stderr
    assert f"privacy ledger {ledger_files(tmp_path)[0]} is missing" in errors[0]
    assert "Traceback" not in result.stderr
