"""Whether a checkpoint and a privacy ledger file belong together, decided at start (no I/O).

The estimates' checkpoint and the privacy ledger are two files
(:mod:`aggregator.service.checkpoint_files`, :mod:`aggregator.ledger.ledger_file`), each
checksummed, each in two generations. A checksum proves a file whole, not that it is the
right file: a ledger deleted, put back from an older copy, or taken from another deployment
is a valid file that under-reports ``epsilon_total``. So each names the other: the checkpoint
records the ledger generation and the SHA-256 of the ledger file's bytes it was written with
(:class:`~aggregator.service.core.checkpoint.LedgerRecord`), the ledger the deployment and
the checkpoint generation it was written with (:class:`LedgerFile`).

The ledger is written first, then the checkpoint
(:meth:`aggregator.service.generations.Generations._write_files`), so the ledger may be
*ahead* of the checkpoint by one write (a stop between the two; one more when the newest
checkpoint was damaged and its previous generation resumed): its records stand, and the
batches the checkpoint lacks are redelivered and found in it already. It is never
legitimately *behind*: :func:`check_binding` refuses a ledger that is missing while the
checkpoint names one, older than the one named (written with an earlier checkpoint
generation, or with the same one but other bytes), or of another deployment, and a
checkpoint of another deployment. There is no conservative rebuild: the operator puts the
right file back (docs/operations.md, *The privacy ledger*).

Files written before the binding existed (a checkpoint without ``ledger``, a version-1
ledger file) are accepted with a warning that the binding starts with the next checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aggregator.service.core.checkpoint import Checkpoint

__all__ = ["Binding", "LedgerFile", "check_binding"]

_ADVICE = (
    "the aggregator does not start with a privacy ledger older than its checkpoint "
    "(docs/operations.md, 'The privacy ledger')"
)


@dataclass(frozen=True)
class LedgerFile:
    """The ledger file found at start: where, its ledger generation, the SHA-256 of its
    bytes, and the checkpoint it was written with (``deployment`` and
    ``checkpoint_generation`` ``None``: written before the binding, or without a
    checkpoint)."""

    path: Path
    generation: int
    digest: str
    deployment: str | None
    checkpoint_generation: int | None


@dataclass
class Binding:
    """What :func:`check_binding` decided: a refusal (one line) or ``None``, and the lines to
    log at WARNING and INFO."""

    refusal: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _short(digest: str) -> str:
    return digest[:16]


def check_binding(
    *,
    deployment: str,
    checkpoint: Checkpoint | None,
    fell_back: bool,
    ledger_path: Path,
    ledger: LedgerFile | None,
) -> Binding:
    """Whether the service of ``deployment`` may start from ``checkpoint`` (``None``: none;
    ``fell_back``: its newest generation was damaged or missing, this is the previous one)
    with ``ledger`` (``None``: neither ``ledger_path`` nor its previous generation exists)."""
    out = Binding()
    owners = []
    if checkpoint is not None:
        theirs = checkpoint.deployment
        advice = f"run with --deployment {theirs} or give this deployment its own --checkpoint"
        owners.append((f"checkpoint {checkpoint.path}", theirs, advice))
    if ledger is not None:
        advice = f"put this deployment's ledger file {ledger_path} in its place"
        owners.append((f"privacy ledger {ledger.path}", ledger.deployment, advice))
    for what, theirs, advice in owners:
        if theirs not in (None, deployment):
            out.refusal = (
                f"{what} is of deployment {theirs!r}, not this service's --deployment "
                f"{deployment!r}; {advice}"
            )
            return out
    record = None if checkpoint is None else checkpoint.ledger
    if checkpoint is None or record is None:
        old = [] if checkpoint is None else [f"checkpoint {checkpoint.path}"]
        if ledger is not None and ledger.checkpoint_generation is None:
            old.append(f"privacy ledger {ledger.path}")
        if old:
            out.warnings.append(
                f"{' and '.join(old)} written before checkpoint and ledger named each other: "
                "their binding starts with the next checkpoint"
            )
        return out
    generation = checkpoint.generation
    if ledger is None:
        out.refusal = (
            f"privacy ledger {ledger_path} is missing, but checkpoint {checkpoint.path} "
            f"(generation {generation}) was written with ledger generation "
            f"{record.generation} (sha256 {_short(record.sha256)}...); put that file back "
            f"from a backup: {_ADVICE}"
        )
        return out
    if ledger.digest == record.sha256:
        return out
    written_with = ledger.checkpoint_generation
    if (
        written_with is not None
        and written_with > generation
        and ledger.generation >= record.generation
    ):
        lead = written_with - generation
        if lead > 1 + int(fell_back):
            out.warnings.append(
                f"checkpoint {checkpoint.path} (generation {generation}) is {lead} writes "
                f"behind its privacy ledger {ledger.path} (written with checkpoint "
                f"generation {written_with}): the checkpoint was rolled back or replaced; "
                "the estimates lack what was acknowledged after it"
            )
        else:
            out.notes.append(
                f"privacy ledger {ledger.path} is ahead of checkpoint generation "
                f"{generation} by one write (a stop between the two): its records stand"
            )
        return out
    made = (
        "before the binding existed"
        if written_with is None
        else f"with checkpoint generation {written_with}"
    )
    out.refusal = (
        f"privacy ledger {ledger.path} is older than checkpoint {checkpoint.path} (generation "
        f"{generation}): it was written {made} (ledger generation {ledger.generation}), the "
        f"checkpoint with ledger generation {record.generation} (sha256 "
        f"{_short(record.sha256)}...); put the newer ledger file back from a backup: {_ADVICE}"
    )
    return out
