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
The worker is ``python -m aggregator.ledger.accountant_process``, started on first use and shared
by every aggregator of the process; it keeps the per-size caches of
:class:`~aggregator.ledger.privacy_ledger.PrivacyLedger` across calls. Calls are pickled frames on
its stdin and stdout, one at a time, each made from a daemon thread, so neither the event
loop nor the interpreter's exit waits for one, and any loop may call. A plain subprocess rather than
:mod:`multiprocessing`: it inherits no descriptor but stderr (``close_fds``: not the
checkpoint's lock, not a socket), and it never re-imports the caller's ``__main__`` (which
``spawn`` does, breaking any script without a ``__main__`` guard). It ends when its stdin
closes or its parent is gone (checked every :data:`PARENT_CHECK` seconds), so a ``kill -9``
of the service leaves nothing behind. What runs there is the same pure code as in a thread
(:meth:`PrivacyLedger.compute`, :func:`~aggregator.ledger.levels.epsilon_curve`); the numbers are
identical. A worker that dies is replaced and the call retried once. A level call may
name the ledger's curve file (:mod:`aggregator.ledger.curve_file`): the worker reads it at
the first call naming it, so a restarted service does not compute the certified curve's
points again, and writes it after each size whose points a computation added (only then:
a first start killed halfway keeps the sizes it finished).

Calls, time limits and cancellation
-----------------------------------
Calls are queued to one dispatcher thread, which hands them to the worker one at a time.
Every call can be given a time limit; a call whose caller gives up (a cancelled task, a
time limit reached) is *cancelled*: dropped from the queue if it has not started, else the
worker is sent ``SIGUSR1``, which interrupts its computation between two Python steps (a
curve evaluation, a convolution) and returns it to its loop with its caches intact; a
worker that has not answered :data:`CANCEL_GRACE` seconds later is killed and replaced. So
an abandoned composition never keeps the worker busy.

A scrape never waits on the accountant: :func:`last_level` returns at once the last level
computed for a ledger (never one of another ledger: levels are keyed by the snapshot's
ledger id, and a level says how many participations it covers), and :func:`level_now`
waits at most its ``timeout`` for a fresh one, leaving the computation to finish in the
background for the next request.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from pathlib import Path
from typing import IO, Any, Final

from aggregator.ledger.curve_file import CurveFile
from aggregator.ledger.levels import PrivacyLevel, Snapshot, epsilon_curve
from aggregator.ledger.privacy_ledger import PrivacyLedger
from edge.spec import MechanismSpec

__all__ = [
    "CANCEL_GRACE",
    "LEVEL_WAIT",
    "NICENESS",
    "AccountantCancelledError",
    "AccountantError",
    "AccountantTimeoutError",
    "compute_curve",
    "compute_level",
    "last_level",
    "level_now",
    "shutdown",
    "submit_level",
    "worker_pid",
]

logger = logging.getLogger(__name__)

NICENESS: Final = 10
"""Added to the worker's nice value: CFS then gives it about a tenth of the CPU share of a
normal process while both want the CPU, and all of an idle one."""
PARENT_CHECK: Final = 0.25
CANCEL_GRACE: Final = 2.0
"""Seconds a worker has to give up a cancelled computation before it is killed."""
LEVEL_WAIT: Final = 5.0
"""Default time limit of :func:`level_now`."""
_THREAD_VARIABLES: Final = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
_FRAME = struct.Struct(">I")


class AccountantError(RuntimeError):
    """The accountant's process could not be started or died twice in one call."""


class AccountantCancelledError(AccountantError):
    """The call was cancelled (its caller gave up) before it finished."""


class AccountantTimeoutError(AccountantError):
    """The call did not finish within its time limit (it was cancelled)."""


class _Cancelled(Exception):  # noqa: N818 (a signal, not an error)
    """Raised in the worker by SIGUSR1 while it computes."""


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
    ledgers: dict[tuple[MechanismSpec, float], PrivacyLedger] = {}
    curve_files: dict[tuple[Path, MechanismSpec, float], CurveFile] = {}

    def level(
        spec: MechanismSpec, delta: float, snapshot: Snapshot, curves: Path | None = None
    ) -> PrivacyLevel:
        ledger = ledgers.get((spec, delta))
        if ledger is None:  # its per-size cache of bounds lives as long as the worker
            ledger = ledgers[(spec, delta)] = PrivacyLedger(spec, delta=delta)
        file = None
        if curves is not None:  # the curve's points kept across a restart
            file = curve_files.get((curves, spec, delta))
            if file is None:  # kept once read (a cancelled read is tried again)
                file = CurveFile(curves, spec, delta)
                file.load()
                curve_files[(curves, spec, delta)] = file
        if file is None:
            return ledger.compute(snapshot)
        with file.saving_as_computed():  # each size's points as soon as it has them
            result = ledger.compute(snapshot)
        file.save()
        return result

    def curve(spec: MechanismSpec, delta: float, grid: tuple[int, ...]) -> dict[int, float]:
        return epsilon_curve(spec, delta=delta, grid=grid)

    def spin(seconds: float) -> int:
        """Compute for ``seconds`` in short Python steps (the tests' stand-in for a long
        composition: cancellation must interrupt it)."""
        deadline, steps = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            steps += 1
        return steps

    return {"level": level, "curve": curve, "spin": spin}


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
    # SIGUSR1 goes to the main thread only: there it interrupts a computation, or a blocked
    # read (then ignored), never lands later on the next request
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK)
    os._exit(0)  # the parent is gone (kill -9): nobody will read a result


_busy = False
"""Whether the worker is computing (SIGUSR1 interrupts only then, never the framing)."""


def _on_cancel(signum: int, frame: object) -> None:
    del signum, frame
    if _busy:
        raise _Cancelled


def main() -> None:
    """The worker's loop: one request in, one response out, until stdin closes."""
    global _busy  # noqa: PLW0603 (the signal handler's view of the loop)
    with contextlib.suppress(OSError):  # not permitted (some sandboxes): normal priority
        os.nice(NICENESS)
    # its warnings (a curve file ignored or not written) on stderr, one line each
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGUSR1, _on_cancel)
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
        except _Cancelled:  # cannot happen (not busy); never break the framing for it
            continue
        response: tuple[str, object]
        try:
            _busy = True
            try:
                response = ("ok", functions[name](*args))
            finally:
                _busy = False
        except _Cancelled:
            response = ("cancelled", None)
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
        self._state = threading.Lock()
        self._current: int | None = None
        """The id of the call whose answer is awaited (under ``_state``): a cancellation
        signals the worker only while it is this call's, never the next one's."""

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
                [sys.executable, "-P", "-m", "aggregator.ledger.accountant_process"],
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

    def call(self, name: str, args: tuple[object, ...], call_id: int = -1) -> Any:
        """Blocking: run ``name(*args)`` in the worker and return its result or raise its
        exception (call it from a thread); ``call_id`` names it for :meth:`cancel`."""
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
                    with self._state:
                        self._current = call_id
                    try:
                        _write(proc.stdin, (name, args))
                        status, value = _read(proc.stdout)
                    finally:
                        with self._state:
                            self._current = None
                except (OSError, EOFError, ValueError, pickle.UnpicklingError) as exc:
                    self._stop()
                    if attempt == 2 or self._exiting:
                        raise AccountantError(f"the accountant's process died: {exc}") from exc
                    logger.warning("the accountant's process died; starting a new one")
                    continue
                if status == "cancelled":
                    raise AccountantCancelledError(f"{name} was cancelled")
                if status == "error":
                    raise value
                return value
        raise AssertionError("unreachable")

    def cancel(self, call_id: int, still_running: Callable[[], bool]) -> None:
        """Interrupt call ``call_id`` (while ``still_running()``): ``SIGUSR1`` every tenth of
        a second while the worker has it (the worker acts on it only while computing), and a
        kill if it has not answered :data:`CANCEL_GRACE` seconds after the first. From a
        daemon thread: never blocks."""

        def signal_until_answered() -> None:
            first: float | None = None
            while still_running():
                with self._state:
                    proc = self._proc
                    if self._current == call_id and proc is not None:
                        now = time.monotonic()
                        first = now if first is None else first
                        if now - first >= CANCEL_GRACE:
                            logger.warning(
                                "the accountant's process did not give up a cancelled call "
                                "within %.0f s; replacing it",
                                CANCEL_GRACE,
                            )
                            with contextlib.suppress(OSError):
                                proc.kill()  # the call sees EOF; its thread cleans up
                            return
                        with contextlib.suppress(OSError):
                            proc.send_signal(signal.SIGUSR1)
                time.sleep(0.1)

        threading.Thread(
            target=signal_until_answered, name="coco-accountant-cancel", daemon=True
        ).start()

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


class _Dispatcher:
    """One daemon thread that runs queued calls in the worker, one at a time."""

    def __init__(self, worker: _Worker) -> None:
        self._worker = worker
        self._jobs: queue.SimpleQueue[tuple[Future[Any], int, str, tuple[object, ...]]] = (
            queue.SimpleQueue()
        )
        self._ids = itertools.count()
        self._running: tuple[Future[Any], int] | None = None
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, name: str, args: tuple[object, ...]) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((future, next(self._ids), name, args))
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="coco-accountant-calls", daemon=True
                )
                self._thread.start()
        return future

    def _run(self) -> None:
        while True:
            future, call_id, name, args = self._jobs.get()
            self._running = (future, call_id)  # before it runs: a cancel now is not lost
            if not future.set_running_or_notify_cancel():
                self._running = None
                continue  # cancelled while queued
            try:
                result = self._worker.call(name, args, call_id)
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                self._running = None

    def cancel(self, future: Future[Any]) -> None:
        """Drop ``future`` from the queue, or interrupt it if the worker runs it."""
        if future.cancel():
            return
        running = self._running
        if running is not None and running[0] is future:
            self._worker.cancel(running[1], lambda: self._running is running)


_WORKER = _Worker()
_CALLS = _Dispatcher(_WORKER)
atexit.register(_WORKER.at_exit)


async def _call(name: str, args: tuple[object, ...], timeout: float | None) -> Any:
    """Run ``name(*args)`` in the worker from the event loop: the loop never waits for it,
    and neither does the interpreter's exit. A cancelled caller, or one whose ``timeout``
    passes, cancels the computation (module docstring)."""
    future = _CALLS.submit(name, args)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
    except TimeoutError:
        _CALLS.cancel(future)
        raise AccountantTimeoutError(f"{name} took more than {timeout} s; cancelled") from None
    except asyncio.CancelledError:
        _CALLS.cancel(future)
        raise


_LEVELS: dict[str, PrivacyLevel] = {}
"""Ledger id -> the last level computed for it."""
_PENDING: dict[str, Future[Any]] = {}
"""Ledger id -> the :func:`level_now` computation under way for it."""
_LEVELS_LOCK = threading.RLock()  # a done callback may run in the thread holding it


def _remember(snapshot: Snapshot, level: PrivacyLevel) -> None:
    if not snapshot.ledger:
        return
    with _LEVELS_LOCK:
        known = _LEVELS.get(snapshot.ledger)
        if known is None or level.generation >= known.generation:
            _LEVELS[snapshot.ledger] = level


async def compute_level(
    spec: MechanismSpec,
    delta: float,
    snapshot: Snapshot,
    *,
    timeout: float | None = None,
    curves: Path | None = None,
) -> PrivacyLevel:
    """:meth:`PrivacyLedger.compute` of ``snapshot``, in the accountant's process (within
    ``timeout`` seconds, else :class:`AccountantTimeoutError`). ``curves``: the ledger's
    curve file (:mod:`aggregator.ledger.curve_file`), read at the first call naming it and
    written whenever the computation added points."""
    level: PrivacyLevel = await _call("level", (spec, delta, snapshot, curves), timeout)
    _remember(snapshot, level)
    return level


async def compute_curve(
    spec: MechanismSpec, delta: float, grid: Sequence[int], *, timeout: float | None = None
) -> dict[int, float]:
    """:func:`~aggregator.ledger.levels.epsilon_curve` on ``grid``, in the accountant's process."""
    curve: dict[int, float] = await _call("curve", (spec, delta, tuple(grid)), timeout)
    return curve


def submit_level(
    spec: MechanismSpec, delta: float, snapshot: Snapshot, *, curves: Path | None = None
) -> Future[Any]:
    """:meth:`PrivacyLedger.compute` of ``snapshot`` queued for the accountant's process,
    from any thread (no event loop needed): a future of the :class:`PrivacyLevel`. It is
    not remembered as a ledger's level (a window's participations are not the ledger's).
    ``curves`` as :func:`compute_level`'s."""
    return _CALLS.submit("level", (spec, delta, snapshot, curves))


def last_level(snapshot: Snapshot) -> PrivacyLevel | None:
    """At once: the last level computed for the ledger ``snapshot`` was taken from (by any
    call), or ``None``. It covers what its ``batches`` and ``generation`` say, which may be
    less than ``snapshot``: show it as such."""
    with _LEVELS_LOCK:
        return _LEVELS.get(snapshot.ledger) if snapshot.ledger else None


def level_now(
    spec: MechanismSpec,
    delta: float,
    snapshot: Snapshot,
    *,
    timeout: float = LEVEL_WAIT,
    curves: Path | None = None,
) -> PrivacyLevel | None:
    """The level of ``snapshot`` if the worker computes it within ``timeout`` seconds, else
    :func:`last_level` (possibly ``None``). Blocks the calling thread at most ``timeout``
    (0: never); the computation goes on in the background and its result is kept for the
    next call. One computation per ledger at a time: while one is under way, a call waits
    for it (within its own ``timeout``) instead of queueing another. ``curves`` as
    :func:`compute_level`'s."""
    with _LEVELS_LOCK:
        known = _LEVELS.get(snapshot.ledger) if snapshot.ledger else None
        if known is not None and known.generation >= snapshot.generation:
            return known
        future = _PENDING.get(snapshot.ledger) if snapshot.ledger else None
        if future is None:
            future = _CALLS.submit("level", (spec, delta, snapshot, curves))
            if snapshot.ledger:
                _PENDING[snapshot.ledger] = future
                future.add_done_callback(lambda done: _settle(snapshot.ledger, done))
    try:
        result = future.result(timeout=timeout)
    except (TimeoutError, CancelledError, AccountantError):
        return last_level(snapshot)
    if not isinstance(result, PrivacyLevel):
        raise AssertionError(f"the worker answered {type(result).__name__} for a level")
    return result if result.generation >= snapshot.generation else last_level(snapshot)


def _settle(ledger: str, future: Future[Any]) -> None:
    """A :func:`level_now` computation finished: keep its level, clear it as under way."""
    with _LEVELS_LOCK:
        if _PENDING.get(ledger) is future:
            del _PENDING[ledger]
        if future.cancelled() or future.exception() is not None:
            return
        level = future.result()
        known = _LEVELS.get(ledger)
        if isinstance(level, PrivacyLevel) and (
            known is None or level.generation >= known.generation
        ):
            _LEVELS[ledger] = level


def shutdown() -> None:
    """Stop the worker process (the next call starts a new one)."""
    _WORKER.shutdown()


def worker_pid() -> int | None:
    """The worker's process id while it runs (for tests and diagnostics)."""
    return _WORKER.pid


if __name__ == "__main__":
    main()
