"""``coco announce``: publish a deployment's retained spec announcement.

Devices, the shuffler and the aggregator all read the retained message on
``coco/v1/<deployment>/spec`` (docs/protocol.md, section 10.5), so one command fixes what the
whole deployment runs: the mechanism spec, the shuffler's ``min_batch`` and the accountant's
``delta``.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from edge import CocoError, MechanismSpec
from edge.announce import (
    DEFAULT_ROUND_SECONDS,
    encode_announcement,
    load_spec_file,
    read_public_key,
)
from edge.cli_options import (
    DEFAULT_BROKER,
    BrokerOption,
    CaFileOption,
    DeploymentOption,
    PasswordFileOption,
    PasswordOption,
    UsernameOption,
    resolve_password,
)
from edge.mqtt_url import parse_broker_url
from edge.topics import spec_topic

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
) -> None:
    """Publish ``payload`` retained with QoS 1 and wait for the broker's PUBACK."""
    import paho.mqtt.client as mqtt  # noqa: PLC0415
    from paho.mqtt.enums import CallbackAPIVersion  # noqa: PLC0415

    host, port, tls = parse_broker_url(url)
    # The client id is the account's name: the broker binds device accounts to their own.
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2, client_id=username or "", protocol=mqtt.MQTTv5
    )
    if username is not None:
        client.username_pw_set(username, password)
    if tls:
        client.tls_set(ca_certs=ca_file)
    # A refused CONNECT and a PUBACK with a failure reason code (MQTT 5: e.g. 0x87 Not
    # authorized when the ACL denies the spec topic) both mean nothing was announced.
    refused: list[str] = []

    def on_connect(_c: mqtt.Client, _u: object, _f: object, rc: ReasonCode, _p: object) -> None:
        if rc.is_failure:
            refused.append(f"connection refused: {rc}")

    def on_publish(_c: mqtt.Client, _u: object, _mid: int, rc: ReasonCode, _p: object) -> None:
        if rc.is_failure:
            refused.append(f"announcement refused: {rc}")

    client.on_connect = on_connect
    client.on_publish = on_publish
    try:
        client.connect(host, port, keepalive=30)
    except OSError as exc:
        raise CocoError(f"cannot connect to the broker at {url}: {exc}") from exc
    client.loop_start()
    try:
        info = client.publish(topic, payload, qos=1, retain=True)
        try:
            info.wait_for_publish(timeout=timeout)
        except RuntimeError as exc:  # the connection was refused or closed
            reason = refused[0] if refused else str(exc)
            raise CocoError(f"the broker at {url}: {reason}") from None
        if refused:
            raise CocoError(f"the broker at {url}: {refused[0]}")
        if not info.is_published():
            raise CocoError(f"the broker did not acknowledge the announcement within {timeout} s")
    finally:
        client.disconnect()
        client.loop_stop()


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


def announce(
    deployment: DeploymentOption,
    min_batch: Annotated[int, typer.Option(help="Smallest batch the shuffler may release.")],
    delta: Annotated[float, typer.Option(help="Target delta of the accountant.")],
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
        int, typer.Option(help="Round length: devices report in floor(unix_time / it).")
    ] = DEFAULT_ROUND_SECONDS,
    batch_public_key: Annotated[
        str | None,
        typer.Option(
            envvar="COCO_BATCH_PUBLIC_KEY",
            help="The shuffler's batch key: 64 hex digits or a file (its signing.pub).",
        ),
    ] = None,
    broker: BrokerOption = DEFAULT_BROKER,
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
        spec = _mechanism(spec_file, mechanism, d, s, epsilon, t)
        payload = encode_announcement(
            spec.to_dict(),
            min_batch=min_batch,
            delta=delta,
            round_seconds=round_seconds,
            batch_public_key=read_public_key(batch_public_key),
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
            )
    except (CocoError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps({"topic": topic, **json.loads(payload)}, indent=1))
