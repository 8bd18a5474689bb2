"""Command-line options shared by every service command (one declaration, one env var)."""

from __future__ import annotations

from typing import Annotated

import typer

BrokerOption = Annotated[
    str, typer.Option(envvar="COCO_BROKER", help="mqtt://host:port or mqtts://host:port.")
]
DeploymentOption = Annotated[
    str, typer.Option(envvar="COCO_DEPLOYMENT", help="Deployment name (one topic level).")
]
DEFAULT_BROKER = "mqtt://127.0.0.1:1883"
