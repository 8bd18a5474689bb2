"""The process-based pipeline scaffold: the ``coco`` command line in subprocesses, as an
operator runs it (tests/faults, tests/cluster, the aggregator's process tests,
tests/test_idle_cpu.py, bench/bench_shards.py). tests/pipeline.py is its in-process
counterpart; both wait with tests/waiting.py and read the services' HTTP endpoints with
tests/service_http.py.

Here: the ``coco`` command (:data:`COCO`, :func:`coco`), a restartable ``coco`` process
with its log (:class:`Process`), a service process with its output piped (:func:`service`,
:func:`wait_running`, :func:`stop`), the command lines of an announcement, a shuffler, an
aggregator and a fleet that the suites extend with their own options, readiness, and the
fleet's ``--acked-log``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from aggregator.estimation.estimators import AggregateState
from edge.spec import MechanismSpec
from tests import service_http, waiting

ROOT = Path(__file__).resolve().parents[1]
COCO = [sys.executable, "-c", "from sim.cli import main; main()"]
"""The ``coco`` command line, run by this interpreter (the checkout's, whatever PATH says)."""
TIMEOUT = 30.0
"""Seconds a process may take to stop, and the default stall window of :func:`wait_until`."""

SEED = int(os.environ.get("FAULT_SEED", str(random.SystemRandom().randrange(2**32))))
"""The seed of the moments of the suites' faults: printed, and replayed by ``FAULT_SEED=...``."""

wait_until = waiting.Waits(TIMEOUT, interval=0.1).wait_until
"""tests/waiting.py's wait, polled every 0.1 s (a poll may scrape a service's endpoints)."""


def rng_for(case: str) -> random.Random:
    """The moments of ``case``'s faults: one generator per case, from the logged suite seed."""
    print(f"FAULT_SEED={SEED} (case {case})")  # shown by pytest on failure
    return random.Random(f"{SEED}:{case}")


def env() -> dict[str, str]:
    """The environment of a service process: this checkout first, INFO logs."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "COCO_LOG_LEVEL": "info"}


def coco(
    *args: str,
    timeout: float = 120,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``coco args`` to its end, its output captured as text."""
    return subprocess.run(
        [*COCO, *args], check=False, capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env=env,
    )  # fmt: skip


def error_lines(output: str) -> list[str]:
    """The ``error: ...`` lines of a command's output."""
    return [line for line in output.splitlines() if line.startswith("error:")]


# -- a restartable process with its log ------------------------------------------------------


class Process:
    """One ``coco`` command, restartable, its output appended to ``log``."""

    def __init__(self, name: str, args: list[str], workdir: Path, *, capture: bool = False) -> None:
        self.name = name
        self.capture = capture
        self.args = args
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                [*COCO, *self.args],
                stdout=subprocess.PIPE if self.capture else out,
                stderr=out if self.capture else subprocess.STDOUT,
                start_new_session=True,
            )

    def send(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float = TIMEOUT) -> int:
        """Its exit code; a failed assertion with the end of its log if it still runs after
        ``timeout`` s (the log is what tells why)."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still runs after {timeout:.0f} s; its log ends:\n"
                + self.output()[-4000:]
            ) from None

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Signal and wait; SIGKILL if it does not end within :data:`TIMEOUT`."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
            try:
                return self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def kill(self) -> None:
        """SIGKILL and reap it, if it runs, and close its pipe (a test's cleanup)."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


# -- a service process with its output piped ------------------------------------------------


@contextmanager
def service(args: list[str], cwd: Path = ROOT) -> Iterator[subprocess.Popen[str]]:
    """``args`` running in :func:`env`, stdout and stderr piped; killed if it still runs at
    the end."""
    proc = subprocess.Popen(
        args, cwd=cwd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def wait_running(
    predicate: Callable[[], object], proc: subprocess.Popen[str] | None = None, stall: float = 30
) -> None:
    """Until ``predicate``; fails when ``proc`` exits, or when its CPU time stands still for
    ``stall`` s (tests/waiting.py)."""

    def holds() -> bool:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the service exited: {proc.communicate()[1]}")
        return bool(predicate())

    waiting.wait_until(
        holds,
        stall,
        progress=None if proc is None else lambda: waiting.cpu_seconds(proc.pid),
        interval=0.05,
    )


def started(proc: subprocess.Popen[str], port: int) -> None:
    """Until the aggregator ``proc`` is subscribed to the batches (its /estimates says so)."""
    wait_running(lambda: aggregator_ready(port), proc)


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGTERM, then its exit code and stderr."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err


# -- readiness -------------------------------------------------------------------------------


def estimates(port: int) -> dict[str, Any] | None:
    """The aggregator's ``/estimates`` (tests/service_http.py), 2 s for an answer."""
    return service_http.estimates(port, timeout=2)


def aggregator_ready(port: int) -> bool:
    """Whether the aggregator on ``port`` is subscribed to the batches."""
    document = estimates(port)
    return document is not None and bool(document.get("subscribed"))


def shuffler_ready(port: int, gauge: str = "coco_shuffler_connected") -> bool:
    """Whether the shuffler's ``gauge`` is 1 (connected; ``coco_shuffler_ready`` once it
    also holds its shard's lease)."""
    samples = service_http.metrics(port)
    return samples is not None and samples.get(gauge) == 1


# -- command lines ---------------------------------------------------------------------------


def announce_args(
    deployment: str,
    spec: MechanismSpec,
    broker: str,
    *,
    min_batch: int,
    round_seconds: int,
    delta: str = "1e-6",
) -> list[str]:
    """``coco announce`` of ``spec``; the caller adds the keys (and its account)."""
    args = ["announce", "--deployment", deployment, "--mechanism", spec.mechanism]
    args += ["--d", str(spec.d), "--s", str(spec.s), "--epsilon", f"{spec.epsilon:g}"]
    args += ["--min-batch", str(min_batch), "--delta", delta]
    return [*args, "--round-seconds", str(round_seconds), "--broker", broker]


def shuffler_args(
    deployment: str, broker: str, *, state_dir: Path, signing_key: Path, metrics_port: int
) -> list[str]:
    """``coco shuffler`` with its durable state and batch key; the caller adds the rest."""
    args = ["shuffler", "--deployment", deployment, "--broker", broker]
    args += ["--state-dir", str(state_dir), "--signing-key", str(signing_key)]
    return [*args, "--metrics-port", str(metrics_port)]


def aggregator_args(
    deployment: str, broker: str, *, checkpoint: Path, metrics_port: int
) -> list[str]:
    """``coco aggregator run`` from a checkpoint; the caller adds the rest."""
    args = ["aggregator", "run", "--deployment", deployment, "--broker", broker]
    return [*args, "--checkpoint", str(checkpoint), "--metrics-port", str(metrics_port)]


def fleet_args(
    deployment: str,
    broker: str,
    *,
    devices: int,
    rounds: int,
    seed: int,
    round_spread: float,
    acked_log: Path,
) -> list[str]:
    """``coco fleet`` writing every acknowledged report to ``acked_log`` and its summary as
    JSON; the caller adds its mode."""
    args = ["fleet", "--deployment", deployment, "--broker", broker]
    args += ["--devices", str(devices), "--rounds", str(rounds), "--seed", str(seed)]
    args += ["--round-spread", str(round_spread), "--acked-log", str(acked_log)]
    return [*args, "--json", "--no-progress"]


# -- what the fleet was told, what was released ----------------------------------------------


def read_acked_reports(path: Path) -> Counter[tuple[int, int, int]]:
    """The ``(round, seed, z)`` of every report a device got a PUBACK for (``coco fleet
    --acked-log``: ``round seed z`` lines)."""
    acked: Counter[tuple[int, int, int]] = Counter()
    for line in path.read_text().splitlines():
        round_, seed, z = line.split()
        acked[int(round_), int(seed), int(z)] += 1
    return acked


def read_acked(path: Path) -> Counter[tuple[int, int]]:
    """The ``(seed, z)`` of every report a device got a PUBACK for, whatever its round."""
    acked: Counter[tuple[int, int]] = Counter()
    for (_round, seed, z), count in read_acked_reports(path).items():
        acked[seed, z] += count
    return acked


Records = Iterable[tuple[Sequence[int], Sequence[int]]]
"""The ``(seeds, zs)`` of released batches."""


def released(batches: Records) -> Counter[tuple[int, int]]:
    """The multiset of ``(seed, z)`` in ``batches``."""
    return Counter((seed, z) for seeds, zs in batches for seed, z in zip(seeds, zs, strict=True))


def offline(spec: MechanismSpec, batches: Records) -> AggregateState:
    """An :class:`AggregateState` of ``batches``, computed here: what the aggregator's sums
    must equal."""
    state = AggregateState(spec)
    batches = list(batches)
    seeds = [s for batch_seeds, _ in batches for s in batch_seeds]
    zs = [z for _, batch_zs in batches for z in batch_zs]
    state.add(np.array(seeds, dtype=np.uint32), np.array(zs, dtype=np.int64))
    return state
