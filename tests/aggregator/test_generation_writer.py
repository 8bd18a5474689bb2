"""One checkpoint generation on disk (aggregator.service.checkpoint_files.GenerationWriter):
the ledger file the service wrote last, or verified at start, becomes ``.prev`` without
being read again; a file replaced behind its back is checked (by its digest, then in full)
and a damaged one never becomes ``.prev``; checkpoints start in the background once half of
``max_unacked`` deliveries are open. Real files, real aggregators."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from aggregator.ledger.ledger_file import ledger_path_for, previous_path, read_ledger
from aggregator.service.service import Aggregator
from tests.aggregator.test_batch_rules import agg_config
from tests.aggregator.test_service import DELTA, MIN_BATCH, SPEC, batch, reports


class Checks:
    """Records every full decode of a ledger file the writer asks for."""

    def __init__(self, agg: Aggregator) -> None:
        writer = agg.generations.writer
        assert writer is not None
        self.real = writer.check_ledger
        self.paths: list[Path] = []
        writer.check_ledger = self

    def __call__(self, text: str, path: Path) -> None:
        self.paths.append(path)
        self.real(text, path)


def bound_generation(path: Path) -> int:
    loaded = read_ledger(path, spec=SPEC, delta=DELTA)
    assert loaded is not None
    assert loaded.bound is not None
    assert not loaded.fell_back
    return loaded.bound.generation


async def apply(agg: Aggregator, round_: int) -> None:
    payload = batch(reports(MIN_BATCH, round_), 100 + round_, round_=round_)
    assert await agg.handle_batch(payload) == "applied"


def test_the_ledger_written_last_becomes_prev_unread(tmp_path: Path) -> None:
    ledger = ledger_path_for(tmp_path / "ckpt.json")

    async def main(rounds: list[int]) -> list[Path]:
        async with Aggregator(agg_config(tmp_path)) as agg:
            checks = Checks(agg)
            for round_ in rounds:
                await apply(agg, round_)
                await agg.checkpoint()
            return checks.paths

    assert asyncio.run(main([10, 11, 12])) == []
    # generations 1..3 (nothing waits for the shutdown's final two): .prev is generation 2
    assert (bound_generation(ledger), bound_generation(previous_path(ledger))) == (3, 2)
    # a new start verified the file: vouched for, not read again either
    assert asyncio.run(main([13])) == []
    assert (bound_generation(ledger), bound_generation(previous_path(ledger))) == (4, 3)


@pytest.mark.parametrize("how", ["same bytes, another file", "damaged"])
def test_a_ledger_replaced_behind_the_service_is_checked(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = ledger_path_for(tmp_path / "ckpt.json")

    async def main() -> list[Path]:
        async with Aggregator(agg_config(tmp_path)) as agg:
            checks = Checks(agg)
            await apply(agg, 10)
            await agg.checkpoint()
            await apply(agg, 11)
            await agg.checkpoint()  # generation 2; .prev is 1
            copy = tmp_path / "copy"
            shutil.copy(ledger, copy)
            if how == "damaged":
                copy.write_text(copy.read_text().replace('"generation":', '"generation":9', 1))
            copy.replace(ledger)  # another inode: the writer cannot vouch for it
            await apply(agg, 12)
            await agg.checkpoint()  # generation 3
            return checks.paths

    with caplog.at_level(logging.WARNING, logger="aggregator.service"):
        checked = asyncio.run(main())
    if how == "damaged":  # hashed, differs, decoded: refused, the good .prev kept
        assert checked == [ledger]
        assert f"not keeping {ledger} as the previous generation" in caplog.text
    else:  # hashed: the bytes written, no decode needed
        assert checked == []
        assert "not keeping" not in caplog.text


def test_checkpoints_start_in_the_background_at_half_the_window(tmp_path: Path) -> None:
    """Deliveries below half of max_unacked start nothing; the one that reaches it starts a
    checkpoint without waiting for it, and its generation is written."""

    async def main() -> list[Any]:
        config = agg_config(tmp_path, max_unacked=4)
        seen: list[Any] = []
        client = paho.Client(CallbackAPIVersion.VERSION2)  # never connected: acks go nowhere
        async with Aggregator(config) as agg:
            agg.session.confirmed = True
            generations = agg.generations
            for i in range(2):
                await apply(agg, 10 + i)
                generations.acks.delivered((client, i + 1, 1))
                generations.delivered()
                seen.append((i, generations.generation, generations._background is not None))
            assert generations._background is not None
            await generations.settle()
            held = [mid for _, mid, _ in generations.acks.held]
            seen.append(("settled", generations.generation, held))
        return seen

    assert asyncio.run(main()) == [
        (0, 0, False),
        (1, 0, True),  # started, not waited for
        ("settled", 1, [1, 2]),
    ]
