"""The shuffler's batch signing key: read, never created by accident, checked against the
announcement.

A signing key is created only by ``coco credentials --batch-key-dir DIR`` or by ``coco
shuffler --create-signing-key`` (explicitly, for the path given or the state directory's
``signing.key``): a mistyped ``--signing-key`` path is an error naming the file, not a new
key that every aggregator then rejects. When the deployment's announcement names a
``batch_public_key``, the shuffler refuses to run with any other key (one line naming both
keys and the file), since every batch it signed would be rejected downstream as
``bad_signature``.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge.batch_auth import BatchSigner, load_or_create_signing_key, public_key_hex
from edge.errors import CocoError

__all__ = ["SigningKeyError", "load_signer"]


class SigningKeyError(CocoError):
    """The signing key is missing, unreadable or not the announced one."""


def load_signing_key(path: Path, *, create: bool = False) -> Ed25519PrivateKey:
    """The key in ``path``; created (mode 0600) only with ``create``."""
    path = Path(path)
    if not create and not path.exists():
        raise SigningKeyError(
            f"the signing key {path} does not exist: create the batch key with "
            "`coco credentials --batch-key-dir DIR` (then --signing-key "
            "DIR/private/signing.key), or pass --create-signing-key to create it here"
        )
    return load_or_create_signing_key(path)


def load_signer(
    path: Path,
    deployment: str,
    *,
    create: bool = False,
    announced: str | None = None,
    shard: str | None = None,
) -> BatchSigner:
    """The batch signer of the key in ``path`` (for ``shard``'s label in a sharded
    deployment), checked against the ``announced`` public key when there is one."""
    key = load_signing_key(path, create=create)
    check_announced(public_key_hex(key), announced, path, shard)
    return BatchSigner(key, deployment, shard)


def check_announced(
    public: str, announced: str | None, path: Path | str, shard: str | None = None
) -> None:
    if announced is not None and public != announced.strip().lower():
        which = "batch_public_key" if shard is None else f"key of shard {shard}"
        raise SigningKeyError(
            f"the signing key {path} has public key {public}, but the announcement's "
            f"{which} is {announced.strip()}: every batch would be rejected; "
            "start with the announced key's private key, or announce this one"
        )
