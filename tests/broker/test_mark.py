"""The shuffler log's acknowledged end (``effects.mark``): kept after every write, across a
compaction's crash window, refused when missing or damaged, rebuilt by repair; a version-2
log (before the mark) is read by its own rules and rewritten with one."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.core.effects import Admitted, Closed, Configured, Effect
from broker.core.machine import CoreConfig
from broker.store.mark import End, decode_mark, encode_mark
from broker.store.records import FILE_HEADER_SIZE, encode_effect, file_header
from broker.store.repair import UNKNOWN, repair
from broker.store.wal import EffectLog, LogDamagedError, StoreError

CONFIG = CoreConfig(fingerprint=1, t=8, round_seconds=10, min_batch=2)


def admitted(round_: int, first: int, n: int) -> Admitted:
    ids = range(first, first + n)
    return Admitted(
        round_,
        b"".join((i * 2654435761 % 2**64).to_bytes(8, "little") for i in ids),
        b"".join(i.to_bytes(4, "little") for i in ids),
        b"".join((i % 8).to_bytes(2, "little") for i in ids),
    )


EFFECTS: list[Effect] = [Configured(10, 1), admitted(100, 0, 5), Closed(500), admitted(101, 9, 3)]


def written(state: Path) -> EffectLog:
    state.mkdir(exist_ok=True)
    log = EffectLog(state / "effects.log")
    log.replay()
    for effect in EFFECTS:
        log.append(effect)
    return log


def mark_of(state: Path) -> tuple[End, ...]:
    ends = decode_mark((state / "effects.mark").read_bytes())
    assert ends is not None
    return ends


def test_the_mark_follows_every_write(tmp_path: Path) -> None:
    log = written(tmp_path)
    (end,) = mark_of(tmp_path)
    assert end == End(log.end.salt, log.size, 4, 8, 0)
    assert end.length == (tmp_path / "effects.log").stat().st_size
    log.close()
    assert EffectLog(tmp_path / "effects.log").replay() == EFFECTS


def test_a_mark_round_trips_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    ends = (End(1, 2, 3, 4, 5), End(6, 7, 8, 9, 10))
    data = encode_mark(ends)
    assert decode_mark(data) == ends
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x10
        assert decode_mark(bytes(damaged)) is None
    written(tmp_path).close()
    mark = bytearray((tmp_path / "effects.mark").read_bytes())
    mark[20] ^= 1
    (tmp_path / "effects.mark").write_bytes(bytes(mark))
    with pytest.raises(StoreError, match=r"effects\.mark is damaged"):
        EffectLog(tmp_path / "effects.log").replay()


def test_a_missing_mark_is_refused_and_repair_writes_one(tmp_path: Path) -> None:
    written(tmp_path).close()
    (tmp_path / "effects.mark").unlink()
    with pytest.raises(StoreError, match=r"acknowledged end \(effects\.mark\) is missing"):
        EffectLog(tmp_path / "effects.log").replay()
    report = repair(tmp_path, CONFIG)
    # every record reads, but nothing says none was cut from the end
    assert report.acknowledged_end == "unknown: no effects.mark"
    assert report.records_kept == 4
    assert report.records_dropped == UNKNOWN
    assert report.reports_lost == UNKNOWN
    assert len(mark_of(tmp_path)) == 1
    assert EffectLog(tmp_path / "effects.log").replay()  # starts again


def test_a_cut_at_a_record_boundary_is_refused_not_taken_for_a_torn_tail(tmp_path: Path) -> None:
    log = written(tmp_path)
    last = log.size - len(encode_effect(EFFECTS[-1], log.end.salt))
    log.close()
    with (tmp_path / "effects.log").open("r+b") as file:
        file.truncate(last)
    with pytest.raises(LogDamagedError, match=f"damaged at offset {last}: the file ends there"):
        EffectLog(tmp_path / "effects.log").replay()
    report = repair(tmp_path, CONFIG)
    assert (report.records_dropped, report.reports_dropped, report.reports_lost) == (1, 3, UNKNOWN)


@pytest.mark.parametrize("left", ["old", "new"])
def test_a_crash_inside_a_compaction_leaves_a_log_its_mark_describes(
    tmp_path: Path, left: str
) -> None:
    """The mark holds both files' ends from before the rename until after it: whichever
    file the crash left, the start reads it (and a foreign file is refused)."""
    log = written(tmp_path)
    old_end, old_bytes = log.end, (tmp_path / "effects.log").read_bytes()
    snapshot = [EFFECTS[0], EFFECTS[2]]
    log.compact(snapshot)
    new_end, new_bytes = log.end, (tmp_path / "effects.log").read_bytes()
    log.close()
    (tmp_path / "effects.mark").write_bytes(encode_mark([old_end, new_end]))
    (tmp_path / "effects.log").write_bytes(old_bytes if left == "old" else new_bytes)
    assert EffectLog(tmp_path / "effects.log").replay() == (EFFECTS if left == "old" else snapshot)
    (tmp_path / "effects.mark").write_bytes(encode_mark([new_end]))
    (tmp_path / "effects.log").write_bytes(old_bytes)  # an older copy put back
    with pytest.raises(StoreError, match=r"not the log its effects\.mark describes"):
        EffectLog(tmp_path / "effects.log").replay()


def test_a_version_2_log_is_read_by_its_rules_and_rewritten_with_a_mark(tmp_path: Path) -> None:
    header, salt = file_header(0xBEEF, version=2)
    data = header + b"".join(encode_effect(e, salt) for e in EFFECTS)
    torn = encode_effect(admitted(101, 20, 2), salt)[:-5]
    (tmp_path / "effects.log").write_bytes(data + torn)  # its last record torn: as before
    log = EffectLog(tmp_path / "effects.log")
    assert log.replay() == EFFECTS
    log.close()
    assert (tmp_path / "effects.log").read_bytes()[8:10] == b"\x03\x00"  # version 3
    (end,) = mark_of(tmp_path)
    assert end.length == (tmp_path / "effects.log").stat().st_size
    assert EffectLog(tmp_path / "effects.log").replay() == EFFECTS


def test_a_header_written_but_not_yet_marked_is_an_empty_log(tmp_path: Path) -> None:
    """A new log's mark is written first (nothing acknowledged), then its header: a crash
    between the two, or in the header, leaves a log that starts empty."""
    log = EffectLog(tmp_path / "effects.log")
    log.replay()
    log.close()
    (end,) = mark_of(tmp_path)
    assert end.length == FILE_HEADER_SIZE
    assert end.records == 0
    (tmp_path / "effects.mark").write_bytes(encode_mark([End(end.salt)]))
    with (tmp_path / "effects.log").open("r+b") as file:
        file.truncate(7)
    assert EffectLog(tmp_path / "effects.log").replay() == []
