"""Keys pinned, never swapped silently: real ``coco aggregator run`` processes and a real
Mosquitto, the way the README runs the aggregator (no ``--batch-public-key``: the key comes
from the announcement), with a checkpoint.

Issue 19's scenario: an announcement replayed with another key, the aggregator restarted.
It used to adopt the new key, resume the old checkpoint and apply a forged 200-report
batch while rejecting every genuine one. Now the pinned key stays in force (ERROR log,
``coco_aggregator_announcements_refused_total``), the batch signed by the announced key is
refused (``untrusted_key``) and kept in the quarantine, never applied, and every genuine one
applied, until the operator accepts the new key with ``coco aggregator trust``: then what
the accepted key signed is applied once (the operator vouched for it), and a batch signed
by the old key is ``bad_signature``."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from aggregator.service.trust import load_pins, trust_path
from edge.batch_auth import BatchSigner
from tests.aggregator.test_service import DEPLOYMENT, MIN_BATCH, SIGNER, batch, publish, reports
from tests.aggregator.test_single_writer import announce, coco_run
from tests.conftest import Broker, free_port
from tests.processes import (
    ROOT,
    coco,
    env,
    error_lines,
    estimates,
    service,
    started,
    stop,
    wait_running,
)
from tests.service_http import metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FORGER = BatchSigner.generate(DEPLOYMENT)


def trust_cli(checkpoint: Path, *args: str) -> subprocess.CompletedProcess[str]:
    trust = ["aggregator", "trust", "--checkpoint", str(checkpoint), *args]
    return coco(*trust, cwd=ROOT, env=env(), timeout=60)


def test_a_replayed_announcement_with_another_key_changes_nothing_until_the_operator_accepts(
    mosquitto: Broker, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "state" / "aggregator.json"
    port = free_port()
    args = coco_run(
        mosquitto, tmp_path, "--checkpoint", str(checkpoint), "--metrics-port", str(port),
        "--checkpoint-interval", "0.5", spec=False,
    )  # fmt: skip
    genuine = [reports(MIN_BATCH + i, 100 + i) for i in range(4)]

    asyncio.run(announce(mosquitto, SIGNER.public_key_hex))
    with service(args) as first:  # first use: the announced key is pinned
        started(first, port)
        asyncio.run(publish(mosquitto, batch(genuine[0], 1)))
        wait_running(lambda: (estimates(port) or {}).get("n") == MIN_BATCH, first)
        rc, err = stop(first)
    assert rc == 0, err
    pins = load_pins(trust_path(checkpoint))
    assert pins is not None
    assert pins.trusted == SIGNER.public_key_hex

    # someone replays the announcement with their own key and restarts the aggregator
    asyncio.run(announce(mosquitto, FORGER.public_key_hex))
    with service(args) as second:
        started(second, port)
        forged = batch(reports(200, 7), 99, signer=FORGER)
        asyncio.run(publish(mosquitto, forged, batch(genuine[1], 2), batch(genuine[2], 3)))
        expected = MIN_BATCH + sum(len(r[0]) for r in genuine[1:3])
        wait_running(lambda: (estimates(port) or {}).get("n") == expected, second)
        document = estimates(port)
        assert document is not None
        assert document["counters"]["rejected"] == {"untrusted_key": 1}
        assert document["batch_public_key"] == SIGNER.public_key_hex
        samples = metrics(port)
        assert samples is not None
        assert samples["coco_aggregator_announcements_refused_total"] == 1
        assert samples["coco_aggregator_quarantined{reason=untrusted_key}"] == 1

        shown = trust_cli(checkpoint)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines() == [
            f"pinned:  {SIGNER.public_key_hex}",
            f"refused: {FORGER.public_key_hex}",
        ]
        # the operator accepts the announced key: the running service picks it up
        accepted = trust_cli(checkpoint, "--accept-announced")
        assert accepted.returncode == 0, accepted.stderr
        assert accepted.stdout.splitlines()[:2] == [
            f"old: {SIGNER.public_key_hex}",
            f"new: {FORGER.public_key_hex}",
        ]
        wait_running(
            lambda: (estimates(port) or {}).get("batch_public_key") == FORGER.public_key_hex,
            second,
        )
        expected += 200  # the kept batch, signed by the key accepted, applied once
        wait_running(lambda: (estimates(port) or {}).get("n") == expected, second)
        asyncio.run(publish(mosquitto, batch(genuine[3], 4, signer=FORGER), batch(genuine[3], 5)))
        expected += len(genuine[3][0])
        wait_running(
            lambda: (
                (estimates(port) or {}).get("counters", {}).get("rejected")
                == {"untrusted_key": 1, "bad_signature": 1}
            ),
            second,
        )
        assert_the_kept_batch_was_replayed(port)
        assert (estimates(port) or {}).get("n") == expected
        rc, err = stop(second)
    assert rc == 0, err
    refusals = [line for line in err.splitlines() if "refused the announced batch key" in line]
    assert len(refusals) == 1, err
    assert "ERROR" in refusals[0]
    assert FORGER.public_key_hex in refusals[0]

    assert_an_option_against_the_pin_is_refused(mosquitto, tmp_path, checkpoint, port)


def assert_the_kept_batch_was_replayed(port: int) -> None:
    samples = metrics(port)
    assert samples is not None
    assert samples["coco_aggregator_quarantined{reason=untrusted_key}"] == 0
    assert samples["coco_aggregator_quarantine_replayed_total{outcome=applied}"] == 1


def assert_an_option_against_the_pin_is_refused(
    mosquitto: Broker, tmp_path: Path, checkpoint: Path, port: int
) -> None:
    """A restart with the old key as an option is refused: the pin moved, and only the
    operator moves it back."""
    option = coco_run(
        mosquitto, tmp_path, "--checkpoint", str(checkpoint), "--metrics-port", str(port),
        "--batch-public-key", SIGNER.public_key_hex, spec=False,
    )  # fmt: skip
    asyncio.run(announce(mosquitto, SIGNER.public_key_hex))
    refused = subprocess.run(
        option, check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1
    errors = error_lines(refused.stderr)
    assert len(errors) == 1, refused.stderr
    assert "differs from the key pinned in" in errors[0]
    assert "coco aggregator trust" in errors[0]


def test_a_lost_trust_file_pins_the_checkpoint_s_key_not_the_announcement_s(
    mosquitto: Broker, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "aggregator.json"
    port = free_port()
    args = coco_run(
        mosquitto, tmp_path, "--checkpoint", str(checkpoint), "--metrics-port", str(port),
        spec=False,
    )  # fmt: skip
    asyncio.run(announce(mosquitto, SIGNER.public_key_hex))
    with service(args) as first:
        started(first, port)
        asyncio.run(publish(mosquitto, batch(reports(MIN_BATCH, 1), 1)))
        wait_running(lambda: (estimates(port) or {}).get("n") == MIN_BATCH, first)
        assert stop(first)[0] == 0
    trust_path(checkpoint).unlink()
    asyncio.run(announce(mosquitto, FORGER.public_key_hex))
    with service(args) as second:
        started(second, port)
        document = estimates(port)
        assert document is not None
        assert document["batch_public_key"] == SIGNER.public_key_hex
        rc, err = stop(second)
    assert rc == 0, err
    pins = load_pins(trust_path(checkpoint))
    assert pins is not None
    assert pins.trusted == SIGNER.public_key_hex
    assert pins.refused == FORGER.public_key_hex


def test_a_damaged_trust_file_is_a_one_line_error(mosquitto: Broker, tmp_path: Path) -> None:
    checkpoint = tmp_path / "aggregator.json"
    path = trust_path(checkpoint)
    path.write_text(
        '{"batch_public_key": "' + "0" * 64 + '", "checksum": "' + "1" * 64 + '", '
        '"deployment": "test", "refused": null, "version": 1}\n'
    )
    asyncio.run(announce(mosquitto, SIGNER.public_key_hex))
    done = subprocess.run(
        coco_run(mosquitto, tmp_path, "--checkpoint", str(checkpoint), spec=False),
        check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    errors = error_lines(done.stderr)
    assert errors == [
        f"error: trust file {path}: field 'checksum' does not match the content: the file is "
        "damaged; restore it from a backup, or move it away and pin the key again with `coco "
        "aggregator trust --accept KEY`"
    ]
