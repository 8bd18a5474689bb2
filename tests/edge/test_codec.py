"""The binary wire format (edge/codec.py), its numpy fast path and the spec announcement."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from aggregator.service.core import batch_codec
from edge import codec, wire_vectors
from edge.announce import PROTOCOL, decode_announcement, encode_announcement, load_spec_file
from edge.errors import SpecError
from edge.spec import MechanismSpec

VECTORS_PATH = Path(__file__).resolve().parents[2] / "docs" / "wire-vectors-v1.json"
VECTORS: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
U32 = st.integers(min_value=0, max_value=0xFFFFFFFF)
U16 = st.integers(min_value=0, max_value=0xFFFF)
BATCH_ID = st.binary(min_size=16, max_size=16)
RECORDS = st.lists(st.tuples(U32, U16), max_size=40)
BATCH_ID_0 = bytes(range(16))

Decoder = Callable[[bytes], object]
DECODERS: dict[str, list[Decoder]] = {
    "report": [codec.decode_report],
    "batch": [codec.decode_batch, batch_codec.decode_batch_arrays],
    "manifest": [codec.decode_manifest],
}


def packed_report(fingerprint: int, round_: int, seed: int, z: int) -> bytes:
    """Independent construction of a report with the struct module."""
    return struct.pack(">BBIIIH", 1, 1, fingerprint, round_, seed, z)


def packed_batch(
    fingerprint: int,
    round_: int,
    batch_id: bytes,
    seeds: list[int],
    zs: list[int],
    *,
    round_seconds: int = 0,
) -> bytes:
    """Independent construction of a batch with the struct module (version 2, ending with
    its ``round_seconds``, unless that is 0)."""
    version = 2 if round_seconds else 1
    header = struct.pack(">BBII16sI", version, 2, fingerprint, round_, batch_id, len(seeds))
    records = b"".join(struct.pack(">IH", s, z) for s, z in zip(seeds, zs, strict=True))
    return header + records + (struct.pack(">I", round_seconds) if round_seconds else b"")


def packed_manifest(
    fingerprint: int,
    round_: int,
    release_id: bytes,
    entries: list[tuple[bytes, int]],
    sources: list[tuple[int, int, int]],
    *,
    round_seconds: int = 0,
) -> bytes:
    """Independent construction of a manifest with the struct module (version 2 unless
    ``round_seconds`` is 0)."""
    version = 2 if round_seconds else 1
    header = struct.pack(">BBII16sI", version, 3, fingerprint, round_, release_id, len(entries))
    batches = b"".join(struct.pack(">16sI", b, c) for b, c in entries)
    rounds = b"".join(struct.pack(">III", r, length, c) for r, length, c in sources)
    trailer = struct.pack(">I", round_seconds) if round_seconds else b""
    return header + batches + struct.pack(">I", len(sources)) + rounds + trailer


def reason_of(decode: Decoder, payload: bytes) -> str | None:
    """``None`` if ``payload`` decodes, else the CodecError reason (any other error fails)."""
    try:
        decode(payload)
    except codec.CodecError as exc:
        reason: str = exc.reason
    else:
        return None
    assert reason in codec.REASONS
    return reason


# --- layout and published vectors ---------------------------------------------------------


def test_sizes() -> None:
    assert codec.REPORT_SIZE == struct.calcsize(">BBIIIH") == 16
    assert codec.BATCH_HEADER_SIZE == struct.calcsize(">BBII16sI") == 30
    assert struct.calcsize(">BBII16s") == codec.COUNT_OFFSET
    assert codec.RECORD_SIZE == struct.calcsize(">IH") == batch_codec.RECORD_DTYPE.itemsize
    assert (codec.VERSION, codec.KIND_REPORT, codec.KIND_BATCH) == (1, 1, 2)


def test_published_wire_vectors_are_what_the_code_generates() -> None:
    assert wire_vectors.all_vectors() == VECTORS


def test_published_vectors_cover_the_boundaries() -> None:
    reports = VECTORS["reports"]
    for field, maximum in [("fingerprint", 2**32 - 1), ("round", 2**32 - 1), ("z", 2**16 - 1)]:
        assert {0, maximum} <= {r[field] for r in reports}, field
    assert {0, 2**32 - 1} <= {r["seed"] for r in reports}
    assert [(b["count"], b["version"]) for b in VECTORS["batches"]] == [
        (0, 1),
        (3, 1),
        (2, 2),
        (0, 2),
    ]
    assert {b["round_seconds"] for b in VECTORS["batches"]} == {0, 60, codec.MAX_ROUND_SECONDS}
    assert {m["version"] for m in VECTORS["manifests"]} == {1, 2}
    assert {m["reason"] for m in VECTORS["malformed"]} == set(codec.REASONS)


@pytest.mark.parametrize("vector", VECTORS["reports"], ids=lambda v: v["hex"])
def test_report_vectors(vector: dict[str, Any]) -> None:
    payload = bytes.fromhex(vector["hex"])
    fields = (vector["fingerprint"], vector["round"], vector["seed"], vector["z"])
    assert payload == packed_report(*fields)
    assert codec.encode_report(*fields) == payload
    assert codec.decode_report(payload) == (vector["version"], *fields)
    assert (vector["version"], vector["kind"]) == (1, 1)


@pytest.mark.parametrize(
    "vector", VECTORS["batches"], ids=lambda v: f"v{v['version']}-count={v['count']}"
)
def test_batch_vectors(vector: dict[str, Any]) -> None:
    payload = bytes.fromhex(vector["hex"])
    batch_id = bytes.fromhex(vector["batch_id"])
    fields = (vector["fingerprint"], vector["round"], batch_id, vector["seeds"], vector["zs"])
    length = vector["round_seconds"]
    assert len(payload) == 30 + 6 * vector["count"] + (4 if length else 0)
    assert payload[0] == vector["version"] == (2 if length else 1)
    assert payload == packed_batch(*fields, round_seconds=length)
    assert codec.encode_batch(*fields, round_seconds=length) == payload
    assert codec.decode_batch(payload) == fields
    assert codec.round_seconds_of(payload) == length
    seeds = np.array(vector["seeds"], dtype=np.uint32)
    zs = np.array(vector["zs"], dtype=np.uint16)
    assert batch_codec.encode_batch_arrays(*fields[:3], seeds, zs, round_seconds=length) == payload
    fingerprint, round_, got_id, got_seeds, got_zs = batch_codec.decode_batch_arrays(payload)
    assert (fingerprint, round_, got_id) == fields[:3]
    np.testing.assert_array_equal(got_seeds, seeds)
    np.testing.assert_array_equal(got_zs, zs)


@pytest.mark.parametrize("vector", VECTORS["manifests"], ids=lambda v: v["hex"][:24])
def test_manifest_vectors(vector: dict[str, Any]) -> None:
    payload = bytes.fromhex(vector["hex"])
    entries = [(bytes.fromhex(b["batch_id"]), b["count"]) for b in vector["batches"]]
    sources = [(s["round"], s["round_seconds"], s["count"]) for s in vector["sources"]]
    release_id = bytes.fromhex(vector["release_id"])
    fields = (vector["fingerprint"], vector["round"], release_id, entries, sources)
    length = vector["round_seconds"]
    assert payload[0] == vector["version"] == (2 if length else 1)
    assert payload == packed_manifest(*fields, round_seconds=length)
    assert codec.encode_manifest(*fields, round_seconds=length) == payload
    assert codec.decode_manifest(payload) == fields
    assert codec.round_seconds_of(payload) == length


@given(
    U32,
    U32,
    BATCH_ID,
    st.lists(st.tuples(BATCH_ID, U16), max_size=20),
    st.tuples(U32, U32),
)
def test_manifest_round_trip(
    fingerprint: int,
    round_: int,
    release_id: bytes,
    entries: list[tuple[bytes, int]],
    source: tuple[int, int],
) -> None:
    total = sum(count for _, count in entries)
    # the same reports, attributed to one or two source rounds
    source_round, length = source
    sources = [(source_round, length, total // 3), (round_, length, total - total // 3)]
    payload = codec.encode_manifest(fingerprint, round_, release_id, entries, sources)
    assert payload == packed_manifest(fingerprint, round_, release_id, entries, sources)
    assert codec.decode_manifest(payload) == (fingerprint, round_, release_id, entries, sources)


def test_manifest_sources_must_add_up_to_the_batches() -> None:
    entries = [(bytes(16), 10)]
    with pytest.raises(codec.CodecError) as caught:
        codec.encode_manifest(1, 2, bytes(16), entries, [(2, 60, 9)])
    assert caught.value.reason == "bad_count"
    good = codec.encode_manifest(1, 2, bytes(16), entries, [(1, 60, 3), (2, 60, 7)])
    bad = good[:-4] + (8).to_bytes(4, "big")
    assert reason_of(codec.decode_manifest, bad) == "bad_count"


@given(payload=st.binary(max_size=120))
def test_random_bytes_decode_as_manifest_or_raise_codec_error(payload: bytes) -> None:
    assert reason_of(codec.decode_manifest, b"\x01\x03" + payload) in {
        None,
        "bad_length",
        "bad_count",
    }


def test_encode_manifest_rejects_bad_fields() -> None:
    cases: list[tuple[Any, ...]] = [
        (2**32, 0, bytes(16), [], []),
        (0, -1, bytes(16), [], []),
        (0, 0, bytes(15), [], []),
        (0, 0, bytes(16), [(bytes(15), 1)], [(0, 1, 1)]),
        (0, 0, bytes(16), [(bytes(16), 2**32)], [(0, 1, 2**32)]),
        (0, 0, bytes(16), [(bytes(16), True)], [(0, 1, 1)]),
        (0, 0, bytes(16), [(bytes(16), 1)], [(2**32, 1, 1)]),
        (0, 0, bytes(16), [(bytes(16), 1)], [(0, -1, 1)]),
    ]
    for args in cases:
        with pytest.raises(codec.CodecError) as caught:
            codec.encode_manifest(*args)
        assert caught.value.reason == "bad_field", args


def test_shard_vectors() -> None:
    import xxhash  # noqa: PLC0415

    from edge.device import shard_index  # noqa: PLC0415
    from edge.shards import shard_label  # noqa: PLC0415

    assert len({v["index"] for v in VECTORS["shards"]}) > 3
    for v in VECTORS["shards"]:
        data = bytes.fromhex(v["device_id_utf8_hex"])
        assert data == v["device_id"].encode()
        assert v["xxh32"] == xxhash.xxh32_intdigest(data, seed=v["seed"])
        assert (
            v["index"]
            == (v["xxh32"] * v["count"]) >> 32
            == shard_index(data, v["seed"], v["count"])
        )
        assert v["label"] == shard_label(v["generation"], v["index"])
        assert v["ingress_topic"] == f"coco/v1/lab/ingress/{v['label']}/{v['device_id']}"


@pytest.mark.parametrize("vector", VECTORS["malformed"], ids=lambda v: v["reason"])
def test_malformed_vectors(vector: dict[str, str]) -> None:
    payload = bytes.fromhex(vector["hex"])
    for decode in DECODERS[vector["message"]]:
        assert reason_of(decode, payload) == vector["reason"]


# --- round trips over all field ranges ----------------------------------------------------


@given(fingerprint=U32, round_=U32, seed=U32, z=U16)
@example(fingerprint=0, round_=0, seed=0, z=0)
@example(fingerprint=2**32 - 1, round_=2**32 - 1, seed=2**32 - 1, z=2**16 - 1)
def test_report_round_trip(fingerprint: int, round_: int, seed: int, z: int) -> None:
    payload = codec.encode_report(fingerprint, round_, seed, z)
    assert payload == packed_report(fingerprint, round_, seed, z)
    assert codec.decode_report(payload) == (1, fingerprint, round_, seed, z)


@given(fingerprint=U32, round_=U32, batch_id=BATCH_ID, records=RECORDS)
def test_batch_round_trip_and_fast_path(
    fingerprint: int, round_: int, batch_id: bytes, records: list[tuple[int, int]]
) -> None:
    seeds = [s for s, _ in records]
    zs = [z for _, z in records]
    payload = codec.encode_batch(fingerprint, round_, batch_id, seeds, zs)
    assert payload == packed_batch(fingerprint, round_, batch_id, seeds, zs)
    assert codec.decode_batch(payload) == (fingerprint, round_, batch_id, seeds, zs)
    fast = batch_codec.encode_batch_arrays(
        fingerprint, round_, batch_id, np.array(seeds, dtype=np.uint32), np.array(zs, np.uint16)
    )
    assert fast == payload
    # Other integer dtypes (e.g. int64 from a generator) encode to the same bytes.
    wide = np.array(seeds, dtype=np.int64), np.array(zs, dtype=np.int64)
    assert batch_codec.encode_batch_arrays(fingerprint, round_, batch_id, *wide) == payload
    got = batch_codec.decode_batch_arrays(payload)
    assert got[:3] == (fingerprint, round_, batch_id)
    assert (got[3].dtype, got[4].dtype) == (np.dtype(np.uint32), np.dtype(np.uint16))
    assert (got[3].tolist(), got[4].tolist()) == (seeds, zs)


def test_decoders_accept_bytearray_and_memoryview() -> None:
    report = bytes.fromhex(VECTORS["reports"][3]["hex"])
    batch = bytes.fromhex(VECTORS["batches"][1]["hex"])
    for wrap in (bytearray, memoryview):
        assert codec.decode_report(wrap(report)) == codec.decode_report(report)
        assert codec.decode_batch(wrap(batch)) == codec.decode_batch(batch)
        got = batch_codec.decode_batch_arrays(wrap(batch))
        assert got[3].tolist() == codec.decode_batch(batch)[3]


def test_fast_decoder_returns_independent_native_arrays() -> None:
    buffer = bytearray.fromhex(VECTORS["batches"][1]["hex"])
    _, _, _, seeds, zs = batch_codec.decode_batch_arrays(buffer)
    buffer[30:] = bytes(len(buffer) - 30)
    assert seeds.tolist() == VECTORS["batches"][1]["seeds"]
    assert zs.tolist() == VECTORS["batches"][1]["zs"]
    for array in (seeds, zs):
        assert array.dtype.isnative
        assert array.flags.writeable


# --- malformed input: CodecError with a reason, never anything else -----------------------


@given(payload=st.binary(max_size=80))
def test_random_bytes_decode_or_raise_codec_error(payload: bytes) -> None:
    assert reason_of(codec.decode_report, payload) in {
        None,
        "bad_length",
        "bad_version",
        "bad_kind",
    }
    pure = reason_of(codec.decode_batch, payload)
    assert reason_of(batch_codec.decode_batch_arrays, payload) == pure


@given(
    prefix=st.sampled_from([b"\x01\x01", b"\x01\x02", b"\x01\x02" + bytes(24)]),
    tail=st.binary(max_size=80),
    count=st.one_of(st.integers(0, 12), U32),
)
def test_well_prefixed_bytes_decode_to_canonical_messages_or_raise(
    prefix: bytes, tail: bytes, count: int
) -> None:
    """Reaches the length and count checks; whatever decodes re-encodes to the same bytes."""
    payload = prefix + tail
    if len(prefix) == 26:
        payload = prefix + struct.pack(">I", count) + tail
    report_reason = reason_of(codec.decode_report, payload)
    if prefix == b"\x01\x01":
        assert report_reason == (None if len(payload) == 16 else "bad_length")
    if report_reason is None:
        assert codec.encode_report(*codec.decode_report(payload)[1:]) == payload
    batch_reason = reason_of(codec.decode_batch, payload)
    assert reason_of(batch_codec.decode_batch_arrays, payload) == batch_reason
    if batch_reason is None:
        assert codec.encode_batch(*codec.decode_batch(payload)) == payload
    elif prefix != b"\x01\x01":
        declared = 30 + 6 * int.from_bytes(payload[26:30], "big")
        want = "bad_length" if len(payload) < 30 else "bad_count"
        assert (batch_reason, len(payload) != declared) == (want, True)


def test_reasons_in_check_order() -> None:
    """Version and kind are judged before the length, so a mis-sent message is named."""
    batch = bytes.fromhex(VECTORS["batches"][1]["hex"])
    report = bytes.fromhex(VECTORS["reports"][3]["hex"])
    assert reason_of(codec.decode_report, b"\x02") == "bad_length"
    assert reason_of(codec.decode_report, b"\x02\x01" + bytes(40)) == "bad_version"
    assert reason_of(codec.decode_report, batch) == "bad_kind"
    assert reason_of(codec.decode_batch, report) == "bad_kind"
    assert reason_of(codec.decode_batch, b"\x01\x02" + bytes(27)) == "bad_length"
    huge = batch[:26] + b"\xff\xff\xff\xff" + batch[30:]
    assert reason_of(codec.decode_batch, huge) == "bad_count"
    assert reason_of(batch_codec.decode_batch_arrays, huge) == "bad_count"


def test_codec_error_is_a_value_error_with_a_message() -> None:
    with pytest.raises(ValueError, match="a report is 16 bytes, got 15") as info:
        codec.decode_report(bytes(15).replace(b"\x00\x00", b"\x01\x01", 1))
    assert isinstance(info.value, codec.CodecError)
    assert info.value.reason == "bad_length"


BAD_VALUES: list[tuple[object, str]] = [
    (-1, "negative"),
    (True, "bool"),
    (1.0, "float"),
    (None, "None"),
    ("1", "str"),
    (np.uint32(1), "numpy scalar"),
]


def _report_fields(position: int, value: object) -> list[Any]:
    fields: list[Any] = [1, 2, 3, 4]
    fields[position] = value
    return fields


@pytest.mark.parametrize(
    ("position", "maximum"), [(0, 2**32 - 1), (1, 2**32 - 1), (2, 2**32 - 1), (3, 2**16 - 1)]
)
def test_encode_report_rejects_fields_out_of_range(position: int, maximum: int) -> None:
    assert codec.encode_report(*_report_fields(position, maximum))
    for value in [maximum + 1, 2**64, *(v for v, _ in BAD_VALUES)]:
        with pytest.raises(codec.CodecError) as info:
            codec.encode_report(*_report_fields(position, value))
        assert info.value.reason == "bad_field", value


def _encoders() -> list[Callable[..., bytes]]:
    return [codec.encode_batch, batch_codec.encode_batch_arrays]


BAD_BATCHES: list[tuple[str, tuple[Any, ...], str]] = [
    ("fingerprint 2^32", (2**32, 0, BATCH_ID_0, [1], [1]), "bad_field"),
    ("fingerprint -1", (-1, 0, BATCH_ID_0, [1], [1]), "bad_field"),
    ("round bool", (0, True, BATCH_ID_0, [1], [1]), "bad_field"),
    ("round 2^32", (0, 2**32, BATCH_ID_0, [1], [1]), "bad_field"),
    ("batch_id 15 bytes", (0, 0, bytes(15), [1], [1]), "bad_field"),
    ("batch_id 17 bytes", (0, 0, bytes(17), [1], [1]), "bad_field"),
    ("batch_id str", (0, 0, "0" * 16, [1], [1]), "bad_field"),
    ("seed 2^32", (0, 0, BATCH_ID_0, [1, 2**32], [1, 1]), "bad_field"),
    ("seed -1", (0, 0, BATCH_ID_0, [-1], [1]), "bad_field"),
    ("seed float", (0, 0, BATCH_ID_0, [1.0], [1]), "bad_field"),
    ("z 2^16", (0, 0, BATCH_ID_0, [1], [2**16]), "bad_field"),
    ("z -1", (0, 0, BATCH_ID_0, [1], [-1]), "bad_field"),
    ("more seeds than z", (0, 0, BATCH_ID_0, [1, 2], [1]), "bad_count"),
    ("more z than seeds", (0, 0, BATCH_ID_0, [], [1]), "bad_count"),
]


@pytest.mark.parametrize(("case", "args", "reason"), BAD_BATCHES, ids=[c[0] for c in BAD_BATCHES])
def test_encode_batch_rejects_bad_fields(case: str, args: tuple[Any, ...], reason: str) -> None:
    for encode in _encoders():
        with pytest.raises(codec.CodecError) as info:
            encode(*args)
        assert info.value.reason == reason, (case, encode)


def test_fast_encoder_rejects_bad_arrays() -> None:
    encode = batch_codec.encode_batch_arrays
    cases: list[tuple[Any, Any, str]] = [
        (np.array([1.0]), np.array([1]), "bad_field"),
        (np.array([True]), np.array([1]), "bad_field"),
        (np.array([[1]]), np.array([[1]]), "bad_field"),
        (np.array(1), np.array(1), "bad_field"),
        (np.array([2**32], dtype=np.uint64), np.array([1]), "bad_field"),
        (np.array([2**63], dtype=np.uint64), np.array([1]), "bad_field"),
        (np.array([1]), np.array([-1], dtype=np.int8), "bad_field"),
        (np.array([1]), np.array([2**16], dtype=np.int32), "bad_field"),
        (np.zeros(3, dtype=np.uint32), np.zeros(2, dtype=np.uint16), "bad_count"),
    ]
    for seeds, zs, reason in cases:
        with pytest.raises(codec.CodecError) as info:
            encode(0, 0, BATCH_ID_0, seeds, zs)
        assert info.value.reason == reason, (seeds, zs)
    assert encode(0, 0, BATCH_ID_0, [], []) == codec.encode_batch(0, 0, BATCH_ID_0, [], [])


# --- the spec announcement ----------------------------------------------------------------

SPECS = [
    MechanismSpec(mechanism="coco", d=10, s=3, epsilon=0.6931471805599453, t=8),
    MechanismSpec(mechanism="collision", d=512, s=16, epsilon=1.0),
    MechanismSpec(mechanism="collision", d=1024, s=1, epsilon=1.0, t=65535),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.fingerprint)
def test_announcement_round_trip(spec: MechanismSpec) -> None:
    payload = encode_announcement(spec.to_dict(), min_batch=1000, delta=1e-6)
    message = json.loads(payload)
    assert message["protocol"] == PROTOCOL == "coco/v1"
    assert payload == json.dumps(message, sort_keys=True, separators=(",", ":")).encode()
    decoded = decode_announcement(payload)
    expected = {
        "protocol": PROTOCOL,
        "spec": spec.to_dict(),
        "min_batch": 1000,
        "delta": 1e-6,
        "round_seconds": 60,
    }
    assert decoded == expected
    assert MechanismSpec.from_dict(decoded["spec"]) == spec
    assert encode_announcement(decoded["spec"], min_batch=1000, delta=1e-6) == payload


def _tampered(**changes: object) -> dict[str, Any]:
    spec = SPECS[0].to_dict()
    for key, value in changes.items():
        if value is ...:
            del spec[key]
        else:
            spec[key] = value
    return spec


BAD_SPECS: list[Any] = [
    pytest.param(_tampered(fingerprint=SPECS[1].fingerprint), id="fingerprint of another spec"),
    pytest.param(_tampered(t=10), id="parameters changed under the fingerprint"),
    pytest.param(_tampered(d=11), id="d changed under the fingerprint"),
    pytest.param(_tampered(fingerprint=...), id="no fingerprint"),
    pytest.param(_tampered(exp_eps_weight=...), id="no exp_eps_weight"),
    pytest.param(_tampered(exp_eps_weight=1 << 25), id="wrong exp_eps_weight"),
    pytest.param(_tampered(unit_weight=1 << 20), id="wrong unit_weight"),
    pytest.param(_tampered(extra=1), id="unknown field"),
    pytest.param(_tampered(t=...), id="no t"),
    pytest.param(_tampered(epsilon=10**400), id="epsilon too large for a float"),
]


@pytest.mark.parametrize("spec_dict", BAD_SPECS)
def test_announcement_rejects_inconsistent_specs(spec_dict: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        encode_announcement(spec_dict, min_batch=1, delta=0.5)
    good = json.loads(encode_announcement(SPECS[0].to_dict(), min_batch=1, delta=0.5))
    good["spec"] = spec_dict
    with pytest.raises(SpecError):
        decode_announcement(json.dumps(good).encode())


@pytest.mark.parametrize(
    ("min_batch", "delta"),
    [
        (0, 0.5),
        (True, 0.5),
        (1.0, 0.5),
        (2**32, 0.5),
        (1, 0),
        (1, 1),
        (1, True),
        (1, "0.1"),
        (1, math.nan),
        (1, math.inf),
        (1, -1e-9),
    ],
)
def test_announcement_rejects_bad_parameters(min_batch: Any, delta: Any) -> None:
    with pytest.raises(SpecError):
        encode_announcement(SPECS[0].to_dict(), min_batch=min_batch, delta=delta)


GOOD = encode_announcement(SPECS[0].to_dict(), min_batch=10, delta=1e-6)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xff",
        b"[]",
        b"null",
        GOOD.replace(b"coco/v1", b"coco/v2"),
        GOOD.replace(b'"min_batch":10', b'"min_batch":0'),
        GOOD.replace(b'"delta":1e-06', b'"delta":NaN'),
        GOOD.replace(b'"delta":1e-06', b'"delta":1e999'),
        GOOD.replace(b'"delta":1e-06,', b""),
        GOOD.replace(b"{", b'{"extra":1,', 1),
        GOOD.replace(b'"round_seconds":60,', b""),
        GOOD.replace(b'"round_seconds":60', b'"round_seconds":0'),
        GOOD.replace(b'"round_seconds":60', b'"round_seconds":86401'),
        GOOD.replace(b'"round_seconds":60', b'"round_seconds":6e1'),
        GOOD.replace(b"{", b'{"batch_public_key":"00",', 1),
        GOOD.replace(b"{", b'{"batch_public_key":"' + b"A" * 64 + b'",', 1),
        GOOD.replace(b'"spec":{', b'"spec":[{', 1)[:-1] + b"]}",
        GOOD.replace(b'"d":10', b'"d":' + b"1" * 5000),
        b"[" * 100_000,
    ],
)
def test_decode_announcement_rejects_malformed_payloads(payload: bytes) -> None:
    with pytest.raises(SpecError):
        decode_announcement(payload)


def _decodes_canonically_or_raises_spec_error(payload: bytes) -> None:
    try:
        decoded = decode_announcement(payload)
    except SpecError:
        return
    params = {
        key: decoded[key]
        for key in ("min_batch", "delta", "round_seconds", "batch_public_key")
        if key in decoded
    }
    assert decode_announcement(encode_announcement(decoded["spec"], **params)) == decoded


@given(payload=st.one_of(st.binary(max_size=200), st.from_regex(rb"\A\{.*\}\Z", fullmatch=True)))
def test_decode_announcement_raises_only_spec_error(payload: bytes) -> None:
    _decodes_canonically_or_raises_spec_error(payload)


@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=5), children, max_size=3)
        ),
        max_leaves=10,
    ),
    field=st.sampled_from(
        [
            "protocol",
            "spec",
            "min_batch",
            "delta",
            "round_seconds",
            "batch_public_key",
            "mechanism",
            "d",
            "t",
        ]
    ),
)
def test_decode_announcement_with_any_json_value_in_any_field(value: object, field: str) -> None:
    message = json.loads(GOOD)
    target = message["spec"] if field in {"mechanism", "d", "t"} else message
    target[field] = value
    _decodes_canonically_or_raises_spec_error(json.dumps(message).encode())


def test_spec_files_hold_a_spec_or_a_whole_announcement(tmp_path: Path) -> None:
    """``--spec`` of every command: ``to_dict`` or an announcement (checked as received)."""
    spec = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
    plain, announced = tmp_path / "spec.json", tmp_path / "announcement.json"
    plain.write_text(json.dumps(spec.to_dict()))
    announced.write_bytes(encode_announcement(spec.to_dict(), min_batch=100, delta=1e-6))
    assert load_spec_file(plain) == spec
    assert load_spec_file(announced) == spec
    bad = tmp_path / "bad.json"
    for text, message in [
        ('["coco"]', "must hold a JSON object"),
        ("{", "cannot read the spec file"),
        (json.dumps({"protocol": "coco/v1", "spec": spec.to_dict()}), "must have the keys"),
    ]:
        bad.write_text(text)
        with pytest.raises(SpecError, match=message):
            load_spec_file(bad)
    with pytest.raises(SpecError, match="cannot read the spec file"):
        load_spec_file(tmp_path / "missing.json")
