"""The broker fixture itself: a real Mosquitto that delivers, stops and restarts."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.conftest import Broker


def pub_sub_roundtrip(broker: Broker) -> bytes:
    where = ["-h", "127.0.0.1", "-p", str(broker.port), "-t", "t/x"]
    sub = subprocess.Popen(["mosquitto_sub", *where, "-C", "1", "-W", "10"], stdout=subprocess.PIPE)
    for _ in range(50):
        subprocess.run(["mosquitto_pub", *where, "-m", "hello"], check=True)
        try:
            out, _ = sub.communicate(timeout=0.2)
            return out
        except subprocess.TimeoutExpired:
            continue
    sub.kill()
    raise AssertionError("no message delivered")


def test_broker_delivers_stops_and_restarts(mosquitto: Broker) -> None:
    assert pub_sub_roundtrip(mosquitto).strip() == b"hello"
    mosquitto.stop()
    address = ("127.0.0.1", mosquitto.port)
    with pytest.raises(ConnectionRefusedError), socket.create_connection(address, timeout=1):
        pass
    mosquitto.start()
    assert pub_sub_roundtrip(mosquitto).strip() == b"hello"
