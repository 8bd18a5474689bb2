"""The curve file: the certified curve's points kept across a restart, used only when they
are exactly the points this process would compute (real files, no mocks)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aggregator.accountant import composition
from aggregator.accountant.batch_pld import curve_points, recompute_curve_point
from aggregator.accountant.blanket import blanket_pair_for_spec
from aggregator.accountant.history import accounting_size, epsilon_total_rounds
from aggregator.ledger import accountant_process
from aggregator.ledger.curve_file import CurveFile, curves_path_for, decode_curves
from aggregator.ledger.ledger_file import canonical_json, ledger_path_for
from aggregator.ledger.levels import LedgerSnapshot
from aggregator.ledger.privacy_ledger import PrivacyLedger
from edge.spec import MechanismSpec
from tests import waiting
from tests.aggregator.test_batch_rules import agg_config

SPEC = MechanismSpec(mechanism="coco", d=128, s=8, epsilon=1.0)
OTHER = MechanismSpec(mechanism="coco", d=128, s=8, epsilon=1.5)
DELTA = 1e-8
HISTORY = {40_000: 9, 50_000: 13, 61_440: 6}
"""Three accounting sizes (small: a few milliseconds per point)."""
LOGGER = "aggregator.ledger.curve_file"


@pytest.fixture(autouse=True)
def fresh_caches() -> Iterator[None]:
    composition.clear_caches()
    yield
    composition.clear_caches()


def uncached(history: dict[int, int], spec: MechanismSpec = SPEC) -> float:
    """``epsilon_total`` as a process that just started computes it, with no file."""
    composition.clear_caches()
    value = epsilon_total_rounds(spec, history, delta=DELTA)
    composition.clear_caches()
    return value


def written(path: Path, history: dict[int, int] = HISTORY, spec: MechanismSpec = SPEC) -> float:
    """Compute ``history`` and write the curve file a service would (then forget it all)."""
    value = epsilon_total_rounds(spec, history, delta=DELTA)
    assert CurveFile(path, spec, DELTA).save()
    composition.clear_caches()
    return value


def restarted(path: Path, history: dict[int, int] = HISTORY) -> tuple[int, float]:
    """As a restarted process: read the file, then compute (sizes read, epsilon_total)."""
    composition.clear_caches()
    loaded = CurveFile(path, SPEC, DELTA).load()
    return loaded, epsilon_total_rounds(SPEC, history, delta=DELTA)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelname == "WARNING"]


def reseal(path: Path, change: Any) -> None:
    """Change the file's JSON with ``change`` and write a matching SHA-256 (a file whose
    checksum is right but whose content is not what this code would write)."""
    document = json.loads(path.read_text(encoding="utf-8"))
    change(document)
    covered = {"pins": document["pins"], "curves": document["curves"]}
    document["sha256"] = hashlib.sha256(canonical_json(covered).encode("ascii")).hexdigest()
    path.write_text(canonical_json(document) + "\n", encoding="utf-8")


def test_the_file_round_trips_and_the_cached_result_is_the_uncached_one_bit_for_bit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.curves"
    expected = uncached(HISTORY)
    assert written(path) == expected
    held = decode_curves(path.read_text(encoding="utf-8"), spec=SPEC, delta=DELTA)
    assert [r.pair.n for r in held] == sorted(accounting_size(n) for n in HISTORY)
    file = CurveFile(path, SPEC, DELTA)
    assert file.load() == 3
    assert file.held == held
    assert epsilon_total_rounds(SPEC, HISTORY, delta=DELTA) == expected  # bit for bit
    # every point came from the file: the computation added none, nothing to write
    assert curve_points() == held
    assert not file.save()


def test_every_point_read_back_is_what_a_fresh_engine_computes(tmp_path: Path) -> None:
    path = tmp_path / "ledger.curves"
    written(path)
    for record in decode_curves(path.read_text(encoding="utf-8"), spec=SPEC, delta=DELTA):
        for j, value in enumerate(record.deltas):
            fresh, finishes = recompute_curve_point(record, j)
            assert fresh == value
            assert finishes == (record.finished and j == len(record.deltas) - 1)


def test_a_file_that_stops_above_the_floor_is_extended_to_the_same_result(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.curves"
    few = {40_000: 1, 61_440: 1}  # 2 rounds: a floor far above 1,000 rounds'
    written(path, few)
    held = decode_curves(path.read_text(encoding="utf-8"), spec=SPEC, delta=DELTA)
    short = {r.pair.n: len(r.deltas) for r in held}
    many = {40_000: 500, 61_440: 500}
    expected = uncached(many)
    loaded, value = restarted(path, many)
    assert loaded == 2
    assert value == expected
    longer = {r.pair.n: len(r.deltas) for r in curve_points()}
    assert all(longer[n] >= short[n] for n in short)
    assert any(longer[n] > short[n] for n in short)


def damage_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    at = data.index(b'"deltas":[') + 12  # a digit of the first size's first delta
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def damage_truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def damage_lower_every_delta(path: Path) -> None:
    def lower(document: dict[str, Any]) -> None:
        for curve in document["curves"]:
            curve["deltas"] = [d * 0.5 for d in curve["deltas"]]

    reseal(path, lower)


def damage_other_tail(path: Path) -> None:
    def tail(document: dict[str, Any]) -> None:
        document["pins"]["curve"]["tail"] = 1e-18

    reseal(path, tail)


def damage_other_engine(path: Path) -> None:
    def engine(document: dict[str, Any]) -> None:
        document["pins"]["engine"] = "0" * 64

    reseal(path, engine)


def damage_skipped_point(path: Path) -> None:
    def skip(document: dict[str, Any]) -> None:
        curve = document["curves"][0]
        del curve["indices"][1]
        del curve["deltas"][1]

    reseal(path, skip)


def damage_not_a_delta(path: Path) -> None:
    def nan(document: dict[str, Any]) -> None:
        document["curves"][-1]["deltas"][0] = math.nan

    reseal(path, nan)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (damage_flip, "the SHA-256 does not match"),
        (damage_truncate, "not valid JSON"),
        (damage_lower_every_delta, "computed afresh"),
        (damage_other_tail, "curve differ"),
        (damage_other_engine, "engine differ"),
        (damage_skipped_point, "not the schedule's"),
        (damage_not_a_delta, "not a delta in [0, 1]"),
    ],
)
def test_a_damaged_or_forged_file_is_ignored_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Any, reason: str
) -> None:
    path = tmp_path / "ledger.curves"
    expected = uncached(HISTORY)
    written(path)
    damage(path)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        loaded, value = restarted(path)
    assert loaded == 0
    assert value == expected
    (warning,) = warnings_of(caplog)
    assert str(path) in warning
    assert reason in warning


def test_a_file_of_another_spec_or_delta_is_not_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.curves"
    written(path, spec=OTHER)
    expected = uncached(HISTORY)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        loaded, value = restarted(path)
    assert loaded == 0
    assert value == expected
    (warning,) = warnings_of(caplog)
    assert "exp_epsilon0" in warning
    assert "spec" in warning

    caplog.clear()
    written(path)
    composition.clear_caches()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert CurveFile(path, SPEC, 1e-6).load() == 0
    (warning,) = warnings_of(caplog)
    assert "delta differ" in warning


def test_a_file_is_written_only_with_its_specs_sizes_and_only_when_points_were_added(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.curves"
    epsilon_total_rounds(OTHER, {50_000: 3}, delta=DELTA)  # another ledger of the process
    file = CurveFile(path, SPEC, DELTA)
    assert not file.save()  # none of this spec's points yet
    assert not path.exists()
    epsilon_total_rounds(SPEC, {40_000: 2}, delta=DELTA)
    assert file.save()
    held = decode_curves(path.read_text(encoding="utf-8"), spec=SPEC, delta=DELTA)
    assert [r.pair for r in held] == [blanket_pair_for_spec(SPEC, n=accounting_size(40_000))]
    mtime = path.stat().st_mtime_ns
    epsilon_total_rounds(SPEC, {40_000: 2}, delta=DELTA)
    assert not file.save()
    assert path.stat().st_mtime_ns == mtime


def test_a_file_that_cannot_be_written_is_warned_once_and_costs_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.curves"
    path.mkdir()  # a directory in its place: the rename fails
    file = CurveFile(path, SPEC, DELTA)
    epsilon_total_rounds(SPEC, {40_000: 2}, delta=DELTA)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert not file.save()
        epsilon_total_rounds(SPEC, {50_000: 2}, delta=DELTA)
        assert not file.save()
    (warning,) = warnings_of(caplog)
    assert "cannot write curve file" in warning


def test_the_service_keeps_the_file_beside_the_ledger(tmp_path: Path) -> None:
    config = agg_config(tmp_path)
    assert config.checkpoint is not None
    assert config.curves_path == curves_path_for(ledger_path_for(config.checkpoint))
    assert agg_config().curves_path is None


def snapshot_of(history: dict[int, int]) -> LedgerSnapshot:
    """A ledger's snapshot after ``count`` rounds of each ``size`` of ``history``."""
    ledger = PrivacyLedger(SPEC, delta=DELTA)
    for size, count in history.items():
        for _ in range(count):
            ledger.record(size)
    return ledger.snapshot()


def test_the_accountants_process_writes_the_file_and_a_new_one_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.curves"
    snapshot = snapshot_of(HISTORY)
    accountant_process.shutdown()
    try:
        first = asyncio.run(accountant_process.compute_level(SPEC, DELTA, snapshot, curves=path))
        held = decode_curves(path.read_text(encoding="utf-8"), spec=SPEC, delta=DELTA)
        assert len(held) == 3
        accountant_process.shutdown()  # a restart: a new process, nothing cached
        second = asyncio.run(accountant_process.compute_level(SPEC, DELTA, snapshot, curves=path))
    finally:
        accountant_process.shutdown()
    assert second == first
    assert first.epsilon_total == uncached(HISTORY)
    assert decode_curves(path.read_text(encoding="utf-8"), spec=SPEC, delta=DELTA) == held


KILLED = dict.fromkeys((327_680, 393_216, 458_752, 524_288, 655_360, 786_432, 917_504), 2)
"""Seven accounting sizes of 0.05-0.2 s of points each: a first start takes long enough to be
killed in the middle."""


def test_a_first_start_killed_halfway_keeps_the_sizes_it_finished(tmp_path: Path) -> None:
    """The accountant's process writes the file after each size it finished (not only after
    the whole composition): killed with SIGKILL once the file appeared, the file holds some
    of the sizes, each point the engine's bit for bit; the call is retried in a new process,
    which reads them and computes the rest, and the result is the uncached one exactly."""
    path = tmp_path / "ledger.curves"
    snapshot = snapshot_of(KILLED)
    accountant_process.shutdown()
    try:
        call = accountant_process.submit_level(SPEC, DELTA, snapshot, curves=path)
        waiting.wait_until(
            path.exists, progress=lambda: waiting.cpu_seconds(accountant_process.worker_pid())
        )
        pid = accountant_process.worker_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        kept = decode_curves(path.read_text(encoding="utf-8"), spec=SPEC, delta=DELTA)
        level = call.result()
        final = decode_curves(path.read_text(encoding="utf-8"), spec=SPEC, delta=DELTA)
    finally:
        accountant_process.shutdown()
    assert 1 <= len(kept) < len(KILLED)
    for record in kept:
        last = len(record.deltas) - 1
        assert recompute_curve_point(record, last) == (record.deltas[last], record.finished)
        assert record in final
    assert sorted(r.pair.n for r in final) == sorted(KILLED)
    assert level.epsilon_total == uncached(KILLED)
