"""The accountant's own process: the service's privacy numbers, computed beside it.

Why a process
-------------
The central privacy level costs CPU in bursts: a batch size not seen before needs its
certified bound (about 60 evaluations of the blanket curve), and ``epsilon_total`` needs a
fresh privacy loss distribution whenever the number of batches crosses a power of two
(2-3 s of CPU each at d = 512; :mod:`aggregator.accountant.composition`). Measured in
``bench/bench_pipeline.py`` (2-core machine, QoS 0, 100,000 reports): with that work in a
thread of the aggregator, the aggregator took 10 s of CPU during the run and the end-to-end
rate was 0.40-0.43 of raw Mosquitto; with no accounting at all, 4.4 s and 0.73. In a thread
it also holds the GIL against the event loop.

So the service hands every computation to one worker process at a lower CPU priority
(``nice`` :data:`NICENESS`): under load the pipeline (broker, shuffler, the service's own
loop) runs first and the privacy level follows when the CPU is free. That is safe because
the service never shows more privacy than it has computed: until the level covers the
newest batch it shows the previous one, with ``batches_accounted`` (:mod:`aggregator.
service`).

How
---
The worker is ``python -m aggregator.accountant_process``, started on first use and shared
by every aggregator of the process; it keeps the per-size caches of
:class:`~aggregator.privacy_ledger.PrivacyLedger` across calls. Calls are pickled frames on
its stdin and stdout, one at a time, each made from a daemon thread, so neither the event
loop nor the interpreter's exit waits for one, and any loop may call. A plain subprocess rather than
:mod:`multiprocessing`: it inherits no descriptor but stderr (``close_fds``: not the
checkpoint's lock, not a socket), and it never re-imports the caller's ``__main__`` (which
``spawn`` does, breaking any script without a ``__main__`` guard). It ends when its stdin
closes or its parent is gone (checked every :data:`PARENT_CHECK` seconds), so a ``kill -9``
of the service leaves nothing behind. What runs there is the same pure code as in a thread
(:meth:`PrivacyLedger.compute`, :func:`~aggregator.metrics.epsilon_curve`); the numbers are
identical. A worker that dies is replaced and the call retried once.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Final

from aggregator.privacy_ledger import PrivacyLedger, PrivacyLevel, Snapshot
from edge.spec import MechanismSpec

__all__ = [
    "NICENESS",
    "AccountantError",
    "compute_curve",
    "compute_level",
    "level_now",
    "shutdown",
    "worker_pid",
]

logger = logging.getLogger(__name__)

NICENESS: Final = 10
"""Added to the worker's nice value: CFS then gives it about a tenth of the CPU share of a
normal process while both want the CPU, and all of an idle one."""
PARENT_CHECK: Final = 0.25
_THREAD_VARIABLES: Final = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
_FRAME = struct.Struct(">I")


class AccountantError(RuntimeError):
    """The accountant's process could not be started or died twice in one call."""


def _write(stream: IO[bytes], value: object) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_FRAME.pack(len(data)) + data)
    stream.flush()


def _read(stream: IO[bytes]) -> Any:
    head = stream.read(_FRAME.size)
    if len(head) < _FRAME.size:
        raise EOFError("the pipe closed")
    (size,) = _FRAME.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the pipe closed")
    return pickle.loads(data)


# --- in the worker ------------------------------------------------------------------------


def _functions() -> dict[str, Callable[..., object]]:
    from aggregator.metrics import epsilon_curve  # noqa: PLC0415

    ledgers: dict[tuple[MechanismSpec, float], PrivacyLedger] = {}

    def level(spec: MechanismSpec, delta: float, snapshot: Snapshot) -> PrivacyLevel:
        ledger = ledgers.get((spec, delta))
        if ledger is None:  # its per-size cache of bounds lives as long as the worker
            ledger = ledgers[(spec, delta)] = PrivacyLedger(spec, delta=delta)
        return ledger.compute(snapshot)

    def curve(spec: MechanismSpec, delta: float, grid: tuple[int, ...]) -> dict[int, float]:
        return epsilon_curve(spec, delta=delta, grid=grid)

    return {"level": level, "curve": curve}


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling both ways, else an exception of the nearest class
    the service handles (ValueError, ArithmeticError) or a RuntimeError, with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # any failure: send its text instead
        for kind in (ValueError, ArithmeticError):
            if isinstance(exc, kind):
                return kind(repr(exc))
        return RuntimeError(repr(exc))
    return exc


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK)
    os._exit(0)  # the parent is gone (kill -9): nobody will read a result


def main() -> None:
    """The worker's loop: one request in, one response out, until stdin closes."""
    with contextlib.suppress(OSError):  # not permitted (some sandboxes): normal priority
        os.nice(NICENESS)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    # the frames get a private copy of stdout; anything else printed goes to stderr, so a
    # stray print cannot break the framing
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    functions = _functions()
    stdin = sys.stdin.buffer
    while True:
        try:
            name, args = _read(stdin)
        except EOFError:
            return
        try:
            response: tuple[str, object] = ("ok", functions[name](*args))
        except Exception as exc:  # handed to the caller, who raises it
            response = ("error", _portable(exc))
        try:
            _write(stdout, response)
        except BrokenPipeError:
            return


# --- in the service -----------------------------------------------------------------------


class _Worker:
    """The one worker process, started on first use and replaced if it dies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._exiting = False

    def _start(self) -> subprocess.Popen[bytes]:
        root = str(Path(__file__).resolve().parents[1])  # where the aggregator package is
        path = os.environ.get("PYTHONPATH")
        env = {
            **os.environ,
            "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}",
            # one core at most: numpy's BLAS threads would otherwise take every core
            **dict.fromkeys(_THREAD_VARIABLES, "1"),
        }
        try:
            return subprocess.Popen(
                # -P: the working directory is not searched (PYTHONPATH names the package)
                [sys.executable, "-P", "-m", "aggregator.accountant_process"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                close_fds=True,
            )
        except OSError as exc:
            raise AccountantError(f"cannot start the accountant's process: {exc}") from exc

    def _stop(self) -> None:
        """Kill the worker, then close its pipes (a thread still reading one sees EOF)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.close()

    def call(self, name: str, args: tuple[object, ...]) -> Any:
        """Blocking: run ``name(*args)`` in the worker and return its result or raise its
        exception (call it from a thread)."""
        with self._lock:
            for attempt in (1, 2):
                if self._exiting:
                    raise AccountantError("the interpreter is exiting")
                if self._proc is None:
                    self._proc = self._start()
                proc = self._proc
                assert proc.stdin is not None
                assert proc.stdout is not None
                try:
                    _write(proc.stdin, (name, args))
                    status, value = _read(proc.stdout)
                except (OSError, EOFError, ValueError, pickle.UnpicklingError) as exc:
                    self._stop()
                    if attempt == 2 or self._exiting:
                        raise AccountantError(f"the accountant's process died: {exc}") from exc
                    logger.warning("the accountant's process died; starting a new one")
                    continue
                if status == "error":
                    raise value
                return value
        raise AssertionError("unreachable")

    def shutdown(self) -> None:
        with self._lock:
            self._stop()

    def at_exit(self) -> None:
        """End the worker as the interpreter exits, without the lock: a daemon thread may
        hold it, waiting for a result nobody will read (it then sees the pipe close, and
        starts no new worker)."""
        self._exiting = True
        self._stop()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return None if proc is None else proc.pid


_WORKER = _Worker()
atexit.register(_WORKER.at_exit)


async def _call(name: str, args: tuple[object, ...]) -> Any:
    """:meth:`_Worker.call` from a daemon thread: the loop never waits for it, and neither
    does the interpreter's exit (a stopping service does not wait for a computation it
    will not use; the worker ends with its parent)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if future.done():  # the caller was cancelled meanwhile
            return
        if exc is None:
            future.set_result(result)
        else:
            future.set_exception(exc)

    def work() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = _WORKER.call(name, args)
        except BaseException as exc:  # handed to the awaiting task
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name="coco-accountant-call", daemon=True).start()
    return await future


async def compute_level(spec: MechanismSpec, delta: float, snapshot: Snapshot) -> PrivacyLevel:
    """:meth:`PrivacyLedger.compute` of ``snapshot``, in the accountant's process."""
    level: PrivacyLevel = await _call("level", (spec, delta, snapshot))
    return level


async def compute_curve(spec: MechanismSpec, delta: float, grid: Sequence[int]) -> dict[int, float]:
    """:func:`~aggregator.metrics.epsilon_curve` on ``grid``, in the accountant's process."""
    curve: dict[int, float] = await _call("curve", (spec, delta, tuple(grid)))
    return curve


def level_now(spec: MechanismSpec, delta: float, snapshot: Snapshot) -> PrivacyLevel:
    """:func:`compute_level`, blocking the calling thread (for callers without a loop)."""
    level: PrivacyLevel = _WORKER.call("level", (spec, delta, snapshot))
    return level


def shutdown() -> None:
    """Stop the worker process (the next call starts a new one)."""
    _WORKER.shutdown()


def worker_pid() -> int | None:
    """The worker's process id while it runs (for tests and diagnostics)."""
    return _WORKER.pid


if __name__ == "__main__":
    main()
