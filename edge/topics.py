"""MQTT topic layout of protocol v1 (docs/protocol.md, "Transport").

::

    coco/v1/<deployment>/spec                 retained JSON spec announcement (QoS 1)
    coco/v1/<deployment>/ingress/<device-id>  one 16-byte report per message (QoS 1)
    coco/v1/<deployment>/batches              shuffled batches (QoS 1)
    coco/v1/<deployment>/aggregator/lease     retained claim of the one aggregator

Deployment and device names are single topic levels: non-empty, no ``/``, ``+``, ``#`` or
NUL, at most 64 characters. Device ids appear only in ingress topics, which only the
shuffler reads.
"""

from __future__ import annotations

from edge.errors import SpecError

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


def ingress_topic(deployment: str, device_id: str) -> str:
    device = check_name("device", device_id)
    return f"{PROTOCOL}/{check_name('deployment', deployment)}/ingress/{device}"


def ingress_filter(deployment: str) -> str:
    """Subscription filter of the shuffler: every device's ingress topic."""
    return f"{PROTOCOL}/{check_name('deployment', deployment)}/ingress/+"


def batches_topic(deployment: str) -> str:
    return f"{PROTOCOL}/{check_name('deployment', deployment)}/batches"


def lease_topic(deployment: str) -> str:
    """The aggregator's retained lease (one writer per deployment)."""
    return f"{PROTOCOL}/{check_name('deployment', deployment)}/aggregator/lease"
