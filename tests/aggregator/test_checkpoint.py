"""The checkpoint text: the piecewise encoder against one call of the json module."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from aggregator.checkpoint import CHECKPOINT_VERSION, encode_checkpoint
from aggregator.estimators import AggregateState
from edge import MechanismSpec

SPEC = MechanismSpec(mechanism="coco", d=12, s=2, epsilon=2.0)


def snapshot(rounds: dict[int, tuple[bytes, ...]]) -> dict[str, Any]:
    state = AggregateState(SPEC)
    rng = np.random.default_rng(0)
    state.add(rng.integers(0, 2**32, 500, dtype=np.uint32), rng.integers(0, SPEC.t, 500))
    return {
        "version": CHECKPOINT_VERSION,
        "fingerprint": SPEC.fingerprint,
        "deployment": "test",
        "delta": 1e-6,
        "state": state,
        "batch_rounds": rounds,
        "retention_rounds": 1440,
        "counters": {"reports": 500, "batches": 1, "rejected": {"empty": 2}},
        "smallest_batch": 500,
        "latest_batch": None,
        "last_batch_timestamp": 1.5,
        "written_at": 2.25,
    }


def reference(snap: dict[str, Any]) -> str:
    """Slow reference: the whole document through ``json.dumps`` at once."""
    document = {
        **{k: v for k, v in snap.items() if k not in ("state", "batch_rounds")},
        "state": snap["state"].to_dict(),
        "batch_rounds": {
            str(r): [i.hex() for i in ids] for r, ids in sorted(snap["batch_rounds"].items())
        },
    }
    return json.dumps(document, separators=(",", ":"))


def test_piecewise_text_equals_one_json_dumps() -> None:
    rng = np.random.default_rng(1)
    cases: list[dict[int, tuple[bytes, ...]]] = [
        {},
        {7: ()},
        {3: (rng.bytes(16),)},
        {12: tuple(rng.bytes(16) for _ in range(2500)), 2: (rng.bytes(16), rng.bytes(16))},
    ]
    for rounds in cases:
        want = reference(snapshot(rounds))
        got = encode_checkpoint(snapshot(rounds))
        assert got == want
        assert json.loads(got)["batch_rounds"] == json.loads(want)["batch_rounds"]
