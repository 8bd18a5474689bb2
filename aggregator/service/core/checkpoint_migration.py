"""Checkpoints of version 3 or older, whose rounds are numbers, made ones keyed by round
starts, with no I/O.

A checkpoint of version 3 or older keyed rounds by their numbers: it is read under the
announced round length (:func:`migrate_rounds`), and refused if that cannot be the length it
was written under (:func:`numbered_rounds_problem`). Apart from the data model
(:mod:`aggregator.service.core.checkpoint`) and the text
(:mod:`aggregator.service.core.checkpoint_codec`) because it is a one-way step taken once, at
start, on a checkpoint already read: the core resuming from one
(:meth:`aggregator.service.core.machine.AggregatorCore.restore`,
:func:`aggregator.service.core.machine.check_resumable`) is its only user.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aggregator.service.core.checkpoint import CHECKPOINT_VERSION, Checkpoint


def numbered_rounds_problem(checkpoint: Checkpoint, unit: int) -> str | None:
    """Why a checkpoint of version 3 or older (rounds by number) cannot be read under the
    round length ``unit`` (the announced one), or ``None``: its newest round would start
    after the checkpoint was written, so it was written under a longer length. (A shorter
    one puts its rounds in the past instead, which an idle fleet does too: not told.)"""
    if checkpoint.version >= CHECKPOINT_VERSION or not checkpoint.batch_rounds:
        return None
    newest = max(checkpoint.batch_rounds)
    written = checkpoint.written_at
    horizon = (checkpoint.retention_rounds or 1) * unit
    if written is not None and newest * unit > written + horizon:
        return (
            f"is of version {checkpoint.version}, whose rounds are numbers: its newest, "
            f"{newest}, would start at {newest * unit} under the announced round_seconds "
            f"{unit}, after the file was written ({written:.0f}); it was written under another "
            "round length: start once under that length to rewrite it, then change it"
        )
    return None


def _scale_reconciliation(data: dict[str, Any], unit: int) -> dict[str, Any]:
    out = dict(data)
    out["pending"] = [{**item, "round": int(item["round"]) * unit} for item in data["pending"]]
    out["releases"] = {str(int(r) * unit): ids for r, ids in data["releases"].items()}
    out["manifested"] = [[s, int(r) * unit, at] for s, r, at in data["manifested"]]
    out["missing"] = [[b, int(r) * unit, c] for b, r, c in data["missing"]]
    out["losses"] = [
        {**{k: v for k, v in item.items() if k != "round"}, "start": int(item["round"]) * unit}
        for item in data["losses"]
    ]
    return out


def migrate_rounds(checkpoint: Checkpoint, unit: int) -> Checkpoint:
    """A checkpoint of version 3 or older with its round numbers made round starts under
    the round length ``unit`` (:func:`numbered_rounds_problem` first)."""
    if checkpoint.version >= CHECKPOINT_VERSION:
        return checkpoint
    reconciliation = checkpoint.reconciliation
    return replace(
        checkpoint,
        batch_rounds={r * unit: list(ids) for r, ids in checkpoint.batch_rounds.items()},
        reconciliation=None
        if reconciliation is None
        else _scale_reconciliation(reconciliation, unit),
    )
