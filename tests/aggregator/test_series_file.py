"""The series file: its codec, and what recovery makes of each kind of damage (real files).

A file is written as the service writes it (:class:`SeriesFile` appends before each
checkpoint and commits after); recovery is given the checkpoint's sequence number and must
replay exactly the committed records, cut off what came after, and refuse, in one line
naming the file and the offset, a file that no longer holds what the checkpoint says.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from aggregator.estimation.estimators import AggregateState
from aggregator.series.core import Delta, Series
from aggregator.series.segment import (
    Header,
    SegmentError,
    committed_prefix,
    decode_header,
    decode_record,
    encode_header,
    encode_record,
    record_size,
)
from aggregator.service.core.checkpoint import Checkpoint, Counters
from aggregator.service.series_file import (
    SeriesFileError,
    SeriesWrite,
    old_path,
    recover_series,
    series_path_for,
)
from edge.spec import MechanismSpec
from tests.aggregator.test_series_core import fingerprint

SPEC = MechanismSpec(mechanism="coco", d=5, s=2, epsilon=1.0)
DEP = "series-test"
R = 10


def partial(rng: np.random.Generator, size: int) -> AggregateState:
    state = AggregateState(SPEC)
    state.add(rng.integers(0, 2**32, size=size, dtype=np.uint64), rng.integers(0, SPEC.t, size))
    return state


def new_series() -> Series:
    return Series(SPEC, round_seconds=R, retention=10**9, step=60, coarse_retention=10**9)


def rows(series: Series) -> list[tuple[object, ...]]:
    """Every row's identity and sums (:func:`tests.aggregator.test_series_core.fingerprint`)."""
    return fingerprint(series)


def checkpoint(path: Path, seq: int | None, generation: int = 1) -> Checkpoint:
    return Checkpoint(
        fingerprint=SPEC.fingerprint,
        deployment=DEP,
        delta=1e-6,
        state=AggregateState(SPEC),
        batch_rounds={},
        counters=Counters(),
        smallest_batch=None,
        latest_batch=None,
        batch_sizes={},
        last_batch_timestamp=None,
        generation=generation,
        series_seq=seq,
        path=path,
    )


class Writer:
    """A series and its file, written generation by generation as the service does."""

    def __init__(self, tmp_path: Path, seed: int = 1) -> None:
        self.ckpt = tmp_path / "agg.json"
        self.rng = np.random.default_rng(seed)
        self.series = new_series()
        self.file = recover_series(self.ckpt, None, new_series(), deployment=DEP).file
        self.seqs: list[int] = []
        """The checkpoint's sequence number after each generation."""
        self.rows_at: list[list[tuple[object, ...]]] = []
        """The rows after each generation."""

    def batches(self, rounds: range, per_round: int = 2) -> None:
        for round_ in rounds:
            for _ in range(per_round):
                size = int(self.rng.integers(5, 30))
                self.series.add(round_, partial(self.rng, size), batch_size=size)

    def write(self) -> SeriesWrite:
        deltas = tuple(self.series.take())
        return SeriesWrite(
            deltas,
            self.series.seq,
            len(self.series),
            self.series.rolled_before,
            self.series.step,
            -math.inf,
        )

    def generation(self, *, compact: bool = False) -> None:
        """Append, "write the checkpoint", commit; compacted when asked (and allowed)."""
        write = self.write()
        self.file.append(write)
        self.file.commit()
        self.series.committed(write.seq)
        if compact and len(self.file.committed_seqs) == 2:
            self.file.compact(write)
        self.seqs.append(write.seq)
        self.rows_at.append(rows(self.series))

    @property
    def path(self) -> Path:
        return series_path_for(self.ckpt)

    def recover(self, seq: int | None, **kwargs: bool) -> Series:
        series = new_series()
        recover_series(self.ckpt, checkpoint(self.ckpt, seq), series, deployment=DEP, **kwargs)
        return series


def test_records_and_headers_decode_to_what_was_encoded() -> None:
    delta = Delta(
        seq=7,
        coarse=True,
        round=12,
        start=3600,
        end=7200,
        n=99,
        sum_u=np.array([1, -2, 3, -(2**40), 5], dtype=np.int64),
        sum_v=np.array([0, 2, 0, 2**50, 1], dtype=np.int64),
        batches=4,
        smallest=None,
        rounds=6,
    )
    data = encode_record(delta)
    assert len(data) == record_size(SPEC.d) == 85 + 16 * SPEC.d
    back, end = decode_record(data, 0, SPEC.d)
    assert end == len(data)
    assert (back.seq, back.coarse, back.round, back.start, back.end) == (7, True, 12, 3600, 7200)
    assert (back.n, back.batches, back.smallest, back.rounds) == (99, 4, None, 6)
    assert back.sum_u.tolist() == delta.sum_u.tolist()
    assert back.sum_v.tolist() == delta.sum_v.tolist()
    header = Header("dép", SPEC.fingerprint, SPEC.d, 41)
    assert decode_header(encode_header(header) + data) == (header, len(encode_header(header)))


def test_each_flipped_bit_of_a_record_is_caught() -> None:
    rng = np.random.default_rng(3)
    delta = Delta(
        seq=1,
        coarse=False,
        round=1,
        start=10,
        end=20,
        n=5,
        sum_u=rng.integers(-100, 100, SPEC.d),
        sum_v=rng.integers(0, 100, SPEC.d),
        batches=1,
        smallest=5,
    )
    data = encode_record(delta)
    for bit in range(8 * len(data)):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(SegmentError) as caught:
            decode_record(bytes(damaged), 0, SPEC.d)
        assert caught.value.offset == 0


def test_a_restart_replays_the_committed_records_and_cuts_the_rest(tmp_path: Path) -> None:
    w = Writer(tmp_path)
    for k in range(4):
        w.batches(range(3 * k, 3 * k + 4))
        w.generation()
    committed = w.path.stat().st_size
    # the next generation's records appended, its checkpoint never written (a kill -9)
    w.batches(range(12, 15))
    w.file.append(w.write())
    assert w.path.stat().st_size > committed
    assert rows(w.recover(w.seqs[-1])) == w.rows_at[-1]
    assert w.path.stat().st_size == committed  # cut on disk
    assert rows(w.recover(w.seqs[-1])) == w.rows_at[-1]  # and again, unchanged


def test_a_checkpoint_rolled_back_to_its_previous_generation_cuts_the_newest(
    tmp_path: Path,
) -> None:
    """The newest checkpoint damaged (or rolled back after a takeover): the previous
    generation's sequence number cuts off the newest generation's records, whose batches
    the broker redelivers (never acknowledged); nothing of them stays counted."""
    w = Writer(tmp_path)
    for k in range(3):
        w.batches(range(2 * k, 2 * k + 3))
        w.generation()
    assert rows(w.recover(w.seqs[-2])) == w.rows_at[-2]
    assert rows(w.recover(w.seqs[-2])) == w.rows_at[-2]


def test_compaction_keeps_what_the_previous_generation_can_fall_back_to(tmp_path: Path) -> None:
    w = Writer(tmp_path)
    for k in range(8):
        w.batches(range(k, k + 6), per_round=3)
        w.generation(compact=True)
    records = w.file.records
    assert records < sum(1 for _ in range(8)) * 6  # merged: fewer records than written
    assert rows(w.recover(w.seqs[-1])) == w.rows_at[-1]
    before = w.path.read_bytes()
    assert rows(w.recover(w.seqs[-2])) == w.rows_at[-2]  # the fallback still separates
    assert len(w.path.read_bytes()) < len(before)
    with pytest.raises(SeriesFileError, match="compacted up to sequence"):
        w.recover(w.seqs[-4])  # older than what the file kept apart
    # the compacted records are required even where the header's base covers the checkpoint
    data = bytearray(w.path.read_bytes())
    header, first = decode_header(bytes(data))
    assert header.base_records > 0
    assert header.base_seq == w.seqs[-2]
    data[first + 30] ^= 1
    w.path.write_bytes(bytes(data))
    with pytest.raises(SeriesFileError, match=f"checksum at offset {first};"):
        w.recover(w.seqs[-2])
    w.path.write_bytes(bytes(data[: first + 7]))
    with pytest.raises(SeriesFileError, match="cut short"):
        w.recover(w.seqs[-2])


def damage_cases(w: Writer) -> dict[str, tuple[bytes, int, str]]:
    """Each kind of damage to the committed part: (new bytes, expected offset, problem)."""
    data = w.path.read_bytes()
    _, first = decode_header(data)
    size = record_size(SPEC.d)
    second = first + size
    flipped = bytearray(data)
    flipped[second + 40] ^= 0x10
    zeroed = bytearray(data)
    zeroed[second : second + 64] = bytes(64)
    other = encode_header(Header("elsewhere", SPEC.fingerprint, SPEC.d)) + data[first:]
    spec = encode_header(Header(DEP, "0badf00d", SPEC.d)) + data[first:]
    header = bytearray(data)
    header[12] ^= 1
    return {
        "bit flip": (bytes(flipped), second, "does not match its checksum"),
        "zeroed block": (bytes(zeroed), second, "length is 0"),
        "cut inside a record": (data[: second + size // 2], second, "cut short"),
        "cut between records": (data[:second], second, "ends at sequence"),
        "foreign deployment": (other, 0, "belongs to deployment 'elsewhere'"),
        "foreign spec": (spec, 0, "belongs to spec '0badf00d'"),
        "damaged header": (bytes(header), 0, "header does not match its checksum"),
        "not a series file": (b'{"version": 3}' + data, 0, "not a series file"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "bit flip",
        "zeroed block",
        "cut inside a record",
        "cut between records",
        "foreign deployment",
        "foreign spec",
        "damaged header",
        "not a series file",
    ],
)
def test_damage_before_the_checkpoints_sequence_is_refused_in_one_line(
    tmp_path: Path, case: str
) -> None:
    w = Writer(tmp_path)
    for k in range(3):
        w.batches(range(k, k + 3))
        w.generation()
    data, offset, problem = damage_cases(w)[case]
    w.path.write_bytes(data)
    with pytest.raises(SeriesFileError) as caught:
        w.recover(w.seqs[-1])
    message = str(caught.value)
    assert "\n" not in message
    assert str(w.path) in message
    assert problem in message
    assert f"at offset {offset}" in message
    assert "--new-series" in message
    assert w.path.read_bytes() == data  # refused: nothing cut, nothing rewritten


@pytest.mark.parametrize("kind", ["bit flip", "zeroed block", "cut short", "garbage"])
def test_damage_after_the_checkpoints_sequence_is_cut_off(tmp_path: Path, kind: str) -> None:
    """A torn or damaged append after the checkpoint (written, never committed): cut."""
    w = Writer(tmp_path)
    for k in range(3):
        w.batches(range(k, k + 3))
        w.generation()
    committed = w.path.read_bytes()
    w.batches(range(5, 9))
    w.file.append(w.write())
    tail = bytearray(w.path.read_bytes()[len(committed) :])
    if kind == "bit flip":
        tail[len(tail) // 2] ^= 4
    elif kind == "zeroed block":
        tail[: min(len(tail), 100)] = bytes(min(len(tail), 100))
    elif kind == "cut short":
        tail = tail[: len(tail) - 7]
    else:
        tail = bytearray(b"\xff" * 33)
    w.path.write_bytes(committed + bytes(tail))
    assert rows(w.recover(w.seqs[-1])) == w.rows_at[-1]
    assert w.path.read_bytes() == committed


def test_a_missing_file_is_refused_unless_nothing_was_committed(tmp_path: Path) -> None:
    w = Writer(tmp_path)
    w.batches(range(3))
    w.generation()
    w.path.unlink()
    with pytest.raises(SeriesFileError, match=r"is missing.*--new-series"):
        w.recover(w.seqs[-1])
    assert w.recover(0).seq == 0  # a checkpoint of nothing: a new file
    assert decode_header(w.path.read_bytes())[0] == Header(DEP, SPEC.fingerprint, SPEC.d, 0)


def test_new_series_sets_the_file_aside_and_starts_past_the_checkpoint(tmp_path: Path) -> None:
    w = Writer(tmp_path)
    for k in range(2):
        w.batches(range(k, k + 3))
        w.generation()
    data = w.path.read_bytes()
    w.path.write_bytes(data[:-5])  # damaged
    series = w.recover(w.seqs[-1], anew=True)
    assert len(series) == 0
    assert series.seq == w.seqs[-1]
    assert old_path(w.path).read_bytes() == data[:-5]
    # a crash before the next checkpoint: the same checkpoint still resumes
    assert len(w.recover(w.seqs[-1])) == 0
    # the series goes on from there, its records numbered past the checkpoint's
    file = recover_series(w.ckpt, checkpoint(w.ckpt, w.seqs[-1]), series, deployment=DEP).file
    series.add(40, partial(w.rng, 9), batch_size=9)
    deltas = tuple(series.take())
    file.append(SeriesWrite(deltas, series.seq, len(series), -math.inf, 60, -math.inf))
    file.commit()
    again = w.recover(series.seq)
    assert rows(again) == rows(series)


def test_a_checkpoint_without_a_series_starts_one_and_keeps_a_stray_file(tmp_path: Path) -> None:
    w = Writer(tmp_path)
    w.batches(range(3))
    w.generation()
    stray = w.path.read_bytes()
    series = w.recover(None)  # a checkpoint written before the field
    assert len(series) == 0
    assert series.seq == 0
    assert old_path(w.path).read_bytes() == stray
    assert (
        committed_prefix(
            w.path.read_bytes(), expect=Header(DEP, SPEC.fingerprint, SPEC.d), upto=0
        ).deltas
        == []
    )


def test_a_failed_append_is_written_again_whole(tmp_path: Path) -> None:
    """The checkpoint after an append failed: the records stay pending and the next
    generation cuts the file back and writes them again with the new ones, once each."""
    w = Writer(tmp_path)
    w.batches(range(3))
    w.generation()
    w.batches(range(2, 5))
    w.file.append(w.write())
    w.file.abandon()  # the checkpoint could not be written
    w.batches(range(4, 7))
    w.generation()
    assert rows(w.recover(w.seqs[-1])) == w.rows_at[-1]
