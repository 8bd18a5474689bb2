"""Command-line options shared by every command (one declaration, one env var).

The MQTT credentials of every command (``coco device``, ``coco fleet``, ``coco shuffler``,
``coco aggregator``, ``coco announce``) use the ``COCO_MQTT_*`` variables. The names
``coco device`` used before (``COCO_USERNAME``, ``COCO_PASSWORD``, ``COCO_CA_FILE``) are
still read, with a deprecation warning (:func:`apply_deprecated_env`).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Annotated

import typer

from edge.defaults import check_delta

BrokerOption = Annotated[
    str, typer.Option(envvar="COCO_BROKER", help="mqtt://host:port or mqtts://host:port.")
]
DeploymentOption = Annotated[
    str, typer.Option(envvar="COCO_DEPLOYMENT", help="Deployment name (one topic level).")
]
DEFAULT_BROKER = "mqtt://127.0.0.1:1883"
SpecFileOption = Annotated[
    Path | None,
    typer.Option(
        "--spec",
        envvar="COCO_SPEC",
        help="Spec JSON (MechanismSpec.to_dict or a whole announcement); default: the "
        "retained announcement on coco/v1/<deployment>/spec.",
    ),
]

UsernameOption = Annotated[
    str | None, typer.Option(envvar="COCO_MQTT_USERNAME", help="MQTT username of this service.")
]
PasswordOption = Annotated[
    str | None,
    typer.Option(
        envvar="COCO_MQTT_PASSWORD",
        help="MQTT password (prefer --password-file: a command line is visible to others).",
    ),
]
PasswordFileOption = Annotated[
    Path | None,
    typer.Option(
        envvar="COCO_MQTT_PASSWORD_FILE",
        help="File holding the MQTT password (e.g. a container secret; whitespace stripped).",
    ),
]
MqttVersionOption = Annotated[
    str,
    typer.Option(
        "--mqtt-version",
        envvar="COCO_MQTT_VERSION",
        help="MQTT protocol: auto (MQTT 5, or 3.1.1 where the broker refuses 5), 5 or 3.1.1.",
    ),
]
DEFAULT_MQTT_VERSION = "auto"

CaFileOption = Annotated[
    str | None,
    typer.Option(envvar="COCO_MQTT_CA_FILE", help="CA bundle for mqtts:// (default: system)."),
]


MetricsHostOption = Annotated[
    str,
    typer.Option(
        envvar="COCO_METRICS_HOST",
        help="Address the HTTP endpoints listen on (0.0.0.0: every interface, e.g. in a "
        "container that Prometheus scrapes).",
    ),
]
"""``--metrics-host`` of every service, default :data:`edge.defaults.DEFAULT_METRICS_HOST`."""


def delta_option(value: float | None) -> float | None:
    """The callback of every ``--delta``: a value outside ``(0, 1)`` is a usage error
    (exit status 2, the same message from every command, before any work is done)."""
    if value is None:
        return None
    try:
        return check_delta(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


DEPRECATED_ENV = {
    "COCO_USERNAME": "COCO_MQTT_USERNAME",
    "COCO_PASSWORD": "COCO_MQTT_PASSWORD",
    "COCO_CA_FILE": "COCO_MQTT_CA_FILE",
}
"""Old environment variable -> its current name."""


def apply_deprecated_env(environ: MutableMapping[str, str]) -> list[str]:
    """Copy each deprecated variable that is set to its current name (unless that one is
    set too); returns one warning per variable used. The entry point calls it before the
    options are read."""
    warnings = []
    for old, new in DEPRECATED_ENV.items():
        if old in environ:
            if new not in environ:
                environ[new] = environ[old]
            warnings.append(f"warning: {old} is deprecated, use {new}")
    return warnings


def resolve_password(password: str | None, password_file: Path | None) -> str | None:
    """The MQTT password from ``--password`` or ``--password-file`` (not both).

    Raises ``ValueError`` for both given, or an unreadable or empty file.
    """
    if password_file is None:
        return password
    if password is not None:
        raise ValueError("give --password or --password-file, not both")
    try:
        text = password_file.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read --password-file {password_file}: {exc}") from exc
    if not text:
        raise ValueError(f"--password-file {password_file} is empty")
    return text


def check_output_file(path: Path, option: str, *, renamed: bool = False) -> None:
    """Refuse an output file that cannot be written, before any work is done.

    Its directory must exist and be writable (whenever the file is new, or ``renamed``: it
    is written to a temporary file renamed over it), and the file, if it exists, must be a
    regular file that can be written (unless ``renamed``); nothing is created. Raises
    ``ValueError`` naming ``option`` and ``path`` (the commands print it as one ``error:``
    line and exit 1).
    """
    parent = path.parent
    if not parent.is_dir():
        raise ValueError(f"{option} {path}: the directory {parent} does not exist")
    if path.is_dir():
        raise ValueError(f"{option} {path}: is a directory, not a file")
    if not renamed and path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{option} {path}: the file is not writable")
    if (renamed or not path.exists()) and not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: the directory {parent} is not writable")
