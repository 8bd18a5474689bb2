"""MQTT topic layout of protocol v1 (docs/protocol.md, "Transport").

::

    coco/v1/<deployment>/spec                 retained JSON spec announcement (QoS 1)
    coco/v1/<deployment>/ingress/<device-id>  one 16-byte report per message (QoS 1)
    coco/v1/<deployment>/batches              shuffled batches (QoS 1)
    coco/v1/<deployment>/aggregator/lease     retained claim of the one aggregator
    coco/v1/<deployment>/manifests            signed per-release manifests (QoS 1)
    coco/v1/<deployment>/shards/-/lease       retained claim of the one (unsharded) shuffler

A sharded deployment (:mod:`edge.shards`) adds a shard label ``<L>`` (``g<generation>s<index>``)::

    coco/v1/<deployment>/ingress/<L>/<device-id>  a device's report of a round of shard L
    coco/v1/<deployment>/batches/<L>              shard L's batches
    coco/v1/<deployment>/manifests/<L>            shard L's manifests
    coco/v1/<deployment>/shards/<L>/lease         retained claim of shard L's one shuffler

Deployment and device names are single topic levels: non-empty, no ``/``, ``+``, ``#`` or
NUL, at most 64 characters. Device ids appear only in ingress topics, which only the
shuffler reads.
"""

from __future__ import annotations

from edge.errors import SpecError
from edge.shards import parse_label

PROTOCOL = "coco/v1"
MAX_NAME = 64


def check_name(kind: str, name: str) -> str:
    """Validate a deployment or device name used as one topic level."""
    if not name or len(name) > MAX_NAME or any(c in name for c in "/+#\x00"):
        raise SpecError(
            f"{kind} name must be 1-{MAX_NAME} characters without '/', '+', '#' or NUL, "
            f"got {name!r}"
        )
    return name


def spec_topic(deployment: str) -> str:
    return f"{PROTOCOL}/{check_name('deployment', deployment)}/spec"


def _base(deployment: str) -> str:
    return f"{PROTOCOL}/{check_name('deployment', deployment)}"


def _shard(label: str | None) -> str:
    if label is None:
        return ""
    parse_label(label)
    return f"/{label}"


def ingress_topic(deployment: str, device_id: str, shard: str | None = None) -> str:
    """A device's ingress topic; ``shard`` is its shard label in a sharded deployment."""
    device = check_name("device", device_id)
    return f"{_base(deployment)}/ingress{_shard(shard)}/{device}"


def ingress_filter(deployment: str, shard: str | None = None) -> str:
    """Subscription filter of a shuffler: every device's ingress topic (of ``shard``)."""
    return f"{_base(deployment)}/ingress{_shard(shard)}/+"


def batches_topic(deployment: str, shard: str | None = None) -> str:
    return f"{_base(deployment)}/batches{_shard(shard)}"


def batches_filter(deployment: str) -> str:
    """Every shard's batch topic (the aggregator of a sharded deployment)."""
    return f"{_base(deployment)}/batches/+"


def manifests_topic(deployment: str, shard: str | None = None) -> str:
    return f"{_base(deployment)}/manifests{_shard(shard)}"


def manifests_filter(deployment: str) -> str:
    """Every shard's manifest topic."""
    return f"{_base(deployment)}/manifests/+"


UNSHARDED = "-"
"""The shard level of an unsharded deployment's lease topic: never a label (``g<n>s<i>``),
and matched by the shuffler account's ``shards/+/lease`` like every shard's."""


def shard_lease_topic(deployment: str, shard: str | None) -> str:
    """The retained claim of the one shuffler that serves ``shard`` (``None``: the one
    shuffler of an unsharded deployment, on ``shards/-/lease``)."""
    level = f"/{UNSHARDED}" if shard is None else _shard(shard)
    return f"{_base(deployment)}/shards{level}/lease"


def shard_of_topic(deployment: str, topic: str, kind: str) -> str | None:
    """The shard label of ``topic`` if it is ``<base>/<kind>/<label>`` (``kind`` is
    ``batches`` or ``manifests``), ``""`` if it is the unsharded ``<base>/<kind>``, else
    ``None``."""
    prefix = f"{_base(deployment)}/{kind}"
    if topic == prefix:
        return ""
    if not topic.startswith(prefix + "/"):
        return None
    label = topic[len(prefix) + 1 :]
    try:
        parse_label(label)
    except SpecError:
        return None
    return label


def lease_topic(deployment: str) -> str:
    """The aggregator's retained lease (one writer per deployment)."""
    return f"{PROTOCOL}/{check_name('deployment', deployment)}/aggregator/lease"
