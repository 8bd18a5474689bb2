"""Free listening ports for the brokers that tests start (Mosquitto, NATS)."""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterator
from pathlib import Path


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port free for a listener now, chosen *below* the kernel's ephemeral range.

    Port 0 would hand out an ephemeral port, and the outgoing connections of a test (a fleet
    of thousands of MQTT clients, Prometheus scrapes) draw from that same range, so the
    port could be taken between this call and the listener's bind. Below the range only
    another listener can take it.
    """
    low = _ephemeral_range()[0]
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10_000, max(low, 10_001))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # everything below the range is busy: fall back
        sock.bind(("127.0.0.1", 0))
        fallback: int = sock.getsockname()[1]
        return fallback


@contextlib.contextmanager
def busy_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A port with a listener on ``host`` for the block (a "port in use" error's test)."""
    with socket.socket() as busy:
        busy.bind((host, 0))
        busy.listen()
        port: int = busy.getsockname()[1]
        yield port
