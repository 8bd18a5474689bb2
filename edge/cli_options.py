"""Command-line options shared by every service command (one declaration, one env var).

The MQTT credentials of the services (``coco shuffler``, ``coco aggregator``, ``coco announce``)
use ``COCO_MQTT_*`` variables; ``coco device`` keeps its own documented ``COCO_USERNAME``,
``COCO_PASSWORD`` and ``COCO_CA_FILE``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
CaFileOption = Annotated[
    str | None,
    typer.Option(envvar="COCO_MQTT_CA_FILE", help="CA bundle for mqtts:// (default: system)."),
]


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
