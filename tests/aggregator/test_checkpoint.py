"""The checkpoint text: the piecewise encoder against one call of the json module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aggregator.estimation.estimators import AggregateState
from aggregator.service.core.checkpoint import Checkpoint, CheckpointError, Counters
from aggregator.service.core.checkpoint_codec import decode_checkpoint, encode_checkpoint
from aggregator.service.core.manifests import Reconciler
from edge import MechanismSpec

SPEC = MechanismSpec(mechanism="coco", d=12, s=2, epsilon=2.0)


def checkpoint(rounds: dict[int, list[bytes]]) -> Checkpoint:
    state = AggregateState(SPEC)
    rng = np.random.default_rng(0)
    state.add(rng.integers(0, 2**32, 500, dtype=np.uint32), rng.integers(0, SPEC.t, 500))
    return Checkpoint(
        generation=4,
        fingerprint=SPEC.fingerprint,
        deployment="test",
        delta=1e-6,
        trusted="ab" * 32,
        state=state,
        batch_rounds=rounds,
        retention_rounds=1440,
        counters=Counters(reports=500, batches=1, rejected={"empty": 2}),
        smallest_batch=500,
        latest_batch=None,
        batch_sizes={500: 1},
        last_batch_timestamp=1.5,
        written_at=2.25,
        shards={"g0s1": {"batches": 1, "reports": 500, "smallest": 500, "latest": 500}},
        reconciliation=Reconciler(grace=60).to_json(),
    )


def reference(ckpt: Checkpoint) -> dict[str, Any]:
    """Slow reference: the whole document (without its checksums) as the json module
    would write it."""
    return {
        "version": 4,
        "generation": ckpt.generation,
        "fingerprint": ckpt.fingerprint,
        "deployment": ckpt.deployment,
        "delta": ckpt.delta,
        "trusted": ckpt.trusted,
        "retention_rounds": ckpt.retention_rounds,
        "counters": ckpt.counters.to_dict(),
        "smallest_batch": ckpt.smallest_batch,
        "latest_batch": ckpt.latest_batch,
        "batch_sizes": {str(n): c for n, c in ckpt.batch_sizes.items()},
        "last_batch_timestamp": ckpt.last_batch_timestamp,
        "written_at": ckpt.written_at,
        "shards": ckpt.shards,
        "reconciliation": ckpt.reconciliation,
        "state": ckpt.state.to_dict(),
        "batch_rounds": {
            str(r): [i.hex() for i in ids] for r, ids in sorted(ckpt.batch_rounds.items())
        },
    }


def test_piecewise_text_equals_one_json_dumps_and_reads_back() -> None:
    rng = np.random.default_rng(1)
    cases: list[dict[int, list[bytes]]] = [
        {},
        {7: []},
        {3: [rng.bytes(16)]},
        {12: [rng.bytes(16) for _ in range(2500)], 2: [rng.bytes(16), rng.bytes(16)]},
    ]
    for rounds in cases:
        ckpt = checkpoint(rounds)
        text = encode_checkpoint(ckpt)
        document = json.loads(text)
        checksums = document.pop("checksums")
        want = reference(ckpt)
        assert json.dumps(document, separators=(",", ":")) == json.dumps(
            want, separators=(",", ":")
        )
        assert sorted(checksums) == sorted(want)
        back = decode_checkpoint(text, Path("ckpt.json"))
        assert back.batch_rounds == {r: list(ids) for r, ids in rounds.items()}
        assert back.state.to_dict() == ckpt.state.to_dict()
        assert back.generation == 4
        assert back.trusted == "ab" * 32


def test_the_series_sequence_is_a_checked_field_and_older_files_have_none() -> None:
    ckpt = checkpoint({3: [b"\x01" * 16]})
    with_series = Checkpoint(**{**ckpt.__dict__, "series_seq": 812})
    text = encode_checkpoint(with_series)
    document = json.loads(text)
    assert document["series"] == {"seq": 812}
    assert list(document).index("series") == list(document).index("batch_rounds") - 1
    # newest_length (between them) is written once a batch was applied: none here
    assert decode_checkpoint(text, Path("c.json")).series_seq == 812
    # a digit changed: valid JSON, a plausible number, refused by its checksum
    damaged = text.replace('"series":{"seq":812}', '"series":{"seq":813}')
    with pytest.raises(CheckpointError, match="field 'series' does not match its checksum"):
        decode_checkpoint(damaged, Path("c.json"))
    malformed = json.loads(text)
    malformed["series"] = {"seq": -1}
    with pytest.raises(CheckpointError, match=r"series\.seq"):
        decode_checkpoint(json.dumps(malformed), Path("c.json"))
    # written before the field existed (or without a series): none
    older = encode_checkpoint(ckpt)
    assert "series" not in json.loads(older)
    assert decode_checkpoint(older, Path("c.json")).series_seq is None
