"""The deployment's broker access control on a real Mosquitto: the dynamic-security
configuration that ``coco credentials`` writes (accounts and roles), with a live shuffler.

The broker's configuration is deploy/mosquitto/mosquitto.conf itself, with only the listener,
the plugin's path (Debian installs it elsewhere than the eclipse-mosquitto image), the
configuration file's path, persistence and logging adapted to a test directory; the plugin's
configuration is written by the ``coco credentials`` command line, as compose.yaml runs it.

What Mosquitto 2.0 with the dynamic-security plugin answers (observed, and asserted below):

* PUBLISH QoS 1 to a topic no role grants: PUBACK with reason code 0x87 (Not authorized), and
  the message is dropped; at QoS 0 there is no answer and the message is dropped too.
* SUBSCRIBE to a filter no role grants: SUBACK reason code 0x87, per filter of the packet;
  and even so, the test checks that nothing reaches the refused subscriber, while a
  permitted subscriber of the same message receives it.
* CONNECT with a wrong password, an unknown user or none: CONNACK 0x87 (Not authorized).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from broker.service.shuffler import Shuffler, ShufflerConfig
from edge import CocoError
from edge.announcement_reader import fetch_announcement
from edge.batch_auth import SIGNATURE_SIZE
from edge.codec import decode_batch, encode_report
from edge.rounds import current_round
from edge.spec import MechanismSpec
from edge.topics import (
    batches_topic,
    ingress_filter,
    ingress_topic,
    lease_topic,
    shard_lease_topic,
    spec_topic,
)
from sim.cli import app
from sim.credentials.accounts import SERVICE_ACCOUNTS, device_id, device_password, service_password
from tests import waiting
from tests.asyncutil import run, value, wait_until
from tests.conftest import (
    IMAGE_PLUGIN,
    MOSQUITTO,
    PLUGIN,
    SHIPPED_CONFIG,
    Broker,
    adapted_config,
    shipped_broker,
)

pytestmark = pytest.mark.integration

DEP = "fleet"  # the deployment name of compose.yaml
SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
SECRET = b"test deployment secret"
NOT_AUTHORIZED = 0x87
ACCEPTED = (0x00, 0x10)  # PUBACK: Success, No matching subscribers
GRANTED_QOS_1 = 0x01
TIMEOUT = 30.0


def write_dynsec(tmp_path: Path) -> Path:
    """The plugin's configuration, written by ``coco credentials`` as compose.yaml runs it."""
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    dynsec = tmp_path / "credentials" / "dynamic-security.json"
    services = [arg for name in SERVICE_ACCOUNTS for arg in ("--service", name)]
    args = ["credentials", "--secret-file", str(secret_file), "--devices", str(len(DEVICES))]
    args += [*services, "--deployment", DEP, "--dynsec-out", str(dynsec)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return dynsec


@dataclass
class Stack:
    broker: Broker

    @property
    def port(self) -> int:
        return self.broker.port

    def password(self, user: str) -> str:
        if user in SERVICE_ACCOUNTS:
            return service_password(SECRET, user)
        return device_password(SECRET, user)


DEVICES = [device_id(i) for i in range(3)]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    if PLUGIN is None:
        pytest.skip("mosquitto's dynamic-security plugin is not installed")
    dynsec = write_dynsec(tmp_path)
    written = dynsec.read_text()
    broker = shipped_broker(tmp_path, PLUGIN, dynsec)
    broker.start()
    try:
        yield Stack(broker)
    finally:
        broker.stop()
    # The broker never rewrites its configuration (no account may use the plugin's API).
    assert dynsec.read_text() == written


def test_adapted_config_keeps_the_deployed_security_settings() -> None:
    deployed = SHIPPED_CONFIG.read_text()
    assert re.search(rf"^plugin {re.escape(IMAGE_PLUGIN)}$", deployed, re.MULTILINE)
    assert not re.search(r"^(password_file|acl_file) ", deployed, re.MULTILINE)
    text = adapted_config(1, Path("/plug.so"), Path("/d.json"), Path("/s"), Path("/l"))
    assert re.search(r"^allow_anonymous false$", text, re.MULTILINE)
    assert re.search(r"^plugin /plug.so$", text, re.MULTILINE)
    assert re.search(r"^plugin_opt_config_file /d.json$", text, re.MULTILINE)
    assert len(re.findall(r"^plugin", text, re.MULTILINE)) == 2
    assert "persistence true" in text


def test_the_configuration_grants_what_the_roles_say(tmp_path: Path) -> None:
    """The written file: every operation denied by default, each device one role of its own."""
    config = json.loads(write_dynsec(tmp_path).read_text())
    assert config["defaultACLAccess"] == {
        "publishClientSend": False,
        "publishClientReceive": False,
        "subscribe": False,
        "unsubscribe": True,
    }
    roles = {r["rolename"]: r["acls"] for r in config["roles"]}
    clients = {c["username"]: [r["rolename"] for r in c["roles"]] for c in config["clients"]}
    assert sorted(clients) == sorted([*DEVICES, *SERVICE_ACCOUNTS])
    for device in DEVICES:
        assert clients[device] == ["device", f"device:{device}"]
        assert roles[f"device:{device}"] == [
            {"acltype": "publishClientSend", "topic": ingress_topic(DEP, device), "allow": True},
            {
                "acltype": "publishClientSend",
                "topic": f"coco/v1/{DEP}/ingress/+/{device}",
                "allow": True,
            },
        ]
    sends = {
        (acl["topic"], rolename)
        for rolename, acls in roles.items()
        for acl in acls
        if acl["acltype"] == "publishClientSend"
    }
    assert sends == {(ingress_topic(DEP, d), f"device:{d}") for d in DEVICES} | {
        (f"coco/v1/{DEP}/ingress/+/{d}", f"device:{d}") for d in DEVICES
    } | {
        (batches_topic(DEP), "shuffler"),
        (batches_topic(DEP) + "/+", "shuffler"),
        (f"coco/v1/{DEP}/manifests", "shuffler"),
        (f"coco/v1/{DEP}/manifests/+", "shuffler"),
        (f"coco/v1/{DEP}/shards/+/lease", "shuffler"),
        (spec_topic(DEP), "announcer"),
        (lease_topic(DEP), "aggregator"),
    }
    assert all(acl["allow"] for acls in roles.values() for acl in acls)


class Probe:
    """A paho MQTT 5 client recording every CONNACK, SUBACK, PUBACK and message."""

    def __init__(
        self,
        port: int,
        username: str | None,
        password: str | None,
        client_id: str | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self.connack: ReasonCode | None = None
        self.subacks: list[list[int]] = []
        self.pubacks: dict[int, int] = {}
        self.messages: list[tuple[str, bytes, bool]] = []
        # A device's account is bound to its name as client id (the plugin's ``clientid``).
        identifier = client_id if client_id is not None else (username or "")
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=identifier, protocol=mqtt.MQTTv5
        )
        if username is not None:
            client.username_pw_set(username, password)
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        self.client = client
        client.connect("127.0.0.1", port)
        client.loop_start()

    def _on_connect(self, _c: object, _u: object, _f: object, rc: ReasonCode, _p: object) -> None:
        self.connack = rc

    def _on_subscribe(
        self, _c: object, _u: object, _mid: int, rcs: list[ReasonCode], _p: object
    ) -> None:
        with self.lock:
            self.subacks.append([rc.value for rc in rcs])

    def _on_publish(self, _c: object, _u: object, mid: int, rc: ReasonCode, _p: object) -> None:
        with self.lock:
            self.pubacks[mid] = rc.value

    def _on_message(self, _c: object, _u: object, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages.append((message.topic, bytes(message.payload), bool(message.retain)))

    async def connected(self) -> None:
        await wait_until(lambda: self.connack is not None, TIMEOUT)
        assert self.connack is not None
        assert not self.connack.is_failure, str(self.connack)

    async def subscribe(self, topic: str) -> list[int]:
        before = len(self.subacks)
        self.client.subscribe(topic, qos=1)
        await wait_until(lambda: len(self.subacks) > before, TIMEOUT)
        return self.subacks[before]

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> int:
        """Publish at QoS 1; the PUBACK's reason code."""
        mid = self.client.publish(topic, payload, qos=1, retain=retain).mid
        await wait_until(lambda: mid in self.pubacks, TIMEOUT)
        return self.pubacks[mid]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@contextlib.asynccontextmanager
async def probe(stack: Stack, user: str) -> AsyncIterator[Probe]:
    client = Probe(stack.port, user, stack.password(user))
    try:
        await client.connected()
        yield client
    finally:
        client.close()


def test_only_the_shuffler_reads_and_claims_the_shuffler_leases(stack: Stack) -> None:
    """A shard's lease (shards/<L>/lease) and an unsharded deployment's (shards/-/lease):
    the shuffler's account subscribes to each one (a literal grant of shards/+/lease would
    refuse both) and publishes its claim; a device or the aggregator may do neither."""

    async def scenario() -> None:
        async with (
            probe(stack, "shuffler") as bridge,
            probe(stack, "aggregator") as aggregator,
            probe(stack, DEVICES[0]) as device,
        ):
            for lease in (shard_lease_topic(DEP, None), shard_lease_topic(DEP, "g0s1")):
                assert await bridge.subscribe(lease) == [GRANTED_QOS_1], lease
                assert await bridge.publish(lease, b"{}") in ACCEPTED, lease
                got = lambda topic=lease: topic in {t for t, _, _ in bridge.messages}  # noqa: E731
                await wait_until(got, TIMEOUT)
                for other in (device, aggregator):
                    assert await other.subscribe(lease) == [NOT_AUTHORIZED], lease
                    assert await other.publish(lease, b"forged") == NOT_AUTHORIZED, lease
            assert device.messages == aggregator.messages == []

    run(scenario(), 4 * TIMEOUT)


@contextlib.asynccontextmanager
async def shuffler(stack: Stack, registry: CollectorRegistry) -> AsyncIterator[Shuffler]:
    config = ShufflerConfig(
        broker=stack.broker.url,
        deployment=DEP,
        spec=SPEC,
        min_batch=2,
        release_size=2,  # released as soon as the two genuine reports are in
        round_seconds=3600,
        flush_interval=0.1,
        username="shuffler",
        password=stack.password("shuffler"),
        drain_timeout=5.0,
    )
    async with Shuffler(config, registry=registry) as bridge:
        task = asyncio.create_task(bridge.run())
        await waiting.until(bridge.connected.is_set, stall=TIMEOUT, what="bridge.connected")
        try:
            yield bridge
        finally:
            bridge.stop()
            await asyncio.wait_for(task, TIMEOUT)


def report(seed: int) -> bytes:
    return encode_report(SPEC.fingerprint_int, current_round(3600), seed, 0)


def test_a_device_publishes_only_to_its_own_ingress_topic(stack: Stack) -> None:
    """Forged reports, batches and announcements are refused with 0x87 and reach nobody;
    the shuffler counts only the devices' own reports, and releases them."""
    registry = CollectorRegistry()
    mallory, alice = DEVICES[1], DEVICES[0]
    announcement = b'{"genuine": true}'

    async def scenario() -> None:
        async with (
            probe(stack, "announcer") as announcer,
            probe(stack, "aggregator") as aggregator,
            shuffler(stack, registry),
            probe(stack, mallory) as device,
            probe(stack, alice) as other,
        ):
            assert await announcer.publish(spec_topic(DEP), announcement, retain=True) in ACCEPTED
            assert await aggregator.subscribe(batches_topic(DEP)) == [GRANTED_QOS_1]

            forged = [
                ingress_topic(DEP, alice),  # another device's ingress topic
                ingress_topic(DEP, "not-a-device"),
                batches_topic(DEP),  # a forged batch straight to the aggregator
                spec_topic(DEP),  # a forged announcement
                f"coco/v1/other/ingress/{mallory}",  # another deployment
            ]
            for topic in forged:
                assert await device.publish(topic, report(66)) == NOT_AUTHORIZED, topic
            device.client.publish(ingress_topic(DEP, alice), report(67), qos=0)
            # A service account is no device: no ingress topic, not even one named like it.
            for account, client in (("announcer", announcer), ("aggregator", aggregator)):
                topic = ingress_topic(DEP, account)
                assert await client.publish(topic, report(68)) == NOT_AUTHORIZED, account
            # The legitimate reports of both devices, after everything forged.
            assert await device.publish(ingress_topic(DEP, mallory), report(1)) in ACCEPTED
            assert await other.publish(ingress_topic(DEP, alice), report(2)) in ACCEPTED

            await wait_until(lambda: len(aggregator.messages) >= 1, TIMEOUT)
            await wait_until(
                lambda: value(registry, "coco_shuffler_reports_released_total") == 2, TIMEOUT
            )
            # Retained spec: still the announcer's (positive control: a fresh reader gets it).
            async with probe(stack, DEVICES[2]) as reader:
                assert await reader.subscribe(spec_topic(DEP)) == [GRANTED_QOS_1]
                await wait_until(lambda: len(reader.messages) == 1, TIMEOUT)
                assert reader.messages == [(spec_topic(DEP), announcement, True)]

        assert value(registry, "coco_shuffler_reports_received_total") == 2
        assert value(registry, "coco_shuffler_reports_accepted_total") == 2
        # The only batch the aggregator saw is the shuffler's, holding the two real reports.
        assert len(aggregator.messages) == 1
        topic, payload, _ = aggregator.messages[0]
        *_, seeds, _zs = decode_batch(payload[:-SIGNATURE_SIZE])
        assert topic == batches_topic(DEP)
        assert sorted(seeds) == [1, 2]

    run(scenario(), 4 * TIMEOUT)


def test_devices_and_the_aggregator_may_not_subscribe_to_reports_nor_devices_to_batches(
    stack: Stack,
) -> None:
    """Subscriptions to ingress, batches or everything are refused with SUBACK 0x87 and
    deliver nothing; the shuffler's account does receive the same reports, and the
    aggregator's the same batch."""
    alice, bob = DEVICES[0], DEVICES[1]
    forbidden = [
        ingress_filter(DEP),  # every device's reports
        ingress_topic(DEP, bob),  # another device's reports
        ingress_topic(DEP, alice),  # its own: a device never needs to read a report
        batches_topic(DEP),
        f"coco/v1/{DEP}/#",
        "coco/v1/+/ingress/+",
        "#",
    ]

    async def scenario() -> None:
        async with (
            probe(stack, "shuffler") as bridge,
            probe(stack, "aggregator") as aggregator,
            probe(stack, alice) as device,
            probe(stack, bob) as sender,
        ):
            assert await bridge.subscribe(ingress_filter(DEP)) == [GRANTED_QOS_1]
            for topic in forbidden:
                assert await device.subscribe(topic) == [NOT_AUTHORIZED], topic
            # One SUBSCRIBE packet, one reason code per filter: the spec is the device's.
            before = len(device.subacks)
            device.client.subscribe([(spec_topic(DEP), 1), (ingress_filter(DEP), 1)])
            await wait_until(lambda: len(device.subacks) > before, TIMEOUT)
            assert device.subacks[before] == [GRANTED_QOS_1, NOT_AUTHORIZED]
            # The aggregator must never see a sender: no ingress topic for it either.
            for topic in (ingress_filter(DEP), ingress_topic(DEP, bob), "#"):
                assert await aggregator.subscribe(topic) == [NOT_AUTHORIZED], topic
            assert await aggregator.subscribe(batches_topic(DEP)) == [GRANTED_QOS_1]
            # The aggregator's lease is its own: no device reads or forges it.
            assert await aggregator.subscribe(lease_topic(DEP)) == [GRANTED_QOS_1]
            assert await device.subscribe(lease_topic(DEP)) == [NOT_AUTHORIZED]
            assert await device.publish(lease_topic(DEP), b"forged") == NOT_AUTHORIZED
            assert await bridge.publish(lease_topic(DEP), b"forged") == NOT_AUTHORIZED

            assert await sender.publish(ingress_topic(DEP, bob), report(5)) in ACCEPTED
            assert await device.publish(ingress_topic(DEP, alice), report(6)) in ACCEPTED
            assert await bridge.publish(batches_topic(DEP), b"batch") in ACCEPTED
            await wait_until(lambda: len(bridge.messages) == 2, TIMEOUT)
            await wait_until(lambda: len(aggregator.messages) == 1, TIMEOUT)
            # Barrier: the broker answers this PUBACK after queueing, on the same
            # connection, every message it routed to the device before.
            assert await device.publish(ingress_topic(DEP, alice), report(7)) in ACCEPTED
            await wait_until(lambda: len(bridge.messages) == 3, TIMEOUT)

        assert device.messages == []
        assert aggregator.messages == [(batches_topic(DEP), b"batch", False)]
        assert sorted(topic for topic, _, _ in bridge.messages) == sorted(
            [ingress_topic(DEP, bob), ingress_topic(DEP, alice), ingress_topic(DEP, alice)]
        )

    run(scenario(), 4 * TIMEOUT)


@pytest.mark.parametrize(
    ("user", "password"),
    [
        (DEVICES[0], "wrong"),
        (DEVICES[0], device_password(SECRET, DEVICES[1])),  # another device's password
        ("shuffler", device_password(SECRET, "shuffler")),  # a device-derived password
        ("dev-999999", device_password(SECRET, "dev-999999")),  # no such account
        (None, None),  # anonymous
    ],
)
def test_wrong_credentials_are_refused(stack: Stack, user: str | None, password: str) -> None:
    async def scenario() -> ReasonCode:
        client = Probe(stack.port, user, password)
        try:
            await wait_until(lambda: client.connack is not None, TIMEOUT)
            assert client.connack is not None
            return client.connack
        finally:
            client.close()

    assert run(scenario(), 2 * TIMEOUT).value == NOT_AUTHORIZED


def test_an_oversized_message_disconnects_its_sender_and_harms_nothing(stack: Stack) -> None:
    """The shipped ``max_packet_size``: a device that sends 1 MB is refused; the shuffler
    never sees it; other devices' reports go through. (That the broker closes the sender's
    connection is asserted on the raw socket by tests/test_hostile_devices.py; paho here
    may notice it late on a loaded machine, so this test does not wait for it.)"""
    registry = CollectorRegistry()

    async def scenario() -> None:
        async with shuffler(stack, registry):
            attacker = Probe(stack.port, DEVICES[1], stack.password(DEVICES[1]))
            try:
                await attacker.connected()
                attacker.client.publish(ingress_topic(DEP, DEVICES[1]), b"\x01" * 1_000_000, qos=1)
            finally:
                attacker.close()
            async with probe(stack, DEVICES[0]) as honest, probe(stack, DEVICES[2]) as other:
                assert await honest.publish(ingress_topic(DEP, DEVICES[0]), report(1)) in ACCEPTED
                assert await other.publish(ingress_topic(DEP, DEVICES[2]), report(2)) in ACCEPTED
                await wait_until(
                    lambda: value(registry, "coco_shuffler_reports_released_total") == 2, TIMEOUT
                )

    run(scenario(), 3 * TIMEOUT)
    assert value(registry, "coco_shuffler_reports_received_total") == 2


@pytest.mark.parametrize(
    "client_id", [DEVICES[1], "shuffler", "aggregator", "shuffler-out", "coco-aggregator-x", ""]
)
def test_a_device_connects_only_with_its_own_client_id(stack: Stack, client_id: str) -> None:
    """No device can take another device's session or a service's (and so disconnect it)."""

    async def scenario() -> ReasonCode:
        client = Probe(stack.port, DEVICES[0], stack.password(DEVICES[0]), client_id=client_id)
        try:
            await wait_until(lambda: client.connack is not None, TIMEOUT)
            assert client.connack is not None
            return client.connack
        finally:
            client.close()

    assert run(scenario(), 2 * TIMEOUT).is_failure


def test_announce_and_the_aggregator_authenticate(stack: Stack, tmp_path: Path) -> None:
    """``coco announce --username announcer --password-file`` sets the spec; a device may not
    (0x87 reported as an error); the aggregator reads it with its own account's
    credentials, and not with a wrong password."""
    password_file = tmp_path / "announcer-password"
    password_file.write_text(stack.password("announcer") + "\n")
    args = [
        "announce",
        "--deployment",
        DEP,
        "--mechanism",
        "coco",
        "--d",
        "6",
        "--s",
        "2",
        "--epsilon",
        "1",
        "--min-batch",
        "100",
        "--delta",
        "1e-6",
        "--broker",
        stack.broker.url,
        "--timeout",
        str(TIMEOUT),
    ]
    ok = CliRunner().invoke(
        app, [*args, "--username", "announcer", "--password-file", str(password_file)]
    )
    assert ok.exit_code == 0, ok.output
    device = DEVICES[0]
    forged = CliRunner().invoke(
        app, [*args, "--username", device, "--password", stack.password(device)]
    )
    assert forged.exit_code == 1
    assert "Not authorized" in forged.output

    announcement = run(
        fetch_announcement(
            stack.broker.url,
            DEP,
            timeout=TIMEOUT,
            username="aggregator",
            password=stack.password("aggregator"),
        ),
        2 * TIMEOUT,
    )
    assert announcement["min_batch"] == 100
    assert MechanismSpec.from_dict(announcement["spec"]).d == 6
    with pytest.raises(CocoError, match="cannot read the spec announcement"):
        run(
            fetch_announcement(
                stack.broker.url, DEP, timeout=TIMEOUT, username="aggregator", password="wrong"
            ),
            2 * TIMEOUT,
        )
