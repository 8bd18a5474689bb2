"""The accountant's own process: the same numbers as in-process, at a lower priority,
replaced when it dies, and gone when its parent is killed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggregator.ledger import accountant_process
from aggregator.ledger.levels import LedgerSnapshot, epsilon_curve
from aggregator.ledger.privacy_ledger import PrivacyLedger
from edge.spec import MechanismSpec
from tests import cputime, waiting

ROOT = Path(__file__).resolve().parents[2]
SPEC = MechanismSpec(mechanism="coco", d=8, s=2, epsilon=1.0)
DELTA = 1e-6


def one_size(count: int, size: int = 100) -> LedgerSnapshot:
    """A snapshot of ``count`` participations of ``size`` reports."""
    return LedgerSnapshot(rounds=((size, count),), smallest=size, latest=size, generation=count)


@pytest.fixture(autouse=True)
def fresh_worker() -> Iterator[None]:
    accountant_process.shutdown()
    yield
    accountant_process.shutdown()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie (exited, not yet reaped by its parent) counts as gone
    fields = cputime.stat_fields(pid)
    return fields is None or fields[0] == "Z"


def wait_until_gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` is gone within ``timeout`` s (scaled, tests/waiting.py)."""
    with contextlib.suppress(waiting.StalledError):
        waiting.wait_until(lambda: gone(pid), stall=timeout, interval=0.05)
    return gone(pid)


def test_the_worker_computes_exactly_what_the_ledger_computes_in_process() -> None:
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    for size in (200, 200, 350, 200):
        ledger.record(size)
    snapshot = ledger.snapshot()
    remote = asyncio.run(accountant_process.compute_level(SPEC, DELTA, snapshot))
    assert remote == PrivacyLedger(SPEC, delta=DELTA).compute(snapshot)
    assert remote.batches == 4
    grid = (100, 300, 1000)
    curve = asyncio.run(accountant_process.compute_curve(SPEC, DELTA, grid))
    assert curve == epsilon_curve(SPEC, delta=DELTA, grid=grid)


def test_the_worker_runs_at_a_lower_priority_than_the_service() -> None:
    asyncio.run(accountant_process.compute_level(SPEC, DELTA, one_size(1)))
    pid = accountant_process.worker_pid()
    assert pid is not None
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, mine + accountant_process.NICENESS)


def test_an_error_in_the_worker_is_raised_in_the_caller_and_the_worker_lives_on() -> None:
    with pytest.raises(ValueError, match="delta"):
        asyncio.run(accountant_process.compute_level(SPEC, 2.0, one_size(1)))
    pid = accountant_process.worker_pid()
    level = asyncio.run(accountant_process.compute_level(SPEC, DELTA, one_size(1)))
    assert level.batches == 1
    assert accountant_process.worker_pid() == pid


def test_a_killed_worker_is_replaced_and_the_call_still_answers() -> None:
    asyncio.run(accountant_process.compute_level(SPEC, DELTA, one_size(1)))
    pid = accountant_process.worker_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_until_gone(pid)
    level = asyncio.run(accountant_process.compute_level(SPEC, DELTA, one_size(2)))
    assert level.batches == 2
    assert accountant_process.worker_pid() not in (None, pid)


def test_kill_9_of_the_service_leaves_no_worker_behind() -> None:
    # a script with no __main__ guard: the worker must not re-import the caller's main
    script = (
        "import asyncio, sys, time\n"
        "from aggregator.ledger import accountant_process\n"
        "from edge.spec import MechanismSpec\n"
        "spec = MechanismSpec(mechanism='coco', d=8, s=2, epsilon=1.0)\n"
        "from aggregator.ledger.privacy_ledger import LedgerSnapshot\n"
        "snap = LedgerSnapshot(rounds=((100, 1),), smallest=100, latest=100, generation=1)\n"
        "asyncio.run(accountant_process.compute_level(spec, 1e-6, snap))\n"
        "print(accountant_process.worker_pid(), flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    ) as service:
        try:
            assert service.stdout is not None
            worker = int(service.stdout.readline())
            assert not gone(worker)
            service.send_signal(signal.SIGKILL)
            service.wait(timeout=10)
            assert wait_until_gone(worker)
            # nothing holds the service's stdout open any longer
            assert service.stdout.read() == ""
        finally:
            if service.poll() is None:
                service.kill()


LIVENESS = 120.0
"""A deadline for a call that must not wait behind a cancelled one (which would run for
SPIN seconds): generous for a loaded machine, far below SPIN."""
SPIN = 3600.0


def test_a_cancelled_call_does_not_keep_the_worker_busy() -> None:
    async def scenario() -> None:
        long = asyncio.create_task(accountant_process._call("spin", (SPIN,), None))
        await asyncio.sleep(0)  # queued; may or may not have started
        while accountant_process.worker_pid() is None:  # started: the worker computes
            await asyncio.sleep(0.05)
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        level = await accountant_process.compute_level(SPEC, DELTA, one_size(1), timeout=LIVENESS)
        assert level.batches == 1

    asyncio.run(scenario())


def test_a_call_past_its_time_limit_is_cancelled() -> None:
    async def scenario() -> None:
        with pytest.raises(accountant_process.AccountantTimeoutError):
            await accountant_process._call("spin", (SPIN,), 0.5)
        level = await accountant_process.compute_level(SPEC, DELTA, one_size(2), timeout=LIVENESS)
        assert level.batches == 2

    asyncio.run(scenario())


def test_level_now_never_waits_past_its_limit_and_keeps_what_it_started() -> None:
    """A scrape while the worker is busy gets the last level of its own ledger at once (here
    none yet); the computation it asked for finishes in the background and is served next."""
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    ledger.record_batch(round=1, shard="", batch_id=bytes(16), size=300)
    snapshot = ledger.snapshot()

    async def scenario() -> None:
        busy = asyncio.create_task(accountant_process._call("spin", (SPIN,), None))
        while accountant_process.worker_pid() is None:
            await asyncio.sleep(0.05)
        # queued behind the spin: not computed, and nothing known for this ledger
        assert accountant_process.level_now(SPEC, DELTA, snapshot, timeout=0) is None
        assert accountant_process.last_level(snapshot) is None
        busy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await busy

    asyncio.run(scenario())
    with contextlib.suppress(waiting.StalledError):  # the worker's CPU time is its progress
        waiting.wait_until(
            lambda: accountant_process.last_level(snapshot) is not None,
            progress=lambda: waiting.cpu_seconds(accountant_process.worker_pid()),
            stall=LIVENESS,
            interval=0.05,
        )
    level = accountant_process.last_level(snapshot)
    assert level is not None
    assert level == ledger.compute(snapshot)
    assert accountant_process.level_now(SPEC, DELTA, snapshot, timeout=0) == level


def test_a_level_is_never_served_for_another_ledger() -> None:
    first, second = PrivacyLedger(SPEC, delta=DELTA), PrivacyLedger(SPEC, delta=DELTA)
    for ledger in (first, second):
        ledger.record_batch(round=1, shard="", batch_id=bytes(16), size=200)
    level = accountant_process.level_now(SPEC, DELTA, first.snapshot(), timeout=LIVENESS)
    assert level is not None
    assert accountant_process.last_level(second.snapshot()) is None
    # a newer snapshot of the first ledger: its older level is served, marked as covering less
    first.record_batch(round=2, shard="", batch_id=bytes(15) + b"\x01", size=200)
    newer = first.snapshot()
    assert accountant_process.last_level(newer) == level
    assert level.generation < newer.generation
