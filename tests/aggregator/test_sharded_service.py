"""A sharded deployment through a real ``coco aggregator run`` and a real Mosquitto: the
announced layouts are pinned; shard batches on ``batches/<L>``, manifests on
``manifests/<L>``; a batch signed by an unannounced key, a manifest that disagrees with the
batches, and a batch that never comes, each counted; per-shard sizes in ``/estimates`` and
``/metrics``; a reshard announced is refused until the operator accepts it."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import aiomqtt
import pytest

from aggregator.service.trust import load_pins, trust_path
from edge.announce import encode_announcement
from edge.batch_auth import BatchSigner
from edge.codec import encode_manifest
from edge.shards import ShardLayout, ShardPlan
from edge.topics import batches_topic, manifests_topic, spec_topic
from tests.aggregator.test_service import (
    DELTA,
    DEPLOYMENT,
    MIN_BATCH,
    SPEC,
    Reports,
    raw_batch,
    reports,
)
from tests.aggregator.test_single_writer import coco_run
from tests.conftest import Broker, free_port
from tests.processes import (
    COCO,
    ROOT,
    env,
    estimates,
    service,
    started,
    stop,
    wait_running,
)
from tests.service_http import metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GRACE = 2.0


def layout(generation: int, signers: list[BatchSigner], from_round: int) -> ShardLayout:
    return ShardLayout(
        count=len(signers),
        from_round=from_round,
        generation=generation,
        seed=11 + generation,
        keys=tuple(s.public_key_hex for s in signers),
    )


async def announce(broker: Broker, plan: ShardPlan) -> None:
    payload = encode_announcement(SPEC.to_dict(), min_batch=MIN_BATCH, delta=DELTA, shards=plan)
    async with asyncio.timeout(10), aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.publish(spec_topic(DEPLOYMENT), payload, qos=1, retain=True)


async def send(broker: Broker, *messages: tuple[str, bytes]) -> None:
    async with asyncio.timeout(10), aiomqtt.Client("127.0.0.1", broker.port) as client:
        for topic, payload in messages:
            await client.publish(topic, payload, qos=1)


def test_a_sharded_deployment_end_to_end(mosquitto: Broker, tmp_path: Path) -> None:
    round_ = int(time.time() // 60)
    old = [BatchSigner.generate(DEPLOYMENT, f"g0s{i}") for i in range(2)]
    plan = ShardPlan((layout(0, old, round_ - 5),))
    checkpoint = tmp_path / "aggregator.json"
    port = free_port()
    args = coco_run(
        mosquitto, tmp_path, "--checkpoint", str(checkpoint), "--metrics-port", str(port),
        "--manifest-grace", str(GRACE), spec=False,
    )  # fmt: skip
    rs = [reports(MIN_BATCH + 10 * i, 300 + i) for i in range(5)]

    def sealed(i: int, signer: BatchSigner, batch_id: int, at: int = round_) -> bytes:
        return signer.seal(raw_batch(rs[i], batch_id, round_=at))

    def manifest(signer: BatchSigner, release: int, entries: list[tuple[int, int]]) -> bytes:
        body = encode_manifest(
            SPEC.fingerprint_int,
            round_,
            release.to_bytes(16, "big"),
            [(b.to_bytes(16, "big"), c) for b, c in entries],
            [(round_, 60, sum(c for _, c in entries))],
        )
        return signer.seal_manifest(body)

    size = [len(r[0]) for r in rs]
    asyncio.run(announce(mosquitto, plan))
    with service(args) as proc:
        started(proc, port)
        forger = BatchSigner.generate(DEPLOYMENT, "g0s0")
        asyncio.run(
            send(
                mosquitto,
                (batches_topic(DEPLOYMENT, "g0s0"), sealed(0, old[0], 1)),
                (batches_topic(DEPLOYMENT, "g0s1"), sealed(1, old[1], 2)),
                (batches_topic(DEPLOYMENT, "g0s0"), sealed(2, forger, 3)),  # unannounced key
                (batches_topic(DEPLOYMENT, "g0s1"), sealed(3, old[1], 4)),
                # g0s0's release listed batch 1 and batch 5, which never comes
                (manifests_topic(DEPLOYMENT, "g0s0"), manifest(old[0], 1, [(1, size[0]), (5, 70)])),
                # g0s1's manifest says batch 2 had another count: rejected (manifest_mismatch);
                # a signed release the ledger cannot place is charged at min_batch
                (manifests_topic(DEPLOYMENT, "g0s1"), manifest(old[1], 2, [(2, size[1] + 1)])),
                (
                    manifests_topic(DEPLOYMENT, "g0s1"),
                    manifest(old[1], 3, [(2, size[1]), (4, size[3])]),
                ),
            ),
        )

        def reconciled() -> bool:
            document = estimates(port) or {}
            return bool(document.get("manifests", {}).get("reports_missing") == 70)

        wait_running(reconciled, proc)
        document = estimates(port)
        assert document is not None
        assert document["n"] == size[0] + size[1] + size[3]
        assert document["shards"] == {
            "g0s0": {"batches": 1, "reports": size[0], "smallest": size[0], "latest": size[0]},
            "g0s1": {
                "batches": 2,
                "reports": size[1] + size[3],
                "smallest": size[1],
                "latest": size[3],
            },
        }
        # the guarantee every report has: the smallest release of the round. g0s0's manifest
        # gives 70 + size[0] (whatever came here), but g0s1's rejected one is charged as a
        # release of min_batch reports: nothing may be assumed of its size
        assert size[0] + 70 > MIN_BATCH
        assert document["batch_size"]["smallest"] == MIN_BATCH
        assert document["counters"]["rejected"] == {"bad_signature": 1}
        assert document["counters"]["manifests_rejected"] == {"manifest_mismatch": 1}
        losses = document["manifests"]["recent_losses"]
        assert [(x["shard"], x["start"], x["reports"]) for x in losses] == [
            ("g0s0", round_ * 60, 70)  # a round is told by its start
        ]
        samples = metrics(port)
        assert samples is not None
        assert samples["coco_aggregator_reports_missing_total"] == 70
        assert samples["coco_aggregator_manifests_total"] == 2
        assert samples["coco_aggregator_manifests_rejected_total{reason=manifest_mismatch}"] == 1
        assert samples["coco_aggregator_shard_batch_size{batch=smallest,shard=g0s1}"] == size[1]
        assert samples["coco_aggregator_shard_reports_total{shard=g0s0}"] == size[0]

        reshard(
            mosquitto, proc, port=port, checkpoint=checkpoint, plan=plan, rep=rs[4], round_=round_
        )
        rc, err = stop(proc)
    assert rc == 0, err


def reshard(
    mosquitto: Broker,
    proc: subprocess.Popen[str],
    *,
    port: int,
    checkpoint: Path,
    plan: ShardPlan,
    rep: Reports,
    round_: int,
) -> None:
    """A second layout from the next round on: refused until the operator accepts it, what
    its new shard signed meanwhile kept, then applied once."""
    new = [BatchSigner.generate(DEPLOYMENT, f"g1s{i}") for i in range(3)]

    def sealed(batch_id: int) -> bytes:
        return new[2].seal(raw_batch(rep, batch_id, round_=round_ + 1))

    # a reshard: a second layout from the next round on; refused until accepted
    resharded = ShardPlan((plan.layouts[0], layout(1, new, round_ + 1)))
    asyncio.run(announce(mosquitto, resharded))
    wait_running(
        lambda: (metrics(port) or {}).get("coco_aggregator_announcements_refused_total") == 1,
        proc,
    )
    asyncio.run(send(mosquitto, (batches_topic(DEPLOYMENT, "g1s2"), sealed(6))))
    wait_running(
        lambda: (
            (estimates(port) or {}).get("counters", {}).get("rejected", {}).get("unknown_shard")
            == 1
        ),
        proc,
    )
    accepted = subprocess.run(
        [*COCO, "aggregator", "trust", "--checkpoint", str(checkpoint), "--accept-announced"],
        check=False, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr
    assert "new: shards g0s0=" in accepted.stdout
    pins = load_pins(trust_path(checkpoint))
    assert pins is not None
    assert "g1s2" not in pins.trusted  # the layouts as JSON: keys, not labels
    wait_running(lambda: "g1s2=" in (estimates(port) or {}).get("batch_public_key", ""), proc)

    def g1s2_batches() -> object:
        return (estimates(port) or {}).get("shards", {}).get("g1s2", {}).get("batches")

    # the batch refused before the trust command was kept, and is applied once now
    wait_running(lambda: g1s2_batches() == 1, proc)
    asyncio.run(send(mosquitto, (batches_topic(DEPLOYMENT, "g1s2"), sealed(7))))
    wait_running(lambda: g1s2_batches() == 2, proc)
    samples = metrics(port) or {}
    assert samples["coco_aggregator_quarantine_replayed_total{outcome=applied}"] == 1
    assert samples["coco_aggregator_quarantined{reason=unknown_shard}"] == 0


def test_a_shard_silent_while_the_others_release_is_logged_and_exported(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """Shard g0s2's shuffler never started: after 3 rounds the others released, one WARNING
    and the gauges say so; its first release, one INFO line."""
    round_ = int(time.time() // 60)
    signers = [BatchSigner.generate(DEPLOYMENT, f"g0s{i}") for i in range(3)]
    plan = ShardPlan((layout(0, signers, round_ - 10),))
    port = free_port()
    args = coco_run(
        mosquitto, tmp_path, "--metrics-port", str(port), "--silent-shard-rounds", "3",
        spec=False,
    )  # fmt: skip
    rep = reports(MIN_BATCH, 400)

    def sealed(shard: int, batch_id: int, at: int) -> tuple[str, bytes]:
        topic = batches_topic(DEPLOYMENT, f"g0s{shard}")
        return topic, signers[shard].seal(raw_batch(rep, batch_id, round_=at))

    def gauge(shard: str) -> float | None:
        samples = metrics(port) or {}
        return samples.get(f"coco_aggregator_shard_silent{{shard={shard}}}")

    asyncio.run(announce(mosquitto, plan))
    with service(args) as proc:
        started(proc, port)
        asyncio.run(
            send(
                mosquitto,
                *(
                    sealed(shard, 10 * k + shard, round_ - 3 + k)
                    for k in range(3)
                    for shard in (0, 1)
                ),
            )
        )
        wait_running(lambda: gauge("g0s2") == 1, proc)
        samples = metrics(port)
        assert samples is not None
        assert samples["coco_aggregator_shard_silent_rounds{shard=g0s2}"] == 3
        assert samples["coco_aggregator_shard_silent{shard=g0s0}"] == 0
        asyncio.run(send(mosquitto, sealed(2, 99, round_ - 1)))
        wait_running(lambda: gauge("g0s2") == 0, proc)
        rc, err = stop(proc)
    assert rc == 0, err
    warnings = [line for line in err.splitlines() if "has released nothing" in line]
    assert len(warnings) == 1, err
    assert "WARNING" in warnings[0]
    assert "shard g0s2 has released nothing for 3 rounds" in warnings[0]
    assert sum("shard g0s2 released again" in line for line in err.splitlines()) == 1, err
