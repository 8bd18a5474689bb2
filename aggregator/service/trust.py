"""The pinned batch key: trusted on first use, stored with the state, moved only by an
operator.

With a checkpoint, the aggregator keeps the shuffler's batch key it trusts in a small
checksummed file beside it, ``<checkpoint>.trust``::

    {"version": 1, "deployment": "plant-7", "trusted": "<64 hex>" or "[<layouts>]",
     "refused": ... | null, "checksum": "<64 hex>"}

``trusted`` is the anchor of :mod:`aggregator.service.core.keys`: the batch key of an unsharded
deployment, or its announced shard layouts (every shard's key) as JSON text.

``checksum`` is the SHA-256 of the other fields as compact JSON with sorted keys.

* **First use.** Without the file, the key of ``--batch-public-key`` (else the
  announcement's) is pinned; a version-3 checkpoint records the key its sums were verified
  under, so a checkpoint whose trust file was lost pins its own key again, never the
  announcement's.
* **A changed announcement** (another ``batch_public_key``, or other shard layouts: a
  new key, a reshard), at start or while running, is
  refused: an ERROR log, ``coco_aggregator_announcements_refused_total``, and the key is
  recorded as ``refused``; the pinned key stays in force, so batches signed by the new key
  are refused (``untrusted_key``) and kept in the quarantine
  (:mod:`aggregator.service.rejected`), to be applied once the key is trusted.
* **Rotation** is the operator's: ``coco aggregator trust --checkpoint PATH
  --accept-announced`` (or ``--accept KEY``) prints the old and the new key and moves the
  pin; the running service picks the new pin up within seconds (:data:`PIN_POLL`), and a
  restart uses it. ``--batch-public-key`` that differs from the pin is refused at start,
  with the command to run.

Without a checkpoint there is no state to pin with: the key is the option's or the
announcement's at every start (logged as a warning).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from prometheus_client import Counter

from aggregator.durable import write_atomically
from aggregator.service.core.keys import anchor_of, describe_anchor, is_anchor
from aggregator.service.core.machine import AggregatorCore
from edge.announce import decode_announcement, shard_plan
from edge.errors import CocoError, SpecError

logger = logging.getLogger("aggregator.service")

TRUST_VERSION = 1
PIN_POLL = 2.0
"""Seconds between two looks of the running service at its trust file."""


class TrustError(CocoError):
    """A trust file that cannot be read or is damaged, or a key the pin refuses."""


@dataclass(frozen=True, kw_only=True)
class Pins:
    """The content of a trust file."""

    deployment: str
    trusted: str
    refused: str | None = None
    """The last announced key that was refused (``--accept-announced`` accepts it)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "version": TRUST_VERSION,
            "deployment": self.deployment,
            "trusted": self.trusted,
            "refused": self.refused,
        }


def trust_path(checkpoint: Path) -> Path:
    """``<checkpoint>.trust``."""
    return checkpoint.with_name(checkpoint.name + ".trust")


def _checksum(document: dict[str, object]) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def encode_pins(pins: Pins) -> str:
    document = pins.to_dict()
    return json.dumps({**document, "checksum": _checksum(document)}, sort_keys=True) + "\n"


def decode_pins(text: str, path: Path) -> Pins:
    """The checked pins of ``text``; :class:`TrustError` naming the file and the field."""

    def error(name: str, problem: str) -> TrustError:
        return TrustError(
            f"trust file {path}: field {name!r} {problem}; restore it from a backup, or move "
            "it away and pin the key again with `coco aggregator trust --accept KEY`"
        )

    try:
        data = json.loads(text)
    except ValueError:
        raise error("checksum", "cannot be checked: the file is not valid JSON") from None
    if not isinstance(data, dict):
        raise error("checksum", "cannot be checked: the file is not a JSON object")
    checksum = data.pop("checksum", None)
    if checksum != _checksum(data):
        raise error("checksum", "does not match the content: the file is damaged")
    if data.get("version") != TRUST_VERSION:
        raise error("version", f"must be {TRUST_VERSION}")
    deployment = data.get("deployment")
    if not isinstance(deployment, str):
        raise error("deployment", "must be a string")
    key, refused = data.get("trusted"), data.get("refused")
    if not is_anchor(key):
        raise error("trusted", "must be 64 lowercase hex digits or shard layouts")
    if refused is not None and not is_anchor(refused):
        raise error("refused", "must be 64 lowercase hex digits, shard layouts or null")
    assert isinstance(key, str)
    return Pins(deployment=deployment, trusted=key, refused=refused)


def load_pins(path: Path) -> Pins | None:
    """The pins of the trust file at ``path``; ``None`` if there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise TrustError(f"cannot read trust file {path}: {exc}") from None
    return decode_pins(text, path)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def update_pins(path: Path, change: Callable[[Pins | None], Pins]) -> tuple[Pins | None, Pins]:
    """Read, change and write the trust file under its lock (the service and the
    ``trust`` command never lose each other's change); ``(before, after)``."""
    with _locked(path):
        before = load_pins(path)
        after = change(before)
        if after != before:
            write_atomically(path, encode_pins(after))
        return before, after


@dataclass(frozen=True)
class Decision:
    """The key in force at start, and the announced key refused (if any)."""

    key: str
    refused: str | None = None
    pinned_now: bool = False


def decide(
    *,
    pins: Pins | None,
    candidate: str,
    configured: bool,
    checkpoint_key: str | None,
    path: Path,
) -> Decision:
    """Which key is in force at start (module docs). ``candidate`` is the option's key
    (``configured``) or else the announcement's; ``checkpoint_key`` the key the recovered
    checkpoint's sums were verified under. :class:`TrustError` for an option that
    disagrees with the pin."""
    pinned = pins.trusted if pins is not None else checkpoint_key
    if pinned is None:
        return Decision(candidate, pinned_now=True)
    if candidate == pinned:
        return Decision(pinned, pinned_now=pins is None)
    if configured:
        raise TrustError(
            f"--batch-public-key {candidate} differs from the key pinned in {path} "
            f"({pinned}); if the shuffler's key really changed, accept it with `coco "
            f"aggregator trust --checkpoint {path.name.removesuffix('.trust')} --accept "
            f"{candidate}`"
        )
    return Decision(pinned, refused=candidate, pinned_now=pins is None)


def pin(path: Path, deployment: str, key: str) -> None:
    """Pin ``key`` if nothing is pinned yet (first use)."""
    update_pins(
        path,
        lambda pins: pins or Pins(deployment=deployment, trusted=key),
    )


def record_refused(path: Path, deployment: str, key: str, in_force: str) -> None:
    """Record ``key`` as the announced key refused (for ``--accept-announced``)."""

    def change(pins: Pins | None) -> Pins:
        if pins is None:
            pins = Pins(deployment=deployment, trusted=in_force)
        return replace(pins, refused=key)

    update_pins(path, change)


def accept(path: Path, *, key: str | None) -> tuple[str | None, str]:
    """The operator's rotation: pin ``key``, or (``None``) the announced key last refused;
    ``(old, new)``. :class:`TrustError` if there is nothing to accept."""

    def change(pins: Pins | None) -> Pins:
        new = key if key is not None else (pins.refused if pins is not None else None)
        if new is None:
            raise TrustError(
                f"no announced key was refused ({path}): nothing to accept; give --accept KEY"
            )
        if not is_anchor(new):
            raise TrustError(f"the key to accept must be 64 lowercase hex digits, got {new!r}")
        deployment = pins.deployment if pins is not None else ""
        return Pins(deployment=deployment, trusted=new, refused=None)

    before, after = update_pins(path, change)
    return (None if before is None else before.trusted), after.trusted


class KeyGuard:
    """The running service's side of the pin (module docs): settles the key in force at
    start, refuses announcements of another key (ERROR, counted once per key, recorded for
    ``--accept-announced``) and adopts a pin the operator moved."""

    def __init__(
        self,
        core: AggregatorCore,
        *,
        deployment: str,
        checkpoint: Path | None,
        refused: Counter,
    ) -> None:
        self.core = core
        self.deployment = deployment
        self.checkpoint = checkpoint
        self.path = None if checkpoint is None else trust_path(checkpoint)
        self.refused_counter = refused
        self._refused: str | None = None
        self.on_trusted: Callable[[], None] = lambda: None
        """Called after the service adopted a pin the operator moved (the quarantine is
        replayed: :mod:`aggregator.service.rejected`)."""
        self._stamp: tuple[int, int] | None = None

    @property
    def key(self) -> str:
        trusted: str = self.core.rules.trusted
        return trusted

    def settle(self, *, configured: bool, checkpoint_key: str | None) -> None:
        """At start, after the checkpoint is recovered: the key in force (:func:`decide`)."""
        path = self.path
        assert path is not None
        pins = load_pins(path)
        decision = decide(
            pins=pins,
            candidate=self.key,
            configured=configured,
            checkpoint_key=checkpoint_key,
            path=path,
        )
        if decision.key != self.key:
            self.core.trust(decision.key)
        if decision.pinned_now:
            pin(path, self.deployment, decision.key)
            logger.info("pinned the batch key %s in %s", decision.key, path)
        self._stamp = _stamp(path)
        if decision.refused is not None:
            self.refuse(decision.refused)
        elif pins is not None and pins.refused is not None:  # refused before: kept, not lost
            self.core.announce(pins.refused)

    def announcement(self, payload: bytes) -> None:
        """A spec announcement arrived: refuse it if it names another batch key."""
        try:
            announcement = decode_announcement(payload)
            key = announcement.get("batch_public_key")
            plan = shard_plan(announcement)
        except SpecError:
            return
        if key is None and plan is None:
            return
        anchor = anchor_of(key, plan)
        if anchor != self.key:
            self.refuse(anchor)

    def refuse(self, key: str) -> None:
        """Refuse an announced key other than the one in force (counted once per key)."""
        if key == self._refused:
            return
        self._refused = key
        self.core.announce(key)  # what it signs is kept (aggregator.service.core.quarantine)
        self.refused_counter.inc()
        how = (
            f"accept it with `coco aggregator trust --checkpoint {self.checkpoint} "
            "--accept-announced` if the shuffler's key really changed"
            if self.path is not None
            else "restart with --checkpoint to pin keys"
        )
        logger.error(
            "refused the announced batch key %s: the key in force is %s; batches signed by "
            "it are rejected; %s (coco_aggregator_announcements_refused_total)",
            describe_anchor(key),
            describe_anchor(self.key),
            how,
        )
        if self.path is not None:
            try:
                record_refused(self.path, self.deployment, key, self.key)
            except (OSError, CocoError):
                logger.exception("cannot record the refused key in %s", self.path)

    async def watch(self) -> None:
        """Adopt a pin the operator moved (``coco aggregator trust``), within
        :data:`PIN_POLL` seconds; one ``stat`` per poll otherwise."""
        path = self.path
        assert path is not None
        while True:
            await asyncio.sleep(PIN_POLL)
            stamp = _stamp(path)
            if stamp == self._stamp:
                continue
            self._stamp = stamp
            try:
                pins = load_pins(path)
            except CocoError:
                logger.exception("cannot read the trust file %s; the key in force stays", path)
                continue
            if pins is not None and pins.trusted != self.key:
                logger.warning(
                    "the operator accepted batch key %s (was %s)",
                    describe_anchor(pins.trusted),
                    describe_anchor(self.key),
                )
                self.core.trust(pins.trusted)
                self._refused = None
                self.on_trusted()


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_ino
