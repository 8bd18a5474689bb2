"""The shuffler's durable state: the log's format, torn tails against damage, version-1
logs, compaction, a full disk, the state directory's lock and keys.

The property test flips bits and cuts the file at random offsets of a real log (hundreds
of seeds): the shuffler either recovers exactly the records before the damaged one, and
only when that one is the last (a torn tail), or refuses to start naming the offset. A
damaged record anywhere else is never read as a torn tail (never a silent loss).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import struct
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.machine import (
    Acked,
    Admitted,
    Carried,
    Closed,
    Configured,
    CoreConfig,
    Dropped,
    Effect,
    Outboxed,
    Pooled,
    Released,
    Seen,
    ShufflerCore,
)
from broker.store.records import FILE_HEADER_SIZE, encode_effect, file_header, scan
from broker.store.repair import repair
from broker.store.wal import (
    EffectLog,
    LogDamagedError,
    LogFullError,
    StateDir,
    StoreError,
    token_of,
)


def cols(*tokens: int, seed: int = 7) -> tuple[bytes, bytes, bytes]:
    return (
        b"".join(t.to_bytes(8, "little") for t in tokens),
        b"".join((seed + i).to_bytes(4, "little") for i in range(len(tokens))),
        b"".join((i % 5).to_bytes(2, "little") for i in range(len(tokens))),
    )


EFFECTS: list[Effect] = [
    Configured(60, 0xC0C0),
    Admitted(7, *cols(1, 2, 3)),
    Seen(7, cols(4, 5)[0]),
    Pooled(8, 1, *cols(9, 10)),
    Released(7, (b"\x01\x02" + bytes(100), b"")),
    Outboxed((b"x" * 30,)),
    Carried(7, 9),
    Dropped(3, "small_round"),
    Closed(2**40),
    Acked(bytes(range(16))),
]


def write(path: Path, effects: list[Effect]) -> None:
    log = EffectLog(path)
    log.replay()
    for effect in effects:
        log.append(effect)
    log.close()


def STARTS_OF(data: bytes) -> list[int]:  # noqa: N802
    """Where each record of a log starts (its markers)."""
    found, position = [], FILE_HEADER_SIZE
    while (position := data.find(b"COCR", position)) >= 0:
        found.append(position)
        position += 1
    return found


def test_every_effect_round_trips(tmp_path: Path) -> None:
    write(tmp_path / "effects.log", EFFECTS)
    assert EffectLog(tmp_path / "effects.log").replay() == EFFECTS
    data = (tmp_path / "effects.log").read_bytes()
    assert data.startswith(b"COCOSLOG")


def test_a_record_cut_short_at_the_end_is_discarded_and_truncated(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    write(path, EFFECTS)
    whole = path.read_bytes()
    path.write_bytes(whole + whole[STARTS_OF(whole)[-1] :][:-3])  # the last record, torn
    log = EffectLog(path)
    assert log.replay() == EFFECTS
    assert path.read_bytes() == whole
    log.append(Acked(bytes(16)))
    log.close()
    assert EffectLog(path).replay() == [*EFFECTS, Acked(bytes(16))]


def test_a_flipped_length_in_a_middle_record_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    """The case that lost 2,001 acknowledged reports: a bit of a middle record's length."""
    path = tmp_path / "effects.log"
    write(path, EFFECTS)
    data = bytearray(path.read_bytes())
    second = FILE_HEADER_SIZE + len(encode_effect(EFFECTS[0], 0))
    data[second + 6] ^= 0x01  # the length field of the Admitted record
    path.write_bytes(bytes(data))
    with pytest.raises(LogDamagedError, match=rf"{path} is damaged at offset {second}.*repair"):
        EffectLog(path).replay()
    assert path.read_bytes() == bytes(data)  # nothing truncated


def test_a_damaged_file_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    write(path, EFFECTS)
    data = bytearray(path.read_bytes())
    data[12] ^= 0x10  # the salt: the header's crc fails
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="damaged file header"):
        EffectLog(path).replay()


def test_a_version_1_log_is_read_and_rewritten(tmp_path: Path) -> None:
    def v1(kind: int, body: bytes) -> bytes:
        head = struct.pack(">BI", kind, len(body))
        return head + body + struct.pack(">I", zlib.crc32(body, zlib.crc32(head)))

    token = bytes(range(16))
    data = v1(8, struct.pack(">I", 99))  # Closed(through round 99)
    data += v1(1, struct.pack(">I16sIH", 100, token, 5, 3))  # Accepted
    data += v1(1, struct.pack(">I16sIH", 100, token[::-1], 6, 2))
    path = tmp_path / "effects.log"
    path.write_bytes(data + b"\x01\x00")  # and a torn tail
    log = EffectLog(path, round_seconds=10)
    effects = log.replay()
    tokens = token[:8] + token[::-1][:8]
    assert effects == [
        Closed(1000),
        Admitted(100, tokens, struct.pack("<II", 5, 6), struct.pack("<HH", 3, 2)),
    ]
    log.close()
    assert path.read_bytes().startswith(b"COCOSLOG")  # rewritten in version 3
    assert EffectLog(path).replay() == effects
    # a crash inside the upgrade, after its mark was written and before the rename
    path.write_bytes(data)
    assert EffectLog(path, round_seconds=10).replay() == effects


def test_compaction_replaces_the_log_atomically_and_never_grows_it(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    log = EffectLog(path)
    log.replay()
    log.extend(EFFECTS[:2])
    assert log.compact([Configured(60, 0xC0C0), Closed(5)])
    log.append(Seen(6, cols(1)[0]))
    log.close()
    assert EffectLog(path).replay() == [Configured(60, 0xC0C0), Closed(5), Seen(6, cols(1)[0])]
    assert not (tmp_path / "effects.log.compact").exists()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # a snapshot bigger than the log is not written
    log = EffectLog(path)
    log.replay()
    size = path.stat().st_size
    assert not log.compact([Outboxed((bytes(10_000),))])
    assert path.stat().st_size == size
    log.close()


def test_restarts_of_a_pooled_state_do_not_grow_its_log(tmp_path: Path) -> None:
    """Issue 17: each restart's compaction grew a pooled log 1.7x. A pool is one record."""
    cfg = CoreConfig(fingerprint=1, t=8, round_seconds=60, min_batch=2)
    path = tmp_path / "effects.log"
    log = EffectLog(path)
    log.replay()
    core = ShufflerCore(cfg)
    for i in range(50):
        effect = Admitted(10, *cols(*range(100 * i + 1, 100 * i + 101), seed=i))
        log.append(effect)
        core.apply(effect)
    log.close()
    sizes = []
    for _ in range(3):
        log = EffectLog(path)
        again = ShufflerCore(cfg)
        for replayed in log.replay():
            again.apply(replayed)
        assert again.state_digest() == core.state_digest()
        log.compact(again.snapshot())
        log.close()
        sizes.append(path.stat().st_size)
    assert sizes[0] <= 50 * (21 + 8 + 1400) + FILE_HEADER_SIZE
    assert sizes[0] == sizes[1] == sizes[2]


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB tmpfs (root only), unmounted at the end."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
        check=False,
        capture_output=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` with a file (returned: unlink it to free it)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    with contextlib.suppress(OSError):
        while True:
            os.write(fd, b"\0" * 4096)
    os.close(fd)
    return filler


def test_a_full_disk_writes_nothing_and_can_be_retried(small_fs: Path) -> None:
    """A write that does not fit (ENOSPC, partly written or not) leaves the log as it was:
    no torn record in its middle; once space is freed the same write succeeds."""
    path = small_fs / "effects.log"
    log = EffectLog(path)
    log.replay()
    log.append(EFFECTS[0])
    size = path.stat().st_size
    filler = fill(small_fs)
    big = Admitted(5, *cols(*range(1, 2001)))  # 28 KB: cannot fit
    with pytest.raises(LogFullError) as caught:
        log.append(big)
    assert caught.value.errno == errno.ENOSPC
    assert log.failure is None  # retryable
    assert path.stat().st_size == size  # nothing of it is in the log
    filler.unlink()
    log.append(big)  # space is back
    log.close()
    assert EffectLog(path).replay() == [EFFECTS[0], big]


def test_a_compaction_or_a_key_that_does_not_fit_leaves_nothing_behind(small_fs: Path) -> None:
    """On a full disk a compaction is a retryable :class:`LogFullError` naming its file,
    the log as it was; a state directory's key file that cannot be written is a one-line
    :class:`StoreError` naming it, and no empty file is left that the next start would
    refuse."""
    path = small_fs / "effects.log"
    log = EffectLog(path)
    log.replay()
    log.extend([Admitted(5, *cols(*range(1, 101)))] * 4)
    before = path.read_bytes()
    filler = fill(small_fs)
    with pytest.raises(LogFullError) as caught:
        log.compact([Admitted(5, *cols(*range(1, 201)))])  # smaller than the log, too big
    assert str(caught.value) == f"cannot write {path}.compact: No space left on device"
    assert log.failure is None
    assert path.read_bytes() == before
    assert not (small_fs / "effects.log.compact").exists()
    with StateDir(small_fs / "state") as state, pytest.raises(StoreError) as refused:
        state.token_key()
    assert str(refused.value) == (
        f"cannot write {small_fs / 'state' / 'token.key'}: No space left on device"
    )
    assert not (small_fs / "state" / "token.key").exists()
    filler.unlink()
    assert log.compact([Admitted(5, *cols(*range(1, 201)))])  # space is back
    log.close()
    assert EffectLog(path).replay() == [Admitted(5, *cols(*range(1, 201)))]


def test_another_write_error_sticks(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    log = EffectLog(path)
    log.replay()
    log.stage(EFFECTS[0])
    assert log._fd is not None
    os.close(log._fd)  # the descriptor is gone: the real write(2) fails (EBADF)
    with pytest.raises(OSError, match="Bad file descriptor"):
        log.flush()
    assert log.staged == 0  # none of them was acknowledged; the broker redelivers them
    for attempt in (lambda: log.stage(EFFECTS[1]), log.flush, lambda: log.compact([])):
        with pytest.raises(OSError, match="failed earlier"):
            attempt()
    log._fd = None


def test_state_dir_lock_and_token_key(tmp_path: Path) -> None:
    with StateDir(tmp_path / "s") as state:
        key = state.token_key()
        with pytest.raises(StoreError, match="another shuffler"), StateDir(tmp_path / "s"):
            pass
    with StateDir(tmp_path / "s") as state:
        assert state.token_key() == key  # persistent: replays stay duplicates
    assert stat.S_IMODE(os.stat(tmp_path / "s" / "token.key").st_mode) == 0o600
    assert token_of(key, "dev-1") != token_of(key, "dev-2")
    assert token_of(key, "dev-1") != token_of(bytes(32), "dev-1")
    assert 0 <= token_of(key, "dev-1") < 2**64
    (tmp_path / "s" / "token.key").write_bytes(b"short")
    with StateDir(tmp_path / "s") as state, pytest.raises(StoreError, match=r"token\.key"):
        state.token_key()


# --- damage at random offsets --------------------------------------------------------------


def _records() -> tuple[bytes, list[int], list[Effect]]:
    """A version-2 log (no acknowledged end: read by the rules it was written under) of
    many records, and the offset where each record starts."""
    effects: list[Effect] = [Configured(10, 1)]
    for i in range(40):
        effects.append(Admitted(100 + i % 3, *cols(*range(10 * i + 1, 10 * i + 1 + i % 7 + 1))))
        if i % 9 == 4:
            effects.append(Closed(1000 * i))
        if i % 13 == 6:
            effects.append(Released(100, (bytes(60 + i),)))
    header, salt = file_header(0xBEEF, version=2)
    starts, data = [], bytearray(header)
    for effect in effects:
        starts.append(len(data))
        data += encode_effect(effect, salt)
    return bytes(data), starts, effects


LOG, STARTS, LOG_EFFECTS = _records()


@settings(max_examples=400, deadline=None)
@given(
    offset=st.integers(0, len(LOG) - 1),
    bit=st.integers(0, 7),
    cut=st.booleans(),
)
def test_damage_at_any_offset_is_refused_or_only_a_torn_last_record(
    tmp_path_factory: pytest.TempPathFactory, offset: int, bit: int, cut: bool
) -> None:
    path = tmp_path_factory.mktemp("log") / "effects.log"
    damaged = bytearray(LOG)
    if cut:
        del damaged[offset:]
    else:
        damaged[offset] ^= 1 << bit
    path.write_bytes(bytes(damaged))
    hit = sum(1 for start in STARTS if start <= offset)  # records before the damaged one
    try:
        recovered = EffectLog(path).replay()
    except StoreError as exc:
        refusal = str(exc)
    else:
        refusal = ""
    if refusal:
        assert not cut or offset < FILE_HEADER_SIZE, "a cut is a torn tail, never damage"
        assert str(path) in refusal
        return
    if offset < FILE_HEADER_SIZE:
        assert cut  # a header cut short: nothing was ever written
        assert recovered == []
        return
    # recovered: exactly the records wholly before the damage, and only the last one torn
    assert recovered == LOG_EFFECTS[: hit - 1]
    assert cut or hit == len(STARTS), "a damaged middle record was read as a torn tail"
    assert path.stat().st_size == STARTS[hit - 1]


def test_scan_reports_where_the_next_intact_record_is() -> None:
    damaged = bytearray(LOG)
    damaged[STARTS[5] + 20] ^= 0x80
    result = scan(bytes(damaged), FILE_HEADER_SIZE, 0xBEEF)
    assert result.effects == LOG_EFFECTS[:5]
    assert result.problem is not None
    assert result.problem.offset == STARTS[5]
    assert result.problem.next_good == STARTS[6]


@settings(max_examples=200, deadline=None)
@given(offset=st.integers(0, len(LOG) - 1), bit=st.integers(0, 7))
def test_repair_after_one_flipped_bit_keeps_every_other_record(
    tmp_path_factory: pytest.TempPathFactory, offset: int, bit: int
) -> None:
    """Whatever bit flips (the header's included: its salt is found again), the repair
    keeps every record but the damaged one."""
    state = tmp_path_factory.mktemp("state")
    damaged = bytearray(LOG)
    damaged[offset] ^= 1 << bit
    (state / "effects.log").write_bytes(bytes(damaged))
    report = repair(state, CoreConfig(fingerprint=1, t=8, round_seconds=10, min_batch=2))
    hit = sum(1 for start in STARTS if start <= offset)  # 0: the header
    expected = [e for i, e in enumerate(LOG_EFFECTS) if i != hit - 1]
    recovered = EffectLog(state / "effects.log").replay()

    def state_of(effects: list[Effect]) -> tuple[object, ...]:
        core = ShufflerCore(CoreConfig(fingerprint=1, t=8, round_seconds=10, min_batch=2))
        for effect in effects:
            core.apply(effect)
        return core.state_digest()

    assert state_of(recovered) == state_of(expected)
    assert report.records_kept == len(expected)
