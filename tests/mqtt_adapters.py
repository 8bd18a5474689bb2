"""The project's three MQTT client libraries behind one small synchronous interface, for
tests that check a broker (tests/test_broker_compat.py): paho-mqtt 2.x (edge/publisher_link.py,
broker/service/announce_cli.py), aiomqtt 2.x (the aggregator, the shuffler's publishing connection)
and gmqtt (the shuffler's ingest, sim/fleet/).

Each adapter connects to one URL with a client id and a clean-session flag, subscribes,
publishes (returning once the PUBACK of a QoS 1 message arrived), records what it receives
as :class:`Received`, and can drop its connection without a DISCONNECT (as a crash or a dead
node would). With ``ack=False`` it never acknowledges a QoS 1 message it receives, the way
the services hold their PUBACK until a message is durable. The async libraries run on an
event loop in a thread of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import aiomqtt
import gmqtt  # type: ignore[import-untyped]
import paho.mqtt.client as mqtt
from gmqtt.mqtt.constants import MQTTv50, MQTTv311  # type: ignore[import-untyped]
from paho.mqtt.enums import CallbackAPIVersion

from edge.mqtt_url import parse_broker_url
from tests import waiting

T = TypeVar("T")
TIMEOUT = 60.0  # generous: the machine is shared and a cluster may be electing leaders


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    retain: bool
    dup: bool | None  # None where the library does not say


wait_for = waiting.Waits(TIMEOUT).wait_until
"""tests/waiting.py's wait, :data:`TIMEOUT` its default stall window."""


class Adapter(Protocol):
    name: str
    received: list[Received]
    session_present: bool | None

    def connect(self) -> None: ...
    def subscribe(self, topic: str, qos: int = 1) -> int: ...
    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None: ...
    def drop(self) -> None: ...
    def close(self) -> None: ...


class PahoAdapter:
    name = "paho"

    def __init__(
        self,
        url: str,
        client_id: str,
        *,
        clean_session: bool,
        ack: bool = True,
        mqtt5: bool = False,
    ) -> None:
        self.host, self.port = parse_broker_url(url)[:2]
        self.received: list[Received] = []
        self.session_present: bool | None = None
        self.connack: Any = None
        self.disconnects: list[Any] = []
        self.granted: dict[int, list[Any]] = {}
        self.acked: set[int] = set()
        if mqtt5:
            self.client = mqtt.Client(
                CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
            )
        else:
            self.client = mqtt.Client(
                CallbackAPIVersion.VERSION2,
                client_id=client_id,
                protocol=mqtt.MQTTv311,
                clean_session=clean_session,
                manual_ack=not ack,
            )
        self.client.reconnect_delay_set(60, 60)  # no reconnection within a test
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = lambda _c, _u, _f, rc, _p: self.disconnects.append(rc)
        self.client.on_subscribe = lambda _c, _u, mid, codes, _p: self.granted.update({mid: codes})
        self.client.on_publish = lambda _c, _u, mid, _rc, _p: self.acked.add(mid)
        self.client.on_message = lambda _c, _u, m: self.received.append(
            Received(m.topic, bytes(m.payload), bool(m.retain), bool(m.dup))
        )

    def _on_connect(self, _c: Any, _u: Any, flags: Any, rc: Any, _p: Any) -> None:
        self.connack = rc
        self.session_present = bool(flags.session_present)

    def connect(self) -> None:
        self.client.connect(self.host, self.port, keepalive=30)
        self.client.loop_start()
        wait_for(lambda: self.connack is not None, what="CONNACK")
        if self.connack.is_failure:
            raise ConnectionError(f"refused: {self.connack}")

    def subscribe(self, topic: str, qos: int = 1) -> int:
        _, mid = self.client.subscribe(topic, qos=qos)
        assert mid is not None
        wait_for(lambda: mid in self.granted, what="SUBACK")
        return int(self.granted[mid][0].value)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        wait_for(lambda: info.mid in self.acked, what="PUBACK")

    def drop(self) -> None:
        sock = self.client.socket()
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        wait_for(lambda: bool(self.disconnects), what="the connection to drop")
        self.client.loop_stop()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class _LoopThread:
    """An asyncio event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = TIMEOUT) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()


class AiomqttAdapter:
    name = "aiomqtt"

    def __init__(
        self,
        url: str,
        client_id: str,
        *,
        clean_session: bool,
        ack: bool = True,
        mqtt5: bool = False,
    ) -> None:
        host, port = parse_broker_url(url)[:2]
        self.received: list[Received] = []
        self.session_present: bool | None = None  # aiomqtt does not expose it
        self._runner = _LoopThread()
        self._reader: asyncio.Task[None] | None = None
        options: dict[str, Any] = (
            {"protocol": aiomqtt.ProtocolVersion.V5}
            if mqtt5
            else {"protocol": aiomqtt.ProtocolVersion.V311, "clean_session": clean_session}
        )

        async def make() -> aiomqtt.Client:  # aiomqtt binds the running loop
            return aiomqtt.Client(
                host, port, identifier=client_id, keepalive=30, timeout=TIMEOUT, **options
            )

        self.client = self._runner.run(make())
        if not ack:
            self.client._client.manual_ack_set(True)  # as the aggregator does

    def connect(self) -> None:
        async def start() -> None:
            await self.client.__aenter__()
            self._reader = asyncio.create_task(self._read())

        self._runner.run(start())

    async def _read(self) -> None:
        with contextlib.suppress(aiomqtt.MqttError):
            async for m in self.client.messages:
                payload = m.payload if isinstance(m.payload, bytes) else str(m.payload).encode()
                self.received.append(Received(str(m.topic), payload, bool(m.retain), None))

    def subscribe(self, topic: str, qos: int = 1) -> int:
        granted = self._runner.run(self.client.subscribe(topic, qos=qos))
        code = granted[0] if granted else None
        return int(getattr(code, "value", code))  # type: ignore[arg-type]

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self._runner.run(self.client.publish(topic, payload, qos=1, retain=retain))

    def drop(self) -> None:
        sock = self.client._client.socket()
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        wait_for(lambda: self._reader is not None and self._reader.done(), what="drop")
        self._runner.stop()

    def close(self) -> None:
        async def stop() -> None:
            with contextlib.suppress(aiomqtt.MqttError):
                await self.client.__aexit__(None, None, None)
            if self._reader is not None:
                self._reader.cancel()

        with contextlib.suppress(Exception):
            self._runner.run(stop(), timeout=15)
        self._runner.stop()


class GmqttAdapter:
    """gmqtt, configured as the shuffler and sim/fleet/ configure it: no reconnection of
    its own (``reconnect_retries`` -2), unless ``gmqtt_reconnects``."""

    name = "gmqtt"

    def __init__(
        self,
        url: str,
        client_id: str,
        *,
        clean_session: bool,
        ack: bool = True,
        mqtt5: bool = False,
        gmqtt_reconnects: bool = False,
    ) -> None:
        self.host, self.port = parse_broker_url(url)[:2]
        self.version = MQTTv50 if mqtt5 else MQTTv311
        self.received: list[Received] = []
        self.session_present: bool | None = None
        self.lost = threading.Event()
        self.granted: dict[int, tuple[int, ...]] = {}
        self.acked: set[int] = set()
        self._runner = _LoopThread()

        async def make() -> Any:
            return gmqtt.Client(client_id, clean_session=clean_session)

        self.client = self._runner.run(make())
        if not gmqtt_reconnects:
            self.client.set_config({"reconnect_retries": -2})
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda _c, mid, qos, _p: self.granted.update({mid: qos})
        self.client.on_disconnect = lambda *_a: self.lost.set()
        handler = self.client._package_handler
        original = handler._handle_puback_packet

        def on_puback(cmd: int, packet: bytes) -> None:
            self.acked.add(int.from_bytes(packet[:2], "big"))
            original(cmd, packet)

        handler._handle_puback_packet = on_puback
        if not ack:  # as the shuffler's ingest does, minus the PUBACK
            handler._handle_qos_1_publish_packet = self._record_without_ack

    def _on_connect(self, _c: Any, flags: int, _rc: int, _p: Any) -> None:
        self.session_present = bool(flags)

    def _on_message(self, _c: Any, topic: str, payload: bytes, _q: int, props: Any) -> int:
        self.received.append(
            Received(topic, bytes(payload), bool(props.get("retain")), bool(props.get("dup")))
        )
        return 0

    def _record_without_ack(self, _mid: int, packet: bytes, topic: str, props: Any) -> None:
        self._on_message(self.client, topic, packet, 1, props)

    @property
    def protocol_version(self) -> int:
        return int(self.client._connection_state.protocol_version)

    def connect(self) -> None:
        self._runner.run(self.start_connect())

    def start_connect(self) -> Coroutine[Any, Any, None]:
        connecting: Coroutine[Any, Any, None] = self.client.connect(
            self.host, self.port, version=self.version
        )
        return connecting

    def subscribe(self, topic: str, qos: int = 1) -> int:
        async def sub() -> int:
            return int(self.client.subscribe(topic, qos=qos))

        mid = self._runner.run(sub())
        wait_for(lambda: mid in self.granted, what="SUBACK")
        return self.granted[mid][0]

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        before = len(self.acked)

        async def pub() -> None:
            self.client.publish(topic, payload, qos=1, retain=retain)

        self._runner.run(pub())
        wait_for(lambda: len(self.acked) > before, what="PUBACK")

    def drop(self) -> None:
        transport = getattr(self.client._connection, "_transport", None)
        if transport is not None:
            self._runner.loop.call_soon_threadsafe(transport.abort)
        wait_for(self.lost.is_set, what="drop")
        self._runner.stop()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._runner.run(self.client.disconnect(), timeout=15)
        self._runner.stop()


ADAPTERS: dict[str, type[PahoAdapter] | type[AiomqttAdapter] | type[GmqttAdapter]] = {
    "paho": PahoAdapter,
    "aiomqtt": AiomqttAdapter,
    "gmqtt": GmqttAdapter,
}


class FailoverClient:
    """A paho-mqtt 3.1.1 client that connects to ``urls[first]`` and, whenever its
    connection ends, connects to the next URL (round robin) with the same client id: what a
    client of a NATS cluster must do when its node dies (docs/brokers.md). paho re-sends its
    unacknowledged QoS 1 messages on the new connection; ``on_connected`` runs on every
    successful CONNACK (subscribe there: a subscription refused while the cluster elects a
    leader is not retried by the broker)."""

    def __init__(
        self,
        urls: Sequence[str],
        first: int,
        client_id: str,
        *,
        clean_session: bool,
        on_connected: Callable[[mqtt.Client], None] | None = None,
        inflight: int = 100,
    ) -> None:
        self.addresses = [parse_broker_url(url)[:2] for url in urls]
        self.index = first % len(self.addresses)
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv311,
            clean_session=clean_session,
        )
        self.client.max_inflight_messages_set(inflight)
        self.client.max_queued_messages_set(0)
        self.connected = threading.Event()
        self.connects = 0
        self._on_connected = on_connected
        self._stop = threading.Event()
        self.client.on_connect = self._connected
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _connected(self, client: mqtt.Client, _u: Any, _f: Any, rc: Any, _p: Any) -> None:
        if not rc.is_failure:
            self.connects += 1
            if self._on_connected is not None:
                self._on_connected(client)
            self.connected.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            host, port = self.addresses[self.index]
            try:
                self.client.connect(host, port, keepalive=15)
            except OSError:
                self.index = (self.index + 1) % len(self.addresses)
                time.sleep(0.2)
                continue
            while not self._stop.is_set():
                if self.client.loop(timeout=0.05) != mqtt.MQTT_ERR_SUCCESS:
                    break
            self.connected.clear()
            self.index = (self.index + 1) % len(self.addresses)
        self.client.disconnect()

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
