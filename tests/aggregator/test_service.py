"""The aggregator service against a real Mosquitto (no MQTT mocks).

Async code runs through ``asyncio.run`` inside synchronous tests, with a timeout around
every wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry

from aggregator.accountant import amplify_spec
from aggregator.estimation.estimators import AggregateState
from aggregator.ledger import accountant_process
from aggregator.ledger.ledger_file import ledger_path_for, load_ledger
from aggregator.service.config import AggregatorConfig
from aggregator.service.core.batch_codec import encode_batch_arrays
from aggregator.service.core.checkpoint import CheckpointError
from aggregator.service.metric_labels import REJECT_REASONS
from aggregator.service.service import Aggregator
from edge import LocalMechanism, MechanismSpec
from edge.batch_auth import BatchSigner
from edge.topics import batches_topic
from tests import waiting
from tests.conftest import MOSQUITTO, Broker, free_port
from tests.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SPEC = MechanismSpec(mechanism="coco", d=12, s=2, epsilon=2.0)
DEPLOYMENT = "test"
DELTA = 1e-6
MIN_BATCH = 50
SHUFFLER_KEY = Ed25519PrivateKey.generate()
SIGNER = BatchSigner(SHUFFLER_KEY, DEPLOYMENT)
ROOT = Path(__file__).resolve().parents[2]

Reports = tuple[NDArray[np.uint32], NDArray[np.int64]]


def reports(n: int, seed: int, spec: MechanismSpec = SPEC) -> Reports:
    rng = np.random.default_rng(seed)
    keys = np.array([rng.choice(spec.d, size=spec.s, replace=False) for _ in range(n)])
    signs = rng.choice([-1, 1], size=(n, spec.s))
    return LocalMechanism.from_spec(spec).randomise_sparse(keys, signs, rng)


def raw_batch(
    rep: Reports, batch_id: int, *, fingerprint: int | None = None, round_: int = 1
) -> bytes:
    """An unsealed batch (what the shuffler signs)."""
    fp = SPEC.fingerprint_int if fingerprint is None else fingerprint
    return encode_batch_arrays(fp, round_, batch_id.to_bytes(16, "big"), rep[0], rep[1])


def batch(
    rep: Reports,
    batch_id: int,
    *,
    fingerprint: int | None = None,
    round_: int = 1,
    signer: BatchSigner = SIGNER,
) -> bytes:
    """A batch sealed by ``signer`` (by default the shuffler key the tests trust)."""
    return signer.seal(raw_batch(rep, batch_id, fingerprint=fingerprint, round_=round_))


def offline(*reps: Reports) -> AggregateState:
    state = AggregateState(SPEC)
    for seeds, z in reps:
        state.add(seeds, z)
    return state


def config(broker: Broker, tmp_path: Path | None, **kwargs: Any) -> AggregatorConfig:
    options: dict[str, Any] = {
        "broker": broker.url,
        "deployment": DEPLOYMENT,
        "spec": SPEC,
        "delta": DELTA,
        "min_batch": MIN_BATCH,
        "batch_public_key": SIGNER.public_key_hex,
        "checkpoint": None if tmp_path is None else tmp_path / "ckpt.json",
        "checkpoint_interval": 0.2,
        "http_port": 0,
        "client_id": f"agg-{broker.port}",
        "reconnect_min": 0.05,
        "reconnect_max": 0.5,
    }
    options.update(kwargs)
    return AggregatorConfig(**options)


async def publish(broker: Broker, *payloads: bytes) -> None:
    async with asyncio.timeout(10), aiomqtt.Client("127.0.0.1", broker.port) as client:
        for payload in payloads:
            await client.publish(batches_topic(DEPLOYMENT), payload, qos=1)


def moving(agg: Aggregator) -> waiting.Progress:
    """What moves while ``agg`` works (tests/waiting.py): its counters and connections, the
    privacy ledger's generations, the accountant's CPU time."""

    def progress() -> tuple[object, ...]:
        c = agg.counters
        return (
            c.batches,
            c.duplicates,
            sum(c.rejected.values()),
            agg.connections,
            agg.subscribed.is_set(),
            agg.core.ledger.generation,
            agg.publisher.level.generation,
            waiting.cpu_seconds(accountant_process.worker_pid()),
        )

    return progress


async def with_aggregator(
    cfg: AggregatorConfig,
    body: Callable[[Aggregator], Awaitable[None]],
    registry: CollectorRegistry | None = None,
    entered: Callable[[Aggregator], None] | None = None,
) -> Aggregator:
    """Run the service around ``body(aggregator)``, then shut it down cleanly. ``entered``
    sees the service recovered and not yet running (what its session queued may be applied
    as soon as it runs)."""
    async with Aggregator(cfg, registry=registry) as agg:
        if entered is not None:
            entered(agg)
        task = asyncio.create_task(agg.run())
        try:
            await until(agg.subscribed.is_set, 10, what="the aggregator subscribed")
            await body(agg)
        finally:
            task.cancel()
            async with asyncio.timeout(10):
                await asyncio.gather(task, return_exceptions=True)
    return agg


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def assert_same_estimates(agg: Aggregator, expected: AggregateState) -> None:
    assert agg.state.n == expected.n
    np.testing.assert_array_equal(agg.state.sum_u, expected.sum_u)
    np.testing.assert_array_equal(agg.state.sum_v, expected.sum_v)
    assert agg.state.estimate().to_dict() == expected.estimate().to_dict()


HOSTILE_REJECTED = {
    "bad_length": 1,
    "bad_signature": 4,
    "bad_count": 1,
    "fingerprint_mismatch": 1,
    "z_out_of_range": 1,
    "below_min_batch": 1,
    "empty": 1,
}
"""What :func:`with_hostile_batches` adds to the rejection counters, by reason."""


def with_hostile_batches(r1: Reports, r2: Reports, r3: Reports) -> list[bytes]:
    """Three good batches (ids 1, 4, 5), a redelivery of batch 1 and one batch per rejection
    of :data:`HOSTILE_REJECTED`."""
    bad_z = (r1[0][:60], np.full(60, SPEC.t, dtype=np.int64))
    other_key = BatchSigner.generate(DEPLOYMENT)
    other_deployment = BatchSigner(SHUFFLER_KEY, "other")
    return [
        batch(r1, 1),
        b"\x01\x02garbage",  # bad_length (shorter than a header and a signature)
        raw_batch(r2, 7),  # bad_signature: not sealed at all
        other_deployment.seal(raw_batch(r2, 11)),  # bad_signature: the trusted key, but
        # sealed for another deployment
        batch(r2, 8, signer=other_key),  # bad_signature: sealed by a key nobody trusts
        batch(r3, 6)[:-1],  # bad_signature: a byte cut from a sealed batch
        SIGNER.seal(raw_batch(r3, 6)[:-1]),  # bad_count (length does not match the count)
        batch(r2, 2, fingerprint=SPEC.fingerprint_int ^ 1),  # fingerprint_mismatch
        batch(bad_z, 3),  # z_out_of_range
        batch((r1[0][:1], r1[1][:1]), 9),  # below_min_batch: one record
        batch((r1[0][:0], r1[1][:0]), 10),  # empty
        batch(r2, 4),
        batch(r1, 1),  # redelivery of batch 1
        batch(r3, 5),
    ]


def assert_hostile_rejections(registry: CollectorRegistry) -> None:
    value = registry.get_sample_value
    for reason in REJECT_REASONS:
        got = value("coco_aggregator_batches_rejected_total", {"reason": reason})
        assert got == HOSTILE_REJECTED.get(reason, 0), reason
    # reports are counted in verified batches only
    assert value("coco_aggregator_reports_rejected_total", {"reason": "z_out_of_range"}) == 60
    assert value("coco_aggregator_reports_rejected_total", {"reason": "below_min_batch"}) == 1
    assert value("coco_aggregator_reports_rejected_total", {"reason": "bad_signature"}) is None


def test_estimates_metrics_rejections_and_endpoint(mosquitto: Broker) -> None:
    registry = CollectorRegistry()
    r1, r2, r3 = reports(300, 1), reports(120, 2), reports(200, 3)
    payloads = with_hostile_batches(r1, r2, r3)
    expected = offline(r1, r2, r3)
    fetched: dict[str, Any] = {}

    async def body(agg: Aggregator) -> None:
        await publish(mosquitto, *payloads)
        await until(
            lambda: agg.counters.batches == 3 and agg.counters.duplicates == 1, progress=moving(agg)
        )
        await until(lambda: sum(agg.counters.rejected.values()) == 10, progress=moving(agg))
        # accounted off the event loop
        await until(lambda: agg.privacy_settled, 90, progress=moving(agg))
        url = f"http://127.0.0.1:{agg.http_port}"

        def get(path: str) -> bytes:
            with urllib.request.urlopen(url + path, timeout=5) as response:
                data: bytes = response.read()
                return data

        fetched["estimates"] = json.loads(await asyncio.to_thread(get, "/estimates"))
        fetched["metrics"] = (await asyncio.to_thread(get, "/metrics")).decode()

    agg = run(with_aggregator(config(mosquitto, None), body, registry))
    assert_same_estimates(agg, expected)

    value = registry.get_sample_value
    assert value("coco_aggregator_reports_total") == expected.n == 620
    assert value("coco_aggregator_batches_total") == 3
    assert value("coco_aggregator_batches_duplicate_total") == 1
    assert_hostile_rejections(registry)
    assert value("coco_aggregator_n") == 620
    assert value("coco_aggregator_delta") == DELTA
    assert value("coco_aggregator_epsilon_local") == SPEC.epsilon
    # one round: one participation at its smallest release (no manifest: the smallest
    # batch), which is also the newest round's level. The smallest is the one-record batch
    # signed by the trusted key: refused (below_min_batch), never applied, but released to
    # whoever listens on the topic, so charged at its real size.
    smallest = amplify_spec(SPEC, n=1, delta=DELTA).epsilon_central
    latest = smallest
    assert value("coco_aggregator_epsilon_central", {"batch": "smallest"}) == smallest
    assert value("coco_aggregator_epsilon_central", {"batch": "latest"}) == latest
    est = expected.estimate()
    for j in range(SPEC.d):
        labels = {"dim": str(j)}
        assert value("coco_aggregator_estimate_mean", labels) == est.mean[j]
        assert value("coco_aggregator_estimate_mean_ci_halfwidth", labels) == pytest.approx(
            est.mean_halfwidth[j]
        )
        assert value("coco_aggregator_estimate_freq", labels) == est.freq[j]
    info = {"mechanism": "coco", "d": "12", "s": "2", "t": str(SPEC.t)}
    assert value("coco_aggregator_mechanism_info", {**info, "fingerprint": SPEC.fingerprint}) == 1
    assert value("coco_aggregator_last_batch_timestamp_seconds") is not None

    document = fetched["estimates"]
    assert document["n"] == 620
    assert document["spec"] == SPEC.to_dict()
    assert document["estimates"] == expected.estimate().to_dict()
    assert document["epsilon_central"] == {"smallest": smallest, "latest": latest}
    assert document["delta"] == DELTA
    assert document["min_batch"] == MIN_BATCH
    assert document["counters"]["rejected"] == dict(sorted(HOSTILE_REJECTED.items()))
    assert document["counters"]["duplicates"] == 1
    assert 'coco_aggregator_batches_rejected_total{reason="bad_count"} 1.0' in fetched["metrics"]


def test_shutdown_tells_what_this_run_applied_and_rejected(
    mosquitto: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aggregator.service")
    r1, r2, r3 = reports(300, 1), reports(120, 2), reports(200, 3)

    async def body(agg: Aggregator) -> None:
        await publish(mosquitto, *with_hostile_batches(r1, r2, r3))
        await until(
            lambda: agg.counters.batches == 3 and agg.counters.duplicates == 1, progress=moving(agg)
        )
        await until(lambda: sum(agg.counters.rejected.values()) == 10, progress=moving(agg))

    run(with_aggregator(config(mosquitto, tmp_path), body))
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stopping")]
    rejected = dict(sorted(HOSTILE_REJECTED.items()))
    assert summary == [
        "stopping: this run applied 3 batches (620 reports) and ignored 1 duplicates; "
        f"rejected 10 batches {rejected} holding 181 verified reports "
        "{'below_min_batch': 1, 'fingerprint_mismatch': 120, 'z_out_of_range': 60}; "
        "left 0 batches unacknowledged {}, which the broker redelivers to the session"
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.getMessage() in summary)


def test_metrics_dims_are_bounded(mosquitto: Broker) -> None:
    registry = CollectorRegistry()
    agg = Aggregator(config(mosquitto, None, metrics_dims=3), registry=registry)
    agg.metrics.set_estimates(agg.state.estimate())
    assert registry.get_sample_value("coco_aggregator_estimate_mean", {"dim": "2"}) is not None
    assert registry.get_sample_value("coco_aggregator_estimate_mean", {"dim": "3"}) is None
    cfg = config(mosquitto, None, metrics_dims=[1, 5])
    assert cfg.exported_dims == (1, 5)
    assert config(mosquitto, None).exported_dims == tuple(range(12))
    with pytest.raises(ValueError, match="metrics_dims"):
        config(mosquitto, None, metrics_dims=[12])


def test_checkpoint_restart_counts_each_batch_once(mosquitto: Broker, tmp_path: Path) -> None:
    rs = [reports(100 + 10 * i, 10 + i) for i in range(6)]

    async def first(agg: Aggregator) -> None:
        await publish(mosquitto, batch(rs[0], 100), batch(rs[1], 101))
        await until(lambda: agg.counters.batches == 2, progress=moving(agg))

    run(with_aggregator(config(mosquitto, tmp_path), first))
    saved = json.loads((tmp_path / "ckpt.json").read_text())
    ledger = load_ledger(ledger_path_for(tmp_path / "ckpt.json"), spec=SPEC, delta=DELTA)
    assert ledger is not None  # epsilon_total's history, in its own file
    # batches without a manifest: a participation each (nothing says which rounds their
    # reports were sent in)
    assert ledger.rounds() == {100: 1, 110: 1}
    assert saved["state"]["n"] == 210
    assert saved["batch_rounds"] == {
        "1": [(100).to_bytes(16, "big").hex(), (101).to_bytes(16, "big").hex()]
    }

    # Published while the service is down: queued in its persistent session.
    run(publish(mosquitto, batch(rs[2], 102), batch(rs[0], 100)))

    resumed: list[int] = []

    async def second(agg: Aggregator) -> None:
        await until(
            lambda: agg.counters.batches == 3 and agg.counters.duplicates >= 1, progress=moving(agg)
        )
        await publish(mosquitto, batch(rs[3], 103), batch(rs[1], 101))
        await until(
            lambda: agg.counters.batches == 4 and agg.counters.duplicates >= 2, progress=moving(agg)
        )
        # the restored history included
        await until(lambda: agg.privacy_settled, 90, progress=moving(agg))

    registry = CollectorRegistry()
    agg = run(
        with_aggregator(
            config(mosquitto, tmp_path), second, registry, lambda a: resumed.append(a.state.n)
        )
    )
    # resumed from the checkpoint before the queued batches came in (they may come in as
    # soon as it subscribes, before the body runs)
    assert resumed == [210]
    assert_same_estimates(agg, offline(*rs[:4]))
    assert registry.get_sample_value("coco_aggregator_batches_total") == 4
    assert registry.get_sample_value("coco_aggregator_reports_total") == agg.state.n
    smallest = amplify_spec(SPEC, n=100, delta=DELTA).epsilon_central
    assert (
        registry.get_sample_value("coco_aggregator_epsilon_central", {"batch": "smallest"})
        == smallest
    )
    saved = json.loads((tmp_path / "ckpt.json").read_text())
    ledger = load_ledger(ledger_path_for(tmp_path / "ckpt.json"), spec=SPEC, delta=DELTA)
    assert ledger is not None
    assert ledger.rounds() == {100: 1, 110: 1, 120: 1, 130: 1}
    assert ledger.releases == 4
    assert saved["state"] == offline(*rs[:4]).to_dict()
    assert saved["counters"]["batches"] == 4


def test_a_restart_behind_a_backlog_keeps_its_lease(mosquitto: Broker, tmp_path: Path) -> None:
    """More batches queued in the session than the broker lets through unacknowledged
    (Mosquitto's ``max_inflight_messages``, 20) hold back the lease claims: after
    ``lease_timeout`` the service applies them, and the previous run's retained claim, which
    arrives behind them, is older than its own: the service keeps running (it used to stop,
    taking it for a takeover)."""
    rs = [reports(MIN_BATCH, 60 + i) for i in range(32)]

    async def first(agg: Aggregator) -> None:  # applies a batch: its claim came back
        await publish(mosquitto, batch(rs[0], 200))
        await until(lambda: agg.counters.batches == 1, progress=moving(agg))

    run(with_aggregator(config(mosquitto, tmp_path), first))
    run(publish(mosquitto, *(batch(rs[i], 200 + i) for i in range(1, 31))))

    async def body(agg: Aggregator) -> None:
        await until(lambda: agg.counters.batches == 31, 20, progress=moving(agg))
        await publish(mosquitto, batch(rs[31], 231))  # behind both claims
        await until(lambda: agg.counters.batches == 32, progress=moving(agg))
        assert agg.subscribed.is_set()

    agg = run(with_aggregator(config(mosquitto, tmp_path, lease_timeout=0.5), body))
    assert_same_estimates(agg, offline(*rs))


def test_a_stop_before_the_lease_claim_came_back_stops(mosquitto: Broker) -> None:
    """Cancelled while it waits for its own claim (right after it subscribed), the service
    stops; it used to hang there for ever."""

    async def scenario() -> None:
        async with Aggregator(config(mosquitto, None)) as agg:
            task = asyncio.create_task(agg.run())
            await until(agg.subscribed.is_set, 10, what="the aggregator subscribed")
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=20)
            assert done == {task}

    run(scenario())


def test_a_cancelled_checkpoint_finishes_its_write_before_releasing(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """Shutdown cancels the checkpoint loop, possibly while a write runs in its thread; the
    cancelled checkpoint must not return before the file is complete (the final checkpoint
    would otherwise find nothing dirty and skip, leaving a file still being written)."""
    path = tmp_path / "ckpt.json"

    async def scenario() -> None:
        async with Aggregator(config(mosquitto, tmp_path, checkpoint_interval=3600)) as agg:
            agg.state.add(*reports(500, 7))
            agg.core.dirty = True
            task = asyncio.create_task(agg.checkpoint())
            while not path.with_name(f".{path.name}.tmp").exists() and not path.exists():
                await asyncio.sleep(0)  # until the thread has started writing
            task.cancel()  # usually mid-write; a write that already ended passes trivially
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert json.loads(path.read_text())["state"]["n"] == 500
            assert not agg.core.dirty

    run(scenario())


_CHILD = """
import asyncio, json, sys
from pathlib import Path
from aggregator.service.config import AggregatorConfig
from aggregator.service.service import run_aggregator
from edge import MechanismSpec
a = json.loads(sys.argv[1])
cfg = AggregatorConfig(
    broker=a["broker"], deployment=a["deployment"], spec=MechanismSpec.from_dict(a["spec"]),
    delta=a["delta"], checkpoint=Path(a["checkpoint"]), checkpoint_interval=3600,
    max_unacked=1000, http_port=a["port"], client_id=a["client_id"],
    min_batch=a["min_batch"], batch_public_key=a["key"],
)
asyncio.run(run_aggregator(cfg))
"""


def test_crash_between_apply_and_checkpoint(mosquitto: Broker, tmp_path: Path) -> None:
    """SIGKILL after batches are applied but before they are checkpointed: the broker
    redelivers the unacknowledged batches and each is counted exactly once."""
    rs = [reports(150, 20 + i) for i in range(4)]
    cfg = config(mosquitto, tmp_path)

    async def first(agg: Aggregator) -> None:
        await publish(mosquitto, batch(rs[0], 200))
        await until(lambda: agg.counters.batches == 1, progress=moving(agg))

    run(with_aggregator(cfg, first))

    port = free_port()
    args = {
        "broker": mosquitto.url,
        "deployment": DEPLOYMENT,
        "spec": SPEC.to_dict(),
        "delta": DELTA,
        "checkpoint": str(cfg.checkpoint),
        "port": port,
        "client_id": cfg.mqtt_client_id,
        "min_batch": MIN_BATCH,
        "key": SIGNER.public_key_hex,
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(args)], cwd=ROOT, env=env)
    try:

        async def until_child_applied(n: int) -> None:
            def read() -> int:
                url = f"http://127.0.0.1:{port}/estimates"
                try:
                    with urllib.request.urlopen(url, timeout=2) as response:
                        count: int = json.loads(response.read())["n"]
                        return count
                except OSError:
                    return -1

            applied = -1

            def seen() -> bool:
                return applied == n

            async def poll() -> None:
                nonlocal applied
                while applied != n:
                    applied = await asyncio.to_thread(read)
                    await asyncio.sleep(0.05)

            poller = asyncio.create_task(poll())
            # the child's progress: the reports it applied, its CPU time
            await until(
                seen,
                20,
                progress=lambda: (applied, waiting.cpu_seconds(child.pid)),
                what=f"{n} applied",
            )
            await poller

        run(until_child_applied(150))
        run(publish(mosquitto, batch(rs[1], 201), batch(rs[2], 202)))
        run(until_child_applied(450))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    saved = json.loads(Path(str(cfg.checkpoint)).read_text())
    assert saved["state"]["n"] == 150  # the crash lost the in-memory state

    async def second(agg: Aggregator) -> None:
        await until(lambda: agg.counters.batches == 3, progress=moving(agg))
        await publish(mosquitto, batch(rs[3], 203))
        await until(lambda: agg.counters.batches == 4, progress=moving(agg))
        await asyncio.sleep(0.3)  # a late double delivery would show up here

    agg = run(with_aggregator(cfg, second))
    assert agg.counters.batches == 4
    assert_same_estimates(agg, offline(*rs))


def test_broker_restart_reconnects(mosquitto: Broker) -> None:
    rs = [reports(80, 30 + i) for i in range(2)]

    async def body(agg: Aggregator) -> None:
        await publish(mosquitto, batch(rs[0], 300))
        await until(lambda: agg.counters.batches == 1, progress=moving(agg))
        await asyncio.to_thread(mosquitto.restart)
        await until(
            lambda: agg.connections >= 2 and agg.subscribed.is_set(),
            20,
            progress=moving(agg),
        )
        await publish(mosquitto, batch(rs[1], 301))
        await until(lambda: agg.counters.batches == 2, progress=moving(agg))

    agg = run(with_aggregator(config(mosquitto, None), body))
    assert_same_estimates(agg, offline(*rs))


def test_checkpoint_of_another_spec_is_refused(mosquitto: Broker, tmp_path: Path) -> None:
    other = MechanismSpec(mechanism="collision", d=12, s=2, epsilon=2.0)
    state = AggregateState(other)
    (tmp_path / "ckpt.json").write_text(
        json.dumps(
            {
                "version": 2,
                "fingerprint": other.fingerprint,
                "state": state.to_dict(),
                "batch_rounds": {},
                "counters": {"reports": 0, "batches": 0, "duplicates": 0, "rejected": {}},
                "smallest_batch": None,
                "latest_batch": None,
                "last_batch_timestamp": None,
                "delta": DELTA,
            }
        )
    )

    async def enter() -> None:
        async with Aggregator(config(mosquitto, tmp_path)):
            pass

    with pytest.raises(CheckpointError, match=f"is for spec {other.fingerprint}"):
        run(enter())


def test_a_broker_that_drops_the_lease_claim_delays_batches_only_until_lease_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Mosquitto's ``acl_file`` grants a SUBSCRIBE it will never deliver on and drops a
    PUBLISH it forbids: the claim never comes back, and after ``lease_timeout`` the service
    applies the batches it held, with a warning."""
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed")
    acl = tmp_path / "acl"
    acl.write_text(f"topic readwrite {batches_topic(DEPLOYMENT)}\n")
    broker = Broker(tmp_path, free_port(), extra_config=f"acl_file {acl}\n")
    broker.start()
    caplog.set_level(logging.WARNING, logger="aggregator.service")
    rep = reports(MIN_BATCH, 40)
    try:

        async def body(agg: Aggregator) -> None:
            await publish(broker, batch(rep, 1))
            await until(lambda: agg.counters.batches == 1, progress=moving(agg))

        agg = run(with_aggregator(config(broker, None, lease_timeout=0.5), body))
    finally:
        broker.stop()
    assert_same_estimates(agg, offline(rep))
    assert any("applying batches without the lease" in r.getMessage() for r in caplog.records)
