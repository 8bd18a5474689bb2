"""DevicePublisher and ``coco device`` against a real Mosquitto (no MQTT mocks).

A paho subscriber on the ingress filter plays the shuffler: it records every message it
receives, so the tests can assert exactly what left the device.

Rounds come from the clock: the tests announce 1 s rounds (so that "the next round" comes
quickly) and check a report's round against the clock's round before and after it was sent,
never against a fixed time. An unset clock and a restart within one round use a given clock.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import typer
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from typer.testing import CliRunner

from edge.announce import AnnouncedPeriod, encode_announcement
from edge.budget import PeriodPolicy
from edge.codec import REPORT_SIZE, decode_report
from edge.device_cli import EXIT_BUDGET_SPENT, device
from edge.errors import InputError, SpecError
from edge.ledger import BudgetLedger
from edge.publisher import DevicePublisher, PublisherConfig, PublisherError
from edge.rounds import ClockError, current_round, round_start
from edge.shards import ShardLayout, ShardPlan
from edge.spec import MechanismSpec
from edge.topics import ingress_filter, ingress_topic, spec_topic
from tests import waiting
from tests.conftest import Broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

DEPLOYMENT = "plant-7"
DEVICE = "dev-0042-secret"
SPEC = MechanismSpec(mechanism="coco", d=4, s=2, epsilon=1.0)
OTHER = MechanismSpec(mechanism="collision", d=4, s=2, epsilon=1.0)
LO = (0.0, -10.0, 0.0, 900.0)
HI = (1.0, 40.0, 100.0, 1100.0)
WAIT = 30.0  # seconds without a new message before a wait gives up (scaled)


@dataclass
class Received:
    topic: str
    payload: bytes
    ledger_reports: int | None  # what the device's ledger file said when the report arrived


@dataclass
class Shuffler:
    """Subscribes to the ingress filter; re-subscribes after every reconnect."""

    broker: Broker
    ledger_path: Path | None = None
    messages: list[Received] = field(default_factory=list)
    subscribed: threading.Event = field(default_factory=threading.Event)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.client = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self.client.reconnect_delay_set(1, 1)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.client.on_disconnect = self._on_disconnect

    def _on_connect(self, client: mqtt.Client, *_: Any) -> None:
        client.subscribe(ingress_filter(DEPLOYMENT), qos=1)

    def _on_subscribe(self, *_: Any) -> None:
        self.subscribed.set()

    def _on_disconnect(self, *_: Any) -> None:
        self.subscribed.clear()

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        reports = None
        if self.ledger_path is not None:
            reports = json.loads(self.ledger_path.read_text())["reports"]
        with self.cond:
            self.messages.append(Received(msg.topic, bytes(msg.payload), reports))
            self.cond.notify_all()

    def start(self) -> None:
        self.client.connect_async("127.0.0.1", self.broker.port)
        self.client.loop_start()
        assert self.subscribed.wait(waiting.scaled(WAIT)), "subscriber did not subscribe"

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def wait_for(self, count: int, timeout: float = WAIT) -> list[Received]:
        """The messages once there are ``count``, or once none arrived for ``timeout`` s
        (tests/waiting.py; a short ``timeout`` checks that no more come)."""
        with contextlib.suppress(waiting.StalledError):
            waiting.wait_until(
                lambda: len(self.messages) >= count,
                progress=lambda: len(self.messages),
                stall=timeout,
            )
        with self.cond:
            return list(self.messages)


@pytest.fixture
def shuffler(mosquitto: Broker, tmp_path: Path) -> Iterator[Shuffler]:
    sub = Shuffler(mosquitto, ledger_path=tmp_path / "ledger.json")
    sub.start()
    try:
        yield sub
    finally:
        sub.stop()


def announce(  # noqa: PLR0917 (the announcement's fields)
    broker: Broker,
    spec: MechanismSpec,
    round_seconds: int = 1,
    shards: ShardPlan | None = None,
    participation: float = 1.0,
    period: AnnouncedPeriod | None = None,
) -> None:
    """Publish the retained spec announcement and wait for the broker to accept it."""
    client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        payload = encode_announcement(
            spec.to_dict(),
            min_batch=10,
            delta=1e-6,
            round_seconds=round_seconds,
            shards=shards,
            participation=participation,
            period=period,
        )
        info = client.publish(spec_topic(DEPLOYMENT), payload, qos=1, retain=True)
        info.wait_for_publish(waiting.scaled(WAIT))
        assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


def config(broker: Broker, **kw: Any) -> PublisherConfig:
    options: dict[str, Any] = {
        "broker": broker.url,
        "deployment": DEPLOYMENT,
        "device_id": DEVICE,
        "connect_timeout": 5.0,
        "publish_timeout": 5.0,
        "spec_timeout": 2.0,
    }
    options.update(kw)
    return PublisherConfig(**options)


def check_report(msg: Received, spec: MechanismSpec, rounds: range) -> int:
    """Check one report (its round in ``rounds``); return its round."""
    assert msg.topic == ingress_topic(DEPLOYMENT, DEVICE)
    assert len(msg.payload) == REPORT_SIZE
    assert DEVICE.encode() not in msg.payload
    version, fingerprint, got_round, _seed, z = decode_report(msg.payload)
    assert (version, fingerprint) == (1, spec.fingerprint_int)
    assert got_round in rounds
    assert 0 <= z < spec.t
    return got_round


def clock_rounds(round_seconds: int, first: int) -> range:
    """The clock's rounds from ``first`` to now."""
    return range(first, current_round(round_seconds) + 1)


def test_reports_from_the_announced_spec(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    announce(mosquitto, SPEC)
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    caplog.set_level("INFO")
    first = current_round(1)
    with DevicePublisher(config(mosquitto), ledger=ledger, lo=LO, hi=HI) as pub:
        assert pub.spec == SPEC
        assert pub.announcement is not None
        assert pub.announcement["min_batch"] == 10
        assert pub.round_seconds == 1
        for _ in range(2):
            assert pub.publish_vector([0.5, 20.0, 33.0, 1000.0]) is True
        assert pub.publish_keys([0, 3], [1, -1]) is True
        last = pub.last_round
    messages = shuffler.wait_for(3)
    time.sleep(0.2)  # nothing more arrives
    assert len(shuffler.messages) == 3
    rounds = [check_report(msg, SPEC, clock_rounds(1, first)) for msg in messages]
    assert rounds == sorted(set(rounds))  # one report per round: each waits for the next
    assert rounds[-1] == last
    for i, msg in enumerate(messages):
        assert msg.ledger_reports is not None
        assert msg.ledger_reports >= i + 1  # charged on disk before it was released
    assert ledger.reports == 3
    assert ledger.spent == 3 * SPEC.epsilon
    info_text = " ".join(r.getMessage() for r in caplog.records if r.levelname != "DEBUG")
    assert DEVICE not in info_text


def test_mqtt_311_and_given_spec_without_announcement(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    cfg = config(mosquitto, protocol="3.1.1")
    first = current_round(60)
    with DevicePublisher(cfg, ledger=ledger, spec=OTHER, round_seconds=60) as pub:
        assert pub.spec == OTHER
        assert pub.round_seconds == 60
        assert pub.publish_keys([1, 2], [-1, -1])
    (msg,) = shuffler.wait_for(1)
    check_report(msg, OTHER, clock_rounds(60, first))
    # Without an announcement the round length must be given.
    with pytest.raises(PublisherError, match="round length is unknown"):
        DevicePublisher(cfg, ledger=ledger, spec=OTHER).start()


def test_given_spec_that_matches_the_announcement(mosquitto: Broker, tmp_path: Path) -> None:
    announce(mosquitto, SPEC, round_seconds=30)
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    with DevicePublisher(config(mosquitto), ledger=ledger, spec=SPEC, round_seconds=30) as pub:
        assert pub.spec == SPEC
        assert pub.announcement is not None
        assert pub.round_seconds == 30
    with pytest.raises(SpecError, match="round_seconds 60 does not match"):
        DevicePublisher(config(mosquitto), ledger=ledger, spec=SPEC, round_seconds=60).start()
    assert ledger.reports == 0


def test_spec_mismatch_is_an_error(mosquitto: Broker, shuffler: Shuffler, tmp_path: Path) -> None:
    announce(mosquitto, SPEC)
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    pub = DevicePublisher(config(mosquitto), ledger=ledger, spec=OTHER)
    with pytest.raises(SpecError, match="does not match"):
        pub.start()
    assert ledger.reports == 0
    assert shuffler.wait_for(1, timeout=0.3) == []


def test_no_spec_anywhere_times_out(mosquitto: Broker, tmp_path: Path) -> None:
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    pub = DevicePublisher(config(mosquitto, spec_timeout=0.5), ledger=ledger)
    started = time.monotonic()
    with pytest.raises(PublisherError, match=r"no spec announcement .* within 0\.5 s"):
        pub.start()
    # it waited for the announcement as long as configured (no wall-clock upper bound: a
    # loaded machine may take longer; a hang is pytest-timeout's to catch)
    assert time.monotonic() - started >= 0.5


def test_unreachable_broker_fails_within_the_timeout(mosquitto: Broker, tmp_path: Path) -> None:
    mosquitto.stop()
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    pub = DevicePublisher(config(mosquitto, connect_timeout=1.0), ledger=ledger, spec=SPEC)
    with pytest.raises(PublisherError, match="not connected"):
        pub.start()


def test_wrong_channel_count_and_bad_input(mosquitto: Broker, tmp_path: Path) -> None:
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    with pytest.raises(InputError, match="d=4"):
        DevicePublisher(
            config(mosquitto), ledger=ledger, spec=SPEC, lo=LO[:3], hi=HI[:3], round_seconds=1
        ).start()
    with DevicePublisher(
        config(mosquitto), ledger=ledger, spec=SPEC, lo=LO, hi=HI, round_seconds=1
    ) as pub:
        with pytest.raises(InputError):
            pub.publish_vector([5.0, 20.0, 33.0, 1000.0])  # 5.0 outside [0, 1]
        with pytest.raises(InputError):
            pub.publish_keys([0, 0], [1, 1])
    assert ledger.reports == 0  # invalid input costs no budget
    with pytest.raises(ValueError, match="round_seconds"):
        DevicePublisher(config(mosquitto), ledger=ledger, spec=SPEC, round_seconds=0)


def test_the_wait_for_the_next_round_is_not_part_of_the_publish_timeout(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    """The third publish waits a whole 1 s round (the second went out at a round's start),
    twice the publish timeout; the timeout starts after that wait."""
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    cfg = config(mosquitto, publish_timeout=0.5)
    with DevicePublisher(cfg, ledger=ledger, spec=SPEC, round_seconds=1) as pub:
        for _ in range(3):
            assert pub.publish_keys([0, 1], [1, 1])
    rounds = [decode_report(m.payload)[2] for m in shuffler.wait_for(3)]
    assert rounds == sorted(set(rounds))
    assert ledger.reports == 3


def test_an_unset_clock_refuses_to_report(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    """A device whose clock reads before 2025 (no RTC, no NTP yet) charges and sends nothing."""
    announce(mosquitto, SPEC)
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    with DevicePublisher(config(mosquitto), ledger=ledger, clock=lambda: 12.0) as pub:
        with pytest.raises(ClockError, match="not set"):
            pub.publish_keys([0, 1], [1, 1])
        assert pub.last_round is None
    assert ledger.reports == 0
    assert shuffler.wait_for(1, timeout=0.3) == []


def test_a_restarted_device_reports_again_in_the_same_round(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    """A device keeps no round across a restart: a second publisher (a reboot) at the same
    time sends a second report of the same round on the same topic, which the shuffler
    rejects as a duplicate (docs/protocol.md, "Rounds"); each charged the ledger."""
    announce(mosquitto, SPEC, round_seconds=60)
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    now = 1_800_000_030.0  # a fixed clock: both runs fall in round 30_000_000
    for _ in range(2):
        with DevicePublisher(config(mosquitto), ledger=ledger, clock=lambda: now) as pub:
            assert pub.publish_keys([0, 1], [1, 1])
            assert pub.last_round == 30_000_000
    messages = shuffler.wait_for(2)
    assert [check_report(m, SPEC, range(30_000_000, 30_000_001)) for m in messages] == [
        30_000_000,
        30_000_000,
    ]
    assert messages[0].payload != messages[1].payload  # fresh randomness each time
    assert ledger.reports == 2


def test_the_client_id_is_the_device_id(mosquitto_client_id_acl: Broker, tmp_path: Path) -> None:
    """A broker ACL on the client id (``%c``) lets the device write its own ingress topic."""
    broker = mosquitto_client_id_acl
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    with DevicePublisher(config(broker), ledger=ledger, spec=SPEC, round_seconds=60) as pub:
        assert pub.publish_keys([0, 1], [1, 1])
    other = config(broker, client_id="someone-else")
    with (
        DevicePublisher(other, ledger=ledger, spec=SPEC, round_seconds=60) as pub,
        pytest.raises(PublisherError, match="rejected"),
    ):
        pub.publish_keys([0, 1], [1, 1])


def test_ledger_refuses_and_nothing_is_published(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=2 * SPEC.epsilon)
    with DevicePublisher(config(mosquitto), ledger=ledger, spec=SPEC, round_seconds=1) as pub:
        assert pub.publish_keys([0, 1], [1, 1]) is True
        assert pub.publish_keys([0, 1], [1, 1]) is True
        last = pub.last_round
        assert pub.publish_keys([0, 1], [1, 1]) is False
        assert pub.publish_keys([0, 1], [1, 1]) is False
        assert pub.last_round == last
    shuffler.wait_for(2)
    shuffler.wait_for(3, timeout=0.5)  # no third
    rounds = [decode_report(m.payload)[2] for m in shuffler.messages]
    assert len(rounds) == 2
    assert rounds[0] < rounds[1] == last
    assert (ledger.reports, ledger.remaining) == (2, 0.0)


PERIOD = 6  # seconds: a period cap's test period, of 1-s rounds


def period_offset() -> float:
    """A clock offset that puts the shifted clock 0.2 s into a period of PERIOD seconds now,
    so that a first report and the next row fall in one period (a loaded machine has
    PERIOD - 0.2 s to get there), whatever the wall clock reads."""
    now = time.time()
    return PERIOD - now % PERIOD + 0.2


def test_a_spent_period_waits_for_the_next_period_and_says_so(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    """A period cap of one report per 6-s period with 1-s rounds, on a clock shifted to
    start just after a period boundary: every publish succeeds, each in its own period, and
    each wait is announced in one line naming when the next period starts; the lifetime cap
    then refuses for good."""
    period = PeriodPolicy.of(SPEC.epsilon, f"{PERIOD}s")
    offset = period_offset()
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=3 * SPEC.epsilon, period=period)
    said: list[str] = []
    with DevicePublisher(
        config(mosquitto),
        ledger=ledger,
        spec=SPEC,
        round_seconds=1,
        on_wait=said.append,
        clock=lambda: time.time() + offset,
    ) as pub:
        rounds = []
        for _ in range(3):
            assert pub.publish_keys([0, 1], [1, 1]) is True
            assert pub.last_round is not None
            rounds.append(pub.last_round)
        assert pub.publish_keys([0, 1], [1, 1]) is False  # the lifetime cap: no wait
    periods = [period.index(round_start(r, 1)) for r in rounds]
    assert periods == sorted(set(periods))  # one report per period
    assert len(said) == 2  # the second and third publish each waited, once
    for line in said:
        assert "privacy budget of this period spent" in line
        assert "the next period starts at" in line
    assert len(shuffler.wait_for(3)) == 3
    assert ledger.state.period == periods[-1]


def test_a_device_not_sampled_charges_and_sends_nothing(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    """An announced participation of 1e-300 (threshold 0: the device never reports): each
    publish sits its round out, one per round, with nothing charged or sent."""
    announce(mosquitto, SPEC, participation=1e-300)
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    with DevicePublisher(config(mosquitto), ledger=ledger) as pub:
        assert pub.participation == 1e-300
        first = None
        for _ in range(2):
            assert pub.publish_keys([0, 1], [1, 1]) is True
            first = first if first is not None else pub.last_round
        assert pub.sat_out == 2
        assert first is not None
        assert pub.last_round is not None
        assert pub.last_round > first  # one round each
    assert ledger.reports == 0
    assert shuffler.wait_for(1, timeout=0.5) == []


def test_publish_after_broker_restart(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    with DevicePublisher(config(mosquitto), ledger=ledger, spec=SPEC, round_seconds=1) as pub:
        assert pub.publish_keys([0, 1], [1, 1])
        assert len(shuffler.wait_for(1)) == 1
        mosquitto.restart()
        assert shuffler.subscribed.wait(waiting.scaled(WAIT)), "subscriber did not come back"
        assert pub.publish_keys([2, 3], [1, -1])  # waits for paho to reconnect
        last = pub.last_round
    messages = shuffler.wait_for(2)
    rounds = [decode_report(m.payload)[2] for m in messages]
    assert rounds[0] < rounds[1] == last


def test_publish_while_broker_down_fails_clearly(mosquitto: Broker, tmp_path: Path) -> None:
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0)
    cfg = config(mosquitto, publish_timeout=0.7)
    with DevicePublisher(cfg, ledger=ledger, spec=SPEC, round_seconds=1) as pub:
        mosquitto.stop()
        waiting.wait_until(lambda: not pub.connected, stall=WAIT, what="paho saw the broker go")
        with pytest.raises(PublisherError, match="not connected"):
            pub.publish_keys([0, 1], [1, 1])
    assert ledger.reports == 0  # nothing charged while there was no connection


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="mqtt://"):
        PublisherConfig(broker="http://x:1", deployment="d", device_id="e")
    with pytest.raises(SpecError):
        PublisherConfig(broker="mqtt://x", deployment="a/b", device_id="e")
    with pytest.raises(ValueError, match="qos"):
        PublisherConfig(broker="mqtt://x", deployment="d", device_id="e", qos=3)
    tls = PublisherConfig(broker="mqtts://broker.example", deployment="d", device_id="e")
    assert (tls.host, tls.port, tls.tls) == ("broker.example", 8883, True)
    plain = PublisherConfig(
        broker="mqtt://h:1999", deployment="d", device_id=DEVICE, password="hunter2"
    )
    assert (plain.port, plain.tls) == (1999, False)
    assert "hunter2" not in repr(plain)
    assert DEVICE not in repr(plain)


# -- coco device ---------------------------------------------------------------------------


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(device)
    return app


def device_args(broker: Broker, tmp_path: Path, *extra: str, budget: str = "10") -> list[str]:
    """``coco device`` options for this file's device, ledger and channels, then ``extra``."""
    return [
        "--broker", broker.url,
        "--deployment", DEPLOYMENT,
        "--device-id", DEVICE,
        "--lo", ",".join(map(str, LO)),
        "--hi", ",".join(map(str, HI)),
        "--ledger", str(tmp_path / "ledger.json"),
        "--budget", budget,
        *extra,
    ]  # fmt: skip


def test_device_cli_end_to_end(mosquitto: Broker, shuffler: Shuffler, tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC.to_dict()))
    csv_text = "humidity,temp,light,pressure\n0.1,10,50,1000\n\n0.9,-5,0,950\n0.5,39,100,1100\n"
    args = device_args(
        mosquitto, tmp_path, "--spec", str(spec_file), "--round-seconds", "1", budget="2"
    )
    first = current_round(1)
    result = CliRunner().invoke(cli(), args, input=csv_text)
    # issue 18: the header was skipped silently and a refusal of the ledger exited 0
    assert result.exit_code == EXIT_BUDGET_SPENT == 4, result.output
    assert result.stdout.strip() == "published 2, refused by ledger 1, failed 0"
    assert result.stderr.splitlines() == [
        "note: line 1 is not numeric: read as a header of 4 columns and skipped",
        f"error: the privacy budget is spent: the ledger {tmp_path / 'ledger.json'} refused "
        "1 row(s) (lifetime budget 2, 0 left)",
    ]
    messages = shuffler.wait_for(2)
    time.sleep(0.2)
    assert len(shuffler.messages) == 2
    rounds = [check_report(msg, SPEC, clock_rounds(1, first)) for msg in messages]
    assert rounds[0] < rounds[1]  # one row per round


def test_device_cli_with_a_period_cap_waits_instead_of_exiting(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    """``--budget-per-period`` without ``--budget``: the rows past the period's cap wait for
    the next period (one ``note:`` line each) and are all published; exit 0."""
    announce(mosquitto, SPEC)
    args = device_args(
        mosquitto, tmp_path, "--budget-per-period", "1", "--period", f"{PERIOD}s",
        "--clock-offset", str(period_offset()),
    )  # fmt: skip
    args.remove("--budget")
    args.remove("10")
    result = CliRunner().invoke(cli(), args, input="0.1,10,50,1000\n0.2,10,50,1000\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "published 2, refused by ledger 0, failed 0"
    (note,) = result.stderr.splitlines()
    assert note.startswith("note: privacy budget of this period spent: 1 of 1")
    assert note.endswith(": waiting for it")
    rounds = [decode_report(m.payload)[2] for m in shuffler.wait_for(2)]
    assert rounds[0] // PERIOD + 1 == rounds[1] // PERIOD  # the next period
    data = json.loads((tmp_path / "ledger.json").read_text())
    assert (data["period_seconds"], data["period"]) == (PERIOD, rounds[1] // PERIOD)
    assert data["total_epsilon"] is None


def test_device_cli_needs_a_cap(mosquitto: Broker, tmp_path: Path) -> None:
    """No --budget, no --budget-per-period and an announcement without a period policy: one
    line naming the options, exit 1, nothing charged; a malformed --period is refused at
    once (exit 2)."""
    announce(mosquitto, SPEC)
    args = device_args(mosquitto, tmp_path)
    args.remove("--budget")
    args.remove("10")
    result = CliRunner().invoke(cli(), args, input="0.1,10,50,1000\n")
    assert result.exit_code == 1, result.output
    assert "--budget-per-period" in result.stderr
    assert "announces no period policy" in result.stderr
    assert not (tmp_path / "ledger.json").exists()
    bad = CliRunner().invoke(cli(), [*args, "--budget-per-period", "1", "--period", "1w"])
    assert bad.exit_code == 2
    assert "a period is a whole number" in bad.output


def test_device_cli_takes_the_announced_period_policy(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    """No period options: the announced policy (1 per PERIOD s) is the ledger's period cap,
    so the second row waits for the next period, as with --budget-per-period 1."""
    announce(mosquitto, SPEC, period=AnnouncedPeriod(PERIOD, 1.0))
    args = device_args(mosquitto, tmp_path, "--clock-offset", str(period_offset()))
    result = CliRunner().invoke(cli(), args, input="0.1,10,50,1000\n0.2,10,50,1000\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "published 2, refused by ledger 0, failed 0"
    (note,) = result.stderr.splitlines()
    assert note.startswith("note: privacy budget of this period spent: 1 of 1")
    rounds = [decode_report(m.payload)[2] for m in shuffler.wait_for(2)]
    assert rounds[0] // PERIOD + 1 == rounds[1] // PERIOD
    data = json.loads((tmp_path / "ledger.json").read_text())
    assert (data["period_epsilon"], data["period_seconds"]) == (1.0, PERIOD)
    assert data["total_epsilon"] == 10.0  # --budget kept beside the announced cap


@pytest.mark.parametrize(
    ("per_period", "period", "accepted"),
    [
        ("2", f"{PERIOD}s", False),  # two reports in an announced period of one
        ("1", f"{PERIOD // 2}s", False),  # one per half period: two per announced period
        ("1", f"{2 * PERIOD}s", True),  # one per two announced periods: tighter
        ("1.5", f"{PERIOD}s", True),  # floor(1.5 / 1) = 1 report: as tight
    ],
)
def test_device_cli_refuses_a_looser_period_cap_than_announced(
    mosquitto: Broker, tmp_path: Path, per_period: str, period: str, accepted: bool
) -> None:
    """An operator's period cap that lets more reports into an announced period than the
    announced cap is refused in one line before anything is charged; a tighter one runs."""
    announce(mosquitto, SPEC, period=AnnouncedPeriod(PERIOD, 1.0))
    args = device_args(mosquitto, tmp_path, "--budget-per-period", per_period, "--period", period)
    result = CliRunner().invoke(cli(), args, input="")
    if accepted:
        assert result.exit_code == 0, result.output
        data = json.loads((tmp_path / "ledger.json").read_text())
        assert data["period_epsilon"] == float(per_period)
    else:
        assert result.exit_code == 1, result.output
        (line,) = result.stderr.splitlines()
        assert line.startswith("error: the period cap")
        assert "no looser" in line
        assert json.loads((tmp_path / "ledger.json").read_text())["reports"] == 0


def test_device_cli_input_file_and_bad_rows(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    announce(mosquitto, SPEC)
    data = tmp_path / "in.csv"
    data.write_text("0.1,10,50,1000\n7,10,50,1000\n0.2,10,50\nx,1,2,3\n0.3,10,50,1000\n")
    args = device_args(mosquitto, tmp_path, "--input", str(data))
    result = CliRunner().invoke(cli(), args)
    assert result.exit_code == 1
    assert result.stdout.strip() == "published 2, refused by ledger 0, failed 3"
    messages = shuffler.wait_for(2)
    rounds = [decode_report(m.payload)[2] for m in messages]
    assert rounds[0] < rounds[1]


def test_device_cli_a_first_line_of_another_width_is_a_bad_row_not_a_header(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    announce(mosquitto, SPEC)
    data = tmp_path / "in.csv"
    data.write_text("temp,humidity\n0.1,10,50,1000\n")
    result = CliRunner().invoke(cli(), device_args(mosquitto, tmp_path, "--input", str(data)))
    assert result.exit_code == 1
    assert result.stdout.strip() == "published 1, refused by ledger 0, failed 1"
    assert "header" not in result.stderr
    assert len(shuffler.wait_for(1)) == 1


def test_device_cli_error_is_one_line(mosquitto: Broker, tmp_path: Path) -> None:
    mosquitto.stop()
    args = [
        "--broker", mosquitto.url,
        "--deployment", DEPLOYMENT,
        "--device-id", DEVICE,
        "--lo", "0,0", "--hi", "1,1",
        "--ledger", str(tmp_path / "ledger.json"),
        "--budget", "1",
        "--timeout", "0.5",
    ]  # fmt: skip
    result = CliRunner().invoke(cli(), args, input="0.5,0.5\n")
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("error: not connected")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_device_cli_with_an_unset_clock_is_a_one_line_error(
    mosquitto: Broker, shuffler: Shuffler, tmp_path: Path
) -> None:
    announce(mosquitto, SPEC)
    # --clock-offset is hidden, for tests: the clock reads long before 2025
    args = device_args(mosquitto, tmp_path, "--clock-offset", "-1e12")
    result = CliRunner().invoke(cli(), args, input="0.1,10,50,1000\n")
    assert result.exit_code == 1
    assert result.stdout.strip() == "published 0, refused by ledger 0, failed 0"
    assert result.stderr.startswith("error: the clock reads")
    assert "not reporting" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert BudgetLedger(tmp_path / "ledger.json", total_epsilon=10.0).reports == 0
    assert shuffler.wait_for(1, timeout=0.3) == []
    assert "--clock-offset" not in CliRunner().invoke(cli(), ["--help"]).output


def _layout(count: int, from_round: int, generation: int) -> ShardLayout:
    keys = tuple(bytes([generation * 16 + i + 1]).hex() * 32 for i in range(count))
    return ShardLayout(
        count=count, from_round=from_round, generation=generation, seed=77, keys=keys
    )


def test_a_sharded_deployment_reports_on_the_shard_of_each_round(
    mosquitto: Broker, tmp_path: Path
) -> None:
    """Each report goes to the ingress topic of the device's shard in the layout of the
    report's round; a round no layout serves costs no budget and sends nothing."""
    now = current_round(1)
    old, new = _layout(3, 0, 0), _layout(5, now + 3, 1)
    announce(mosquitto, SPEC, shards=ShardPlan((old, new)))
    sub = Shuffler(mosquitto)
    sub.client.on_connect = lambda client, *_: client.subscribe(
        f"coco/v1/{DEPLOYMENT}/ingress/#", qos=1
    )
    sub.start()
    ledger = BudgetLedger(tmp_path / "ledger.json", total_epsilon=100.0)
    try:
        with DevicePublisher(config(mosquitto), ledger=ledger) as pub:
            while True:
                assert pub.publish_keys([0, 2], [1, -1])
                if pub.last_round is not None and pub.last_round >= now + 3:
                    break
        messages = sub.wait_for(ledger.reports)
    finally:
        sub.stop()
    assert len(messages) == ledger.reports >= 2
    for message in messages:
        round_ = decode_report(message.payload)[2]
        layout = old if round_ < new.from_round else new
        label = layout.label(layout.index_of(DEVICE))
        assert message.topic == ingress_topic(DEPLOYMENT, DEVICE, label)
    assert {decode_report(m.payload)[2] >= new.from_round for m in messages} == {False, True}

    announce(mosquitto, SPEC, shards=ShardPlan((_layout(2, now + 10_000, 2),)))
    with DevicePublisher(config(mosquitto), ledger=ledger) as pub:
        spent = ledger.spent
        with pytest.raises(PublisherError, match="no shard layout"):
            pub.publish_keys([0, 2], [1, -1])
        assert ledger.spent == spent
