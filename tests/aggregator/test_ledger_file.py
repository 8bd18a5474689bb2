"""The ledger's own file: round trip, damage refused (every flipped bit), the previous good
generation kept and used, and a checkpoint reset that does not forget privacy loss."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.ledger.ledger_file import (
    Bound,
    LedgerFileError,
    decode_ledger,
    encode_ledger,
    ledger_path_for,
    load_ledger,
    previous_path,
    save_ledger,
)
from aggregator.ledger.privacy_ledger import PrivacyLedger
from edge.spec import MechanismSpec

SPEC = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=1.0)
DELTA = 1e-6


def bid(i: int) -> bytes:
    return i.to_bytes(16, "big")


def sample_ledger(rounds: int = 6) -> PrivacyLedger:
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    ledger.record(321)  # an old per-batch record
    for r in range(rounds):
        ledger.record_manifest(
            round=r,
            shard="g0s0",
            release_id=bid(r),
            batches=[(bid(100 + r), 500 + r)],
            sources=[(r, 60)] if r % 2 else None,  # rows with and without sources
        )
        ledger.record_batch(round=r, shard="g0s1", batch_id=bid(200 + r), size=400 + r)
    ledger.compact(1)
    ledger.record_batch(round=0, shard="g0s1", batch_id=bid(999), size=450)  # late
    return ledger


def test_round_trip_keeps_everything(tmp_path: Path) -> None:
    ledger = sample_ledger()
    path = tmp_path / "agg.json.ledger"
    save_ledger(path, ledger)
    loaded = load_ledger(path, spec=SPEC, delta=DELTA)
    assert loaded is not None
    assert loaded.to_dict() == ledger.to_dict()
    assert loaded.generation == ledger.generation
    assert loaded.rounds() == ledger.rounds()
    # the same content (the id names the ledger object, so levels are never mixed up)
    assert replace(loaded.snapshot(), ledger="") == replace(ledger.snapshot(), ledger="")
    assert encode_ledger(loaded) == encode_ledger(ledger)
    assert ledger_path_for(tmp_path / "agg.json") == path


@pytest.mark.parametrize("bound", [None, Bound("fleet-ü", 17)])
def test_the_assembled_text_is_the_canonical_json_of_the_document(bound: Bound | None) -> None:
    """encode_ledger encodes the content once and assembles the document around it: the
    text is exactly the sorted-key JSON of the whole document, and its sha256 covers the
    binding and the content."""
    ledger = sample_ledger()
    text = encode_ledger(ledger, bound)
    binding = None if bound is None else {"deployment": bound.deployment, "generation": 17}
    covered = {"checkpoint": binding, "ledger": ledger.to_dict()}
    canonical = json.dumps(covered, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    document = {
        "format": "coco-privacy-ledger",
        "version": 2,
        **covered,
        "sha256": hashlib.sha256(canonical.encode()).hexdigest(),
    }
    assert text == json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n"
    assert decode_ledger(text, path=Path("x"), spec=SPEC, delta=DELTA).to_dict() == (
        ledger.to_dict()
    )


def test_missing_file_is_none_and_another_spec_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    assert load_ledger(path, spec=SPEC, delta=DELTA) is None
    save_ledger(path, sample_ledger())
    other = MechanismSpec(mechanism="coco", d=6, s=2, epsilon=0.5)
    with pytest.raises(LedgerFileError, match=r"field 'ledger\.fingerprint'"):
        load_ledger(path, spec=other, delta=DELTA)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_flipped_bit_is_refused_with_file_and_field(data: st.DataObject) -> None:
    text = encode_ledger(sample_ledger(3)).encode()
    offset = data.draw(st.integers(0, len(text) - 1))
    bit = data.draw(st.integers(0, 7))
    damaged = bytearray(text)
    damaged[offset] ^= 1 << bit
    path = Path("/state/agg.ledger")
    try:
        decoded = damaged.decode("utf-8")
    except UnicodeDecodeError:
        return  # refused by the reader as "not UTF-8 text" (tested below)
    with contextlib.suppress(ValueError):
        if json.loads(decoded) == json.loads(text):
            return  # the same content (1e-06 read as 1E-06): nothing was damaged
    with pytest.raises(LedgerFileError) as info:
        decode_ledger(decoded, path=path, spec=SPEC, delta=DELTA)
    message = str(info.value)
    assert str(path) in message
    assert "\n" not in message
    # the file, and a field (or "not valid JSON" / "not a JSON object")
    assert "field '" in message or "JSON" in message


def test_a_damaged_file_falls_back_to_the_previous_generation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger"
    older = sample_ledger(3)
    save_ledger(path, older)
    newer = sample_ledger(5)
    save_ledger(path, newer)
    assert previous_path(path).exists()
    # a digit changed in the content: valid JSON, refused by its checksum
    text = path.read_text()
    damaged = text.replace('"generation":', '"generation":1', 1)
    assert damaged != text
    path.write_text(damaged)
    with pytest.raises(LedgerFileError, match="field 'sha256' does not match"):
        decode_ledger(damaged, path=path, spec=SPEC, delta=DELTA)
    with caplog.at_level(logging.WARNING, logger="aggregator.ledger.ledger_file"):
        loaded = load_ledger(path, spec=SPEC, delta=DELTA)
    assert loaded is not None
    assert loaded.to_dict() == older.to_dict()
    assert "previous generation" in caplog.text
    assert str(path) in caplog.text
    # saving again keeps the good previous generation, not the damaged file
    save_ledger(path, loaded)
    assert load_ledger(previous_path(path), spec=SPEC, delta=DELTA) is not None
    assert json.loads(previous_path(path).read_text())["ledger"] == older.to_dict()


def test_both_generations_damaged_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    save_ledger(path, sample_ledger(2))
    save_ledger(path, sample_ledger(3))
    path.write_bytes(b"\xff\xfe not text")
    previous_path(path).write_text("{}")
    with pytest.raises(LedgerFileError) as info:
        load_ledger(path, spec=SPEC, delta=DELTA)
    assert "not UTF-8" in str(info.value)
    assert "previous generation cannot be used" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_file_with_a_previous_generation_uses_it(tmp_path: Path) -> None:
    """A crash between keeping the previous generation and writing the new one."""
    path = tmp_path / "ledger"
    save_ledger(path, sample_ledger(2))
    save_ledger(path, sample_ledger(4))
    path.unlink()
    loaded = load_ledger(path, spec=SPEC, delta=DELTA)
    assert loaded is not None
    assert loaded.to_dict() == sample_ledger(2).to_dict()


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda c: c.update(compacted={"0": 1}), "ledger.compacted.0"),
        (lambda c: c.update(late={"5": -1}), "ledger.late.5"),
        (lambda c: c["manifests"][0].__setitem__(2, "zz"), "ledger.manifests[0]"),
        (lambda c: c["batches"][0].__setitem__(3, 0), "ledger.batches[0].size"),
        (lambda c: c.pop("generation"), "ledger.generation"),
        (lambda c: c["batches"].append(list(c["batches"][0])), "ledger.batches"),
    ],
)
def test_a_well_sealed_but_invalid_content_names_its_field(mutate: object, field: str) -> None:
    """Written by a faulty program (checksum right, content wrong): still refused."""
    import hashlib  # noqa: PLC0415

    document = json.loads(encode_ledger(sample_ledger(3)))
    content = document["ledger"]
    mutate(content)  # type: ignore[operator]
    sealed = {"checkpoint": document["checkpoint"], "ledger": content}  # version 2
    canonical = json.dumps(sealed, sort_keys=True, separators=(",", ":"))
    document["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    with pytest.raises(LedgerFileError, match=re.escape(f"field '{field}")):
        decode_ledger(json.dumps(document), path=Path("x"), spec=SPEC, delta=DELTA)
