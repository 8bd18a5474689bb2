"""The lease of an unsharded deployment (docs/protocol.md, section 13.4): one ``coco
shuffler`` per deployment, as one per shard. A second process with its own state directory
is refused at start with one line while the first holds ``coco/v1/<dep>/shards/-/lease``;
the same state directory restarted takes over at once. Real processes, real Mosquitto."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
from pathlib import Path

import aiomqtt
import pytest

from broker.service.lease import Lease
from edge.spec import MechanismSpec
from edge.topics import shard_lease_topic
from tests import waiting
from tests.conftest import Broker
from tests.processes import COCO

pytestmark = pytest.mark.integration

DEP = "unsharded-lease"
SPEC = MechanismSpec(mechanism="coco", d=16, s=2, epsilon=1.0)


def read_lease(broker: Broker) -> Lease | None:
    """The retained lease of the deployment (``None``: none within a second)."""

    async def read() -> Lease | None:
        async with aiomqtt.Client("127.0.0.1", broker.port) as client:
            await client.subscribe(shard_lease_topic(DEP, None), qos=1)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    async for message in client.messages:
                        assert isinstance(message.payload, bytes)
                        return Lease.decode(message.payload)
        return None

    return asyncio.run(read())


def test_a_second_unsharded_coco_shuffler_is_refused_and_a_restart_takes_over(
    mosquitto: Broker, tmp_path: Path
) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC.to_dict()))
    key = tmp_path / "signing.key"

    def shuffler(state: str) -> subprocess.Popen[str]:
        args = ["--broker", mosquitto.url, "--deployment", DEP, "--spec", str(spec)]
        args += ["--round-seconds", "2", "--min-batch", "5", "--max-skew", "0.5"]
        args += ["--state-dir", str(tmp_path / state), "--signing-key", str(key)]
        args += ["--create-signing-key", "--lease-ttl", "30", "--no-broker-stats"]
        return subprocess.Popen(
            [*COCO, "shuffler", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def holds(process: subprocess.Popen[str], state: str, other_than: str | None = None) -> Lease:
        """Wait until ``process`` (of state directory ``state``) holds the lease."""
        found: list[Lease] = []

        def held() -> bool:
            assert process.poll() is None, process.communicate()[0]
            owner_file = tmp_path / state / "owner.id"
            lease = read_lease(mosquitto)
            if lease is None or not owner_file.exists():
                return False
            mine = lease.owner == owner_file.read_text().strip()
            if mine and lease.instance != other_than and lease.ttl > 0:
                found.append(lease)
                return True
            return False

        waiting.wait_until(
            held,
            progress=lambda: waiting.cpu_seconds(process.pid),  # starting up is CPU work
            stall=60,
            what=f"the shuffler of {state} holds the lease",
            interval=0.1,
        )
        return found[-1]

    def refused() -> None:
        second = shuffler("b")
        out, _ = second.communicate(timeout=60)
        errors = [line for line in out.splitlines() if line.startswith("error:")]
        assert second.returncode == 1, out
        assert len(errors) == 1, out
        assert f"deployment {DEP} (unsharded) is held by another shuffler" in errors[0]
        assert "Traceback" not in out

    first = shuffler("a")
    again: subprocess.Popen[str] | None = None
    try:
        lease = holds(first, "a")
        refused()
        assert first.poll() is None  # the holder keeps running
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=60)
        assert first.returncode == 0, out
        # the same state directory: takes over at once, though its old lease is fresh (ttl 30)
        again = shuffler("a")
        taken = holds(again, "a", other_than=lease.instance)
        assert taken.owner == lease.owner
        refused()  # and it keeps the lease: another directory is still refused
        assert again.poll() is None
    finally:
        for process in (first, again):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate()
