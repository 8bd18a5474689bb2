"""Test vectors for firmware, generated from :mod:`edge.device` (docs/protocol.md).

``python -m edge.vectors > docs/vectors-v1.json`` regenerates the published file; the test
suite checks that the file, this generator, an independent XXH32 implementation and the
MicroPython port all agree.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from edge import device
from edge.spec import MechanismSpec

HASH_CASES: list[tuple[int, int]] = [
    (0, 0),
    (1, 0),
    (0, 1),
    (2, 1),
    (3, 0xDEADBEEF),
    (255, 0x12345678),
    (1023, 0x9E3779B1),
    (4095, 0xFFFFFFFF),
    (0xFFFFFFFF, 0),
    (0xFFFFFFFF, 0xFFFFFFFF),
    (123456789, 987654321),
    (2**31, 2**31 - 1),
]

RANDOMISER_CASES: list[dict[str, Any]] = [
    {
        "mechanism": "coco",
        "d": 10,
        "s": 3,
        "epsilon": 0.6931471805599453,
        "t": 8,
        "keys": [2, 4, 8],
        "signs": [1, -1, -1],
    },
    {
        "mechanism": "coco",
        "d": 128,
        "s": 8,
        "epsilon": 0.5,
        "t": None,
        "keys": [0, 5, 17, 33, 64, 65, 100, 127],
        "signs": [1, -1, 1, 1, -1, -1, 1, -1],
    },
    {
        "mechanism": "collision",
        "d": 6,
        "s": 2,
        "epsilon": 0.6931471805599453,
        "t": 4,
        "keys": [2, 4],
        "signs": [1, -1],
    },
    {
        "mechanism": "collision",
        "d": 512,
        "s": 16,
        "epsilon": 1.0,
        "t": None,
        "keys": list(range(0, 512, 32)),
        "signs": [1, -1] * 8,
    },
]
SEEDS = [0, 1, 0xC0FFEE, 0xFFFFFFFF]
STREAM_SEED = 2024
DRAWS = 6


def hash_vectors() -> list[dict[str, int]]:
    """XXH32 of 4-byte little-endian keys, and both mechanisms' bucket functions."""
    out = []
    for key, seed in HASH_CASES:
        pair, h2_positive = device.coco_hash(key, seed, 11)
        out.append(
            {
                "key": key,
                "seed": seed,
                "xxh32": device.xxh32_u32(key, seed),
                "collision_bucket_t13": device.collision_bucket(key, seed, 13),
                "coco_h1_half11": pair,
                "coco_h2": 1 if h2_positive else -1,
            }
        )
    return out


def randomiser_vectors() -> list[dict[str, Any]]:
    """Reports drawn with the deterministic stream ``xxh32_stream(STREAM_SEED)``.

    For each case and seed, a fresh stream is started and ``DRAWS`` reports are drawn one
    after another from it (all with the same hash seed), so an implementation that follows
    the normative sampling steps reproduces ``z`` exactly.
    """
    out = []
    for case in RANDOMISER_CASES:
        spec = MechanismSpec(
            mechanism=case["mechanism"],
            d=case["d"],
            s=case["s"],
            epsilon=case["epsilon"],
            t=case["t"],
        )
        fn = device.randomise_coco if spec.mechanism == "coco" else device.randomise_collision
        for seed in SEEDS:
            bits = device.xxh32_stream(STREAM_SEED)
            z = [
                fn(
                    case["keys"],
                    case["signs"],
                    spec.d,
                    spec.s,
                    spec.t,
                    spec.exp_eps_weight,
                    seed,
                    bits,
                )
                for _ in range(DRAWS)
            ]
            out.append(
                {
                    "mechanism": spec.mechanism,
                    "d": spec.d,
                    "s": spec.s,
                    "t": spec.t,
                    "epsilon": spec.epsilon,
                    "exp_eps_weight": spec.exp_eps_weight,
                    "unit_weight": spec.unit_weight,
                    "fingerprint": spec.fingerprint,
                    "keys": case["keys"],
                    "signs": case["signs"],
                    "seed": seed,
                    "stream_seed": STREAM_SEED,
                    "z": z,
                }
            )
    return out


def stream_vectors() -> dict[str, Any]:
    bits = device.xxh32_stream(STREAM_SEED)
    return {"stream_seed": STREAM_SEED, "words": [bits(32) for _ in range(8)]}


def all_vectors() -> dict[str, Any]:
    return {
        "hash_version": device.HASH_VERSION,
        "weight_unit": device.WEIGHT_UNIT,
        "hash": hash_vectors(),
        "stream": stream_vectors(),
        "randomiser": randomiser_vectors(),
    }


def main() -> None:
    json.dump(all_vectors(), sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
