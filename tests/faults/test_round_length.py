"""A change of ``round_seconds``, 2 s -> 3 s -> 2 s and 60 s -> 10 s -> 60 s, done as
docs/operations.md says while a fleet reports: nothing acknowledged is lost, nothing counted
twice, nothing refused.

The stack of tests/faults/stack.py (real Mosquitto, ``coco shuffler --state-dir``, ``coco
aggregator run --checkpoint``, the independent recorder). Three fleets, one per length
(``coco fleet`` reads the round length from the announcement when it starts, as a device
does). Between them, the procedure of docs/operations.md ("Changing the deployment's
parameters"): announce the new ``round_seconds``, restart the shuffler on its state
directory; the aggregator is left running, or restarted on its checkpoint (then it reads
the new length too). Then: acknowledged == aggregated + held + dropped by the round policy,
exactly; the checkpoint's sums equal the recorder's batches, each once; no batch or
manifest refused (in particular none ``stale_round``, as every batch after the change was
before rounds were times); batches of both lengths were released, each length on the wire;
the per-round series holds one row per release round, ``[round L, (round + 1) L)`` with the
batch's own ``L``.

The schedule of 2 s and 3 s rounds changes the length by half; the one of 60 s (the default)
and 10 s by six times, in both directions, so that a round number of one length is far
from any round of the other (six times larger after 60 -> 10, six times smaller after
10 -> 60, while the aggregator's horizon and retention count rounds of the newest length).
Its rounds are real minutes: one round at 60 s, three at 10 s, one at 60 s, about four
minutes a case, mostly waiting. It is marked ``unhurried`` (scripts/test runs it at nice 10
beside the computations): its deadlines are tens of seconds wide, which a niced fleet and
services meet with room to spare.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from aggregator.service.checkpoint_files import load_checkpoint
from aggregator.service.series_file import load_series
from sim.fleet.cli import EXIT_NOT_SENT
from tests import processes
from tests.faults.stack import ROUNDS, SPEC, Stack, running_stack, settle

pytestmark = [pytest.mark.integration]

SCHEDULES = {
    "2-3-2": ((2, ROUNDS), (3, ROUNDS), (2, ROUNDS)),
    "60-10-60": ((60, 1), (10, 3), (60, 1)),
}
"""Per case, the phases: a round length and how many rounds a fleet reports at it."""
MINUTES = (pytest.mark.unhurried, pytest.mark.timeout(900))


def change_length(stack: Stack, length: int, *, restart_aggregator: bool) -> None:
    """docs/operations.md: announce the new round length, restart the shuffler (and, in
    one case, the aggregator)."""
    stack.announce(round_seconds=length)
    assert stack.shuffler.stop() == 0, stack.shuffler.output()[-2000:]
    stack.shuffler = stack.shuffler_process(f"shuffler-{length}s", stack.state_dir)
    stack.start_shuffler()
    if restart_aggregator:
        assert stack.aggregator.stop() == 0, stack.aggregator.output()[-2000:]
        stack.aggregator = stack.aggregator_process(f"aggregator-{length}s", stack.checkpoint)
        stack.start_aggregator()


def run_fleet(
    stack: Stack, phase: int, length: int, rounds: int
) -> tuple[Counter[tuple[int, int]], int]:
    """One fleet's ``rounds`` rounds at ``length``: the ``(seed, z)`` acknowledged, and when
    its last round ends (the fleet exits once it has published in it)."""
    acked_log = stack.workdir / f"acked-{phase}.log"
    fleet = stack.fleet(acked_log, seed=1000 + phase, rounds=rounds)
    fleet.start()
    assert fleet.proc is not None
    stdout, _ = fleet.proc.communicate(timeout=120)
    summary = dict(json.loads(stdout))
    assert summary["round_seconds"] == length, summary
    expected = EXIT_NOT_SENT if summary["reports_not_sent"] else 0
    assert fleet.proc.returncode == expected, fleet.output()[-2000:]
    assert summary["reports_not_sent"] == 0, summary
    reports = processes.read_acked_reports(acked_log)
    last = max(round_ for round_, _, _ in reports)
    return processes.read_acked(acked_log), (last + 1) * length


def wait_for(when: float) -> None:
    """Sleep until Unix time ``when`` (the next length's rounds must not hold an earlier
    round's start: a device reports once per round)."""
    delay = when - time.time()
    if delay > 0:
        time.sleep(delay)


@pytest.mark.parametrize("restart_aggregator", [False, True], ids=["running", "restarted"])
@pytest.mark.parametrize(
    "schedule",
    [
        pytest.param(SCHEDULES["2-3-2"], id="2-3-2", marks=pytest.mark.timeout(300)),
        pytest.param(SCHEDULES["60-10-60"], id="60-10-60", marks=MINUTES),
    ],
)
def test_round_seconds_change(
    tmp_path: Path, schedule: tuple[tuple[int, int], ...], restart_aggregator: bool
) -> None:
    lengths = [length for length, _ in schedule]
    with running_stack(tmp_path, round_seconds=lengths[0]) as stack:
        assert stack.recorder is not None
        recorder = stack.recorder
        acked: Counter[tuple[int, int]] = Counter()
        ended = 0
        for phase, (length, rounds) in enumerate(schedule):
            if phase:
                change_length(stack, length, restart_aggregator=restart_aggregator)
                wait_for(math.ceil(ended / length) * length)
            phase_acked, ended = run_fleet(stack, phase, length, rounds)
            acked += phase_acked
        wait_for(ended)  # the last round closed: its pool is due for release
        settled = settle(stack, [(stack.shuffler, stack.shuffler_port)], acked)
        assert stack.aggregator.stop() == 0, stack.aggregator.output()[-2000:]

        assert not recorder.problems, recorder.problems[:3]
        assert set(recorder.lengths.values()) == set(lengths)  # both on the wire (version 2)
        released = recorder.released
        missing = acked - released
        assert not released - acked  # nothing released that no device was told
        assert sum(missing.values()) == settled.held + settled.dropped
        checkpoint = load_checkpoint(stack.checkpoint)
        applied = {batch_id for ids in checkpoint.batch_rounds.values() for batch_id in ids}
        assert applied == set(recorder.records)  # each released batch applied, once
        offline = recorder.offline()
        assert checkpoint.state.n == offline.n == recorder.count
        assert np.array_equal(checkpoint.state.sum_u, offline.sum_u)
        assert np.array_equal(checkpoint.state.sum_v, offline.sum_v)
        assert checkpoint.counters.rejected == {}, checkpoint.counters.rejected
        assert checkpoint.counters.manifests_rejected == {}
        assert sum(acked.values()) == checkpoint.state.n + settled.held + settled.dropped
        # the series: one row per release round, its own interval of time
        series = load_series(stack.checkpoint)
        rows = {(row.start, row.end): row for row in series.rows()}
        expected: dict[tuple[int, int], list[bytes]] = {}
        for batch_id in applied:
            round_, length = recorder.rounds[batch_id], recorder.lengths[batch_id]
            expected.setdefault((round_ * length, (round_ + 1) * length), []).append(batch_id)
        assert sorted(rows) == sorted(expected)
        for key, ids in expected.items():
            state = recorder.offline(set(ids))
            assert rows[key].state.n == state.n, key
            assert np.array_equal(rows[key].state.sum_u, state.sum_u), key
            assert rows[key].batches == len(ids), key
        assert SPEC.fingerprint == checkpoint.fingerprint
        print(
            f"acknowledged {sum(acked.values())}, aggregated {checkpoint.state.n} in "
            f"{len(applied)} batches of lengths {sorted(set(recorder.lengths.values()))}, "
            f"held {settled.held}, dropped {settled.dropped}, series rows {len(rows)}"
        )
