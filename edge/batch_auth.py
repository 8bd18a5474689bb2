"""Signed batches: the shuffler seals every batch with Ed25519, the aggregator opens it.

A batch on the wire (``coco/v1/<deployment>/batches``) is the version-1 batch of
:mod:`edge.codec` followed by a 64-byte Ed25519 signature::

    message   = batch || signature
    signature = Ed25519(shuffler_key, b"coco/v1/batch\\x00" || deployment || b"\\x00" || batch)

The deployment name in the signed text stops a batch of one deployment from being
replayed into another that trusts the same key. In a sharded deployment (:mod:`edge.shards`)
the shard's label follows the deployment, so a batch of one shard cannot pass for another's::

    signature = Ed25519(shard_key, b"coco/v1/batch\x00" || deployment || b"\x00" || label
                                   || b"\x00" || batch)

A release manifest (:func:`edge.codec.encode_manifest`) is sealed the same way under the
domain ``b"coco/v1/manifest\x00"``, by the same key. The batch inside is unchanged (its header
carries the spec fingerprint, round, a random 16-byte ``batch_id`` and the count), so an
attacker who can publish on the batch topic can neither forge a batch nor re-send one
under a new ``batch_id``: the aggregator rejects anything whose signature does not verify
under the key it trusts, and deduplicates by ``batch_id`` what does.

The public key travels as 64 lowercase hex digits, in the announcement's
``batch_public_key`` or in the aggregator's configuration (which then wins). The private
key is a 32-byte Ed25519 seed kept in a file of mode 0600, stored as 64 hex digits and a
newline.

This module is for the services (it needs the ``cryptography`` package); devices never see
batches.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from edge.codec import BATCH_HEADER_SIZE
from edge.errors import CocoError

__all__ = [
    "SIGNATURE_SIZE",
    "BatchAuthError",
    "BatchSigner",
    "BatchVerifier",
    "load_or_create_signing_key",
    "public_key_hex",
]

SIGNATURE_SIZE = 64
_DOMAIN = b"coco/v1/batch\x00"
_MANIFEST_DOMAIN = b"coco/v1/manifest\x00"
_KEY_HEX = 64


class BatchAuthError(CocoError):
    """A batch message that is not authentic: ``reason`` is ``"bad_length"`` (too short to
    hold a batch and a signature) or ``"bad_signature"``."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _context(deployment: str, shard: str | None) -> bytes:
    """What follows the domain in every signed text: ``deployment \x00`` (``label \x00``)."""
    text = deployment.encode() + b"\x00"
    if shard is not None:
        text += shard.encode() + b"\x00"
    return text


def _parse_hex(kind: str, text: str) -> bytes:
    text = text.strip()
    if len(text) != _KEY_HEX or any(c not in "0123456789abcdef" for c in text):
        raise CocoError(f"{kind} must be {_KEY_HEX} lowercase hex digits")
    return bytes.fromhex(text)


class BatchSigner:
    """Seals batches and manifests of one deployment (and shard: its label, ``None`` for an
    unsharded deployment) with one Ed25519 private key."""

    def __init__(
        self, private_key: Ed25519PrivateKey, deployment: str, shard: str | None = None
    ) -> None:
        self._key = private_key
        self._deployment = deployment
        self.shard = shard
        self._context = _context(deployment, shard)
        self.public_key_hex = public_key_hex(private_key)

    @classmethod
    def generate(cls, deployment: str, shard: str | None = None) -> BatchSigner:
        """A signer with a fresh key held only in memory (tests, the in-process demo)."""
        return cls(Ed25519PrivateKey.generate(), deployment, shard)

    def seal(self, batch: bytes) -> bytes:
        """``batch || signature``."""
        return batch + self._key.sign(_DOMAIN + self._context + batch)

    def seal_manifest(self, manifest: bytes) -> bytes:
        """``manifest || signature`` (domain ``coco/v1/manifest``)."""
        return manifest + self._key.sign(_MANIFEST_DOMAIN + self._context + manifest)


class BatchVerifier:
    """Opens sealed batches and manifests of one deployment (and shard) under one trusted
    public key."""

    def __init__(self, public_key: str, deployment: str, shard: str | None = None) -> None:
        raw = _parse_hex("batch public key", public_key)
        self._key = Ed25519PublicKey.from_public_bytes(raw)
        self._deployment = deployment
        self.shard = shard
        self._context = _context(deployment, shard)
        self.public_key_hex = raw.hex()

    def open(self, message: bytes | bytearray | memoryview) -> memoryview:
        """The batch inside ``message`` if its signature verifies; :class:`BatchAuthError`
        otherwise. The batch itself is not decoded here (:mod:`edge.codec` does that)."""
        return self._open(message, _DOMAIN, "batch")

    def open_manifest(self, message: bytes | bytearray | memoryview) -> memoryview:
        """The manifest inside ``message`` if its signature verifies (as :meth:`open`)."""
        return self._open(message, _MANIFEST_DOMAIN, "manifest")

    def _open(
        self, message: bytes | bytearray | memoryview, domain: bytes, what: str
    ) -> memoryview:
        view = memoryview(message)
        if len(view) < BATCH_HEADER_SIZE + SIGNATURE_SIZE:
            raise BatchAuthError(
                f"a signed {what} is at least {BATCH_HEADER_SIZE + SIGNATURE_SIZE} bytes, "
                f"got {len(view)}",
                "bad_length",
            )
        body, signature = view[:-SIGNATURE_SIZE], view[-SIGNATURE_SIZE:]
        try:
            self._key.verify(bytes(signature), domain + self._context + bytes(body))
        except InvalidSignature:
            raise BatchAuthError(f"the {what} signature does not verify", "bad_signature") from None
        return body


def public_key_hex(private_key: Ed25519PrivateKey) -> str:
    raw = private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return raw.hex()


def load_or_create_signing_key(path: Path) -> Ed25519PrivateKey:
    """The private key in ``path``, created (mode 0600, never through a symlink) if absent.

    The file holds the 32-byte Ed25519 seed as 64 hex digits; anything else raises
    :class:`CocoError` naming the file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        key = Ed25519PrivateKey.generate()
        seed = key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as exc:
            raise CocoError(f"cannot create the signing key {path}: {exc}") from exc
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(seed.hex() + "\n")
            out.flush()
            os.fsync(out.fileno())
        return key
    except UnicodeDecodeError:
        raise CocoError(
            f"{path} is not a signing key file: it holds binary data, not the 64 hex digits "
            "of an Ed25519 seed (coco credentials --batch-key-dir writes one)"
        ) from None
    except OSError as exc:
        raise CocoError(f"cannot read the signing key {path}: {exc}") from exc
    try:
        return Ed25519PrivateKey.from_private_bytes(_parse_hex(f"the signing key {path}", text))
    except CocoError:
        raise
    except ValueError as exc:
        raise CocoError(f"the signing key {path} is not an Ed25519 key: {exc}") from exc
