"""Fault injection: every report acknowledged to a device is counted exactly once.

Real processes only: a Mosquitto per test, and the ``coco`` command line in subprocesses
(``coco announce``, ``coco shuffler --state-dir``, ``coco aggregator run --checkpoint``,
``coco fleet --acked-log``). A fleet of :data:`DEVICES` devices publishes :data:`ROUNDS`
wall-clock rounds of :data:`ROUND_SECONDS` s while a fault hits at a random moment, drawn
from a seeded :class:`random.Random` whose seed is logged (``FAULT_SEED=... pytest`` replays
a run's moments):

* ``kill -9`` of the shuffler, restarted on the same ``--state-dir``;
* ``kill -9`` of the aggregator, restarted on the same ``--checkpoint``;
* ``kill -9`` of the aggregator, a random bit of its newest checkpoint flipped (or the file
  cut short), restarted: it falls back to the previous generation;
* ``kill -9`` of the aggregator, its newest checkpoint replaced by the previous generation
  (as after a takeover), restarted;
* both at once;
* SIGTERM restarts of each;
* a broker restart (SIGTERM, start again) of the shipped deploy/mosquitto/mosquitto.conf,
  adapted as tests/deploy/test_acl.py does (dynamic-security plugin, ``coco credentials``,
  per-device accounts: ``coco fleet --credentials-secret-file``);
* ``kill -9`` of that broker, with its autosave and with ``autosave_on_changes``: here
  acknowledged reports can be lost (Mosquitto acknowledges before it saves), so the loss
  is printed, and only "never counted twice" is asserted.

Counts that live in a process die with it, so each case reconciles what can be observed
from outside: the ``round seed z`` lines of the reports devices got a PUBACK for (the
fleet's ``--acked-log``); every batch released on the batches topic, as seen by an
independent recorder with a persistent MQTT 5 session (deduplicated by ``batch_id``, each
signature verified with the shuffler's ``signing.pub``); the last shuffler's ``/metrics``
(reports still pooled or in its outbox, and dropped by its round policy); the aggregator's
final checkpoint. After each case:

1. acknowledged == aggregated + rejected by the aggregator + still held by the shuffler +
   dropped by the shuffler's round policy, exactly, with their reasons. A fault that cuts the
   devices' connections leaves rounds below ``min_batch``; such a pool is carried into the
   next round, and a device's report in it that meets the same device's report of that
   round is dropped, counted as ``carry_superseded`` (one report per device per batch);
2. the multiset of ``(seed, z)`` released equals the multiset acknowledged (minus what the
   shuffler still holds or dropped so); where a fault cut a device's connection before its PUBACK, a
   report may be released that no device saw acknowledged, at most as many as the fleet
   counted as unacknowledged;
3. no report aggregated twice: the checkpoint's ``n`` is the number of distinct released
   records, and its sums equal an offline :class:`AggregateState` of the recorder's batches;
4. the per-round series (the checkpoint and ``<checkpoint>.series``, read offline) holds
   each release round's sums, batch count and smallest batch exactly as recomputed from the
   recorder's batches of that round.

The stack, one case and these checks: tests/faults/stack.py. A second writer on the same
state: tests/faults/test_second_writer.py.
"""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from aggregator.ledger.ledger_file import file_digest, ledger_path_for
from aggregator.service.checkpoint_files import previous_path
from broker.store.records import ADMITTED, HEAD_SIZE, read_header, record_spans
from tests.faults.stack import Fault, Stack, pause, reconcile, run_case, running_stack
from tests.processes import coco, error_lines, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


# -- the faults -----------------------------------------------------------------------------


def kill_shuffler(stack: Stack, rng: random.Random) -> None:
    stack.shuffler.stop(signal.SIGKILL)
    pause(rng)
    stack.start_shuffler()


def kill_aggregator(stack: Stack, rng: random.Random) -> None:
    stack.aggregator.stop(signal.SIGKILL)
    pause(rng)
    stack.start_aggregator()


def kill_aggregator_damage_checkpoint(stack: Stack, rng: random.Random) -> None:
    """``kill -9`` of the aggregator once it has two checkpoint generations, a random bit
    of the newest file flipped (or the file cut short): it resumes from the previous
    generation, and the broker redelivers the batches that generation lacks, none of which
    had been acknowledged."""
    previous = previous_path(stack.checkpoint)
    wait_until(previous.exists, 60, what="two checkpoint generations")
    stack.aggregator.stop(signal.SIGKILL)
    data = bytearray(stack.checkpoint.read_bytes())
    if rng.random() < 0.25:
        data = data[: rng.randrange(len(data))]
        print(f"checkpoint cut to {len(data)} bytes")
    else:
        offset, bit = rng.randrange(len(data)), rng.randrange(8)
        data[offset] ^= 1 << bit
        print(f"checkpoint byte {offset} of {len(data)}: bit {bit} flipped")
    stack.checkpoint.write_bytes(bytes(data))
    pause(rng)
    stack.start_aggregator()
    fallback = "resuming from the previous generation" in stack.aggregator.output()
    print(f"fell back to the previous generation: {fallback}")


def series_seq(checkpoint: Path) -> int | None:
    """The series sequence number a checkpoint file records (``None`` while unreadable)."""
    try:
        return int(json.loads(checkpoint.read_text())["series"]["seq"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def between_writes(checkpoint: Path) -> bool:
    """Whether the ledger file is the one the newest checkpoint names (its SHA-256 there):
    not frozen in the middle of a generation's writes (ledger renamed, checkpoint not yet),
    a moment no takeover rolls back at (it waits for the write in flight)."""
    try:
        named = json.loads(checkpoint.read_text())["ledger"]["sha256"]
        ledger = ledger_path_for(checkpoint).read_text(encoding="utf-8")
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(named == file_digest(ledger))


def kill_aggregator_roll_back(stack: Stack, rng: random.Random) -> None:
    """``kill -9`` of the aggregator frozen (SIGSTOP) at a moment when its newest checkpoint
    generation holds series records the previous one lacks, that generation replaced by the
    previous one (what a takeover's roll-back does), restarted: the restart cuts those
    records off, and the broker redelivers their batches (never acknowledged), so every
    round's row still counts each batch once (:func:`~tests.faults.stack.check_series`)."""
    previous = previous_path(stack.checkpoint)

    def frozen_ahead() -> bool:
        stack.aggregator.send(signal.SIGSTOP)
        newest, older = series_seq(stack.checkpoint), series_seq(previous)
        if (
            newest is not None
            and older is not None
            and newest > older
            and between_writes(stack.checkpoint)
        ):
            return True
        stack.aggregator.send(signal.SIGCONT)
        return False

    wait_until(frozen_ahead, 60, what="a newest generation with series records of its own")
    stack.aggregator.stop(signal.SIGKILL)
    previous.replace(stack.checkpoint)
    pause(rng)
    stack.start_aggregator()
    assert "written after checkpoint generation" in stack.aggregator.output()


def kill_both(stack: Stack, rng: random.Random) -> None:
    stack.shuffler.send(signal.SIGKILL)
    stack.aggregator.send(signal.SIGKILL)
    stack.shuffler.wait()
    stack.aggregator.wait()
    pause(rng)
    stack.start_shuffler()
    stack.start_aggregator()


def term_shuffler(stack: Stack, rng: random.Random) -> None:
    assert stack.shuffler.stop(signal.SIGTERM) == 0
    pause(rng)
    stack.start_shuffler()


def term_aggregator(stack: Stack, rng: random.Random) -> None:
    assert stack.aggregator.stop(signal.SIGTERM) == 0
    pause(rng)
    stack.start_aggregator()


def restart_broker(stack: Stack, rng: random.Random) -> None:
    stack.broker.stop()  # SIGTERM: Mosquitto saves its store
    pause(rng)
    stack.broker.start()


FAULTS: dict[str, Fault] = {
    "kill-9-shuffler": kill_shuffler,
    "kill-9-aggregator": kill_aggregator,
    "kill-9-aggregator-damaged-checkpoint": kill_aggregator_damage_checkpoint,
    "kill-9-aggregator-rolled-back": kill_aggregator_roll_back,
    "kill-9-both": kill_both,
    "sigterm-shuffler": term_shuffler,
    "sigterm-aggregator": term_aggregator,
}


@pytest.mark.parametrize("case", list(FAULTS))
def test_every_acknowledged_report_counts_once_across_a_crash(tmp_path: Path, case: str) -> None:
    with running_stack(tmp_path) as stack:
        outcome = run_case(stack, case, FAULTS[case])
        reconcile(stack, outcome)


def test_every_acknowledged_report_counts_once_across_a_broker_restart(tmp_path: Path) -> None:
    """The shipped broker configuration, per-device accounts: devices' connections break,
    so a report may be released whose PUBACK its device never got (counted as such)."""
    with running_stack(tmp_path, shipped=True) as stack:
        outcome = run_case(stack, "broker-restart", restart_broker)
        reconcile(stack, outcome, cut_connections=True)


def kill_broker(stack: Stack, rng: random.Random) -> None:
    assert stack.broker.proc is not None
    stack.broker.proc.kill()  # SIGKILL: no final save of the store
    stack.broker.proc.wait()
    stack.broker.proc = None
    pause(rng)
    stack.broker.start()


AUTOSAVE = {
    "shipped-autosave-30s": "",
    "autosave-on-changes": "autosave_on_changes true\nautosave_interval 1\n",
}


@pytest.mark.parametrize("autosave", list(AUTOSAVE))
def test_a_broker_crash_may_lose_acknowledged_reports_but_never_counts_one_twice(
    tmp_path: Path, autosave: str
) -> None:
    """``kill -9`` of the broker (the shipped configuration; then with the store saved
    after every change): Mosquitto acknowledges from memory and saves later, so reports
    and batches it acknowledged since its last save can be lost, and the loss is only
    printed (it depends on the moment). What is asserted: the recorder, the aggregator and
    the devices still agree on everything else, and nothing is aggregated twice, although
    the restored store redelivers what was already processed."""
    with running_stack(tmp_path, shipped=True, broker_config=AUTOSAVE[autosave]) as stack:
        outcome = run_case(stack, f"broker-kill-9-{autosave}", kill_broker, exact=False)
        reconcile(stack, outcome, cut_connections=True, broker_crash=True)


def flip_a_middle_admitted_record(log: Path, rng: random.Random) -> int:
    """Flip one bit among the tokens of an ``admitted`` record that is not the last record
    (damage at rest, not a torn write); the record's offset. Its seeds and z stay as they
    were, so the repair can tell exactly which of its reports were released anyway."""
    data = bytearray(log.read_bytes())
    salt = read_header(bytes(data))
    assert salt is not None
    spans = record_spans(bytes(data), salt)
    middle = [s for s in spans[:-1] if s[1] == ADMITTED]
    assert middle, f"no admitted record before the last of {len(spans)}"
    offset, _kind, end = rng.choice(middle)
    n = (end - 4 - offset - HEAD_SIZE - 8) // 14
    data[rng.randrange(offset + HEAD_SIZE + 8, offset + HEAD_SIZE + 8 + 8 * n)] ^= (
        1 << rng.randrange(8)
    )
    log.write_bytes(bytes(data))
    return offset


def test_a_damaged_log_is_refused_repaired_and_the_counts_reconcile(tmp_path: Path) -> None:
    """``kill -9`` of the shuffler, one bit flipped in a middle record of its real log:
    the restart is refused with one line naming the file and the offset; ``coco shuffler
    repair`` salvages the rest and says how many of the damaged record's reports were lost
    (none, when a batch released them after it was written); the repaired shuffler resumes,
    and acknowledged == aggregated + held + those lost, exactly, nothing aggregated twice."""
    repaired: dict[str, Any] = {}

    def damage(stack: Stack, rng: random.Random) -> None:
        stack.shuffler.stop(signal.SIGKILL)
        offset = flip_a_middle_admitted_record(stack.state_dir / "effects.log", rng)
        stack.shuffler.start()
        assert stack.shuffler.wait() == 1
        errors = error_lines(stack.shuffler.output().split("--- start")[-1])
        assert len(errors) == 1, stack.shuffler.output()[-2000:]
        assert f"effects.log is damaged at offset {offset}" in errors[0]
        assert "coco shuffler repair" in errors[0]
        done = coco("shuffler", "repair", "--state-dir", str(stack.state_dir), timeout=120)
        assert done.returncode == 0, done.stderr
        repaired.update(json.loads(done.stdout))
        print(f"repair: {repaired}")
        assert repaired["lost_releases"] == 0
        stack.start_shuffler()

    with running_stack(tmp_path) as stack:
        outcome = run_case(stack, "damaged-log", damage, exact=False)
        assert repaired["reports_dropped"] > 0
        reconcile(stack, outcome, repaired_loss=repaired["reports_lost"])
