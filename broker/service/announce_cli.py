"""``coco announce``: publish a deployment's retained spec announcement.

Devices, the shuffler and the aggregator all read the retained message on
``coco/v1/<deployment>/spec`` (docs/protocol.md, section 10.5), so one command fixes what the
whole deployment runs: the mechanism spec, the shuffler's ``min_batch`` and the accountant's
``delta``, and for a sharded deployment its shard layouts (``--shard-key`` once per shard;
``--reshard`` adds a layout to the announced one: docs/protocol.md, section 13). Optionally
the participation probability ``q`` (``--participation``, written only below 1) and the
deployment's device period policy (``--budget-per-period`` per ``--period``): devices report
in a round with probability ``q``, and a device that follows the policy reports at most
``floor(budget_per_period / epsilon)`` times per period (docs/protocol.md, 10.5, 12.1,
12.2). ``--reshard`` keeps both from the current announcement unless they are given.

The announcement is published retained at QoS 1 over MQTT 5, or 3.1.1 where the broker speaks
only that, and then read back: it counts as announced only once the broker hands the same
bytes back as the topic's retained message (a 3.1.1 broker drops a publish its ACL refuses
without a word, so the PUBACK alone proves nothing there).
"""

from __future__ import annotations

import json
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from edge import CocoError, MechanismSpec
from edge.announce import (
    AnnouncedPeriod,
    encode_announcement,
    load_spec_file,
    participation_of,
    period_of,
    read_public_key,
    shard_plan,
)
from edge.budget import parse_period
from edge.cli_options import (
    DEFAULT_BROKER,
    DEFAULT_MQTT_VERSION,
    BrokerOption,
    CaFileOption,
    DeploymentOption,
    MqttVersionOption,
    PasswordFileOption,
    PasswordOption,
    UsernameOption,
    delta_option,
    resolve_password,
)
from edge.defaults import DEFAULT_ROUND_SECONDS
from edge.errors import SpecError
from edge.mqtt_url import parse_broker_url, parse_broker_urls
from edge.mqtt_version import MqttVersion, VersionChoice, check_mqtt_version, is_version_refusal
from edge.rounds import current_round
from edge.shards import ShardLayout, ShardPlan
from edge.topics import spec_topic

ECHO_RETRY = 0.5
"""Seconds between the subscriptions that ask for the retained announcement back."""

if TYPE_CHECKING:  # paho is imported when the command runs, not for --help
    import paho.mqtt.client as mqtt
    from paho.mqtt.reasoncodes import ReasonCode


class AnnouncedMechanism(StrEnum):
    coco = "coco"
    collision = "collision"


def publish_retained(
    url: str,
    topic: str,
    payload: bytes,
    *,
    timeout: float,
    username: str | None = None,
    password: str | None = None,
    ca_file: str | None = None,
    mqtt_version: MqttVersion = "auto",
) -> None:
    """Publish ``payload`` retained with QoS 1, wait for the broker's PUBACK, then read the
    topic's retained message back and require the same bytes (module docs).

    ``url`` is one broker URL or a cluster's nodes separated by commas: the nodes are tried
    in turn until one takes the announcement (a cluster replicates retained messages, so
    one node's acknowledgement and read-back suffice); a node that cannot be reached is
    skipped, any other refusal ends the attempt."""
    nodes = [node.strip() for node in url.split(",")]
    parse_broker_urls(url)  # the whole list is checked before anything is sent
    for index, node in enumerate(nodes):
        try:
            _publish_to_node(
                node,
                topic,
                payload,
                timeout=timeout,
                username=username,
                password=password,
                ca_file=ca_file,
                mqtt_version=mqtt_version,
            )
            return
        except _UnreachableError as exc:
            if index == len(nodes) - 1:
                raise CocoError(str(exc)) from None


def _publish_to_node(
    url: str,
    topic: str,
    payload: bytes,
    *,
    timeout: float,
    username: str | None,
    password: str | None,
    ca_file: str | None,
    mqtt_version: MqttVersion,
) -> None:
    choice = VersionChoice(mqtt_version, broker=url)
    while True:
        try:
            _publish_once(
                url,
                topic,
                payload,
                timeout=timeout,
                username=username,
                password=password,
                ca_file=ca_file,
                mqtt5=choice.mqtt5,
            )
            return
        except _VersionRefusedError:
            if not choice.refused():
                raise CocoError(choice.describe_refusal()) from None


class _VersionRefusedError(Exception):
    """The broker refused the MQTT protocol version of the CONNECT."""


class _UnreachableError(Exception):
    """No connection to this node (refused, unreachable, name unknown): try the next."""


class _Outcome:
    """What the paho callbacks saw: refusals, and the retained message read back."""

    def __init__(self, topic: str, expected: bytes) -> None:
        import threading  # noqa: PLC0415

        self.topic = topic
        self.expected = expected
        self.refused: list[str] = []
        self.version_refused = threading.Event()
        self.echoed: list[bytes] = []
        self.echo = threading.Event()

    def on_connect(
        self, client: mqtt.Client, _u: object, _f: object, rc: ReasonCode, _p: object
    ) -> None:
        if rc.is_failure:
            if is_version_refusal(rc):
                self.version_refused.set()
                client.disconnect()
            self.refused.append(f"connection refused: {rc}")

    def on_publish(self, _c: mqtt.Client, _u: object, _m: int, rc: ReasonCode, _p: object) -> None:
        if rc.is_failure:
            self.refused.append(f"announcement refused: {rc}")

    def on_message(self, _c: mqtt.Client, _u: object, message: mqtt.MQTTMessage) -> None:
        if message.topic == self.topic and message.retain:
            self.echoed.append(bytes(message.payload))
            if self.echoed[-1] == self.expected:
                self.echo.set()


def _publish_once(
    url: str,
    topic: str,
    payload: bytes,
    *,
    timeout: float,
    username: str | None,
    password: str | None,
    ca_file: str | None,
    mqtt5: bool,
) -> None:
    import paho.mqtt.client as mqtt  # noqa: PLC0415
    from paho.mqtt.enums import CallbackAPIVersion  # noqa: PLC0415

    host, port, tls = parse_broker_url(url)
    # The client id is the account's name: the broker binds device accounts to their own.
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=username or "",
        protocol=mqtt.MQTTv5 if mqtt5 else mqtt.MQTTv311,
    )
    if username is not None:
        client.username_pw_set(username, password)
    if tls:
        client.tls_set(ca_certs=ca_file)
    # A refused CONNECT and a PUBACK with a failure reason code (MQTT 5: e.g. 0x87 Not
    # authorized when the ACL denies the spec topic) both mean nothing was announced.
    seen = _Outcome(topic, payload)
    client.on_connect = seen.on_connect
    client.on_publish = seen.on_publish
    client.on_message = seen.on_message
    try:
        client.connect(host, port, keepalive=30)
    except OSError as exc:
        raise _UnreachableError(f"cannot connect to the broker at {url}: {exc}") from exc
    client.loop_start()
    try:
        info = client.publish(topic, payload, qos=1, retain=True)
        try:
            info.wait_for_publish(timeout=timeout)
        except RuntimeError as exc:  # the connection was refused or closed
            if seen.version_refused.is_set():
                raise _VersionRefusedError from None
            reason = seen.refused[0] if seen.refused else str(exc)
            raise CocoError(f"the broker at {url}: {reason}") from None
        if seen.version_refused.is_set():
            raise _VersionRefusedError
        if seen.refused:
            raise CocoError(f"the broker at {url}: {seen.refused[0]}")
        if not info.is_published():
            raise CocoError(f"the broker did not acknowledge the announcement within {timeout} s")
        # The retained message comes back on subscription. A NATS node serves a retained
        # message some time after its PUBACK (seen: none at all on a subscription made at
        # once, on 2.15.1): subscribe again until it shows, as a SUBSCRIBE that replaces a
        # subscription is sent the retained message anew.
        deadline = time.monotonic() + timeout
        while not seen.echo.is_set():
            client.subscribe(topic, qos=1)
            left = deadline - time.monotonic()
            if seen.echo.wait(min(ECHO_RETRY, max(left, 0.0))) or left <= ECHO_RETRY:
                break
        if not seen.echo.is_set():
            raise CocoError(
                f"the broker at {url} acknowledged the announcement but does not retain it on "
                f"{topic} (an ACL that refuses the topic, or a broker without retained "
                "messages): nothing was announced"
            )
    finally:
        client.disconnect()
        client.loop_stop()


def _current(
    broker: str,
    deployment: str,
    timeout: float,
    username: str | None,
    password: str | None,
    ca_file: str | None,
    mqtt_version: MqttVersion,
) -> dict[str, Any] | None:
    """The retained announcement (``None`` when there is none)."""
    import asyncio  # noqa: PLC0415

    from edge.announcement_reader import (  # noqa: PLC0415 (MQTT client: not for --help)
        NotAnnouncedError,
        fetch_announcement,
    )

    try:
        return asyncio.run(
            fetch_announcement(
                broker,
                deployment,
                timeout=timeout,
                username=username,
                password=password,
                ca_file=ca_file,
                client_id=username,
                mqtt_version=mqtt_version,
            )
        )
    except NotAnnouncedError:
        return None
    except SpecError as exc:
        raise CocoError(f"the retained announcement is not valid: {exc}") from None


def _mechanism(
    spec_file: Path | None,
    mechanism: AnnouncedMechanism | None,
    d: int | None,
    s: int | None,
    epsilon: float | None,
    t: int | None,
) -> MechanismSpec:
    """The spec of ``--spec``, or of the mechanism options (all of them, not both)."""
    given = {"--mechanism": mechanism, "--d": d, "--s": s, "--epsilon": epsilon}
    if spec_file is not None:
        if any(v is not None for v in (*given.values(), t)):
            raise ValueError("give --spec or the mechanism options, not both")
        return load_spec_file(spec_file)
    if mechanism is None or d is None or s is None or epsilon is None:
        missing = [name for name, value in given.items() if value is None]
        raise ValueError(f"missing {', '.join(missing)} (or give --spec)")
    mechanism_name: Any = mechanism.value  # MechanismSpec checks it
    return MechanismSpec(mechanism=mechanism_name, d=d, s=s, epsilon=epsilon, t=t)  # type: ignore[arg-type]  # t None: MSE-optimal


RESHARD_LEAD_ROUNDS = 3
"""Default rounds between now and a new layout's first round (``--reshard``): time for every
device and shuffler to see the announcement before the layout takes over."""


def _check_ahead(from_round: int, round_seconds: int) -> None:
    """Refuse a layout whose first round has begun: the devices sent that round's reports
    under the layout before (or unsharded), and the new shards would reject them as
    ``wrong_shard``. A first layout from round 0 (the default) makes a deployment sharded
    from the start and is not checked."""
    now = current_round(round_seconds)
    if from_round <= now:
        raise ValueError(
            f"--shards-from-round {from_round} is not ahead of the current round {now} "
            f"(round_seconds {round_seconds}): two layouts would serve it; give "
            f"{now + RESHARD_LEAD_ROUNDS} or later (the default with --reshard)"
        )


def _shards(
    keys: list[str] | None,
    seed: int,
    from_round: int | None,
    *,
    reshard: bool,
    current: dict[str, Any] | None,
    round_seconds: int,
) -> ShardPlan | None:
    """The layouts to announce: ``--shard-key`` (one per shard, in order) makes one layout;
    with ``--reshard`` it is appended, as the next generation, to the newest layout of the
    ``current`` announcement (which must be sharded)."""
    if not keys:
        if reshard:
            raise ValueError("--reshard needs the new layout's keys (--shard-key, once per shard)")
        return None
    public = tuple(k for k in (read_public_key(key) for key in keys) if k is not None)
    if from_round is not None and (reshard or from_round > 0):
        _check_ahead(from_round, round_seconds)
    if not reshard:
        return ShardPlan(
            (
                ShardLayout(
                    count=len(public),
                    from_round=0 if from_round is None else from_round,
                    generation=0,
                    seed=seed,
                    keys=public,
                ),
            )
        )
    if current is None:
        raise ValueError("--reshard needs the current announcement (none is retained)")
    plan = shard_plan(current)
    if plan is None:
        raise ValueError(
            "--reshard: the current announcement is not sharded (announce its first layout "
            "without --reshard)"
        )
    if current["round_seconds"] != round_seconds:
        raise ValueError(
            f"--reshard keeps round_seconds ({current['round_seconds']}); change it in a "
            "separate announcement"
        )
    newest = plan.layouts[-1]
    start = current_round(round_seconds) + RESHARD_LEAD_ROUNDS if from_round is None else from_round
    layout = ShardLayout(
        count=len(public),
        from_round=start,
        generation=newest.generation + 1,
        seed=seed,
        keys=public,
    )
    return ShardPlan((newest, layout))


def _policy(
    participation: float | None,
    budget_per_period: float | None,
    period: str | None,
    current: dict[str, Any] | None,
) -> tuple[float, AnnouncedPeriod | None]:
    """``q`` and the period policy to announce: the options', else (with ``--reshard``) the
    current announcement's, else ``q = 1`` and no policy."""
    if period is not None and budget_per_period is None:
        raise ValueError("--period is the length of a --budget-per-period's period: give both")
    q = participation_of(current) if participation is None else participation
    announced = period_of(current)
    if budget_per_period is not None:
        announced = AnnouncedPeriod(parse_period(period or "1d"), budget_per_period)
    return q, announced


def announce(
    deployment: DeploymentOption,
    min_batch: Annotated[int, typer.Option(help="Smallest batch the shuffler may release.")],
    delta: Annotated[
        float,
        typer.Option(callback=delta_option, help="Target delta of the accountant, in (0, 1)."),
    ],
    mechanism: Annotated[
        AnnouncedMechanism | None, typer.Option(help="Local randomiser (or --spec).")
    ] = None,
    d: Annotated[int | None, typer.Option(help="Dimension of the encoded vectors.")] = None,
    s: Annotated[int | None, typer.Option(help="Non-zeros per vector.")] = None,
    epsilon: Annotated[float | None, typer.Option(help="Local budget of one report.")] = None,
    t: Annotated[
        int | None, typer.Option(help="Output domain size (default: MSE-optimal).")
    ] = None,
    spec_file: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="The mechanism from a spec file (e.g. coco privacy calibrate --spec-out) "
            "instead of --mechanism, --d, --s, --epsilon and --t.",
        ),
    ] = None,
    round_seconds: Annotated[
        int, typer.Option(help="Round length in seconds: devices report in floor(unix_time / it).")
    ] = DEFAULT_ROUND_SECONDS,
    batch_public_key: Annotated[
        str | None,
        typer.Option(
            envvar="COCO_BATCH_PUBLIC_KEY",
            help="The shuffler's batch key: 64 hex digits or a file (its signing.pub).",
        ),
    ] = None,
    shard_key: Annotated[
        list[str] | None,
        typer.Option(
            help="Sharded deployment: the batch key of each shard's shuffler (64 hex digits or "
            "its signing.pub), once per shard, in shard order."
        ),
    ] = None,
    shard_seed: Annotated[
        int, typer.Option(help="Seed of the device-to-shard assignment (a u32).")
    ] = 0,
    shards_from_round: Annotated[
        int | None,
        typer.Option(
            help="First round of the layout (default 0; with --reshard, the current round + "
            f"{RESHARD_LEAD_ROUNDS})."
        ),
    ] = None,
    reshard: Annotated[
        bool,
        typer.Option(
            help="Add the --shard-key layout to the announced one (next generation, from "
            "--shards-from-round on) instead of replacing it."
        ),
    ] = False,
    participation: Annotated[
        float | None,
        typer.Option(
            help="Probability q in (0, 1] with which a device reports in a round (default 1: "
            "every round; written only below 1)."
        ),
    ] = None,
    budget_per_period: Annotated[
        float | None,
        typer.Option(
            help="The deployment's device period policy: the local epsilon a device may "
            "spend per --period (at least one report's epsilon)."
        ),
    ] = None,
    period: Annotated[
        str | None,
        typer.Option(
            help="Length of a --budget-per-period's period: 1h, 1d, 7d ... (default 1d; a "
            "whole number of rounds; periods aligned on Unix time)."
        ),
    ] = None,
    broker: BrokerOption = DEFAULT_BROKER,
    mqtt_version: MqttVersionOption = DEFAULT_MQTT_VERSION,
    dry_run: Annotated[bool, typer.Option(help="Print the announcement, publish nothing.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the PUBACK.")] = 10.0,
    username: UsernameOption = None,
    password: PasswordOption = None,
    password_file: PasswordFileOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """Publish the retained spec announcement of a deployment (or print it)."""
    try:
        password_value = resolve_password(password, password_file)
        version = check_mqtt_version(mqtt_version)
        spec = _mechanism(spec_file, mechanism, d, s, epsilon, t)
        if shard_key and batch_public_key is not None:
            raise ValueError("a sharded deployment has --shard-key, not --batch-public-key")
        current = None
        if reshard:
            current = _current(
                broker, deployment, timeout, username, password_value, ca_file, version
            )
        plan = _shards(
            shard_key,
            shard_seed,
            shards_from_round,
            reshard=reshard,
            current=current,
            round_seconds=round_seconds,
        )
        q, announced_period = _policy(participation, budget_per_period, period, current)
        payload = encode_announcement(
            spec.to_dict(),
            min_batch=min_batch,
            delta=delta,
            round_seconds=round_seconds,
            batch_public_key=read_public_key(batch_public_key),
            shards=plan,
            participation=q,
            period=announced_period,
        )
        topic = spec_topic(deployment)
        if not dry_run:
            publish_retained(
                broker,
                topic,
                payload,
                timeout=timeout,
                username=username,
                password=password_value,
                ca_file=ca_file,
                mqtt_version=version,
            )
    except (CocoError, ValueError, OSError, TimeoutError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps({"topic": topic, **json.loads(payload)}, indent=1))
