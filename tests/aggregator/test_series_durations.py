"""Durations of the series' options: what parses, and a one-line refusal for the rest."""

from __future__ import annotations

import pytest

from aggregator.series.durations import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("15m", 900),
        ("1h", 3600),
        ("1.5h", 5400),
        ("7d", 604800),
        ("2w", 1209600),
        (" 1H ", 3600),
        (".5m", 30),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "0", "0s", "-1h", "1y", "1h30m", "nan", "inf", "1e3"])
def test_bad_durations_are_refused_in_one_line(text: str) -> None:
    with pytest.raises(ValueError, match="duration") as caught:
        parse_duration(text)
    assert "\n" not in str(caught.value)


def test_the_run_options_become_the_series_settings() -> None:
    from aggregator.service.cli import series_options  # noqa: PLC0415
    from edge.errors import CocoError  # noqa: PLC0415

    assert series_options("7d", "1h", "90d") == {
        "series_retention": 604800.0,
        "series_step": 3600,
        "series_coarse_retention": 7776000.0,
    }
    assert series_options("36h", "none", "0")["series_step"] is None
    for args, option in [
        (("7x", "1h", "0"), "--series-retention"),
        (("7d", "1.5s", "0"), "--series-step"),
        (("7d", "1h", "-3d"), "--series-coarse-retention"),
    ]:
        with pytest.raises(CocoError, match=option):
            series_options(*args)
