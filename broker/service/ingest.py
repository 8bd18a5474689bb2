"""The ingest connection's machinery: PUBACKs only after the log write, loss detection, and
log records of the MQTT library with their details withheld.

:class:`GroupCommit` and :func:`ack_after_handling` implement the shuffler's delivery
promise (docs/operations.md, "Delivery guarantee"): a report's PUBACK leaves only once the
effects of its socket read are written to the state directory's log.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable

import gmqtt  # type: ignore[import-untyped]

from broker.store.wal import LogFullError, StoreError

__all__ = [
    "MQTT_LOGGER",
    "Acks",
    "GroupCommit",
    "IngestError",
    "SessionTakenOverError",
    "ack_after_handling",
]


class _WithholdDetails(logging.Filter):
    """The MQTT library's log records name topics, hence device ids, and print payloads at
    DEBUG (and topics in some warnings). None of that may reach a log: records below
    WARNING are dropped, and the others keep only their level and a fixed text."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return False
        record.msg = "MQTT client library reported a %s (details withheld: they may name a device)"
        record.args = (record.levelname.lower(),)
        record.exc_info = record.exc_text = None
        return True


MQTT_LOGGER = logging.getLogger("broker.shuffler.mqtt")
MQTT_LOGGER.addFilter(_WithholdDetails())
for _module in ("client", "mqtt.protocol", "mqtt.package", "mqtt.connection", "mqtt.handler"):
    logging.getLogger(f"gmqtt.{_module}").addFilter(_WithholdDetails())
logging.getLogger("gmqtt.mqtt.utils").addFilter(_WithholdDetails())


_PUBACK = struct.Struct(">BBH")
"""A PUBACK: type 4, remaining length 2, the packet id. The same bytes in MQTT 3.1.1 and 5
(reason code 0 and no properties may be omitted, MQTT 5 section 3.4.2.1)."""


class GroupCommit:
    """The log records and PUBACKs of one socket read of the ingest connection, written
    together once the read is handled.

    gmqtt parses a whole socket read (up to 64 KiB: hundreds of reports) in one synchronous
    pass, calling the shuffler for each report. Each report's record is staged in the log
    (:meth:`broker.store.wal.EffectLog.stage`) and its PUBACK noted here; the first one schedules
    :meth:`flush` for right after the pass (``call_soon``), which writes the staged records
    (one ``write(2)``, one ``fsync`` with ``--fsync``) and only then every PUBACK of the read,
    in arrival order, in one write to the socket. So a PUBACK still never leaves before its
    report is on disk, and a failed log write sends none of them (the broker redelivers).
    Measured in ``bench/bench_pipeline.py``: one ``write(2)`` per report to the log and one
    ``send(2)`` per PUBACK were the shuffler's largest costs after the MQTT parsing.
    """

    def __init__(
        self,
        client: gmqtt.Client,
        flush_log: Callable[[], None],
        fail: Callable[[BaseException], None],
        pause: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._client = client
        self._flush_log = flush_log
        self._fail = fail
        self._pause = pause or fail
        self._acks: list[int] = []
        self._scheduled = False

    def note(self) -> None:
        """Something was staged: flush after this read."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def ack(self, mid: int) -> None:
        self._acks.append(mid)
        self.note()

    def flush(self) -> None:
        """Write the staged records, then send the PUBACKs (also called before a DISCONNECT)."""
        self._scheduled = False
        acks, self._acks = self._acks, []
        try:
            self._flush_log()
        except LogFullError as exc:
            self._pause(exc)  # nothing of this read is acknowledged: redelivered later
            return
        except (OSError, StoreError) as exc:
            self._fail(exc)  # nothing of this read is acknowledged: the broker redelivers it
            return
        if not acks:
            return
        connection = self._client._connection
        transport = getattr(connection, "_transport", None)
        if transport is None or transport.is_closing():
            return  # lost: the broker redelivers them, and the log calls them duplicates
        connection.send_package(b"".join([_PUBACK.pack(0x40, 2, mid) for mid in acks]))


def ack_after_handling(
    client: gmqtt.Client, handle: Callable[[str, object, object], bool], group: GroupCommit
) -> None:
    """Make ``client`` acknowledge a QoS 1 report only after ``handle`` returned ``True``,
    through ``group`` (after its record is written).

    gmqtt's optimistic mode acknowledges *before* the message handler runs, and its
    non-optimistic mode only for coroutine handlers (a task per message). This replaces
    the one method that handles an incoming QoS 1 PUBLISH, so the synchronous handler
    stages the report's record, and the PUBACK follows once it is written, in arrival
    order. A handler that returns ``False`` or raises leaves the message unacknowledged
    (the broker redelivers it to the session).
    """
    handler = client._package_handler  # no public hook exists (gmqtt pinned in pyproject)

    def handle_qos_1(mid: int, packet: object, topic: str, properties: object) -> None:
        if handle(topic, packet, properties):
            group.ack(mid)

    handler._handle_qos_1_publish_packet = handle_qos_1


class IngestError(Exception):
    """The gmqtt ingest connection was lost or its subscription refused."""


class SessionTakenOverError(Exception):
    """Another client connected with the shuffler's client id: it stops instead of fighting."""


class Acks:
    """SUBACK waits and loss detection of one gmqtt ingest connection."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.lost = asyncio.Event()
        self.reason: int | None = None
        self.pending: dict[int, asyncio.Future[tuple[int, ...]]] = {}

    def on_ack(self, _client: object, mid: int, codes: object, *_: object) -> None:
        future = self.pending.get(mid)
        if future is not None and not future.done():
            future.set_result(tuple(codes) if isinstance(codes, tuple | list) else ())

    def on_disconnect(self, _client: object, packet: object = None, *_: object) -> None:
        if isinstance(packet, bytes | bytearray) and packet:
            self.reason = packet[0]
        self.lost.set()
        for future in self.pending.values():
            if not future.done():
                future.set_exception(IngestError("connection lost"))

    async def wait(self, mid: int) -> tuple[int, ...]:
        if self.lost.is_set():
            raise IngestError("connection lost")
        future: asyncio.Future[tuple[int, ...]] = asyncio.get_running_loop().create_future()
        self.pending[mid] = future
        try:
            async with asyncio.timeout(self.timeout):
                return await future
        finally:
            del self.pending[mid]
