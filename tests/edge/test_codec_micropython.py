"""``edge/codec.py`` under real MicroPython: the published wire vectors, both directions.

Uses the harness of :mod:`tests.edge.test_micropython` (MicroPython 1.27's WebAssembly port
on Node.js). MicroPython's ``struct.pack`` truncates out-of-range values and its ``bool`` is
not an ``int``, so the encoders' range and type checks are run there too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edge import codec
from tests.edge.test_micropython import (  # noqa: F401 (pytest fixtures used by name)
    RunMicroPython,
    micropython_harness,
    run_micropython,
)

pytestmark = [pytest.mark.integration, pytest.mark.unhurried]

REPO = Path(__file__).resolve().parents[2]
CODEC = REPO / "edge" / "codec.py"
VECTORS: dict[str, Any] = json.loads(
    (REPO / "docs" / "wire-vectors-v1.json").read_text(encoding="utf-8")
)

PROGRAM = """
import codec

def reason(fn, *args):
    try:
        fn(*args)
    except codec.CodecError as e:
        assert isinstance(e, ValueError)
        return e.reason
    return "ok"

for v in VECTORS["reports"]:
    print(repr(codec.decode_report(bytes.fromhex(v["hex"]))))
    print(codec.encode_report(v["fingerprint"], v["round"], v["seed"], v["z"]).hex())
for v in VECTORS["batches"]:
    fp, rnd, batch_id, seeds, zs = codec.decode_batch(bytes.fromhex(v["hex"]))
    print(repr([fp, rnd, batch_id.hex(), seeds, zs]))
    print(codec.decode_batch(bytearray.fromhex(v["hex"]))[3] == seeds)
    print(codec.encode_batch(v["fingerprint"], v["round"], bytes.fromhex(v["batch_id"]),
                             v["seeds"], v["zs"], round_seconds=v["round_seconds"]).hex())
for v in VECTORS["manifests"]:
    fp, rnd, release_id, entries, sources = codec.decode_manifest(bytes.fromhex(v["hex"]))
    print(repr([fp, rnd, release_id.hex(), [[b.hex(), c] for b, c in entries],
                [list(s) for s in sources]]))
    print(codec.encode_manifest(v["fingerprint"], v["round"], bytes.fromhex(v["release_id"]),
                                [(bytes.fromhex(b["batch_id"]), b["count"])
                                 for b in v["batches"]],
                                [(s["round"], s["round_seconds"], s["count"])
                                 for s in v["sources"]],
                                round_seconds=v["round_seconds"]).hex())
DECODE = {"report": codec.decode_report, "batch": codec.decode_batch,
          "manifest": codec.decode_manifest}
for v in VECTORS["malformed"]:
    print(reason(DECODE[v["message"]], bytes.fromhex(v["hex"])))
for args in ENCODE_ERRORS:
    print(reason(codec.encode_report, *args))
for args in BATCH_ERRORS:
    print(reason(codec.encode_batch, *args))
"""

# (arguments, reason) of encoder calls; "ok" for the one that must succeed.
ENCODE_ERRORS: list[tuple[tuple[Any, ...], str]] = [
    ((2**32, 0, 0, 0), "bad_field"),
    ((0, -1, 0, 0), "bad_field"),
    ((0, 0, 2**32 + 5, 0), "bad_field"),
    ((0, 0, 0, 2**16), "bad_field"),
    ((0, 0, 0, -1), "bad_field"),
    ((True, 0, 0, 0), "bad_field"),
    ((0, 0, 0, False), "bad_field"),
    ((0, 0, 1.0, 0), "bad_field"),
    ((0, 0, 0, 2**16 - 1), "ok"),
]
BATCH_ERRORS: list[tuple[tuple[Any, ...], str]] = [
    ((0, 0, bytes(16), [2**32], [0]), "bad_field"),
    ((0, 0, bytes(16), [0], [2**16]), "bad_field"),
    ((0, 0, bytes(16), [True], [0]), "bad_field"),
    ((0, 0, bytes(15), [], []), "bad_field"),
    ((0, 2**32, bytes(16), [], []), "bad_field"),
    ((0, 0, bytes(16), [1, 2], [3]), "bad_count"),
]


def _reason(fn: Any, *args: Any) -> str:
    try:
        fn(*args)
    except codec.CodecError as exc:
        return str(exc.reason)
    return "ok"


def test_encoder_expectations_hold_on_cpython() -> None:
    for args, reason in ENCODE_ERRORS:
        assert _reason(codec.encode_report, *args) == reason, args
    for args, reason in BATCH_ERRORS:
        assert _reason(codec.encode_batch, *args) == reason, args


def test_wire_vectors_under_micropython(run_micropython: RunMicroPython) -> None:  # noqa: F811
    encode_args = [args for args, _ in ENCODE_ERRORS]
    batch_args = [args for args, _ in BATCH_ERRORS]
    code = (
        f"VECTORS = {VECTORS!r}\nENCODE_ERRORS = {encode_args!r}\n"
        f"BATCH_ERRORS = {batch_args!r}\n{PROGRAM}"
    )
    want: list[str] = []
    for v in VECTORS["reports"]:
        want.append(repr((1, v["fingerprint"], v["round"], v["seed"], v["z"])))
        want.append(v["hex"])
    for v in VECTORS["batches"]:
        want.append(repr([v["fingerprint"], v["round"], v["batch_id"], v["seeds"], v["zs"]]))
        want += ["True", v["hex"]]
    for v in VECTORS["manifests"]:
        entries = [[b["batch_id"], b["count"]] for b in v["batches"]]
        sources = [[s["round"], s["round_seconds"], s["count"]] for s in v["sources"]]
        want.append(repr([v["fingerprint"], v["round"], v["release_id"], entries, sources]))
        want.append(v["hex"])
    want += [m["reason"] for m in VECTORS["malformed"]]
    want += [reason for _, reason in ENCODE_ERRORS + BATCH_ERRORS]
    assert run_micropython(CODEC, code=code).splitlines() == want
