"""A second writer beside a running stack of the fault suite (tests/faults/stack.py: real
processes, reconciled as tests/faults/test_exactly_once.py says).

A second aggregator on the same checkpoint and a second shuffler on the same state
directory refuse to start with a one-line error; a second shuffler with its own state
directory is refused by the deployment's lease, and what was acknowledged reconciles
exactly. (Two shufflers of one client id fighting over the session:
tests/broker/test_shuffler.py, ``test_two_shufflers_with_one_client_id_do_not_fight``.)
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.faults.stack import Settled, Stack, reconcile, run_case, running_stack, settle
from tests.processes import error_lines

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def test_a_second_aggregator_or_shuffler_on_the_same_state_refuses_to_start(
    tmp_path: Path,
) -> None:
    """Same checkpoint, same state directory: the second process exits 1 with one line
    naming what is in use, and the first ones keep running."""
    with running_stack(tmp_path) as stack:
        aggregator = stack.aggregator_process("aggregator-2", stack.checkpoint, port=free_port())
        aggregator.start()
        assert aggregator.wait() == 1
        errors = error_lines(aggregator.output())
        assert len(errors) == 1, aggregator.output()
        assert "in use by another aggregator" in errors[0]
        assert str(stack.checkpoint) in errors[0]
        shuffler = stack.shuffler_process("shuffler-2", stack.state_dir, port=free_port())
        shuffler.start()
        assert shuffler.wait() == 1
        errors = error_lines(shuffler.output())
        assert len(errors) == 1, shuffler.output()
        assert str(stack.state_dir) in errors[0]
        for output in (aggregator.output(), shuffler.output()):
            assert "Traceback" not in output
        assert stack.shuffler.alive()
        assert stack.shuffler_ready()
        assert stack.aggregator.alive()
        assert stack.aggregator_ready()


def test_a_second_shuffler_of_the_deployment_is_refused_and_counts_reconcile(
    tmp_path: Path,
) -> None:
    """A second shuffler with its own state directory (and the same batch key and MQTT
    client id), started at a random moment of the run "to add capacity", would receive and
    release every report a second time; the deployment's lease (docs/protocol.md, 13.4)
    refuses it at start with one line, before it connects a session, and exit 1. The first
    one keeps running undisturbed: every acknowledged report is released exactly once."""
    state_b = tmp_path / "shuffler-b-state"
    state_b.mkdir(mode=0o700)
    port_b = free_port()

    with running_stack(tmp_path) as stack:
        second = stack.shuffler_process("shuffler-b", state_b, port=port_b)

        def start_second(_stack: Stack, _rng: random.Random) -> None:
            second.start()

        def finish(stack: Stack, acked: Counter[tuple[int, int]]) -> Settled:
            assert second.wait() == 1
            errors = error_lines(second.output())
            assert len(errors) == 1, second.output()[-2000:]
            assert "(unsharded) is held by another shuffler" in errors[0]
            assert "Traceback" not in second.output()
            assert stack.shuffler.alive()
            return settle(stack, [(stack.shuffler, stack.shuffler_port)], acked)

        outcome = run_case(stack, "second-shuffler", start_second, finish)
        reconcile(stack, outcome)
