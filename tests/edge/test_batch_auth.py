"""Sealed batches and manifests: what each signature binds (edge/batch_auth.py)."""

from __future__ import annotations

import pytest

from edge import codec
from edge.batch_auth import SIGNATURE_SIZE, BatchAuthError, BatchSigner, BatchVerifier

BATCH = codec.encode_batch(7, 100, bytes(range(16)), [1, 2, 3], [0, 1, 2])
MANIFEST = codec.encode_manifest(7, 100, bytes(16), [(bytes(range(16)), 3)], [(100, 60, 3)])


def _reason(verifier: BatchVerifier, message: bytes, *, manifest: bool = False) -> str | None:
    try:
        (verifier.open_manifest if manifest else verifier.open)(message)
    except BatchAuthError as exc:
        return exc.reason
    return None


def test_batches_and_manifests_open_under_their_own_context() -> None:
    for shard in (None, "g0s1"):
        signer = BatchSigner.generate("lab", shard)
        verifier = BatchVerifier(signer.public_key_hex, "lab", shard)
        assert bytes(verifier.open(signer.seal(BATCH))) == BATCH
        assert bytes(verifier.open_manifest(signer.seal_manifest(MANIFEST))) == MANIFEST


def test_a_signature_binds_deployment_shard_and_kind() -> None:
    signer = BatchSigner.generate("lab", "g0s1")
    key = signer.public_key_hex
    sealed, sealed_manifest = signer.seal(BATCH), signer.seal_manifest(MANIFEST)
    others = [
        BatchVerifier(key, "lab", "g0s2"),  # another shard of the same deployment
        BatchVerifier(key, "lab", None),  # the unsharded context
        BatchVerifier(key, "lab2", "g0s1"),  # another deployment
        BatchVerifier(BatchSigner.generate("lab").public_key_hex, "lab", "g0s1"),  # another key
    ]
    for verifier in others:
        assert _reason(verifier, sealed) == "bad_signature"
        assert _reason(verifier, sealed_manifest, manifest=True) == "bad_signature"
    right = BatchVerifier(key, "lab", "g0s1")
    # a manifest never passes for a batch, nor the other way round
    assert _reason(right, sealed_manifest) == "bad_signature"
    assert _reason(right, sealed, manifest=True) == "bad_signature"


def test_unsharded_signed_text_is_unchanged() -> None:
    """An unsharded batch is signed exactly as protocol v1 always said: domain, deployment,
    NUL, batch (no shard label)."""
    signer = BatchSigner.generate("lab")
    sealed = signer.seal(BATCH)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PublicKey,
    )

    public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(signer.public_key_hex))
    public.verify(sealed[-SIGNATURE_SIZE:], b"coco/v1/batch\x00lab\x00" + BATCH)
    sharded = BatchSigner.generate("lab", "g3s2")
    public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(sharded.public_key_hex))
    public.verify(
        sharded.seal(BATCH)[-SIGNATURE_SIZE:], b"coco/v1/batch\x00lab\x00g3s2\x00" + BATCH
    )
    public.verify(
        sharded.seal_manifest(MANIFEST)[-SIGNATURE_SIZE:],
        b"coco/v1/manifest\x00lab\x00g3s2\x00" + MANIFEST,
    )


@pytest.mark.parametrize("size", [0, 1, codec.BATCH_HEADER_SIZE + SIGNATURE_SIZE - 1])
def test_short_messages_are_bad_length(size: int) -> None:
    verifier = BatchVerifier(BatchSigner.generate("lab").public_key_hex, "lab")
    assert _reason(verifier, bytes(size)) == "bad_length"
    assert _reason(verifier, bytes(size), manifest=True) == "bad_length"
