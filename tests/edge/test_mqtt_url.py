"""Broker URLs and lists of cluster nodes (edge/mqtt_url.py)."""

from __future__ import annotations

import pytest

from edge.mqtt_url import BrokerAddress, BrokerList, parse_broker_url, parse_broker_urls


def test_one_url() -> None:
    assert parse_broker_url("mqtt://h") == BrokerAddress("h", 1883, False)
    assert parse_broker_url("mqtts://h:1") == BrokerAddress("h", 1, True)
    assert parse_broker_urls("mqtt://h:2") == (BrokerAddress("h", 2, False),)
    for bad in ("http://h", "mqtt://", "mqtt://h:x", "mqtt://h/p", "mqtt://h,mqtt://g"):
        with pytest.raises(ValueError, match="broker"):
            parse_broker_url(bad)


def test_a_list_of_nodes_rotates_on_failure() -> None:
    nodes = BrokerList("mqtt://a:1, mqtt://b:2,mqtt://c:3")
    assert len(nodes) == 3
    assert nodes.current == BrokerAddress("a", 1, False)
    assert nodes.failed() == BrokerAddress("b", 2, False)
    assert nodes.failed() == BrokerAddress("c", 3, False)
    assert nodes.failed() == BrokerAddress("a", 1, False)
    assert not nodes.tls


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("mqtt://a:1,", "empty entry"),
        ("mqtt://a:1,mqtts://b:2", "mixes"),
        ("mqtt://a:1,mqtt://a:1", "twice"),
        ("mqtt://a:1,ftp://b", "broker must be"),
    ],
)
def test_bad_lists(value: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_broker_urls(value)
