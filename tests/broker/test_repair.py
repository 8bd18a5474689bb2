"""``coco shuffler repair``: a damaged log is salvaged before and after the damage, a copy
is kept, and what was dropped is reported (records, bytes and reports, exactly or
"unknown")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.core.effects import Effect
from broker.core.machine import Admitted, Closed, Configured, CoreConfig, ShufflerCore
from broker.store.records import FILE_HEADER_SIZE
from broker.store.repair import repair
from broker.store.wal import EffectLog, LogDamagedError, StateDir
from sim.cli import app

CONFIG = CoreConfig(fingerprint=1, t=8, round_seconds=10, min_batch=2)


def admitted(round_: int, first: int, n: int) -> Admitted:
    ids = range(first, first + n)
    return Admitted(
        round_,
        b"".join((i * 2654435761 % 2**64).to_bytes(8, "little") for i in ids),
        b"".join(i.to_bytes(4, "little") for i in ids),
        b"".join((i % 8).to_bytes(2, "little") for i in ids),
    )


EFFECTS: list[Effect] = [
    Configured(10, 1),
    admitted(100, 0, 5),
    admitted(100, 5, 7),  # the one damaged below
    Closed(500),
    admitted(101, 20, 3),
]


def state_of(effects: list[Effect]) -> tuple[object, ...]:
    core = ShufflerCore(CONFIG)
    for effect in effects:
        core.apply(effect)
    return core.state_digest()


def damaged_state_dir(tmp_path: Path, where: str) -> Path:
    state = tmp_path / "state"
    with StateDir(state):
        log = EffectLog(state / "effects.log")
        log.replay()
        starts = []
        for effect in EFFECTS:
            starts.append(log.size)
            log.append(effect)
        log.close()
    data = bytearray((state / "effects.log").read_bytes())
    data[starts[2] + (6 if where == "length" else 40)] ^= 0x04
    (state / "effects.log").write_bytes(bytes(data))
    with pytest.raises(LogDamagedError, match=f"offset {starts[2]}"):
        EffectLog(state / "effects.log").replay()
    return state


@pytest.mark.parametrize("where", ["length", "body"])
def test_repair_keeps_every_intact_record_and_reports_the_loss(tmp_path: Path, where: str) -> None:
    state = damaged_state_dir(tmp_path, where)
    original = (state / "effects.log").read_bytes()
    report = repair(state, CONFIG)
    assert report.copy is not None
    assert Path(report.copy).read_bytes() == original  # the damaged file is kept
    assert report.records_kept == 4  # before and after the damage
    assert report.bytes_dropped == len(admitted(100, 5, 7).seeds) * 14 // 4 + 8 + 17
    (stretch,) = report.damaged_stretches
    assert stretch["acknowledged"] is True
    # counted against the acknowledged end, whether or not the head survived
    assert report.acknowledged_end == "checked"
    assert report.records_dropped == 1
    assert report.reports_dropped == 7
    assert report.released_reports_dropped == 0
    if where == "body":  # the head survived: its kind is known, and no batch released them
        assert stretch["records"] == ["admitted"]
        assert report.reports_lost == 7
    else:  # a damaged head: which record it was, and so whether it is lost, is unknown
        assert "records" not in stretch
        assert report.reports_lost == "unknown"
    # the repaired log replays to the state without the damaged record
    recovered = EffectLog(state / "effects.log").replay()
    assert state_of(recovered) == state_of([e for i, e in enumerate(EFFECTS) if i != 2])
    assert (state / "effects.log").read_bytes()[:8] == b"COCOSLOG"


def test_repair_from_the_command_line(tmp_path: Path) -> None:
    state = damaged_state_dir(tmp_path, "body")
    result = CliRunner().invoke(app, ["shuffler", "repair", "--state-dir", str(state)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["reports_lost"] == 7
    assert document["records_kept"] == 4
    assert len(EffectLog(state / "effects.log").replay()) > 0


def test_repair_refuses_a_running_shuffler_s_state(tmp_path: Path) -> None:
    state = damaged_state_dir(tmp_path, "body")
    with StateDir(state):
        result = CliRunner().invoke(app, ["shuffler", "repair", "--state-dir", str(state)])
    assert result.exit_code == 1
    assert "another shuffler" in result.output


def test_header_size_is_what_the_format_says() -> None:
    assert FILE_HEADER_SIZE == 20


@pytest.mark.parametrize("made", [False, True])
def test_repair_refuses_a_directory_without_shuffler_state(tmp_path: Path, made: bool) -> None:
    """A mistyped --state-dir (missing, or a directory with no log) is refused in one line
    and nothing is created in it."""
    state = tmp_path / "typo"
    if made:
        state.mkdir()
    result = CliRunner().invoke(app, ["shuffler", "repair", "--state-dir", str(state)])
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ")
    assert str(state) in line
    assert "not a shuffler state directory" in line
    assert (list(state.iterdir()) == []) if made else not state.exists()
