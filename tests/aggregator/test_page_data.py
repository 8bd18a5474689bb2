"""The live page's data (aggregator/page/page_data.py): channels in physical units, the privacy
history's bound, and what is refused."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from aggregator.page.page_data import (
    MAX_POINTS,
    Channel,
    PrivacyHistory,
    channel_estimates,
    channels_from_json,
    check_channels,
)
from edge.encoders import SensorEncoder
from sim.demo.pipeline import sensor_channels
from sim.models.sensors import channel_table


def test_channel_estimates_are_the_encoders_decoding() -> None:
    channels = sensor_channels(6)
    assert [c.name for c in channels] == [c.name for c in channel_table(6)]
    mean = [0.1, -0.05, 0.0, 0.2, -0.3, 0.01]
    se = [0.01, 0.02, 0.01, 0.03, 0.02, 0.01]
    rows = channel_estimates(channels, s=2, n=1000, mean=mean, mean_se=se, confidence=0.95)
    encoder = SensorEncoder(lo=tuple(c.lo for c in channels), hi=tuple(c.hi for c in channels), s=2)
    value, value_se = encoder.decode_mean(np.array(mean), np.array(se), n=1000)
    for j, row in enumerate(rows):
        assert row["name"] == channels[j].name
        assert row["unit"] == channels[j].unit
        assert row["value"] == pytest.approx(value[j], rel=1e-15)
        half = (row["value_hi"] - row["value_lo"]) / 2
        assert half == pytest.approx(1.959963984540054 * value_se[j], rel=1e-12)
    assert rows[0]["unit"] == "degC"
    # temperature: centre 15 degC, half-range 35, scale d/s = 3 -> 15 + 35 * 0.3
    assert rows[0]["value"] == pytest.approx(25.5)


def test_no_estimate_before_the_first_report() -> None:
    channels = sensor_channels(3)
    rows = channel_estimates(
        channels, s=1, n=0, mean=[None] * 3, mean_se=[None] * 3, confidence=0.95
    )
    assert all(r["value"] is None and r["value_lo"] is None for r in rows)
    json.dumps(rows, allow_nan=False)  # JSON without NaN


@pytest.mark.parametrize(
    ("name", "unit", "lo", "hi", "message"),
    [
        ("", "C", 0.0, 1.0, "name must have 1 to 32"),
        ("x" * 33, "C", 0.0, 1.0, "name must have 1 to 32"),
        ("temp", "u" * 17, 0.0, 1.0, "unit must have 1 to 16"),
        ("temp\n", "C", 0.0, 1.0, "printable ASCII"),
        ("temp", "C", 1.0, 1.0, "is empty"),
        ("temp", "C", 0.0, math.inf, "is empty"),
    ],
)
def test_a_bad_channel_is_refused(name: str, unit: str, lo: float, hi: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Channel(name, unit, lo, hi)


def test_channels_must_describe_every_dimension_once() -> None:
    channels = sensor_channels(4)
    assert check_channels(channels, d=4, s=2) == channels
    with pytest.raises(ValueError, match="one channel per dimension"):
        check_channels(channels, d=5, s=2)
    with pytest.raises(ValueError, match="distinct"):
        check_channels([*channels[:3], channels[0]], d=4, s=2)


def test_the_history_records_new_levels_only() -> None:
    history = PrivacyHistory()
    assert not history.record(1.0, batches=0, smallest=None, latest=None, total=None)
    assert history.record(2.0, batches=1, smallest=0.5, latest=0.5, total=0.5)
    assert not history.record(3.0, batches=1, smallest=0.5, latest=0.5, total=0.5)
    assert history.record(4.0, batches=2, smallest=0.6, latest=0.6, total=0.8)
    assert history.to_json() == {
        "columns": ["time", "batches_accounted", "smallest", "latest", "epsilon_total"],
        "points": [[2.0, 1, 0.5, 0.5, 0.5], [4.0, 2, 0.6, 0.6, 0.8]],
    }


def test_the_history_is_bounded_and_spans_the_whole_run() -> None:
    history = PrivacyHistory()
    for k in range(1, 10_001):
        history.record(float(k), batches=k, smallest=1.0, latest=1.0, total=math.sqrt(k))
        assert len(history.points) <= MAX_POINTS
    times = [p[0] for p in history.points]
    assert times[0] == 1.0  # the first level
    assert times[-1] == 10_000.0  # the newest
    assert times == sorted(times)
    assert len(history.points) > MAX_POINTS // 2
    assert len(json.dumps(history.to_json())) < 20_000  # bounded /estimates


def test_channels_from_json() -> None:
    data = [c.to_json() for c in sensor_channels(3)]
    assert channels_from_json(json.loads(json.dumps(data))) == sensor_channels(3)
    for bad, message in [
        ({}, "non-empty JSON list"),
        ([], "non-empty JSON list"),
        ([{"name": "t", "unit": "C", "lo": 0}], "channel 0: need exactly the keys"),
        ([{"name": "t", "unit": "C", "lo": 0, "hi": 1, "device": "x"}], "exactly the keys"),
        ([{"name": "t", "unit": "C", "lo": "0", "hi": 1}], "lo and hi must be numbers"),
        ([{"name": "t", "unit": "C", "lo": True, "hi": 1}], "lo and hi must be numbers"),
        ([{"name": "t", "unit": "C", "lo": 2, "hi": 1}], "is empty"),
    ]:
        with pytest.raises(ValueError, match=message):
            channels_from_json(bad)


def test_a_point_is_timed_when_its_data_came_not_when_it_was_computed() -> None:
    history = PrivacyHistory()
    history.ledger_changed(1, 10.0)  # batch of round 1 applied at t = 10
    history.ledger_changed(2, 12.0)
    history.ledger_changed(3, 14.0)
    # the accountant caught up at t = 30 with the level of generation 2, then of 3
    assert history.record(30.0, generation=2, batches=2, smallest=0.5, latest=0.5, total=0.7)
    assert history.record(31.0, generation=3, batches=3, smallest=0.5, latest=0.6, total=0.9)
    assert [p[0] for p in history.points] == [12.0, 14.0]
    # a level whose sizes changed since it was computed is not a point
    assert not history.record(32.0, generation=3, batches=3, smallest=None, latest=0.6, total=1)
    # a restored ledger's level, with no change seen: the time it is shown
    restored = PrivacyHistory()
    assert restored.record(5.0, generation=7, batches=4, smallest=0.4, latest=0.4, total=0.8)
    assert restored.points[0][0] == 5.0
