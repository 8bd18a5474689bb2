"""What the broker reads: a Mosquitto password file (any broker reading that format), and
the configuration of Mosquitto's dynamic-security plugin (accounts and the deployment's
roles), which the reference deployment uses because it refuses a forbidden SUBSCRIBE
outright. The passwords come from :mod:`sim.credentials.accounts`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable
from typing import Any

from edge.topics import (
    batches_topic,
    check_name,
    ingress_filter,
    ingress_topic,
    lease_topic,
    manifests_topic,
    shard_lease_topic,
    spec_topic,
)
from sim.credentials.accounts import SERVICE_ACCOUNTS

# -- Mosquitto password files ----------------------------------------------------------------

MOSQUITTO_PBKDF2_ID = 7
"""Mosquitto 2's hash id for PBKDF2-HMAC-SHA512 (``mosquitto_passwd -H sha512-pbkdf2``)."""
MOSQUITTO_SALT_BYTES = 12
MOSQUITTO_DEFAULT_ITERATIONS = 101
_SHA512_BYTES = 64


def _check_username(username: str) -> str:
    # A password-file line is `username:hash`, one per line; Mosquitto splits at the first ':'.
    if not username or any(c in username for c in ":\n\r\x00") or len(username.encode()) > 65535:
        raise ValueError(f"invalid MQTT username for a password file: {username!r}")
    return username


def mosquitto_password_line(
    username: str,
    password: str,
    *,
    salt: bytes | None = None,
    iterations: int = MOSQUITTO_DEFAULT_ITERATIONS,
) -> str:
    """One line of a Mosquitto 2 password file, as ``mosquitto_passwd`` writes it:
    ``username:$7$<iterations>$<base64 salt>$<base64 PBKDF2-HMAC-SHA512>`` (no newline).

    ``salt`` defaults to 12 random bytes (Mosquitto's length); the hash is the 64-byte
    PBKDF2-HMAC-SHA512 of the UTF-8 password under the raw salt bytes.
    """
    _check_username(username)
    salt, digest = _pbkdf2_sha512(password, salt, iterations)
    return (
        f"{username}:${MOSQUITTO_PBKDF2_ID}${iterations}$"
        f"{base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"
    )


def _pbkdf2_sha512(password: str, salt: bytes | None, iterations: int) -> tuple[bytes, bytes]:
    """(salt, 64-byte PBKDF2-HMAC-SHA512 of the UTF-8 password): Mosquitto's password hash,
    in its password files and in the dynamic-security plugin alike. ``salt`` defaults to 12
    random bytes, Mosquitto's own length."""
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if salt is None:
        salt = secrets.token_bytes(MOSQUITTO_SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, _SHA512_BYTES)
    return salt, digest


def verify_mosquitto_password_line(line: str, password: str) -> bool:
    """Whether ``password`` matches a ``$7$`` (PBKDF2-HMAC-SHA512) password-file line."""
    _, _, hashed = line.strip().partition(":")
    parts = hashed.split("$")
    if len(parts) != 5 or parts[0] or parts[1] != str(MOSQUITTO_PBKDF2_ID):
        raise ValueError("not a Mosquitto PBKDF2-HMAC-SHA512 ($7$) password line")
    iterations, salt, expected = int(parts[2]), base64.b64decode(parts[3]), parts[4]
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, _SHA512_BYTES)
    return hmac.compare_digest(base64.b64encode(digest).decode(), expected)


def mosquitto_password_file(
    accounts: Iterable[tuple[str, str]], *, iterations: int = MOSQUITTO_DEFAULT_ITERATIONS
) -> str:
    """A whole password file for ``(username, password)`` pairs; duplicate names refused."""
    lines: list[str] = []
    seen: set[str] = set()
    for username, password in accounts:
        if username in seen:
            raise ValueError(f"duplicate MQTT username {username!r}")
        seen.add(username)
        lines.append(mosquitto_password_line(username, password, iterations=iterations))
    return "".join(line + "\n" for line in lines)


# -- Mosquitto's dynamic-security plugin ----------------------------------------------------
#
# Why this plugin and not `acl_file`: Mosquitto 2.0's ACL file is never consulted for a
# SUBSCRIBE (it filters each delivery instead), so a device subscribing to every report is
# granted the subscription and then receives nothing. The plugin checks subscriptions, and
# a forbidden one is answered SUBACK 0x87 (Not authorized). Its ACL topics take no `%u`
# substitution before Mosquitto 2.1, so each device gets a role of its own naming its own
# ingress topic (tests/deploy/test_acl.py, docs/deployment.md).

DEVICE_ROLE = "device"
"""The role every device shares: read the deployment's spec."""

_SUBSTITUTED_LEVELS = ("%c", "%u")
_BOUND_SERVICES = frozenset({"announcer"})
"""Service accounts bound to their name as client id, like devices."""
_RESERVED_CLIENT_IDS = frozenset(
    name + suffix for name in SERVICE_ACCOUNTS for suffix in ("", "-out")
)
"""Client ids of the services (a service's id is its account name; the shuffler's
publishing connection adds ``-out``): no device may be named after one."""

DYNSEC_DEFAULT_ACL_ACCESS = {
    "publishClientSend": False,
    "publishClientReceive": False,
    "subscribe": False,
    # Dropping a subscription grants nothing; the shuffler unsubscribes when it drains.
    "unsubscribe": True,
}
"""What the plugin allows when no role of the client has a matching ACL."""


def sharded_ingress_filter(deployment: str, device: str) -> str:
    """``coco/v1/<deployment>/ingress/+/<device>``: a device's ingress topic in any shard."""
    return (
        ingress_topic(deployment, device).rsplit("/", 1)[0] + "/+/" + check_name("device", device)
    )


def device_role(device: str) -> str:
    """The role of ``device`` alone: publish to its own ingress topic."""
    return f"device:{device}"


def dynsec_password(
    password: str, *, salt: bytes | None = None, iterations: int = MOSQUITTO_DEFAULT_ITERATIONS
) -> dict[str, Any]:
    """The ``password``, ``salt`` and ``iterations`` fields of a dynamic-security client, as
    the plugin stores them: base64 PBKDF2-HMAC-SHA512 of the UTF-8 password under the raw
    salt bytes, base64 salt (12 random bytes unless given), iteration count."""
    salt, digest = _pbkdf2_sha512(password, salt, iterations)
    return {
        "password": base64.b64encode(digest).decode(),
        "salt": base64.b64encode(salt).decode(),
        "iterations": iterations,
    }


def _allow(acltype: str, topic: str) -> dict[str, Any]:
    return {"acltype": acltype, "topic": topic, "allow": True}


def _read(topic: str) -> list[dict[str, Any]]:
    # Subscribing to exactly this filter, and receiving messages on the topics it matches.
    return [_allow("subscribeLiteral", topic), _allow("publishClientReceive", topic)]


def service_roles(deployment: str) -> dict[str, list[dict[str, Any]]]:
    """The ACLs of each service account of ``deployment`` (docs/deployment.md says why).

    Each grant covers the unsharded topic and, one level down, every shard's (a sharded
    deployment's shard label: docs/protocol.md, section 13)."""
    spec, batches = spec_topic(deployment), batches_topic(deployment)
    manifests, lease = manifests_topic(deployment), lease_topic(deployment)
    shard_leases = shard_lease_topic(deployment, "g0s0").replace("/g0s0/", "/+/")
    return {
        # The only account that sees who sent what; it releases only shuffled batches.
        "shuffler": [
            *_read(ingress_filter(deployment)),
            *_read(ingress_filter(deployment).replace("/+", "/+/+")),
            _allow("publishClientSend", batches),
            _allow("publishClientSend", batches + "/+"),
            _allow("publishClientSend", manifests),
            _allow("publishClientSend", manifests + "/+"),
            *_read(spec),
            # Each shard's lease (shards/<L>/lease, an unsharded one's shards/-/lease), by
            # pattern: a literal grant of shards/+/lease would refuse SUBSCRIBE to each one.
            _allow("subscribePattern", shard_leases),
            _allow("publishClientReceive", shard_leases),
            _allow("publishClientSend", shard_leases),
        ],
        # Never an ingress topic: the aggregator must not see a sender. Its lease (the
        # retained claim that keeps a second aggregator from double counting) is its own.
        "aggregator": [
            *_read(batches),
            *_read(batches + "/+"),
            *_read(manifests),
            *_read(manifests + "/+"),
            *_read(spec),
            *_read(lease),
            _allow("publishClientSend", lease),
        ],
        # The only account that may set the retained spec, the deployment's privacy level.
        "announcer": [_allow("publishClientSend", spec), *_read(spec)],
    }


def dynsec_config(
    deployment: str,
    devices: Iterable[tuple[str, str]],
    services: Iterable[tuple[str, str]],
    *,
    iterations: int = MOSQUITTO_DEFAULT_ITERATIONS,
) -> dict[str, Any]:
    """The dynamic-security plugin's whole configuration for ``(name, password)`` pairs of
    devices and service accounts: every account with its password hash and roles, every
    operation not granted by a role denied (unsubscribing aside), no administrator (the
    plugin's ``$CONTROL`` API is closed, so the broker never rewrites the file).

    A device may publish to ``coco/v1/<deployment>/ingress/<its name>`` (and to
    ``ingress/<any shard>/<its name>``) and read the spec, nothing else, and may connect
    only with its name as client id (the plugin's ``clientid``): no device can connect as
    another device or as a service. Duplicate names, unknown service accounts, device names
    that are a service's client id, and device names the plugin would substitute (``%c``,
    ``%u``: Mosquitto 2.1 replaces such a topic level by the client id or username, which
    would let a device pick its ingress topic)
    are refused.
    """
    roles_of_services = service_roles(deployment)
    roles: list[dict[str, Any]] = [{"rolename": DEVICE_ROLE, "acls": _read(spec_topic(deployment))}]
    clients: list[dict[str, Any]] = []
    seen: set[str] = set()

    def client(name: str, password: str, rolenames: list[str], *, bound: bool) -> None:
        if name in seen:
            raise ValueError(f"duplicate MQTT username {name!r}")
        seen.add(name)
        clients.append(
            {
                "username": name,
                # A device connects only with its own name as client id, so it can take
                # neither another device's session nor a service's.
                **({"clientid": name} if bound else {}),
                "roles": [{"rolename": r} for r in rolenames],
                **dynsec_password(password, iterations=iterations),
            }
        )

    for name, password in services:
        if name not in roles_of_services:
            known = ", ".join(roles_of_services)
            raise ValueError(f"no role for service account {name!r} (known: {known})")
        # The announcer connects once, as itself; the shuffler (two connections) and the
        # aggregator (its session and a separate read of the spec) use several ids.
        client(name, password, [name], bound=name in _BOUND_SERVICES)
        roles.append({"rolename": name, "acls": roles_of_services[name]})
    for name, password in devices:
        if name in _SUBSTITUTED_LEVELS:
            raise ValueError(f"device name {name!r} is an ACL substitution pattern")
        if name in _RESERVED_CLIENT_IDS:
            raise ValueError(f"device name {name!r} is a service's client id")
        own = device_role(name)
        client(name, password, [DEVICE_ROLE, own], bound=True)
        roles.append(
            {
                "rolename": own,
                "acls": [
                    _allow("publishClientSend", ingress_topic(deployment, name)),
                    # any shard's level: the shuffler of a shard refuses a device not in it
                    _allow("publishClientSend", sharded_ingress_filter(deployment, name)),
                ],
            }
        )
    return {
        "defaultACLAccess": dict(DYNSEC_DEFAULT_ACL_ACCESS),
        "clients": clients,
        "groups": [],
        "roles": roles,
    }


def dynsec_config_text(config: dict[str, Any]) -> str:
    """The configuration as the plugin's JSON file (one ACL per line, for reviewing)."""
    return json.dumps(config, indent=1) + "\n"
