"""What the aggregator applies: only sealed batches of at least ``min_batch`` reports, each
``batch_id`` once, and nothing below the retained horizon of rounds; the checkpoint holds the
ids of that horizon only, and a corrupted checkpoint is a one-line error naming the field.

:meth:`Aggregator.handle_batch` is driven directly (the MQTT path is in test_service.py)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from aggregator.accountant import amplify_spec
from aggregator.service.checkpoint_files import load_checkpoint
from aggregator.service.config import AggregatorConfig, resolve_batch_public_key
from aggregator.service.core.batch_codec import encode_batch_arrays
from aggregator.service.core.checkpoint import CHECKPOINT_VERSION, CheckpointError
from aggregator.service.service import Aggregator
from edge.batch_auth import BatchSigner
from edge.errors import CocoError
from tests import waiting
from tests.aggregator.test_service import (
    DELTA,
    DEPLOYMENT,
    MIN_BATCH,
    SIGNER,
    SPEC,
    batch,
    moving,
    offline,
    reports,
)

RETENTION = 3


def agg_config(tmp_path: Path | None = None, **kwargs: Any) -> AggregatorConfig:
    options: dict[str, Any] = {
        "broker": "mqtt://127.0.0.1:1",  # never connected: handle_batch needs no broker
        "deployment": DEPLOYMENT,
        "spec": SPEC,
        "delta": DELTA,
        "min_batch": MIN_BATCH,
        "batch_public_key": SIGNER.public_key_hex,
        "retention_rounds": RETENTION,
        "http_port": None,
        "checkpoint": None if tmp_path is None else tmp_path / "ckpt.json",
    }
    options.update(kwargs)
    return AggregatorConfig(**options)


def outcomes(agg: Aggregator, *payloads: bytes) -> list[str]:
    async def main() -> list[str]:
        return [await agg.handle_batch(payload) for payload in payloads]

    return asyncio.run(main())


def test_one_forged_record_never_moves_epsilon_central_and_a_signed_one_is_charged() -> None:
    agg = Aggregator(agg_config())
    good = reports(MIN_BATCH, 1)
    assert outcomes(agg, batch(good, 1)) == ["applied"]

    def settled() -> bool:
        agg.snapshot()  # accounts what is missing, waiting a moment for the accountant
        return agg.privacy_settled

    # the level of the good batch, not the one before it (the accountant may still be at
    # work when the first snapshot is taken on a loaded machine)
    waiting.wait_until(settled, 90, progress=moving(agg))
    eps = agg.snapshot()["epsilon_central"]
    assert eps is not None
    forger = BatchSigner.generate(DEPLOYMENT)
    forged = [batch(reports(n, 2), 10 + n, signer=forger) for n in (1, 2, MIN_BATCH - 1)]
    assert outcomes(agg, *forged) == ["bad_signature"] * 3
    assert agg.snapshot()["epsilon_central"] == eps
    # Signed by the trusted key (a buggy shuffler): refused, never applied, but released to
    # whoever listens, so charged at its real size: the guarantee of its reports is that of
    # a release of 1, and epsilon_central (the smallest release's) says so.
    tiny = [batch(reports(n, 2), 10 + n) for n in (1, 2, MIN_BATCH - 1)]
    assert outcomes(agg, *tiny) == ["below_min_batch"] * 3
    assert agg.smallest_batch == MIN_BATCH
    assert agg.state.n == MIN_BATCH
    waiting.wait_until(settled, 90, progress=moving(agg))
    assert agg.snapshot()["epsilon_central"] == {
        "smallest": amplify_spec(SPEC, n=1, delta=DELTA).epsilon_central,
        "latest": amplify_spec(SPEC, n=1, delta=DELTA).epsilon_central,
    }


def test_estimates_counters_follow_every_batch_not_only_applied_ones() -> None:
    agg = Aggregator(agg_config())
    good = reports(MIN_BATCH, 3)
    assert outcomes(agg, batch(good, 1), b"junk", batch(good, 1)) == [
        "applied",
        "bad_length",
        "duplicate",
    ]
    counters = agg.snapshot()["counters"]
    assert counters["rejected"] == {"bad_length": 1}
    assert counters["duplicates"] == 1
    assert counters["batches"] == 1


def test_retained_horizon_rejects_every_replay_and_forgets_old_ids() -> None:
    agg = Aggregator(agg_config())
    rep = reports(MIN_BATCH, 4)
    assert outcomes(agg, batch(rep, 1, round_=10), batch(rep, 2, round_=11)) == ["applied"] * 2
    assert outcomes(agg, batch(rep, 3, round_=12)) == ["applied"]
    assert agg.oldest_retained_round == 10
    # a late batch of a retained round is applied; a replay of any retained id is not
    assert outcomes(agg, batch(rep, 4, round_=10), batch(rep, 1, round_=10)) == [
        "applied",
        "duplicate",
    ]
    assert outcomes(agg, batch(rep, 5, round_=13)) == ["applied"]  # horizon moves to 11
    assert agg.oldest_retained_round == 11
    assert agg.retained_batch_ids == 3  # the ids of rounds 11..13 only
    # the ids of round 10 are forgotten, so round 10 is refused as a whole, old id or new
    assert outcomes(agg, batch(rep, 1, round_=10), batch(rep, 6, round_=10)) == [
        "stale_round",
        "stale_round",
    ]
    assert outcomes(agg, batch(rep, 2, round_=11)) == ["duplicate"]
    assert agg.counters.batches == 5
    assert agg.counters.rejected == {"stale_round": 2}
    assert agg.counters.rejected_reports == {"stale_round": 2 * MIN_BATCH}
    assert agg.snapshot()["retention"] == {
        "rounds": RETENTION,
        "round_seconds": 1,  # no length announced or on the wire: rounds are their starts
        "newest_round": 13,
        "oldest_round": 11,
        "newest_start": 13,
        "oldest_start": 11,
        "batch_ids": 3,
    }
    value = agg.registry.get_sample_value
    assert value("coco_aggregator_batch_ids_retained") == 3
    assert value("coco_aggregator_oldest_retained_round") == 11
    assert value("coco_aggregator_batches_rejected_total", {"reason": "stale_round"}) == 2


def test_checkpoint_size_is_bounded_by_the_window_and_restart_keeps_the_horizon(
    tmp_path: Path,
) -> None:
    rep = reports(MIN_BATCH, 5)
    sizes = []

    async def first() -> None:
        async with Aggregator(agg_config(tmp_path)) as agg:
            for round_ in range(100, 140):
                for k in range(2):
                    outcome = await agg.handle_batch(batch(rep, 2 * round_ + k, round_=round_))
                    assert outcome == "applied"
                await agg.checkpoint()
                sizes.append((tmp_path / "ckpt.json").stat().st_size)
                assert agg.retained_batch_ids == 2 * min(RETENTION, round_ - 99)

    asyncio.run(first())
    # the file does not grow with the rounds behind it: 6 ids (200 bytes) every time; only
    # the digits of the sums, counters and timestamp vary
    assert max(sizes[RETENTION:]) - min(sizes[RETENTION:]) < 64
    saved = load_checkpoint(tmp_path / "ckpt.json")
    assert sorted(saved.batch_rounds) == [137, 138, 139]
    assert sum(len(ids) for ids in saved.batch_rounds.values()) == 2 * RETENTION

    async def second() -> list[str]:
        async with Aggregator(agg_config(tmp_path)) as agg:
            assert agg.state.n == 80 * MIN_BATCH
            return [
                await agg.handle_batch(batch(rep, 2 * 139, round_=139)),  # replay: retained
                await agg.handle_batch(batch(rep, 2 * 100, round_=100)),  # replay: stale
                await agg.handle_batch(batch(rep, 9999, round_=137)),  # late and new
            ]

    assert asyncio.run(second()) == ["duplicate", "stale_round", "applied"]


def test_an_unsigned_version_1_checkpoint_keeps_its_sums(tmp_path: Path) -> None:
    rep = reports(MIN_BATCH, 6)
    state = offline(rep)
    (tmp_path / "ckpt.json").write_text(
        json.dumps(
            {
                "version": 1,
                "fingerprint": SPEC.fingerprint,
                "deployment": DEPLOYMENT,
                "delta": DELTA,
                "state": state.to_dict(),
                "seen": ["00" * 16],
                "counters": {"reports": 50, "batches": 1, "duplicates": 0, "rejected": {}},
                "smallest_batch": 50,
                "latest_batch": 50,
                "last_batch_timestamp": None,
            }
        )
    )

    async def main() -> None:
        async with Aggregator(agg_config(tmp_path)) as agg:
            assert agg.state.n == MIN_BATCH
            assert agg.retained_batch_ids == 0

    asyncio.run(main())
    assert load_checkpoint(tmp_path / "ckpt.json").version == CHECKPOINT_VERSION


def _valid_checkpoint(tmp_path: Path) -> dict[str, Any]:
    async def main() -> None:
        async with Aggregator(agg_config(tmp_path)) as agg:
            await agg.handle_batch(batch(reports(MIN_BATCH, 7), 1, round_=5))

    asyncio.run(main())
    data: dict[str, Any] = json.loads((tmp_path / "ckpt.json").read_text())
    return data


CORRUPTIONS = [
    ("version", lambda d: d.update(version=7)),
    ("delta", lambda d: d.pop("delta")),
    ("state", lambda d: d["state"].update(sum_u=[1, 2])),
    ("state", lambda d: d["state"].pop("sum_v")),
    ("batch_rounds", lambda d: d.update(batch_rounds={"-4": []})),
    ("batch_rounds.5", lambda d: d["batch_rounds"].update({"5": ["zz" * 16]})),
    ("counters.reports", lambda d: d["counters"].update(reports=-1)),
    ("counters.rejected.bad_length", lambda d: d["counters"]["rejected"].update(bad_length="x")),
    ("smallest_batch", lambda d: d.update(smallest_batch="one")),
    ("last_batch_timestamp", lambda d: d.update(last_batch_timestamp=[])),
]


@pytest.mark.parametrize(("name", "corrupt"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_a_corrupted_checkpoint_names_the_file_and_the_field(
    tmp_path: Path, name: str, corrupt: Any
) -> None:
    data = _valid_checkpoint(tmp_path)
    corrupt(data)
    path = tmp_path / "ckpt.json"
    path.write_text(json.dumps(data))

    async def enter() -> None:
        async with Aggregator(agg_config(tmp_path)):
            pass

    with pytest.raises(CheckpointError) as info:
        asyncio.run(enter())
    message = str(info.value)
    assert f"checkpoint {path}: field {name!r}" in message
    assert "\n" not in message


def test_a_truncated_checkpoint_is_a_one_line_error(tmp_path: Path) -> None:
    _valid_checkpoint(tmp_path)
    path = tmp_path / "ckpt.json"
    path.write_text(path.read_text()[:40])
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is not valid JSON") as info:
        load_checkpoint(path)
    assert "\n" not in str(info.value)


def test_key_and_min_batch_are_required() -> None:
    with pytest.raises(ValueError, match="batch_public_key is required"):
        agg_config(batch_public_key=None)
    with pytest.raises(CocoError, match="64 lowercase hex digits"):
        agg_config(batch_public_key="00" * 31)
    with pytest.raises(ValueError, match="min_batch is required"):
        agg_config(min_batch=None)
    with pytest.raises(ValueError, match="retention_rounds must be >= 1"):
        agg_config(retention_rounds=0)


def test_which_key_is_trusted() -> None:
    a = BatchSigner.generate(DEPLOYMENT).public_key_hex
    b = BatchSigner.generate(DEPLOYMENT).public_key_hex
    assert resolve_batch_public_key(a, None) == a
    assert resolve_batch_public_key(None, b) == b
    assert resolve_batch_public_key(a, a) == a
    with pytest.raises(CocoError, match="differs from the announced batch_public_key"):
        resolve_batch_public_key(a, b)
    with pytest.raises(CocoError, match="give --batch-public-key"):
        resolve_batch_public_key(None, None)


def test_client_id_comes_from_the_account() -> None:
    assert agg_config().mqtt_client_id == f"coco-aggregator-{DEPLOYMENT}"
    assert agg_config(username="agg-plant-7").mqtt_client_id == "agg-plant-7"
    assert agg_config(username="agg-plant-7", client_id="x").mqtt_client_id == "x"


def test_a_round_far_beyond_the_clock_cannot_move_the_horizon() -> None:
    """One sealed batch of round 2^32 - 16 would put every honest round below the horizon;
    with the announced round length it is refused instead (the aggregator's round today is
    about 3·10^7 for 60-second rounds)."""
    rep = reports(MIN_BATCH, 8)
    far = batch(rep, 1, round_=0xFFFFFFF0)
    agg = Aggregator(agg_config(round_seconds=60))
    assert outcomes(agg, far, batch(rep, 2, round_=5)) == ["future_round", "applied"]
    assert agg.newest_round == 5
    assert agg.counters.rejected_reports == {"future_round": MIN_BATCH}
    # without a round length (--spec alone) there is no clock to judge by
    assert outcomes(Aggregator(agg_config()), far) == ["applied"]
    with pytest.raises(ValueError, match="round_seconds must be an int"):
        agg_config(round_seconds=0)


def test_the_privacy_ledger_survives_a_checkpoint_reset(tmp_path: Path) -> None:
    """The ledger has its own file beside the checkpoint: moving the checkpoint (and its
    previous generation) away, as an operator resets the estimates, forgets no privacy
    loss."""
    rep = reports(MIN_BATCH, 9)

    async def run(batches: list[tuple[int, int]]) -> tuple[int, int]:
        async with Aggregator(agg_config(tmp_path)) as agg:
            for batch_id, round_ in batches:
                assert await agg.handle_batch(batch(rep, batch_id, round_=round_)) == "applied"
            return agg.state.n, sum(agg.ledger.rounds().values())

    assert asyncio.run(run([(1, 10), (2, 11)])) == (2 * MIN_BATCH, 2)
    for name in ("ckpt.json", "ckpt.json.previous"):
        (tmp_path / name).unlink(missing_ok=True)
    # the estimates start from zero; the privacy loss of rounds 10 and 11 stays
    assert asyncio.run(run([(3, 12)])) == (MIN_BATCH, 3)


def test_a_batch_of_another_round_length_is_applied_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An aggregator running with 60-s rounds applies a batch of a 10-s round (wire version
    2, after a change of round_seconds it was not restarted for) and counts it, with one
    INFO line; a batch of its own length, or of version 1 (read under its length), is not
    counted."""
    rep = reports(MIN_BATCH, 9)
    now = int(time.time())
    agg = Aggregator(agg_config(round_seconds=60))

    def sealed(batch_id: int, round_: int, length: int) -> bytes:
        raw = encode_batch_arrays(
            SPEC.fingerprint_int, round_, batch_id.to_bytes(16, "big"), rep[0], rep[1],
            round_seconds=length,
        )  # fmt: skip
        return SIGNER.seal(raw)

    own, v1 = sealed(1, now // 60 - 1, 60), sealed(2, now // 60 - 1, 0)
    shorter = [sealed(3 + k, now // 10 - 1 - k, 10) for k in range(3)]
    with caplog.at_level("INFO", logger="aggregator"):
        assert outcomes(agg, own, v1, *shorter) == ["applied"] * 5
    value = agg.registry.get_sample_value("coco_aggregator_batches_other_length_total")
    assert value == 3
    lines = [r.getMessage() for r in caplog.records if "10-s rounds" in r.getMessage()]
    assert len(lines) == 2  # the 1st and the 2nd: powers of two
    assert "runs with 60-s rounds" in lines[0]
