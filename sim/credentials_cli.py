"""``coco credentials``: a Mosquitto password file for a fleet and its service accounts.

Every password is derived from one deployment secret (:mod:`sim.credentials`), so the
broker's password file, the services' password files and a device's provisioning all come
from the secret alone. Nothing secret is ever printed, except one password on request
(``--show-password``, for provisioning a device).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from edge import CocoError
from sim.credentials import (
    DEFAULT_PREFIX,
    MOSQUITTO_DEFAULT_ITERATIONS,
    SERVICE_ACCOUNTS,
    create_secret,
    device_id,
    device_password,
    mosquitto_password_file,
    read_secret,
    service_password,
    write_private_file,
)


def _parse_owner(owner: str) -> tuple[int, int]:
    uid, sep, gid = owner.partition(":")
    try:
        return int(uid), int(gid if sep else uid)
    except ValueError:
        raise ValueError(f"--passwd-owner must be UID or UID:GID, got {owner!r}") from None


def credentials(
    secret_file: Annotated[
        Path,
        typer.Option(
            envvar="COCO_CREDENTIALS_SECRET_FILE",
            help="The deployment secret every password is derived from.",
        ),
    ],
    devices: Annotated[
        int, typer.Option(help="Numbered devices <prefix>000000 ... (simulated fleets).")
    ] = 0,
    prefix: Annotated[str, typer.Option(help="Name prefix of the numbered devices.")] = (
        DEFAULT_PREFIX
    ),
    device: Annotated[
        list[str] | None, typer.Option(help="A named device (repeat); e.g. real hardware.")
    ] = None,
    service: Annotated[
        list[str] | None,
        typer.Option(help=f"A service account (repeat), e.g. {', '.join(SERVICE_ACCOUNTS)}."),
    ] = None,
    passwd_out: Annotated[
        Path | None, typer.Option(help="Write the broker's password file here.")
    ] = None,
    passwd_owner: Annotated[
        str | None,
        typer.Option(help="UID[:GID] owning the password file (the broker's user, e.g. 1883)."),
    ] = None,
    service_password_dir: Annotated[
        Path | None,
        typer.Option(help="Write each service's password to DIR/<service>/password."),
    ] = None,
    create_missing_secret: Annotated[
        bool,
        typer.Option(
            "--create-secret",
            help="Create a random secret if --secret-file does not exist (never overwrites).",
        ),
    ] = False,
    show_password: Annotated[
        str | None,
        typer.Option(
            help="Print this device's password (a service's if also given with --service)."
        ),
    ] = None,
    iterations: Annotated[
        int, typer.Option(help="PBKDF2 iterations of the password hashes.")
    ] = MOSQUITTO_DEFAULT_ITERATIONS,
) -> None:
    """Derive the MQTT credentials of a deployment from its secret and write the broker's
    password file (Mosquitto 2, PBKDF2-SHA512) and the services' password files."""
    try:
        if create_missing_secret and not secret_file.exists():
            secret = create_secret(secret_file)
            typer.echo(f"created a new deployment secret in {secret_file}", err=True)
        else:
            secret = read_secret(secret_file)
        services = list(service or [])
        if show_password is not None:
            derive = service_password if show_password in services else device_password
            typer.echo(derive(secret, show_password))
            return
        if passwd_out is None:
            raise ValueError("give --passwd-out (or --show-password NAME)")
        if devices < 0:
            raise ValueError(f"--devices must be >= 0, got {devices}")
        names = [device_id(i, prefix) for i in range(devices)] + list(device or [])
        accounts = [(name, device_password(secret, name)) for name in names]
        accounts += [(name, service_password(secret, name)) for name in services]
        owner = _parse_owner(passwd_owner) if passwd_owner is not None else None
        text = mosquitto_password_file(accounts, iterations=iterations)
        write_private_file(passwd_out, text, owner=owner)
        if service_password_dir is not None:
            for name in services:
                path = service_password_dir / name / "password"
                write_private_file(path, service_password(secret, name))
    except (CocoError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    summary = {
        "passwd": str(passwd_out),
        "devices": len(names),
        "services": services,
        "service_password_dir": None if service_password_dir is None else str(service_password_dir),
    }
    typer.echo(json.dumps(summary))
