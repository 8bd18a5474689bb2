"""The dependency-free device module: hash family, random integers, published vectors."""

from __future__ import annotations

import json
import random
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from edge import device, hashing, vectors

VECTORS = Path(__file__).resolve().parents[2] / "docs" / "vectors-v1.json"
U32 = st.integers(min_value=0, max_value=0xFFFFFFFF)


@given(key=U32, seed=U32)
def test_xxh32_matches_the_reference_implementation(key: int, seed: int) -> None:
    """An independent implementation (the xxhash C library) agrees bit for bit."""
    assert device.xxh32_u32(key, seed) == xxhash.xxh32_intdigest(struct.pack("<I", key), seed=seed)


def test_vectorised_hash_matches_scalar() -> None:
    rng = np.random.default_rng(0)
    seeds = rng.integers(0, 2**32, size=64, dtype=np.uint32)
    keys = np.concatenate([np.arange(200), [2**31, 2**32 - 1]])
    h = hashing.xxh32(seeds, hashing.key_terms(keys))
    for i, seed in enumerate(seeds):
        for j, key in enumerate(keys):
            assert int(h[i, j]) == device.xxh32_u32(int(key), int(seed))
    t, half = 13, 11
    buckets = hashing.fastrange(h, t)
    pairs = hashing.fastrange31(h, half)
    for i, seed in enumerate(seeds[:8]):
        for j, key in enumerate(keys):
            assert buckets[i, j] == device.collision_bucket(int(key), int(seed), t)
            assert pairs[i, j] == device.coco_hash(int(key), int(seed), half)[0]


@pytest.mark.parametrize(("n", "bits"), [(2, 32), (7, 32), (13, 32), (11, 31), (64, 31), (1, 31)])
def test_preimage_bounds_match_range_reduction(n: int, bits: int) -> None:
    rng = np.random.default_rng(n)
    h = rng.integers(0, 2**32, size=5000, dtype=np.uint32)
    x = h if bits == 32 else h & np.uint32(0x7FFFFFFF)
    reduced = (x.astype(np.uint64) * np.uint64(n)) >> np.uint64(bits)
    lo, width = hashing.preimage_bounds(np.arange(n), n, bits)
    for v in range(n):
        assert np.array_equal((x - lo[v]) < width[v], reduced == v)


def test_published_vectors_are_what_the_code_generates() -> None:
    assert json.loads(VECTORS.read_text()) == vectors.all_vectors()


def test_published_hash_vectors_match_the_reference_implementation() -> None:
    for case in json.loads(VECTORS.read_text())["hash"]:
        ref = xxhash.xxh32_intdigest(struct.pack("<I", case["key"]), seed=case["seed"])
        assert case["xxh32"] == ref
        assert case["collision_bucket_t13"] == (ref * 13) >> 32
        assert case["coco_h1_half11"] == ((ref & 0x7FFFFFFF) * 11) >> 31
        assert case["coco_h2"] == (1 if ref >> 31 else -1)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 100, 1000, 4097])
def test_randbelow_is_exactly_uniform(n: int) -> None:
    """Each k-bit pattern is accepted as itself if below n and rejected otherwise, so every
    value in [0, n) comes from exactly one pattern: uniform given uniform bits."""
    k = device._bits_for(n)
    assert (1 << (k - 1)) < n <= (1 << k)  # at least half the patterns are accepted
    outcomes: Counter[int | str] = Counter()
    for pattern in range(1 << k):
        served = iter([pattern, 0])  # after a rejection the next draw is 0
        value = device.randbelow(n, lambda _bits, it=served: next(it))  # type: ignore[misc]
        outcomes[value if pattern < n else "rejected"] += 1
        assert value == (pattern if pattern < n else 0)
    expected: Counter[int | str] = Counter(range(n))
    expected["rejected"] = (1 << k) - n
    assert outcomes == expected


def test_randbelow_draws_32_bit_chunks_most_significant_first() -> None:
    n = (1 << 40) + 3  # 41 bits: a 32-bit chunk, then 9 bits
    words = iter([0x1, 0x2])
    calls: list[int] = []

    def bits(k: int) -> int:
        calls.append(k)
        return next(words)

    assert device.randbelow(n, bits) == (1 << 9) | 2
    assert calls == [32, 9]
    assert device.randbelow(1, bits) == 0  # no randomness needed
    assert calls == [32, 9]
    with pytest.raises(ValueError, match="n >= 1"):
        device.randbelow(0, bits)


def test_nth_free_skips_used_values() -> None:
    rnd = random.Random(5)
    for _ in range(200):
        used = sorted(rnd.sample(range(30), rnd.randint(0, 10)))
        free = [v for v in range(40) if v not in used]
        q = rnd.randrange(20)
        assert device._nth_free(q, used) == free[q]


@pytest.mark.parametrize(
    ("keys", "signs", "message"),
    [
        ([0, 1], [1], "exactly s=2"),
        ([0, 9], [1, 1], "key 9 is outside"),
        ([3, 3], [1, 1], "appears twice"),
        ([0, 1], [1, 0], "must be \\+1 or -1"),
    ],
)
def test_check_sparse_names_the_problem(keys: list[int], signs: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        device.check_sparse(keys, signs, 5, 2)


def test_stream_is_the_documented_function() -> None:
    bits = device.xxh32_stream(2024)
    assert [bits(32) for _ in range(3)] == [device.xxh32_u32(i, 2024) for i in range(3)]
    assert bits(5) == device.xxh32_u32(3, 2024) >> 27


@pytest.mark.parametrize("randomise", [device.randomise_collision, device.randomise_coco])
def test_randomisers_refuse_inputs_that_would_change_omega(
    randomise: object,
) -> None:
    """A count other than s would change the normaliser, so the reference refuses it."""
    assert callable(randomise)
    bits = device.xxh32_stream(1)
    with pytest.raises(ValueError, match="exactly s=3"):
        randomise([1, 2], [1, 1], 10, 3, 8, 27660952, 5, bits)
    with pytest.raises(ValueError, match="appears twice"):
        randomise([1, 1, 2], [1, 1, 1], 10, 3, 8, 27660952, 5, bits)
    with pytest.raises(ValueError, match="outside"):
        randomise([1, 2, 10], [1, 1, 1], 10, 3, 8, 27660952, 5, bits)
    assert 0 <= randomise([1, 2, 9], [1, -1, 1], 10, 3, 8, 27660952, 5, bits) < 8
