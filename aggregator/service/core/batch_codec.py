"""Vectorised encoder and decoder of shuffled batches (wire format versions 1 and 2).

Byte for byte the same format as :func:`edge.codec.encode_batch` /
:func:`edge.codec.decode_batch` (the layout is documented there). The header goes through
the pure codec, so both paths validate identically and raise the same
:class:`edge.codec.CodecError`; only the records are read and written as a structured
big-endian numpy array.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from edge import codec
from edge.codec import CodecError

RECORD_DTYPE = np.dtype([("seed", ">u4"), ("z", ">u2")])
"""One record on the wire: ``seed`` u32 then ``z`` u16, big-endian, no padding."""


def decode_batch_arrays(
    payload: bytes | bytearray | memoryview,
) -> tuple[int, int, bytes, npt.NDArray[np.uint32], npt.NDArray[np.uint16]]:
    """``(fingerprint, round_, batch_id, seeds, z)`` with native-endian ``uint32``/``uint16``
    arrays (fresh copies, independent of ``payload``); :class:`CodecError` if invalid."""
    fingerprint, round_, batch_id, count = codec.decode_batch_header(payload)
    records = np.frombuffer(
        payload, dtype=RECORD_DTYPE, count=count, offset=codec.BATCH_HEADER_SIZE
    )
    seeds = records["seed"].astype(np.uint32)
    z = records["z"].astype(np.uint16)
    return fingerprint, round_, batch_id, seeds, z


def _column(name: str, values: npt.ArrayLike) -> npt.NDArray[np.generic]:
    array = np.asarray(values)
    if array.ndim != 1:
        raise CodecError(f"{name} must be one-dimensional, got shape {array.shape}", "bad_field")
    return array


def _check_range(name: str, array: npt.NDArray[np.generic], maximum: int) -> None:
    if array.size == 0:
        return
    if array.dtype.kind not in "iu":
        raise CodecError(f"{name} must have an integer dtype, got {array.dtype}", "bad_field")
    lo, hi = int(array.min()), int(array.max())
    if lo < 0 or hi > maximum:
        raise CodecError(
            f"{name} must be in [0, {maximum}], got values in [{lo}, {hi}]", "bad_field"
        )


def encode_batch_arrays(
    fingerprint: int,
    round_: int,
    batch_id: bytes,
    seeds: npt.ArrayLike,
    z: npt.ArrayLike,
    *,
    round_seconds: int = 0,
) -> bytes:
    """A batch of the records ``(seeds[i], z[i])`` in the given (shuffled) order, of a
    round of ``round_seconds`` (version 2; 0: version 1).

    ``seeds`` and ``z`` are one-dimensional integer arrays of equal length with values in
    ``[0, 2^32)`` and ``[0, 2^16)``; anything else raises :class:`CodecError`, with the
    reason :func:`edge.codec.encode_batch` gives.
    """
    seed_column = _column("seeds", seeds)
    z_column = _column("z", z)
    if seed_column.size != z_column.size:
        raise CodecError(f"{seed_column.size} seeds but {z_column.size} z values", "bad_count")
    header = codec.encode_batch_header(
        fingerprint, round_, batch_id, seed_column.size, round_seconds
    )
    _check_range("seed", seed_column, codec.U32_MAX)
    _check_range("z", z_column, codec.U16_MAX)
    records = np.empty(seed_column.size, dtype=RECORD_DTYPE)
    if seed_column.size:
        records["seed"] = seed_column
        records["z"] = z_column
    return header + records.tobytes() + codec.encode_trailer(round_seconds)
