"""The certified curve's points kept across a restart: ``<ledger file>.curves``.

What it holds
-------------
``epsilon_total`` composes one privacy loss distribution per accounting size, each built
from the certified blanket curve of that size evaluated at a few points
(:mod:`aggregator.accountant.batch_pld`). Those evaluations are almost the
whole cost of a first composition (about 0.2 s per size at 10^6 reports: 6.5 s of the 7.5 s
of a ledger of 33 sizes), and they depend on nothing the ledger records: only on the size,
``eps0``, ``s``, ``t``, the engine's window tail, the schedule of points and the code that
computes them. So the accountant's process keeps them in a file beside the ledger, written
after each size it computed (:meth:`CurveFile.saving_as_computed`: a first start killed
halfway keeps the sizes it finished), and a restarted service composes the same ledger
with the points read back instead of computed (the compositions are still computed). One
UTF-8 JSON object::

    {"format": "coco-curve-cache", "version": 1,
     "pins": {"spec": "<fingerprint>", "exp_epsilon0": p, "s": s, "t": t, "delta": delta,
              "curve": {tail, plateau, schedule, sparse, min_step_fraction},
              "engine": "<SHA-256 of the accountant's source>", "numpy": "<version>",
              "scipy": "<version>", "long_double_eps": u, "machine": "<arch>"},
     "curves": [{"n": n, "step": h, "indices": [...], "deltas": [...],
                 "finished": bool}, ...],
     "sha256": "<64 hex digits>"}

``sha256`` covers ``pins`` and ``curves`` (the canonical JSON of both, as the ledger's
file: :func:`aggregator.ledger.ledger_file.canonical_json`); the file is written atomically
(:func:`aggregator.durable.write_atomically`: temporary file, ``fsync``, rename, ``fsync``
of the directory). Floats are written by ``repr``, which reads back to the same bits.

Why a cache cannot change a result
----------------------------------
Each point is a deterministic function of its inputs: the certified engine evaluated at
``indices[j] * step`` for the pair of size ``n`` (no state carried between evaluations,
no randomness, and the sums in a fixed order). ``pins`` names every input besides the
size: the spec's ``p``, ``s`` and ``t``, the engine's constants, a digest of the source of
every module of :mod:`aggregator.accountant` and of :mod:`edge.spec` (any change to the
code that computes a point, or to anything it imports from the package, changes it), the
numeric libraries' versions and the extended precision of the machine. A file whose
pins differ from the running process's in anything is not used; so a point read back is
the point this process would compute, bit for bit, and the composition built from it is
the uncached one exactly. Points need no pin on the floor they were computed down to:
the points of a size are the same sequence whatever the floor, which only says where to
stop, and a file that stops early is extended by computing the missing points. The file
is also pinned to the ledger's ``delta``, which the points do not depend on: a ledger
accounting at another ``delta`` starts afresh rather than read a file it did not write.

What a file is checked for at load, before a point is used (any failure: the whole file
is ignored with one WARNING line and every point recomputed, so a damaged file costs
time, never privacy):

* the format, the version and the SHA-256 (a flipped bit, a truncation);
* the pins (another spec, ``delta``, engine, library or machine);
* each size's structure: the grid step of its size, the schedule's indices, values in
  ``[0, 1]``, ``(eps0, 0)`` only as the last point (:func:`check_curve_points`);
* one point picked at random among all the file's points below ``eps0``, computed afresh
  and compared bit for bit (about 50 ms): a file that is consistent but was not written
  by this code (pins forged, or a library that changed without its version) is caught
  with a probability that grows with the share of points it got wrong.

The SHA-256 is a checksum, not a signature: like the ledger's own file, this one is
trusted against damage, not against someone who can write the ledger's directory (who
could as well rewrite the ledger). The random check makes a forged file a gamble even
then.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import platform
import secrets
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import scipy

import aggregator.accountant
import edge.spec
from aggregator.accountant.batch_pld import (
    CURVE_PINS,
    CurvePoints,
    check_curve_points,
    curve_points,
    on_new_points,
    recompute_curve_point,
    seed_curve_points,
)
from aggregator.accountant.blanket import BlanketPair, blanket_pair_for_spec
from aggregator.durable import write_atomically
from aggregator.ledger.ledger_file import canonical_json
from edge.spec import MechanismSpec

__all__ = [
    "FORMAT",
    "VERSION",
    "CurveFile",
    "CurveFileError",
    "curves_path_for",
    "decode_curves",
    "encode_curves",
    "read_curves",
]

logger = logging.getLogger(__name__)

FORMAT: Final = "coco-curve-cache"
VERSION: Final = 1


class CurveFileError(ValueError):
    """A curve file that cannot be used (one line: the file and what is wrong)."""


def curves_path_for(ledger: Path) -> Path:
    """The curve file beside a ledger file: ``<ledger>.curves``."""
    return ledger.with_name(ledger.name + ".curves")


@functools.cache
def _engine_digest() -> str:
    """SHA-256 of the source of every module the curve's points are computed by (the
    package :mod:`aggregator.accountant`, and :mod:`edge.spec` for ``p``)."""
    package = Path(aggregator.accountant.__file__).parent
    files = [*sorted(package.glob("*.py")), Path(edge.spec.__file__)]
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


def pins(spec: MechanismSpec, delta: float) -> dict[str, Any]:
    """Everything a file's points depend on besides the size (module docstring), and the
    ledger's ``delta``."""
    return {
        "spec": spec.fingerprint,
        "exp_epsilon0": spec.exp_epsilon,
        "s": spec.s,
        "t": spec.t,
        "delta": delta,
        "curve": CURVE_PINS,
        "engine": _engine_digest(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "long_double_eps": float(np.finfo(np.longdouble).eps),
        "machine": platform.machine(),
    }


def _of_spec(spec: MechanismSpec) -> tuple[float, int, int]:
    """What a pair shares with every pair of ``spec``: ``(p, s, t)``."""
    return (spec.exp_epsilon, spec.s, spec.t)


def _key(pair: BlanketPair) -> tuple[float, int, int]:
    return (pair.exp_epsilon0, pair.s, pair.t)


def encode_curves(spec: MechanismSpec, delta: float, records: Sequence[CurvePoints]) -> str:
    """The file's text for ``records`` (all of ``spec``'s pairs)."""
    curves = []
    for record in records:
        pair = record.pair
        if _key(pair) != _of_spec(spec):
            raise ValueError(f"a curve of another spec ({pair}) in a file of {spec.fingerprint}")
        curves.append(
            {
                "n": pair.n,
                "step": record.step,
                "indices": list(record.indices),
                "deltas": list(record.deltas),
                "finished": record.finished,
            }
        )
    covered = {"pins": pins(spec, delta), "curves": curves}
    digest = hashlib.sha256(canonical_json(covered).encode("ascii")).hexdigest()
    document = {"format": FORMAT, "version": VERSION, **covered, "sha256": digest}
    return canonical_json(document) + "\n"


def _record(spec: MechanismSpec, i: int, raw: object) -> CurvePoints:
    if not isinstance(raw, dict) or set(raw) != {"n", "step", "indices", "deltas", "finished"}:
        raise CurveFileError(f"curves[{i}] must be {{n, step, indices, deltas, finished}}")
    n, step, indices, deltas, finished = (
        raw[k] for k in ("n", "step", "indices", "deltas", "finished")
    )
    if isinstance(n, bool) or not isinstance(n, int):
        raise CurveFileError(f"curves[{i}].n must be an integer")
    if not (
        isinstance(step, float)
        and isinstance(finished, bool)
        and isinstance(indices, list)
        and all(isinstance(k, int) and not isinstance(k, bool) for k in indices)
        and isinstance(deltas, list)
        and all(isinstance(d, float) for d in deltas)
    ):
        raise CurveFileError(f"curves[{i}] has a field of the wrong type")
    try:
        pair = blanket_pair_for_spec(spec, n=n)
    except (TypeError, ValueError) as exc:
        raise CurveFileError(f"curves[{i}].n: {exc}") from None
    points = CurvePoints(
        pair=pair, step=step, indices=tuple(indices), deltas=tuple(deltas), finished=finished
    )
    problem = check_curve_points(points)
    if problem is not None:
        raise CurveFileError(f"curves[{i}] (n={n}): {problem}")
    return points


def decode_curves(text: str, *, spec: MechanismSpec, delta: float) -> list[CurvePoints]:
    """The checked points of a file's ``text`` (format, version, SHA-256, pins, each
    size's structure: module docstring); :class:`CurveFileError` otherwise. The random
    recomputed point is :func:`read_curves`'s."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CurveFileError(f"not valid JSON ({' '.join(str(exc).split())})") from None
    if not isinstance(document, dict):
        raise CurveFileError("not a JSON object")
    if document.get("format") != FORMAT or document.get("version") != VERSION:
        raise CurveFileError(
            f"format {document.get('format')!r} version {document.get('version')!r}, not "
            f"{FORMAT!r} version {VERSION}"
        )
    covered = {"pins": document.get("pins"), "curves": document.get("curves")}
    digest = hashlib.sha256(canonical_json(covered).encode("ascii")).hexdigest()
    if document.get("sha256") != digest:
        raise CurveFileError("the SHA-256 does not match the content: the file is damaged")
    expected = pins(spec, delta)
    found = covered["pins"]
    if found != expected:
        names = sorted(
            key
            for key in expected
            if not isinstance(found, Mapping) or found.get(key) != expected[key]
        )
        raise CurveFileError(f"written for other inputs ({', '.join(names) or 'pins'} differ)")
    curves = covered["curves"]
    if not isinstance(curves, list):
        raise CurveFileError("curves must be a list")
    records = [_record(spec, i, raw) for i, raw in enumerate(curves)]
    if len({r.pair.n for r in records}) != len(records):
        raise CurveFileError("a size appears twice")
    return records


def _spot_check(records: Sequence[CurvePoints]) -> str | None:
    """One point picked at random among all of ``records``' points below ``eps0`` (the
    ``(eps0, 0)`` ends are exact, and checked by :func:`check_curve_points`), computed
    afresh: ``None`` if it is the same bit for bit and finishes the curve where the file
    says."""
    below = [
        (record, j)
        for record in records
        for j, k in enumerate(record.indices)
        if k * record.step < record.pair.epsilon0
    ]
    if not below:
        return None
    record, j = below[secrets.randbelow(len(below))]
    value, finishes = recompute_curve_point(record, j)
    last = j == len(record.deltas) - 1
    wrong_end = finishes != record.finished if last else finishes
    if value != record.deltas[j] or wrong_end:
        return (
            f"point {j} of n={record.pair.n} computed afresh is {value!r} "
            f"(finishing the curve: {finishes}), the file has {record.deltas[j]!r}"
        )
    return None


def read_curves(path: Path, *, spec: MechanismSpec, delta: float) -> list[CurvePoints]:
    """The points of the file at ``path``, checked (module docstring); ``[]`` if there is
    none, or (logged as one WARNING line) if it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        logger.warning("ignoring curve file %s (recomputing its points): %s", path, exc)
        return []
    try:
        records = decode_curves(text, spec=spec, delta=delta)
        problem = _spot_check(records)
        if problem is not None:
            raise CurveFileError(problem)
    except (OSError, ValueError, TypeError, ArithmeticError) as exc:  # CurveFileError too
        # a cache must never stop a computation: whatever went wrong, the points are computed
        logger.warning("ignoring curve file %s (recomputing its points): %s", path, exc)
        return []
    return records


class CurveFile:
    """The curve file of one ledger (its spec and ``delta``), in the process that computes
    the points (the accountant's): :meth:`load` once, then each computation inside
    :meth:`saving_as_computed` (the file is written after each size that got new points, so
    a first start killed halfway keeps the sizes it finished), or followed by :meth:`save`
    (it writes only when points were added)."""

    def __init__(self, path: Path, spec: MechanismSpec, delta: float) -> None:
        self.path = path
        self.spec = spec
        self.delta = delta
        self.held: list[CurvePoints] = []
        """What the file holds (as read, or last written)."""
        self._failing = False

    def _current(self) -> list[CurvePoints]:
        key = _of_spec(self.spec)
        return curve_points(lambda pair: _key(pair) == key)

    def load(self) -> int:
        """Read the file and use its points (each size's, where it holds more than this
        process computed); the number of sizes it held."""
        self.held = read_curves(self.path, spec=self.spec, delta=self.delta)
        for record in self.held:
            seed_curve_points(record)
        return len(self.held)

    @contextlib.contextmanager
    def saving_as_computed(self) -> Iterator[None]:
        """Inside, :meth:`save` after each evaluation that added points to one of the spec's
        sizes (:func:`~aggregator.accountant.batch_pld.on_new_points`: once per size, in
        the computing thread; a write costs a few milliseconds against the 0.1-0.3 s of a
        size's points)."""
        key = _of_spec(self.spec)

        def listener(pair: BlanketPair) -> None:
            if _key(pair) == key:
                self.save()

        remove = on_new_points(listener)
        try:
            yield
        finally:
            remove()

    def save(self) -> bool:
        """Write the points of the spec's sizes if they changed since the file was read or
        written; whether it wrote. A file that cannot be written is logged (at WARNING,
        once until a write succeeds) and left: it only costs time at the next start."""
        current = self._current()
        if current == self.held:
            return False
        try:
            write_atomically(self.path, encode_curves(self.spec, self.delta, current))
        except OSError as exc:
            if not self._failing:
                logger.warning("cannot write curve file %s (kept as it was): %s", self.path, exc)
            self._failing = True
            return False
        self._failing = False
        self.held = current
        return True
