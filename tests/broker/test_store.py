"""The shuffler's durable state: the effect log's format, torn tails, damage, compaction,
the state directory's lock and keys."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from broker.core import (
    Accepted,
    Acked,
    Carried,
    Closed,
    Dropped,
    Effect,
    Outboxed,
    Pooled,
    Released,
    Seen,
)
from broker.store import (
    EffectLog,
    StateDir,
    StoreError,
    decode_effects,
    encode_accepted,
    encode_effect,
    token_of,
)

TOKEN = bytes(range(16))
EFFECTS: list[Effect] = [
    Accepted(7, TOKEN, 0xFFFFFFFF, 65535),
    Seen(7, TOKEN),
    Pooled(8, TOKEN, 1, 2),
    Released(7, (b"\x01\x02" + bytes(100), b"")),
    Outboxed((b"x" * 30,)),
    Carried(7, 9),
    Dropped(3, "small_round"),
    Closed(0xFFFFFFFF),
    Acked(TOKEN),
]


def test_every_effect_round_trips() -> None:
    data = b"".join(encode_effect(e) for e in EFFECTS)
    assert decode_effects(data) == (EFFECTS, len(data))
    for effect in (Accepted(0, TOKEN, 0, 0), Accepted(0xFFFFFFFF, TOKEN, 0xFFFFFFFF, 65535)):
        assert encode_accepted(effect) == encode_effect(effect)  # the hot path, same bytes


def test_a_record_cut_short_at_the_end_is_discarded_and_truncated(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    whole = b"".join(encode_effect(e) for e in EFFECTS)
    path.write_bytes(whole + encode_effect(Accepted(1, TOKEN, 1, 1))[:-3])
    log = EffectLog(path)
    assert log.replay() == EFFECTS
    assert path.read_bytes() == whole
    log.append(Acked(TOKEN))
    log.close()
    assert EffectLog(path).replay() == [*EFFECTS, Acked(TOKEN)]


@pytest.mark.parametrize("position", [0, 5, 40])
def test_a_damaged_record_names_the_file_and_offset(tmp_path: Path, position: int) -> None:
    path = tmp_path / "effects.log"
    data = bytearray(b"".join(encode_effect(e) for e in EFFECTS))
    data[position] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=rf"{path}.*offset \d+"):
        EffectLog(path).replay()


def test_compaction_replaces_the_log_atomically(tmp_path: Path) -> None:
    log = EffectLog(tmp_path / "effects.log")
    log.replay()
    log.extend(EFFECTS)
    log.compact([Closed(5)])
    log.append(Seen(6, TOKEN))
    log.close()
    assert EffectLog(tmp_path / "effects.log").replay() == [Closed(5), Seen(6, TOKEN)]
    assert not (tmp_path / "effects.log.compact").exists()
    assert stat.S_IMODE(os.stat(tmp_path / "effects.log").st_mode) == 0o600


def test_state_dir_lock_keys_and_modes(tmp_path: Path) -> None:
    with StateDir(tmp_path / "s") as state:
        key = state.token_key()
        signer = state.signer("dep")
        with pytest.raises(StoreError, match="another shuffler"), StateDir(tmp_path / "s"):
            pass
    with StateDir(tmp_path / "s") as state:
        assert state.token_key() == key  # persistent: replays stay duplicates
        assert state.signer("dep").public_key_hex == signer.public_key_hex
    for name in ("token.key", "signing.key"):
        assert stat.S_IMODE(os.stat(tmp_path / "s" / name).st_mode) == 0o600
    assert (tmp_path / "s" / "signing.pub").read_text().strip() == signer.public_key_hex
    assert token_of(key, "dev-1") != token_of(key, "dev-2")
    assert token_of(key, "dev-1") != token_of(bytes(32), "dev-1")
    (tmp_path / "s" / "token.key").write_bytes(b"short")
    with StateDir(tmp_path / "s") as state, pytest.raises(StoreError, match=r"token\.key"):
        state.token_key()


def test_staged_records_reach_the_disk_only_when_written_and_in_order(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    log = EffectLog(path)
    log.replay()
    log.stage(EFFECTS[0])
    log.stage(EFFECTS[1])
    assert path.read_bytes() == b""  # nothing is on disk before the write
    assert log.staged == len(encode_effect(EFFECTS[0])) + len(encode_effect(EFFECTS[1]))
    log.flush()
    assert log.staged == 0
    assert decode_effects(path.read_bytes(), name="log")[0] == EFFECTS[:2]
    log.stage(EFFECTS[2])
    log.extend(EFFECTS[3:5])  # staged records go first, in one write
    log.stage(EFFECTS[5])
    log.append(EFFECTS[6])
    assert decode_effects(path.read_bytes(), name="log")[0] == EFFECTS[:7]
    log.stage(EFFECTS[7])
    log.compact([Closed(5)])  # the snapshot replaces what was staged, nothing follows it
    assert EffectLog(path).replay() == [Closed(5)]
    log.stage(EFFECTS[8])
    log.close()  # closing writes what is staged
    assert EffectLog(path).replay() == [Closed(5), EFFECTS[8]]


def test_a_failed_write_drops_the_staged_records(tmp_path: Path) -> None:
    path = tmp_path / "effects.log"
    log = EffectLog(path)
    log.replay()
    log.stage(EFFECTS[0])
    assert log._fd is not None
    os.close(log._fd)  # the descriptor is gone: the real write(2) fails (EBADF)
    with pytest.raises(OSError, match="Bad file descriptor"):
        log.flush()
    assert log.staged == 0  # none of them was acknowledged; the broker redelivers them
    # the failure sticks: nothing more is staged or written (a record after a torn one
    # would be unreadable), so nothing staged later can be taken for written
    with pytest.raises(OSError, match="failed earlier"):
        log.stage(EFFECTS[1])
    with pytest.raises(OSError, match="failed earlier"):
        log.flush()
    with pytest.raises(OSError, match="failed earlier"):
        log.extend(EFFECTS[2:3])
    with pytest.raises(OSError, match="failed earlier"):
        log.compact([Closed(5)])
    log._fd = None
    assert path.read_bytes() == b""
