"""SIMULATION-ONLY ground truth of a fleet run: what the aggregator's estimates estimate.

The aggregator estimates, per dimension ``j``, the mean of ``x_j`` over the reports it
applied and the share of them with ``x_j != 0`` (``/estimates``: ``mean``, ``freq``). The
fleet knows every vector it randomised, so it can compute both exactly over the reports it
*published* (acknowledged by the broker at QoS 1, written at QoS 0), per round (keyed by the
wall-clock round number the reports carried) and overall.
No real deployment has these numbers; they exist to measure the error of the private
estimates.

A ground-truth file is never overwritten: :func:`merge_documents` adds a run's rounds to
the file's (``coco fleet --ground-truth`` runs it after every round, onto the file as it was
when the run started: :func:`write_onto`), after :func:`check_compatible` made sure that
the file is one of the same seed, spec, model, round length and day length
(``day_seconds``, a real day in a file that does not say); any other file is refused with a
one-line error. A round in both with other counts is refused too: a device's report in a
round is the same whichever run sends it (:class:`sim.fleet.models.DeviceStreams`), and a
shuffler keeps the first one, so two runs' counts of one round cannot be added.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge.errors import CocoError
from edge.spec import MechanismSpec
from sim.models.day import DAY_SECONDS

__all__ = [
    "SIMULATION_ONLY_NOTE",
    "GroundTruth",
    "GroundTruthFileError",
    "check_compatible",
    "merge_documents",
    "read_document",
    "write_merged",
    "write_onto",
]

SIMULATION_ONLY_NOTE = (
    "SIMULATION ONLY: exact per-dimension mean of x_j and share of reports with x_j != 0 over "
    "the ternary vectors of every report the simulated fleet published (same coordinates as "
    "the aggregator's /estimates mean and freq). No real deployment knows these values."
)


class GroundTruthFileError(CocoError):
    """A ``--ground-truth`` file this run cannot add its rounds to (one line, names it)."""


@dataclass
class _Sums:
    total: list[int]
    present: list[int]
    n: int = 0

    def stats(self) -> dict[str, Any]:
        """``n``, ``mean`` and ``freq``, and the exact integer sums they come from:
        ``total`` (of ``x_j``) and ``present`` (reports with ``x_j != 0``)."""
        n = self.n
        return {
            "n": n,
            "mean": [t / n if n else None for t in self.total],
            "freq": [c / n if n else None for c in self.present],
            "total": list(self.total),
            "present": list(self.present),
        }

    def add(self, other: _Sums) -> None:
        self.total = [a + b for a, b in zip(self.total, other.total, strict=True)]
        self.present = [a + b for a, b in zip(self.present, other.present, strict=True)]
        self.n += other.n


@dataclass
class GroundTruth:
    """Integer sums of the published vectors, per round and overall (exact)."""

    d: int
    rounds: dict[int, _Sums] = field(default_factory=dict)
    overall: _Sums = field(init=False)

    def __post_init__(self) -> None:
        self.overall = _Sums([0] * self.d, [0] * self.d)

    def add_sums(self, round_: int, total: list[int], present: list[int], n: int) -> None:
        """The integer sums of ``n`` published reports of round ``round_`` (a batch)."""
        sums = _Sums(list(total), list(present), n)
        kept = self.rounds.get(round_)
        if kept is None:
            self.rounds[round_] = sums
        else:
            kept.add(sums)
        self.overall.add(sums)

    def add(self, round_: int, keys: list[int], signs: list[int]) -> None:
        """One published report's vector."""
        sums = self.rounds.get(round_)
        if sums is None:
            sums = self.rounds[round_] = _Sums([0] * self.d, [0] * self.d)
        for target in (sums, self.overall):
            total, present = target.total, target.present
            for k, sign in zip(keys, signs, strict=True):
                total[k] += sign
                present[k] += 1
            target.n += 1

    @property
    def n(self) -> int:
        return self.overall.n

    def mean(self, j: int) -> float:
        """Running mean of ``x_j`` over every report published so far (NaN before any)."""
        n = self.overall.n
        return self.overall.total[j] / n if n else float("nan")

    def freq(self, j: int) -> float:
        """Running share of published reports with ``x_j != 0`` (NaN before any)."""
        n = self.overall.n
        return self.overall.present[j] / n if n else float("nan")

    def to_dict(
        self,
        *,
        spec: MechanismSpec,
        seed: int,
        model: str,
        round_seconds: int,
        day_seconds: int = DAY_SECONDS,
        run: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The ``--ground-truth`` document (``simulation_only`` says what it is); ``run``:
        what this run was (devices, rounds), the one entry of its ``runs``. Round ``r``
        spans ``[r round_seconds, (r + 1) round_seconds)`` in Unix time; ``day_seconds``
        is the length of the sensor model's day (``--day-seconds``)."""
        return {
            "simulation_only": True,
            "note": SIMULATION_ONLY_NOTE,
            "spec": spec.to_dict(),
            "seed": seed,
            "model": model,
            "round_seconds": round_seconds,
            "day_seconds": day_seconds,
            "runs": [] if run is None else [run],
            "overall": self.overall.stats(),
            "rounds": [{"round": r, **sums.stats()} for r, sums in sorted(self.rounds.items())],
        }


_IDENTITY = ("seed", "model", "round_seconds", "day_seconds")
_DEFAULTS = {"day_seconds": DAY_SECONDS}
"""What a file written before a key existed had (a real day)."""


def read_document(path: Path) -> dict[str, Any] | None:
    """The ground-truth document in ``path`` (``None`` if there is no such file), or a
    :class:`GroundTruthFileError` for a file that is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise GroundTruthFileError(f"cannot read the ground-truth file {path}: {exc}") from None
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not (isinstance(doc, dict) and doc.get("simulation_only") is True):
        raise GroundTruthFileError(
            f"{path} is not a ground-truth file of coco fleet: not adding to it (give "
            "--ground-truth another path)"
        )
    rounds = doc.get("rounds")
    if not isinstance(rounds, list) or not all(
        isinstance(x, dict) and isinstance(x.get("total"), list) for x in rounds
    ):
        raise GroundTruthFileError(
            f"{path} holds no per-round sums (written by an older coco fleet?): not adding "
            "to it (give --ground-truth another path)"
        )
    return doc


def check_compatible(path: Path, doc: dict[str, Any] | None, header: dict[str, Any]) -> None:
    """Refuse (:class:`GroundTruthFileError`) a file ``doc`` whose seed, model, round
    length or spec is not the run's ``header`` (a document of :meth:`GroundTruth.to_dict`)."""
    if doc is None:
        return
    for key in _IDENTITY:
        theirs = doc.get(key, _DEFAULTS.get(key))
        if theirs != header[key]:
            raise GroundTruthFileError(
                f"{path} is the ground truth of a run with {key} {theirs}, this run has "
                f"{key} {header[key]}: not adding to it (give --ground-truth another path)"
            )
    spec = doc.get("spec")
    if spec != header["spec"]:
        theirs = spec.get("fingerprint") if isinstance(spec, dict) else None
        raise GroundTruthFileError(
            f"{path} is the ground truth of a run with spec {theirs}, this run has spec "
            f"{header['spec']['fingerprint']}: not adding to it (give --ground-truth another path)"
        )


def _rounds_of(doc: dict[str, Any]) -> dict[int, _Sums]:
    return {
        int(x["round"]): _Sums(list(x["total"]), list(x["present"]), int(x["n"]))
        for x in doc["rounds"]
    }


def merge_documents(path: Path, old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` (a run's document) with the rounds and runs of ``old`` (the file's) added;
    :class:`GroundTruthFileError` if they cannot be (another seed, spec, model, round
    length; a round in both with other counts)."""
    if old is None:
        return new
    check_compatible(path, old, new)
    rounds = _rounds_of(old)
    for round_, sums in _rounds_of(new).items():
        kept = rounds.get(round_)
        if kept is None:
            rounds[round_] = sums
        elif (kept.n, kept.total, kept.present) != (sums.n, sums.total, sums.present):
            raise GroundTruthFileError(
                f"{path} already holds round {round_} with other counts (n {kept.n}, this run "
                f"{sums.n}): the same devices report the same in a round whatever the run and "
                "the shuffler keeps the first, so the two cannot be added; the file is "
                "unchanged (give --ground-truth another path)"
            )
    d = len(new["overall"]["total"])
    overall = _Sums([0] * d, [0] * d)
    for sums in rounds.values():
        overall.add(sums)
    return {
        **new,
        "runs": [*old.get("runs", []), *new["runs"]],
        "overall": overall.stats(),
        "rounds": [{"round": r, **sums.stats()} for r, sums in sorted(rounds.items())],
    }


def write_merged(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Add the run's ``doc`` to the file ``path`` (or create it), atomically (a temporary
    file renamed over it); returns what was written."""
    return write_onto(path, read_document(path), doc)


def write_onto(path: Path, base: dict[str, Any] | None, doc: dict[str, Any]) -> dict[str, Any]:
    """Write ``base`` (the file's document as it was before the run, read once at its
    start: :func:`read_document`) with the run's ``doc`` added to ``path``, atomically. A
    run that writes its truth after every round (``coco fleet --ground-truth``, so that an
    aggregator's ``--truth`` can show it live) replaces its own rounds each time instead of
    adding them again."""
    merged = merge_documents(path, base, doc)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(merged, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return merged
