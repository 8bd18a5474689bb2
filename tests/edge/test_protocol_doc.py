"""docs/protocol.md holds the complete announcement of section 10.5 and the sealed batch of
section 10.3 exactly as the project's code generates them (edge/doc_vectors.py), and the
values are what they claim to be: an announcement the services accept, a signature that
verifies over the documented signed text under the documented raw RFC 8032 key."""

from __future__ import annotations

import re
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edge import codec, doc_vectors
from edge.announce import decode_announcement
from edge.batch_auth import BatchVerifier
from edge.wire_vectors import batch_vectors

DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text(encoding="utf-8")


def code_blocks(section: str) -> list[str]:
    """The fenced code blocks of the numbered section ``section`` (e.g. ``"10.5"``)."""
    start = DOC.index(f"### {section} ")
    end = DOC.index("\n#", start + 1)
    return re.findall(r"```[a-z]*\n(.*?)```", DOC[start:end], flags=re.DOTALL)


def test_the_announcement_in_the_page_is_the_generated_one() -> None:
    payload = doc_vectors.announcement()
    assert payload.decode() + "\n" in code_blocks("10.5")
    assert f"A complete announcement, {len(payload)} bytes" in DOC
    decoded = decode_announcement(payload)  # the services accept it as it is
    assert decoded["spec"]["fingerprint"] == "5b67bef7"  # the worked example of section 2.4
    assert decoded["batch_public_key"] == doc_vectors.batch_public_key()


def test_the_sealed_batch_in_the_page_is_the_generated_one() -> None:
    block = next(b for b in code_blocks("10.3") if b.startswith("deployment"))
    values = dict(line.split(maxsplit=1) for line in block.replace("private key (seed)",
                  "seed").replace("signed text", "signed_text").replace("sealed message",
                  "message").splitlines())  # fmt: skip
    sealed = doc_vectors.sealed_batch()
    assert values == {
        "deployment": "lab",
        "seed": doc_vectors.SIGNING_SEED.hex(),
        "batch_public_key": doc_vectors.batch_public_key(),
        "batch": sealed.batch.hex(),
        "signed_text": sealed.signed_text.hex(),
        "signature": sealed.signature.hex(),
        "message": sealed.message.hex(),
    }
    assert block == "\n".join(doc_vectors.render().split("\n")[2:]) + "\n"


def test_the_sealed_batch_verifies_as_documented() -> None:
    sealed = doc_vectors.sealed_batch()
    assert sealed.batch.hex() == batch_vectors()[1]["hex"]
    assert sealed.signed_text == b"coco/v1/batch\x00lab\x00" + sealed.batch
    assert sealed.message == sealed.batch + sealed.signature
    assert len(sealed.signature) == 64
    # the raw 32-byte RFC 8032 key, independently of edge.batch_auth
    raw = bytes.fromhex(doc_vectors.batch_public_key())
    assert len(raw) == 32
    Ed25519PublicKey.from_public_bytes(raw).verify(sealed.signature, sealed.signed_text)
    assert BatchVerifier(raw.hex(), "lab").open(sealed.message) == sealed.batch
    assert codec.decode_batch(sealed.batch)[3] == [0, 0xFFFFFFFF, 0xC0FFEE]
    assert "raw 32-byte Ed25519 public key of RFC 8032" in DOC
