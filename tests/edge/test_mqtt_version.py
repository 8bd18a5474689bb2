"""Negotiating the MQTT protocol version (edge/mqtt_version.py)."""

from __future__ import annotations

import pytest

from edge.mqtt_version import VersionChoice, check_mqtt_version, is_version_refusal


class _ReasonCode:
    def __init__(self, value: int) -> None:
        self.value = value


def test_refusal_codes() -> None:
    assert is_version_refusal(0x84)
    assert is_version_refusal(1)
    assert is_version_refusal(_ReasonCode(0x84))
    for other in (0, 0x80, 0x86, 0x87, 5, None, "0x84"):
        assert not is_version_refusal(other)


def test_auto_falls_back_once_and_stays() -> None:
    choice = VersionChoice("auto")
    assert choice.current == "5"
    assert choice.mqtt5
    assert choice.refused() is True
    assert str(choice.current) == "3.1.1"
    assert not choice.mqtt5
    assert choice.refused() is False  # 3.1.1 refused too: final
    assert choice.current == "3.1.1"


@pytest.mark.parametrize("requested", ["5", "3.1.1"])
def test_an_explicit_version_is_never_changed(requested: str) -> None:
    choice = VersionChoice(check_mqtt_version(requested), broker="mqtt://x:1")
    assert choice.current == requested
    assert choice.refused() is False
    assert choice.current == requested
    assert "mqtt://x:1" in choice.describe_refusal()


def test_unknown_versions_are_refused() -> None:
    for bad in ("4", "3", "v5", "", "AUTO"):
        with pytest.raises(ValueError, match="--mqtt-version"):
            check_mqtt_version(bad)
