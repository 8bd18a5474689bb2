"""Encoders: sensor vectors and key-value data into s-sparse ternary vectors."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edge import InputError
from edge.encoders import KeyValueEncoder, SensorEncoder

K = 5.0  # standard errors allowed for one statistic; with a few dozen statistics per test
# the chance of a false failure is below 1e-5 (and the seeds are fixed).


def test_ternary_encoding_is_unbiased_with_scale_d_over_s() -> None:
    enc = SensorEncoder(lo=(0.0, -10.0, 900.0, 0.0), hi=(40.0, 10.0, 1100.0, 1.0), s=2)
    readings = np.array([[30.0, -5.0, 1000.0, 0.1]])
    v = enc.normalise(readings)[0]
    n = 200_000
    keys, signs = enc.encode_batch(np.repeat(readings, n, axis=0), np.random.default_rng(0))
    x = np.zeros(4)
    np.add.at(x, keys.ravel(), signs.ravel().astype(float))
    mean = x / n
    # E[x_j] = (s/d) v_j; each x_j is in {-1, 0, 1} with P(x_j != 0) = s/d.
    expected = enc.s / enc.d * v
    se = np.sqrt((enc.s / enc.d - expected**2) / n)
    assert np.all(np.abs(mean - expected) <= K * se)
    # Without a mechanism (aggregator SE 0) the decoded SE is the encoding's alone, exact
    # here because every report reads the same values, up to plugging in the estimated v
    # (within K SE of v, which moves the SE by well under 1%).
    decoded, decoded_se = enc.decode_mean(mean, np.zeros(4), n=n)
    half = (np.array(enc.hi) - np.array(enc.lo)) / 2
    assert np.allclose(decoded_se, enc.scale * half * se, rtol=0.01)
    assert np.all(np.abs(decoded - readings[0]) <= K * decoded_se)


def test_device_and_batch_encoders_have_the_same_law() -> None:
    enc = SensorEncoder(lo=(0.0,) * 6, hi=(1.0,) * 6, s=3)
    readings = [0.0, 0.2, 0.5, 0.7, 1.0, 0.9]
    rnd = random.Random(1)
    n = 40_000
    dev = np.zeros(6)
    for _ in range(n):
        keys, signs = enc.encode(readings, getrandbits=rnd.getrandbits)
        assert len(set(keys)) == 3
        for j, b in zip(keys, signs, strict=True):
            dev[j] += b
    bkeys, bsigns = enc.encode_batch(np.tile(readings, (n, 1)), np.random.default_rng(1))
    bat = np.zeros(6)
    np.add.at(bat, bkeys.ravel(), bsigns.ravel().astype(float))
    v = enc.normalise(np.array([readings]))[0]
    expected = 0.5 * v
    se = np.sqrt((0.5 - expected**2) / n)
    assert np.all(np.abs(dev / n - expected) <= K * se)
    assert np.all(np.abs(bat / n - expected) <= K * se)


@pytest.mark.parametrize(
    ("readings", "message"),
    [
        ([1.0, float("nan")], "channel 1: reading nan is not a finite number"),
        ([1.0, float("inf")], "channel 1: reading inf"),
        ([-0.5, 0.5], "channel 0: reading -0.5 is outside \\[0.0, 2.0\\]"),
        ([1.0, 5.0], "channel 1: reading 5.0 is outside"),
        ([1.0], "need one \\(lo, hi\\) range per channel"),
    ],
)
def test_invalid_readings_name_the_value(readings: list[float], message: str) -> None:
    enc = SensorEncoder(lo=(0.0, 0.0), hi=(2.0, 4.0), s=1)
    with pytest.raises(InputError, match=message):
        enc.encode(readings)
    if len(readings) == 2:
        with pytest.raises(InputError, match=message.replace("channel", "row 0, channel")):
            enc.encode_batch(np.array([readings]), np.random.default_rng(0))


def test_clip_accepts_out_of_range_readings() -> None:
    enc = SensorEncoder(lo=(0.0, 0.0), hi=(2.0, 4.0), s=2, clip=True)
    rnd = random.Random(2)
    for _ in range(50):
        keys, signs = enc.encode([-5.0, 9.0], getrandbits=rnd.getrandbits)
        assert dict(zip(keys, signs, strict=True)) == {0: -1, 1: 1}
    assert np.array_equal(enc.normalise(np.array([[-5.0, 9.0]])), [[-1.0, 1.0]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lo": (0.0,), "hi": (0.0,), "s": 1}, "channel 0: range \\[0.0, 0.0\\]"),
        ({"lo": (0.0,), "hi": (1.0, 2.0), "s": 1}, "as many lo as hi"),
        ({"lo": (0.0,), "hi": (1.0,), "s": 2}, "s must be in \\[1, d=1\\], got 2"),
    ],
)
def test_invalid_encoder_parameters(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        SensorEncoder(**kwargs)  # type: ignore[arg-type]


def test_key_value_padding_gives_exactly_s_keys() -> None:
    enc = KeyValueEncoder(d=10, s=4)
    rnd = random.Random(3)
    for pairs in [{}, {3: 0.5}, {1: -1.0, 2: 1.0, 9: 0.0}, {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4}]:
        for _ in range(20):
            keys, signs = enc.encode(pairs, getrandbits=rnd.getrandbits)
            assert len(keys) == 4
            assert len(set(keys)) == 4
            assert set(pairs) <= set(keys)
            assert all(10 <= k < 14 for k in keys if k not in pairs)
            assert set(signs) <= {-1, 1}
            assert all(k < enc.mechanism_d for k in keys)


def test_key_value_overflow_policy() -> None:
    pairs = dict.fromkeys(range(6), 0.0)
    rnd = random.Random(4)
    keys, _ = KeyValueEncoder(d=10, s=4).encode(pairs, getrandbits=rnd.getrandbits)
    assert len(keys) == 4
    assert set(keys) <= set(pairs)
    with pytest.raises(InputError, match="6 keys exceed s=4"):
        KeyValueEncoder(d=10, s=4, sample_overflow=False).encode(pairs)


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ({10: 0.0}, "key 10 is outside \\[0, 10\\)"),
        ({-1: 0.0}, "key -1 is outside"),
        ({2: 1.5}, "key 2: value 1.5 is not in \\[-1, 1\\]"),
        ({2: float("nan")}, "key 2: value nan"),
    ],
)
def test_key_value_errors_name_the_value(pairs: dict[int, float], message: str) -> None:
    with pytest.raises(InputError, match=message):
        KeyValueEncoder(d=10, s=4).encode(pairs)
