"""``coco credentials``: the broker's accounts for a fleet and its service accounts.

Every password is derived from one deployment secret (:mod:`sim.credentials`), so the
broker's configuration (Mosquitto's dynamic-security file, or a password file), the services'
password files and a device's provisioning all come from the secret alone. Nothing secret is
ever printed, except one password on request (``--show-password``, for provisioning a device).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from edge import CocoError
from edge.batch_auth import load_or_create_signing_key, public_key_hex
from sim.credentials.accounts import (
    DEFAULT_PREFIX,
    SERVICE_ACCOUNTS,
    create_secret,
    device_id,
    device_password,
    read_secret,
    service_password,
    write_private_file,
)
from sim.credentials.mosquitto import (
    MOSQUITTO_DEFAULT_ITERATIONS,
    dynsec_config,
    dynsec_config_text,
    mosquitto_password_file,
)


def _parse_owner(option: str, owner: str | None) -> tuple[int, int] | None:
    if owner is None:
        return None
    uid, sep, gid = owner.partition(":")
    try:
        return int(uid), int(gid if sep else uid)
    except ValueError:
        raise ValueError(f"{option} must be UID or UID:GID, got {owner!r}") from None


def _secret(path: Path, *, create: bool) -> bytes:
    if create and not path.exists():
        secret = create_secret(path)
        typer.echo(f"created a new deployment secret in {path}", err=True)
        return secret
    return read_secret(path)


def _write_service_passwords(directory: Path, secret: bytes, services: list[str]) -> None:
    for name in services:
        write_private_file(directory / name / "password", service_password(secret, name))


def _write_batch_key(directory: Path) -> None:
    key = load_or_create_signing_key(directory / "private" / "signing.key")
    public = directory / "public" / "signing.pub"
    public.parent.mkdir(parents=True, exist_ok=True)
    public.write_text(public_key_hex(key) + "\n")


def credentials(
    secret_file: Annotated[
        Path | None,
        typer.Option(
            envvar="COCO_CREDENTIALS_SECRET_FILE",
            help="The deployment secret every password is derived from.",
        ),
    ] = None,
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
    deployment: Annotated[
        str | None,
        typer.Option(
            envvar="COCO_DEPLOYMENT",
            help="Deployment name (one topic level) the roles of --dynsec-out grant topics of.",
        ),
    ] = None,
    dynsec_out: Annotated[
        Path | None,
        typer.Option(
            help="Write Mosquitto's dynamic-security plugin configuration here: accounts "
            "and roles (needs --deployment)."
        ),
    ] = None,
    dynsec_owner: Annotated[
        str | None,
        typer.Option(help="UID[:GID] owning the dynamic-security file (the broker's user)."),
    ] = None,
    passwd_out: Annotated[
        Path | None,
        typer.Option(help="Write a Mosquitto password file here (for an acl_file broker)."),
    ] = None,
    passwd_owner: Annotated[
        str | None,
        typer.Option(help="UID[:GID] owning the password file (the broker's user, e.g. 1883)."),
    ] = None,
    service_password_dir: Annotated[
        Path | None,
        typer.Option(help="Write each service's password to DIR/<service>/password."),
    ] = None,
    batch_key_dir: Annotated[
        Path | None,
        typer.Option(
            help="The shuffler's Ed25519 batch key: DIR/private/signing.key (created if "
            "absent, never overwritten) and DIR/public/signing.pub (announce and aggregator)."
        ),
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
    dynamic-security configuration and/or password file (Mosquitto 2, PBKDF2-SHA512) and
    the services' password files; and/or the shuffler's batch key (no secret needed)."""
    try:
        if secret_file is None or (
            batch_key_dir is not None and passwd_out is None and dynsec_out is None
        ):
            if batch_key_dir is None:
                raise ValueError("--secret-file is required (every password derives from it)")
            _write_batch_key(batch_key_dir)  # only the batch key: no secret involved
            typer.echo(json.dumps({"batch_key_dir": str(batch_key_dir)}))
            return
        secret = _secret(secret_file, create=create_missing_secret)
        services = list(service or [])
        if show_password is not None:
            derive = service_password if show_password in services else device_password
            typer.echo(derive(secret, show_password))
            return
        if passwd_out is None and dynsec_out is None:
            raise ValueError("give --dynsec-out and/or --passwd-out (or --show-password NAME)")
        if dynsec_out is not None and deployment is None:
            raise ValueError("--dynsec-out needs --deployment (the topics its roles grant)")
        if devices < 0:
            raise ValueError(f"--devices must be >= 0, got {devices}")
        names = [device_id(i, prefix) for i in range(devices)] + list(device or [])
        device_accounts = [(name, device_password(secret, name)) for name in names]
        service_accounts = [(name, service_password(secret, name)) for name in services]
        dynsec_file_owner = _parse_owner("--dynsec-owner", dynsec_owner)
        passwd_file_owner = _parse_owner("--passwd-owner", passwd_owner)
        # Everything is computed before anything is written: an error leaves no file behind.
        outputs: list[tuple[Path, str, tuple[int, int] | None]] = []
        if dynsec_out is not None and deployment is not None:
            config = dynsec_config(
                deployment, device_accounts, service_accounts, iterations=iterations
            )
            outputs.append((dynsec_out, dynsec_config_text(config), dynsec_file_owner))
        if passwd_out is not None:
            text = mosquitto_password_file(
                device_accounts + service_accounts, iterations=iterations
            )
            outputs.append((passwd_out, text, passwd_file_owner))
        for path, text, owner in outputs:
            write_private_file(path, text, owner=owner)
        if service_password_dir is not None:
            _write_service_passwords(service_password_dir, secret, services)
        if batch_key_dir is not None:
            _write_batch_key(batch_key_dir)
    except (CocoError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    summary = {
        "dynsec": None if dynsec_out is None else str(dynsec_out),
        "deployment": deployment,
        "passwd": None if passwd_out is None else str(passwd_out),
        "devices": len(names),
        "services": services,
        "service_password_dir": None if service_password_dir is None else str(service_password_dir),
        "batch_key_dir": None if batch_key_dir is None else str(batch_key_dir),
    }
    typer.echo(json.dumps(summary))
