"""An embedded pure-Python MQTT broker (amqtt) for the demo when Mosquitto is not installed.

:class:`EmbeddedBroker` is an async context manager that runs an :class:`amqtt.broker.Broker`
on a loopback address (anonymous access, which is why non-loopback hosts are refused) at a
free port and exposes its ``mqtt://`` URL::

    async with EmbeddedBroker() as broker:
        await run(broker.url)

Limits: amqtt speaks **MQTT 3.1.1 only** (it refuses a bare MQTT 5 CONNECT, but one with
properties, e.g. a session expiry interval, it misreads and the client times out) and
relays 1.3k-2.3k reports/s in the demo, so it is a fallback for small fleets, not a
Mosquitto replacement.

By default the broker runs in a **background thread with its own event loop** (``threaded``);
``threaded=False`` runs it as tasks in the caller's loop. Measured with the whole demo
(``coco demo``, 3 rounds, this repository's CI-sized machine): 2000 devices took 2.9-3.8 s
threaded and 3.5-4.9 s in-loop, 10000 devices 22 s and 19 s, i.e. the same 1.3k-2.3k
reports/s either way (the GIL, not the loop, is the limit). Threaded is the default
because it is the more robust one: the broker's connection handlers, which amqtt does not
always reap on shutdown, live and die in its own loop, whose exception handler can drop the
"Exception in callback ... CancelledError" noise of a handler cancelled mid-CONNECT at
shutdown without touching the caller's loop (in-loop that noise reaches the caller's loop
and its log), and a
blocking step of the demo (encoding a round, an accountant computation) does not also
freeze the broker's keep-alives.

Warnings: the test suite turns every warning into an error. amqtt 0.12 does not always close
a client's socket on shutdown (a connection whose handler it cancels keeps its transport),
which becomes ``ResourceWarning: unclosed transport`` when the socket is collected; the
broker therefore records every accepted connection's ``StreamWriter`` and closes what is
still open after :meth:`amqtt.broker.Broker.shutdown`. That fixes the cause instead of
filtering the warning. Otherwise amqtt 0.12 warns
(``DeprecationWarning``) only for the legacy config fields ``auth``, ``topic-check`` and
``sys_interval``; :meth:`EmbeddedBroker._config` uses the ``plugins`` form instead, and a
run of the demo under ``python -X dev -W error`` (threaded and in-loop) emits no warning at
all, so nothing is filtered. ``warnings.catch_warnings`` was rejected: it is process-wide
and restores the filters on exit, which would undo filters other code set meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import threading
from types import TracebackType
from typing import Any, Self

__all__ = ["EmbeddedBroker", "EmbeddedBrokerError"]

_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 10.0


class EmbeddedBrokerError(RuntimeError):
    """The embedded broker cannot start (amqtt missing, address in use, ...)."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _quiet_cancellation(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The broker loop's exception handler: a connection handler cancelled at shutdown is
    not an error (asyncio's stream callback re-raises its ``CancelledError``); anything else
    goes to the default handler."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


class EmbeddedBroker:
    """An amqtt broker on ``host:port`` (``port=0``: a free port), anonymous, loopback only."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, threaded: bool = True) -> None:
        if not _is_loopback(host):
            raise ValueError(
                f"the embedded broker allows anonymous access: loopback only, got {host!r}"
            )
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {port}")
        self.host = host
        self.port = port
        self.threaded = threaded
        self._broker: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        if self._broker is None:
            raise RuntimeError("the embedded broker is not running")
        return f"mqtt://{self.host}:{self.port}"

    def _config(self) -> dict[str, Any]:
        return {
            "listeners": {
                "default": {
                    "type": "tcp",
                    "bind": f"{self.host}:{self.port}",
                }
            },
            # Only anonymous auth: no $SYS publisher, no packet/event logging plugins.
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            },
        }

    async def _start_here(self) -> Any:
        try:
            from amqtt.broker import Broker  # noqa: PLC0415
        except ImportError as exc:
            raise EmbeddedBrokerError("amqtt is not installed (pip install amqtt)") from exc
        broker = Broker(self._config())
        # Record each accepted connection (see the module docstring); amqtt binds
        # ``stream_connected`` when it starts its listener, so an instance attribute works.
        original = broker.stream_connected

        async def stream_connected(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, listener_name: str
        ) -> None:
            self._writers.add(writer)
            try:
                await original(reader, writer, listener_name)
            finally:
                self._writers.discard(writer)
                writer.close()

        broker.stream_connected = stream_connected
        try:
            await broker.start()
        except Exception as exc:
            raise EmbeddedBrokerError(
                f"amqtt did not start on {self.host}:{self.port}: {exc}"
            ) from exc
        server = broker._servers["default"].instance
        self.port = int(server.sockets[0].getsockname()[1])
        return broker

    async def _shutdown(self, broker: Any) -> None:
        """Stop amqtt, then close the connections it left open."""
        await broker.shutdown()
        writers, self._writers = list(self._writers), set()
        for writer in writers:
            writer.close()
        for writer in writers:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    # -- threaded mode ---------------------------------------------------------------------

    def _thread_main(self, started: threading.Event, errors: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_quiet_cancellation)
        self._loop = loop
        try:
            self._stopped = asyncio.Event()

            async def main() -> None:
                try:
                    broker = await self._start_here()
                except BaseException as exc:
                    errors.append(exc)
                    started.set()
                    return
                self._broker = broker
                started.set()
                assert self._stopped is not None
                await self._stopped.wait()
                await self._shutdown(broker)

            loop.run_until_complete(main())
            # Whatever amqtt left behind (per-connection handlers): cancel and reap it.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        except BaseException as exc:
            errors.append(exc)
            started.set()
        finally:
            loop.close()

    # -- context manager -------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        # amqtt logs every connection and packet at INFO: keep it at WARNING or above.
        logging.getLogger("amqtt").setLevel(
            max(logging.getLogger("amqtt").getEffectiveLevel(), logging.WARNING)
        )
        if not self.threaded:
            self._broker = await self._start_here()
            return self
        started = threading.Event()
        errors: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._thread_main, args=(started, errors), name="coco-amqtt", daemon=True
        )
        self._thread.start()
        if not await asyncio.to_thread(started.wait, _START_TIMEOUT):
            await self.__aexit__(None, None, None)
            raise EmbeddedBrokerError(f"amqtt did not start within {_START_TIMEOUT:g} s")
        if errors:
            await asyncio.to_thread(self._thread.join, _STOP_TIMEOUT)
            raise errors[0]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if not self.threaded:
                if self._broker is not None:
                    await asyncio.wait_for(self._shutdown(self._broker), _STOP_TIMEOUT)
                return
            loop, stopped, thread = self._loop, self._stopped, self._thread
            if loop is not None and stopped is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # loop closed meanwhile
                    loop.call_soon_threadsafe(stopped.set)
            if thread is not None:
                await asyncio.to_thread(thread.join, _STOP_TIMEOUT)
                if thread.is_alive():
                    raise EmbeddedBrokerError(f"amqtt did not stop within {_STOP_TIMEOUT:g} s")
        finally:
            self._broker = None
