"""Announcements for libcoco's parser: the reference reading of the services
(``edge.announce``, and the ``shards`` layouts of DESIGN D2 where this checkout's
``edge.announce`` predates them), hand-written valid and refused announcements, and seeded
random, damaged and garbage ones."""

from __future__ import annotations

import hashlib
import json
import math
import random
from fractions import Fraction
from typing import Any

from edge import announce, doc_vectors
from edge.announce import encode_announcement
from edge.errors import SpecError
from edge.participation import threshold
from edge.spec import MechanismSpec
from tests.libcoco.commands import (
    COCO_MAX_S,
    MECH_CODE,
    U32,
    Script,
    err,
    label,
    random_spec,
    shard_index,
)

# --- the reference -----------------------------------------------------------------------

_LAYOUT_KEYS = {"count", "from_round", "generation", "keys", "seed"}


def _int_in(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_shards(value: object) -> list[dict[str, int]]:
    """The layouts of DESIGN D2 (docs/protocol.md, sharded deployments); SpecError else."""
    if not isinstance(value, list) or not 1 <= len(value) <= 2:
        raise SpecError("shards: one or two layouts")
    layouts: list[dict[str, int]] = []
    for item in value:
        if not isinstance(item, dict) or set(item) != _LAYOUT_KEYS:
            raise SpecError(
                "shards: a layout has exactly count, from_round, generation, keys, seed"
            )
        ok = (
            _int_in(item["count"], 1, 256)
            and _int_in(item["from_round"], 0, U32)
            and _int_in(item["generation"], 0, 65535)
            and _int_in(item["seed"], 0, U32)
            and isinstance(item["keys"], list)
            and len(item["keys"]) == item["count"]
            and all(
                isinstance(k, str) and len(k) == 64 and all(c in "0123456789abcdef" for c in k)
                for k in item["keys"]
            )
        )
        if not ok:
            raise SpecError("shards: a field is out of range")
        if layouts and (
            item["from_round"] <= layouts[-1]["from_round"]
            or item["generation"] <= layouts[-1]["generation"]
        ):
            raise SpecError("shards: layouts sorted by from_round and generation")
        layouts.append({k: item[k] for k in ("count", "from_round", "generation", "seed")})
    return layouts


def reference_announcement(payload: bytes) -> dict[str, Any] | None:
    """The announcement as the services read it, or None if they refuse it. ``shards`` is
    checked here by the rules of DESIGN D2 when this checkout's edge.announce predates it."""
    try:
        message = json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    layouts: list[dict[str, int]] = []
    knows_shards = "shards" in getattr(announce, "_OPTIONAL_KEYS", frozenset())
    if isinstance(message, dict) and "shards" in message and not knows_shards:
        try:
            layouts = check_shards(message.pop("shards"))
        except SpecError:
            return None
        if "batch_public_key" in message:
            return None
        payload = json.dumps(message).encode()
    try:
        decoded = announce.decode_announcement(payload)
    except SpecError:
        return None
    if "shards" in decoded:
        layouts = check_shards(decoded["shards"])
    decoded["layouts"] = layouts
    return decoded


def announcement_result(payload: bytes) -> str:
    """The line ``ann`` prints for ``payload``: ``ok <fields>`` or ``err *``."""
    decoded = reference_announcement(payload)
    if decoded is None:
        return "err *"
    spec = decoded["spec"]
    if spec["s"] > COCO_MAX_S:
        return err("spec_s_max")
    fields = [
        "ok",
        MECH_CODE[spec["mechanism"]],
        spec["d"],
        spec["s"],
        spec["t"],
        spec["exp_eps_weight"],
        spec["hash_version"],
        int(spec["fingerprint"], 16),
        decoded["round_seconds"],
        decoded["min_batch"],
        math.ceil(Fraction(spec["epsilon"]) * (1 << 32)),
        decoded.get("batch_public_key", "-"),
        len(decoded["layouts"]),
    ]
    for layout in decoded["layouts"]:
        fields += [layout["count"], layout["from_round"], layout["generation"], layout["seed"]]
    fields.append(threshold(decoded.get("participation", 1.0)))
    budget = decoded.get("budget_per_period")
    fields.append(decoded.get("period_seconds", 0))
    fields.append(0 if budget is None else math.floor(Fraction(repr(budget)) * (1 << 32)))
    return " ".join(str(v) for v in fields)


def add_announcement(script: Script, payload: bytes, expected: str | None = None) -> None:
    script.add(f"ann {payload.hex() or '-'}", expected or announcement_result(payload))


def device_topic(decoded: dict[str, Any], deployment: str, device_id: str, round_: int) -> str:
    """The ingress topic (in hex, as the harness prints it) of a device's report of
    ``round_`` (DESIGN D2), or the error."""
    layouts = decoded["layouts"]
    if not layouts:
        return f"coco/v1/{deployment}/ingress/{device_id}".encode().hex()
    in_force = [layout for layout in layouts if layout["from_round"] <= round_]
    if not in_force:
        return err("no_layout")
    layout = in_force[-1]
    index = shard_index(device_id.encode(), layout["seed"], layout["count"])
    shard = label(layout["generation"], index)
    return f"coco/v1/{deployment}/ingress/{shard}/{device_id}".encode().hex()


# --- announcements --------------------------------------------------------------------------

KEY_A = doc_vectors.batch_public_key()


def _keys(count: int, tag: str) -> list[str]:
    return [hashlib.sha256(f"{tag}/{i}".encode()).hexdigest() for i in range(count)]


def announcement_doc(mechanism: MechanismSpec | None = None, **changes: Any) -> dict[str, Any]:
    """A valid announcement as a dict, to change before encoding."""
    mechanism = mechanism or MechanismSpec(mechanism="collision", d=6, s=2, epsilon=1.0)
    doc: dict[str, Any] = json.loads(
        encode_announcement(mechanism.to_dict(), min_batch=100, delta=1e-6, round_seconds=10)
    )
    doc.update(changes)
    return doc


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def layout(
    count: int, from_round: int, generation: int, seed: int, tag: str = "k"
) -> dict[str, Any]:
    return {
        "count": count,
        "from_round": from_round,
        "generation": generation,
        "keys": _keys(count, f"{tag}{generation}"),
        "seed": seed,
    }


def announcement_cases(*, large: bool = True) -> Script:
    """Hand-written announcements: valid ones (unsharded, with a batch key, sharded with one
    and two layouts) with their fields, and refusals with the documented status. ``large``
    adds a layout of 256 shards (17 KB of JSON; too large for the emulated boards' buffer)."""
    script = Script()
    good = announcement_doc()
    add_announcement(script, dumps(good))
    add_announcement(script, dumps(announcement_doc(batch_public_key=KEY_A)))
    pretty = json.dumps(good, indent=2).encode()  # whitespace anywhere JSON allows it
    add_announcement(script, pretty, announcement_result(dumps(good)))
    sharded = announcement_doc(shards=[layout(3, 0, 0, 7)])
    add_announcement(script, dumps(sharded))
    two = announcement_doc(
        shards=[layout(2, 100, 4, 1), layout(256 if large else 5, 200, 5, 0xFFFFFFFF)]
    )
    add_announcement(script, dumps(two))
    for round_ in (99, 100, 199, 200, 0xFFFFFFFF):
        script.add(
            f"devtopic {b'lab'.hex()} {b'sensor-7'.hex()} {round_}",
            device_topic(_decoded(two), "lab", "sensor-7", round_),
        )
    for q in (0.25, 1, 1.0, 0.3, 1e-300, 0.999999999):
        add_announcement(script, dumps(announcement_doc(participation=q)))
    for seconds, budget in ((10, 1.0), (86_400, 24), (31_622_400, 0.3 + 0.7), (20, 1.5)):
        add_announcement(
            script, dumps(announcement_doc(period_seconds=seconds, budget_per_period=budget))
        )
    add_announcement(  # with participation, a batch key and whitespace
        script,
        json.dumps(
            announcement_doc(
                participation=0.1,
                batch_public_key=KEY_A,
                period_seconds=3600,
                budget_per_period=2.5,
            ),
            indent=1,
        ).encode(),
    )
    add_announcement(script, dumps(sharded))
    for i in range(6):
        dev = f"dev-{i}"
        script.add(
            f"devtopic {b'lab'.hex()} {dev.encode().hex()} 5",
            device_topic(_decoded(sharded), "lab", dev, 5),
        )
    big_s = MechanismSpec(mechanism="coco", d=64, s=COCO_MAX_S + 1, epsilon=1.0)
    spec_d = announcement_doc()["spec"]
    refusals: list[tuple[bytes, str]] = [
        (b"", "json"),
        (b"[]", "json"),
        (b"{", "json"),
        (dumps(good)[:-1], "json"),
        (dumps(good) + b"x", "json"),
        (dumps(good) + b" \n", "ok*"),
        (b"\xef\xbb\xbf" + dumps(good), "json"),  # a UTF-8 BOM
        (dumps(good).replace(b'"protocol":"coco/v1"', b'"protocol":"coco/v2"'), "announcement"),
        (dumps({k: v for k, v in good.items() if k != "min_batch"}), "announcement"),
        (dumps(announcement_doc(extra=1)), "announcement"),
        (dumps(announcement_doc(round_seconds=0)), "announcement"),
        (dumps(announcement_doc(round_seconds=86401)), "announcement"),
        (dumps(announcement_doc(round_seconds=60.0)), "announcement"),
        (dumps(announcement_doc(round_seconds="60")), "announcement"),
        (dumps(announcement_doc(round_seconds=True)), "announcement"),
        (dumps(announcement_doc(min_batch=0)), "announcement"),
        (dumps(announcement_doc(min_batch=2**32)), "announcement"),
        (dumps(announcement_doc(delta=1)), "announcement"),
        (dumps(announcement_doc(delta=0)), "announcement"),
        (dumps(announcement_doc(delta=-1e-6)), "announcement"),
        (dumps(announcement_doc(participation=0)), "announcement"),
        (dumps(announcement_doc(participation=-0.5)), "announcement"),
        (dumps(announcement_doc(participation=1.5)), "announcement"),
        (dumps(announcement_doc(participation=1.0000001)), "announcement"),
        (dumps(announcement_doc(participation="0.5")), "announcement"),
        (dumps(announcement_doc(participation=True)), "announcement"),
        (dumps(announcement_doc(period_seconds=10)), "announcement"),  # without its budget
        (dumps(announcement_doc(budget_per_period=1.0)), "announcement"),  # without its period
        (dumps(announcement_doc(period_seconds=15, budget_per_period=1.0)), "announcement"),
        (dumps(announcement_doc(period_seconds=0, budget_per_period=1.0)), "announcement"),
        (dumps(announcement_doc(period_seconds=31_622_410, budget_per_period=1.0)),
         "announcement"),
        (dumps(announcement_doc(period_seconds=10.0, budget_per_period=1.0)), "announcement"),
        (dumps(announcement_doc(period_seconds="10", budget_per_period=1.0)), "announcement"),
        (dumps(announcement_doc(period_seconds=10, budget_per_period=0.999)), "announcement"),
        (dumps(announcement_doc(period_seconds=10, budget_per_period=0)), "announcement"),
        (dumps(announcement_doc(period_seconds=10, budget_per_period=-1)), "announcement"),
        (dumps(announcement_doc(period_seconds=10, budget_per_period=2.0**31)), "announcement"),
        (dumps(announcement_doc(period_seconds=10, budget_per_period="1")), "announcement"),
        (dumps(announcement_doc(period_seconds=10, budget_per_period=None)), "announcement"),
        (dumps(announcement_doc(batch_public_key=KEY_A.upper())), "announcement"),
        (dumps(announcement_doc(batch_public_key=KEY_A[:-2])), "announcement"),
        (dumps(announcement_doc(spec={**spec_d, "hash_version": 2})), "spec_hash_version"),
        (dumps(announcement_doc(spec={**spec_d, "fingerprint": "00000000"})), "fingerprint"),
        (dumps(announcement_doc(spec={**spec_d, "unit_weight": 1 << 23})), "announcement"),
        (dumps(announcement_doc(spec={**spec_d, "mechanism": "olh"})), "announcement"),
        (dumps(announcement_doc(spec={**spec_d, "d": 0})), "spec_d"),
        (dumps(announcement_doc(spec={**spec_d, "s": 7})), "spec_s"),
        (dumps(announcement_doc(spec={**spec_d, "t": 2})), "spec_t"),
        (dumps(announcement_doc(spec={**spec_d, "exp_eps_weight": 1 << 24})), "spec_weight"),
        (dumps(announcement_doc(spec={**spec_d, "epsilon": 0})), "announcement"),
        (dumps(announcement_doc(spec={**spec_d, "epsilon": 20.5})), "announcement"),
        (dumps(announcement_doc(spec={k: v for k, v in spec_d.items() if k != "t"})),
         "announcement"),
        (dumps(announcement_doc(spec=big_s.to_dict())), "spec_s_max"),
        (dumps(announcement_doc(spec=[1])), "announcement"),
        (dumps(announcement_doc(shards=[])), "announcement"),
        (dumps(announcement_doc(shards=[layout(1, 0, 0, 0)] * 3)), "announcement"),
        (dumps(announcement_doc(shards=[layout(2, 5, 1, 0), layout(2, 5, 2, 0)])), "announcement"),
        (dumps(announcement_doc(shards=[layout(2, 5, 1, 0), layout(2, 6, 1, 0)])), "announcement"),
        (dumps(announcement_doc(shards=[layout(0, 0, 0, 0)])), "announcement"),
        *([(dumps(announcement_doc(shards=[layout(257, 0, 0, 0)])), "announcement")]
          if large else []),
        (dumps(announcement_doc(shards=[{**layout(2, 0, 0, 0), "keys": _keys(1, "x")}])),
         "announcement"),
        (dumps(announcement_doc(shards=[{**layout(1, 0, 0, 0), "extra": 1}])), "announcement"),
        (dumps(announcement_doc(shards=[layout(1, 0, 65536, 0)])), "announcement"),
        (dumps(announcement_doc(shards=[layout(1, 0, 0, 2**32)])), "announcement"),
        (dumps(announcement_doc(shards=[layout(1, 0, 0, 0)], batch_public_key=KEY_A)),
         "announcement"),
    ]  # fmt: skip
    for payload, status in refusals:
        expected = status if status.endswith("*") else err(status)
        reference = reference_announcement(payload)
        # the services refuse what libcoco refuses, but for libcoco's own limit on s
        assert (reference is None) == (status not in ("ok*", "spec_s_max")), (payload, status)
        add_announcement(script, payload, expected)
    return script


def _decoded(doc: dict[str, Any]) -> dict[str, Any]:
    decoded = reference_announcement(dumps(doc))
    assert decoded is not None
    return decoded


def random_announcements(rng: random.Random, count: int) -> Script:
    """Valid announcements of random specs, changes of them (a field, a byte, a cut, a
    splice) and garbage: libcoco accepts exactly what the services accept, with the same
    fields."""
    script = Script()
    for _ in range(count):
        spec = random_spec(rng)
        doc = announcement_doc(
            spec,
            min_batch=rng.randint(1, 2**32 - 1),
            delta=rng.choice([1e-6, 1e-9, 0.5, 1e-300]),
            round_seconds=rng.randint(1, 86400),
        )
        if rng.random() < 0.2:
            doc["participation"] = rng.choice([rng.random(), 1, 0.5, 1e-6, 0.1])
        if rng.random() < 0.2:  # a period of whole rounds, or not; a budget around epsilon
            doc["period_seconds"] = doc["round_seconds"] * rng.choice([1, 2, 24, 100]) + (
                rng.random() < 0.2
            )
            doc["budget_per_period"] = rng.choice(
                [spec.epsilon, spec.epsilon * rng.uniform(0.5, 30), rng.uniform(0, 40), 1e9]
            )
        if rng.random() < 0.3:
            doc["batch_public_key"] = KEY_A
        elif rng.random() < 0.3:
            doc["shards"] = [layout(rng.randint(1, 4), rng.randint(0, 99), 0, rng.getrandbits(32))]
        payload = dumps(doc)
        kind = rng.randrange(6)
        if kind == 1:  # one byte replaced by another JSON-ish byte
            i = rng.randrange(len(payload))
            payload = payload[:i] + bytes([rng.choice(b'0123456789{}[]",:.-e ')]) + payload[i + 1 :]
        elif kind == 2:  # cut short
            payload = payload[: rng.randrange(len(payload))]
        elif kind == 3:  # one field of the spec changed
            key = rng.choice(sorted(doc["spec"]))
            doc["spec"][key] = rng.choice([0, 1, 2, 65535, 2**32, -1, 0.5, "x", None, True])
            payload = dumps(doc)
        elif kind == 4:  # a splice of two announcements' bytes
            cut = rng.randrange(len(payload))
            payload = payload[:cut] + dumps(announcement_doc())[cut // 2 :]
        elif kind == 5:  # garbage of JSON's alphabet, or any bytes
            alphabet = b'{}[]",:0123456789.-eE truefalsn\\/u\x00\xff'
            payload = bytes(rng.choice(alphabet) for _ in range(rng.randrange(60)))
            if rng.random() < 0.3:
                payload = bytes(rng.getrandbits(8) for _ in range(rng.randrange(60)))
        if _has_duplicate_keys(payload):
            continue  # JSON allows them, the services keep the last, libcoco refuses them
        add_announcement(script, payload)
    return script


def _has_duplicate_keys(payload: bytes) -> bool:
    found = False

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal found
        found = found or len({k for k, _ in pairs}) != len(pairs)
        return dict(pairs)

    try:
        json.loads(payload, object_pairs_hook=hook)
    except ValueError:
        return False
    return found
