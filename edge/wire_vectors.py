"""Test vectors for the binary wire format (:mod:`edge.codec`): reports of version 1, batches
and manifests of both versions (version 2 ends with the round's ``round_seconds``; shufflers
write it, receivers still decode version 1). The file keeps its name, ``-v1``: the name is
that of the published set, whose every vector carries its own ``version``.

``python -m edge.wire_vectors > docs/wire-vectors-v1.json`` regenerates the published file;
the test suite checks that the file, this generator, hand-built ``struct.pack`` bytes, the
numpy fast path and the MicroPython port all agree.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

from edge import codec, topics
from edge.device import shard_index, xxh32
from edge.shards import shard_label
from edge.spec import MechanismSpec

_COCO = MechanismSpec(mechanism="coco", d=10, s=3, epsilon=0.6931471805599453, t=8)
_COLLISION = MechanismSpec(mechanism="collision", d=6, s=2, epsilon=0.6931471805599453, t=4)
_MAX_T_SPEC = MechanismSpec(mechanism="collision", d=1024, s=1, epsilon=1.0, t=65535)

# (fingerprint, round, seed, z): each field at 0 and at its maximum, a byte-order probe
# (distinct bytes in every position) and reports of real specs.
REPORT_CASES: list[tuple[int, int, int, int]] = [
    (0, 0, 0, 0),
    (codec.U32_MAX, codec.U32_MAX, codec.U32_MAX, codec.U16_MAX),
    (0x01020304, 0x05060708, 0x090A0B0C, 0x0D0E),
    (_COCO.fingerprint_int, 1, 0xC0FFEE, 6),
    (_COLLISION.fingerprint_int, 0x80000000, 0xFFFFFFFF, 0),
    (_MAX_T_SPEC.fingerprint_int, 7, 1, _MAX_T_SPEC.t - 1),
]

# (fingerprint, round, batch_id, seeds, zs, round_seconds): round_seconds 0 is version 1
BATCH_CASES: list[tuple[int, int, bytes, list[int], list[int], int]] = [
    (_COCO.fingerprint_int, 0, bytes(range(16)), [], [], 0),
    (
        _COLLISION.fingerprint_int,
        0xFFFFFFFF,
        hashlib.sha256(b"coco-fleet/wire-vectors/v1").digest()[:16],
        [0, codec.U32_MAX, 0xC0FFEE],
        [codec.U16_MAX, 0, 3],
        0,
    ),
    (
        _COCO.fingerprint_int,
        29401920,  # 2025-11-26T00:00:00Z in 60-s rounds
        hashlib.sha256(b"coco-fleet/wire-vectors/v2").digest()[:16],
        [0x01020304, 7],
        [5, 0],
        60,
    ),
    (_COLLISION.fingerprint_int, 20420, bytes(range(16, 32)), [], [], codec.MAX_ROUND_SECONDS),
]


# (fingerprint, round, release_id, [(batch_id, count), ...], [(round, round_seconds,
# count)], round_seconds): round_seconds 0 is version 1
MANIFEST_CASES: list[
    tuple[int, int, bytes, list[tuple[bytes, int]], list[tuple[int, int, int]], int]
] = [
    (_COCO.fingerprint_int, 0, bytes(16), [], [], 0),
    (
        _COLLISION.fingerprint_int,
        29401920,
        hashlib.sha256(b"coco-fleet/wire-vectors/v1/release").digest()[:16],
        [(bytes(range(16)), 1000), (bytes(range(16, 32)), 1001)],
        [(29401919, 60, 7), (29401920, 60, 1994)],  # 7 carried in from the round before
        0,
    ),
    (
        _COCO.fingerprint_int,
        7,
        bytes(range(100, 116)),
        [(bytes(range(32, 48)), codec.U32_MAX)],
        [(codec.U32_MAX, 0, 5), (7, 1, codec.U32_MAX - 5)],  # 5 of an unknown round
        0,
    ),
    (
        # the first 10-s round after a change from 60 s: 7 reports carried in from the last
        # 60-s round, which is the 10-s rounds' 176411514..176411519
        _COLLISION.fingerprint_int,
        176411520,
        hashlib.sha256(b"coco-fleet/wire-vectors/v2/release").digest()[:16],
        [(bytes(range(48, 64)), 1000)],
        [(29401919, 60, 7), (176411520, 10, 993)],
        10,
    ),
]

# (device id, layout seed, shard count, generation): the shard a device publishes to
SHARD_CASES: list[tuple[str, int, int, int]] = [
    ("dev-0001", 0, 1, 0),
    ("dev-0001", 0, 3, 0),
    ("sensor-000042", 0xC0FFEE, 3, 1),
    ("a", 0xFFFFFFFF, 256, 7),
    ("0123456789abcdef", 1, 2, 0),
    ("x" * 64, 0x9E3779B1, 5, 65535),
    ("capteur-é", 42, 4, 2),
    ("node-17", 3, 7, 0),
    ("node-18", 3, 7, 0),
    ("node-19", 3, 7, 0),
]


def batch_bytes(case: tuple[int, int, bytes, list[int], list[int], int]) -> bytes:
    return codec.encode_batch(*case[:5], round_seconds=case[5])


def manifest_bytes(
    case: tuple[int, int, bytes, list[tuple[bytes, int]], list[tuple[int, int, int]], int],
) -> bytes:
    return codec.encode_manifest(*case[:5], round_seconds=case[5])


def manifest_vectors() -> list[dict[str, Any]]:
    out = []
    for fingerprint, round_, release_id, entries, sources, length in MANIFEST_CASES:
        out.append(
            {
                "hex": manifest_bytes(
                    (fingerprint, round_, release_id, entries, sources, length)
                ).hex(),
                "version": codec.BATCH_VERSION if length else codec.VERSION,
                "kind": codec.KIND_MANIFEST,
                "fingerprint": fingerprint,
                "round": round_,
                "release_id": release_id.hex(),
                "batches": [{"batch_id": b.hex(), "count": c} for b, c in entries],
                "sources": [
                    {"round": r, "round_seconds": seconds, "count": c} for r, seconds, c in sources
                ],
                "round_seconds": length,
            }
        )
    return out


def shard_vectors() -> list[dict[str, Any]]:
    out = []
    for device, seed, count, generation in SHARD_CASES:
        index = shard_index(device.encode(), seed, count)
        label = shard_label(generation, index)
        out.append(
            {
                "device_id": device,
                "device_id_utf8_hex": device.encode().hex(),
                "seed": seed,
                "count": count,
                "generation": generation,
                "xxh32": xxh32(device.encode(), seed),
                "index": index,
                "label": label,
                "ingress_topic": topics.ingress_topic("lab", device, label),
            }
        )
    return out


def malformed_vectors() -> list[dict[str, str]]:
    """Messages each decoder must reject, with the reason (checked in the documented order)."""
    report = codec.encode_report(*REPORT_CASES[3])
    batch, manifest, batch2, manifest2 = (
        batch_bytes(BATCH_CASES[1]),
        manifest_bytes(MANIFEST_CASES[1]),
        batch_bytes(BATCH_CASES[2]),
        manifest_bytes(MANIFEST_CASES[3]),
    )
    zero = (0).to_bytes(4, "big")
    too_long = (codec.MAX_ROUND_SECONDS + 1).to_bytes(4, "big")
    cases = [
        ("report", b"", "bad_length"),
        ("report", b"\x01", "bad_length"),
        ("report", report[:-1], "bad_length"),
        ("report", report + b"\x00", "bad_length"),
        ("report", b"\x02" + report[1:], "bad_version"),
        ("report", b"\x00" + report[1:], "bad_version"),
        ("report", b"\x02\x01", "bad_version"),
        ("report", report[:1] + b"\x02" + report[2:], "bad_kind"),
        ("report", batch, "bad_kind"),
        ("batch", report, "bad_kind"),
        ("batch", b"", "bad_length"),
        ("batch", batch[: codec.BATCH_HEADER_SIZE - 1], "bad_length"),
        ("batch", b"\x07" + batch[1:], "bad_version"),
        ("batch", batch[:-1], "bad_count"),
        ("batch", batch + b"\x00" * codec.RECORD_SIZE, "bad_count"),
        ("batch", batch[: codec.BATCH_HEADER_SIZE], "bad_count"),
        ("batch", batch[:26] + b"\xff\xff\xff\xff" + batch[30:], "bad_count"),
        ("manifest", b"", "bad_length"),
        ("manifest", batch, "bad_kind"),
        ("manifest", manifest[: codec.MANIFEST_HEADER_SIZE - 1], "bad_length"),
        ("manifest", b"\x07" + manifest[1:], "bad_version"),
        ("manifest", manifest[:-1], "bad_count"),
        ("manifest", manifest + b"\x00" * codec.MANIFEST_SOURCE_SIZE, "bad_count"),
        ("manifest", manifest[:70], "bad_count"),  # cut before its sources
        ("manifest", manifest[:-4] + (1995).to_bytes(4, "big"), "bad_count"),  # 2002 != 2001
        ("batch", manifest, "bad_kind"),
        # version 2: the trailer's length, and round_seconds in [1, 86400]
        ("batch", batch2[:-4], "bad_count"),  # version 2 without its round_seconds
        ("batch", b"\x01" + batch2[1:], "bad_count"),  # version 1 with 4 bytes too many
        ("batch", batch2[:-4] + zero, "bad_field"),
        ("batch", batch2[:-4] + too_long, "bad_field"),
        ("batch", b"\x03" + batch2[1:], "bad_version"),
        ("manifest", manifest2[:-4], "bad_count"),
        ("manifest", manifest2[:-4] + zero, "bad_field"),
        # round_seconds is checked before the sources' sum: both wrong is bad_field
        ("manifest", manifest2[:-8] + (994).to_bytes(4, "big") + too_long, "bad_field"),
        ("manifest", manifest2[:-8] + (994).to_bytes(4, "big") + manifest2[-4:], "bad_count"),
    ]
    return [
        {"message": kind, "hex": payload.hex(), "reason": reason} for kind, payload, reason in cases
    ]


def report_vectors() -> list[dict[str, Any]]:
    out = []
    for fingerprint, round_, seed, z in REPORT_CASES:
        out.append(
            {
                "hex": codec.encode_report(fingerprint, round_, seed, z).hex(),
                "version": codec.VERSION,
                "kind": codec.KIND_REPORT,
                "fingerprint": fingerprint,
                "round": round_,
                "seed": seed,
                "z": z,
            }
        )
    return out


def batch_vectors() -> list[dict[str, Any]]:
    out = []
    for fingerprint, round_, batch_id, seeds, zs, length in BATCH_CASES:
        out.append(
            {
                "hex": batch_bytes((fingerprint, round_, batch_id, seeds, zs, length)).hex(),
                "version": codec.BATCH_VERSION if length else codec.VERSION,
                "kind": codec.KIND_BATCH,
                "fingerprint": fingerprint,
                "round": round_,
                "batch_id": batch_id.hex(),
                "count": len(seeds),
                "seeds": seeds,
                "zs": zs,
                "round_seconds": length,
            }
        )
    return out


def all_vectors() -> dict[str, Any]:
    return {
        "wire_version": codec.VERSION,
        "batch_version": codec.BATCH_VERSION,
        "trailer_size": codec.TRAILER_SIZE,
        "report_size": codec.REPORT_SIZE,
        "batch_header_size": codec.BATCH_HEADER_SIZE,
        "record_size": codec.RECORD_SIZE,
        "reports": report_vectors(),
        "batches": batch_vectors(),
        "manifest_header_size": codec.MANIFEST_HEADER_SIZE,
        "manifest_entry_size": codec.MANIFEST_ENTRY_SIZE,
        "manifests": manifest_vectors(),
        "shards": shard_vectors(),
        "malformed": malformed_vectors(),
    }


def main() -> None:
    json.dump(all_vectors(), sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
