"""The scripts libcoco runs in the tests: every published vector, the worked examples of
docs/protocol.md, error paths, and seeded random cases against the Python reference
(:mod:`tests.libcoco.commands`); announcements are in :mod:`tests.libcoco.announcements`."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

from edge import device, doc_vectors
from edge.participation import participates, threshold
from edge.spec import MechanismSpec
from tests.libcoco.announcements import add_announcement, announcement_cases
from tests.libcoco.commands import (
    COCO_MAX_S,
    Ledger,
    Script,
    Spec,
    Stream,
    add_batch,
    add_decode_batch,
    add_decode_report,
    add_label,
    add_pad,
    add_rand,
    add_report,
    add_round,
    add_shard,
    add_spec,
    add_tern,
    add_ternint,
    add_topic,
    add_units,
    err,
    ledger_record,
    ledger_record_v1,
    random_spec,
)

REPO = Path(__file__).resolve().parents[2]
VECTORS = json.loads((REPO / "docs" / "vectors-v1.json").read_text(encoding="utf-8"))
WIRE = json.loads((REPO / "docs" / "wire-vectors-v1.json").read_text(encoding="utf-8"))


def published_vectors() -> Script:
    """Every vector of docs/vectors-v1.json and docs/wire-vectors-v1.json, malformed
    messages included, and the worked examples of docs/protocol.md sections 2.4, 4.2, 6.5,
    7.1, 10.3, 10.5 and 11.1."""
    script = Script()
    for case in VECTORS["hash"]:
        script.add(
            f"xxh32 {case['key']} {case['seed']}",
            f"{case['xxh32']} {case['collision_bucket_t13']} {case['coco_h1_half11']} "
            f"{case['coco_h2']}",
        )
    words = VECTORS["stream"]["words"]
    script.add(f"stream {VECTORS['stream']['stream_seed']} {len(words)}", " ".join(map(str, words)))
    for case in VECTORS["randomiser"]:
        spec = Spec(case["mechanism"], case["d"], case["s"], case["t"], case["exp_eps_weight"])
        assert spec.fp == int(case["fingerprint"], 16)
        add_spec(script, spec)
        bits = Stream(case["stream_seed"])
        # the published z, and the number of words the reference draws for them
        z = device.randomise_coco if spec.mechanism == "coco" else device.randomise_collision
        replay = [
            z(case["keys"], case["signs"], spec.d, spec.s, spec.t, spec.e, case["seed"], bits)
            for _ in case["z"]
        ]
        assert replay == case["z"]
        script.add(
            f"rand {case['stream_seed']} {case['seed']} {len(case['z'])} "
            f"{len(case['keys'])} {' '.join(map(str, case['keys'] + case['signs']))}",
            " ".join(str(v) for v in [*case["z"], "|", bits.used]),
        )
    for report in WIRE["reports"]:
        fields = (report["fingerprint"], report["round"], report["seed"], report["z"])
        script.add(f"report {' '.join(map(str, fields))}", report["hex"])
        script.add(f"decrep {report['hex']}", " ".join(map(str, fields)))
    # libcoco encodes and decodes version-1 batches (docs/protocol.md section 10): a
    # version-2 batch, the shufflers' since rounds carry their length, is bad_version to it
    for batch in WIRE["batches"]:
        if batch["version"] != 1:
            script.add(f"decbatch {batch['hex']}", err("bad_version"))
            continue
        records = " ".join(f"{s} {z}" for s, z in zip(batch["seeds"], batch["zs"], strict=True))
        head = f"{batch['fingerprint']} {batch['round']} {batch['batch_id']} {batch['count']}"
        script.add(f"batch {head} {records}".rstrip(), batch["hex"])
        script.add(f"decbatch {batch['hex']}", f"{head} {records}".rstrip())
    for bad in WIRE["malformed"]:
        if bad["message"] == "manifest":
            continue  # shuffler -> aggregator only: a device never decodes a manifest
        command = "decrep" if bad["message"] == "report" else "decbatch"
        version_2 = bad["message"] == "batch" and bad["hex"].startswith("02")
        reason = "bad_version" if version_2 else bad["reason"]
        script.add(f"{command} {bad['hex'] or '-'}", err(reason))
    for case in WIRE["shards"]:  # docs/protocol.md section 13.2
        device_id = bytes.fromhex(case["device_id_utf8_hex"])
        script.add(f"shard {case['seed']} {case['count']} {device_id.hex()}", str(case["index"]))
        add_topic(script, b"lab", device_id, case["label"])
    _protocol_examples(script)
    return script


def _protocol_examples(script: Script) -> None:
    for n in [1, 2, 3, 10, 2**32, 2**32 + 1, 2**40 + 3, 2**53 - 1]:  # section 4.2
        bits = Stream(2024)
        r = device.randbelow(n, bits)
        script.add(f"randbelow 2024 {n}", f"{r} {bits.used}")
    for mech in ("coco", "collision"):  # section 2.4
        sp = MechanismSpec(mechanism=mech, d=128, s=8, epsilon=0.5)
        add_spec(
            script, Spec(mech, sp.d, sp.s, sp.t, sp.exp_eps_weight, fingerprint=sp.fingerprint_int)
        )
    # section 6.5: the encoder examples, each from a fresh xxh32_stream(77)
    add_tern(
        script, [0.5, -3.0, 10.0, 2.25], [0.0, -5.0, 0.0, 2.0], [1.0, 5.0, 10.0, 2.5], 3,
        clip=False, stream_seed=77,
    )  # fmt: skip
    add_tern(script, [1.5, 0.0], [0.0, 0.0], [1.0, 1.0], 2, clip=True, stream_seed=77)
    add_pad(script, [(3, 0.25), (7, -1.0)], 10, 4, overflow=True, stream_seed=77)
    add_pad(script, [(k, 0.5) for k in range(6)], 10, 3, overflow=True, stream_seed=77)
    add_round(script, 1764115230, 60)  # section 11.1
    # sections 10.3 and 10.5: the complete announcement, the sealed batch's plain batch
    add_announcement(script, doc_vectors.announcement())
    add_decode_batch(script, doc_vectors.sealed_batch().batch)


# --- seeded random cases against the reference -----------------------------------------------


def _random_input(rng: random.Random, d: int, s: int) -> tuple[list[int], list[int]]:
    keys = rng.sample(range(d), s) if d < 10**6 else [rng.randrange(d) for _ in range(s)]
    while len(set(keys)) < s:
        keys = [rng.randrange(d) for _ in range(s)]
    return keys, [rng.choice((-1, 1)) for _ in keys]


def _colliding_input(spec: MechanismSpec, seed: int) -> tuple[list[int], list[int]]:
    """An input whose entries share buckets (pairs) under ``seed`` where the domain allows."""
    groups: dict[int, list[int]] = {}
    for j in range(min(spec.d, 4000)):
        if spec.mechanism == "coco":
            key, _ = device.coco_hash(j, seed, spec.t // 2)
        else:
            key = device.collision_bucket(2 * j + 1, seed, spec.t)
        groups.setdefault(key, []).append(j)
    best = max(groups.values(), key=len)[: spec.s]
    rest = [j for j in range(spec.d) if j not in best][: spec.s - len(best)]
    keys = best + rest
    return keys, [1] * len(keys)


def random_randomisers(rng: random.Random, count: int) -> Script:
    script = Script()
    for _ in range(count):
        sp = random_spec(rng)
        spec = Spec(sp.mechanism, sp.d, sp.s, sp.t, sp.exp_eps_weight)
        add_spec(script, spec)
        for _ in range(2):
            seed = rng.getrandbits(32)
            if rng.random() < 0.3 and sp.d <= 4000:
                keys, signs = _colliding_input(sp, seed)
            else:
                keys, signs = _random_input(rng, sp.d, sp.s)
            add_rand(script, spec, keys, signs, seed=seed, stream_seed=rng.getrandbits(32),
                     draws=rng.randint(1, 8))  # fmt: skip
        # invalid inputs: a key too many or too few, out of range, repeated, a bad sign
        keys, signs = _random_input(rng, sp.d, sp.s)
        bad = rng.randrange(5)
        if bad == 0:
            keys, signs = keys[:-1], signs[:-1]
        elif bad == 1:
            keys, signs = [*keys, sp.d], [*signs, 1]
        elif bad == 2:
            keys[rng.randrange(sp.s)] = sp.d + rng.randrange(5)
        elif bad == 3 and sp.s > 1:
            keys[1] = keys[0]
        else:
            signs[rng.randrange(sp.s)] = rng.choice([0, 2, -2])
        add_rand(script, spec, keys, signs, seed=1, stream_seed=2, draws=1)
    return script


def random_specs(rng: random.Random, count: int) -> Script:
    """Raw spec fields around every boundary: the status and fingerprint coco.h documents."""
    script = Script()
    for fixed in [  # each limit exactly, on both sides
        Spec("collision", 64, COCO_MAX_S, COCO_MAX_S + 1, 27660952),
        Spec("collision", 64, COCO_MAX_S + 1, COCO_MAX_S + 2, 27660952),
        Spec("coco", 2**30, 2, 6, 27660952),
        Spec("coco", 2**30 + 1, 2, 6, 27660952),
        Spec("coco", 100, 3, 65534, 27660952),
        Spec("coco", 100, 3, 65536, 27660952),
        Spec("collision", 100, 3, 4, (1 << 24) + 1),
        Spec("collision", 100, 3, 4, 1 << 24),
        Spec("collision", 100, 2, 3, ((1 << 53) - (1 << 24)) // 2 - 1),
        Spec("collision", 100, 2, 3, ((1 << 53) - (1 << 24)) // 2),
    ]:
        add_spec(script, fixed)
    for _ in range(count):
        mech = rng.choice(["coco", "collision", "coco", "collision", "none"])
        d = rng.choice([0, 1, 2, 64, 2**30, 2**30 + 1, 2**32 - 1])
        s = rng.choice([0, 1, 2, 31, 32, 33, 64, d, d + 1]) & 0xFFFFFFFF
        t = rng.choice([0, 1, s + 1, 2 * s + 1, 2 * s + 2, 2 * s + 3, 65535, 65536]) & 0xFFFFFFFF
        e = rng.choice([0, 1 << 24, (1 << 24) + 1, 27660952, (1 << 53) - 1, 1 << 53, 1 << 60])
        hv = rng.choice([1, 1, 1, 0, 2])
        fp = rng.choice([None, None, rng.getrandbits(32)])
        add_spec(script, Spec(mech, d, s, t, e, hv, fp))
    return script


def _random_reading(rng: random.Random, lo: float, hi: float) -> float:
    kind = rng.random()
    if kind < 0.7:
        return rng.uniform(lo, hi)
    if kind < 0.8:
        return rng.choice([lo, hi])
    if kind < 0.9:
        return rng.choice([lo - 1.0, hi + 1e-9, hi * 3 + 1])
    return rng.choice([float("nan"), float("inf"), -float("inf")])


def random_encoders(rng: random.Random, count: int) -> Script:
    script = Script()
    for _ in range(count):
        d = rng.randint(1, 24)
        s = rng.randint(1, d) if rng.random() < 0.95 else rng.choice([0, d + 1])
        lo = [rng.uniform(-1e3, 1e3) for _ in range(d)]
        hi = [a + rng.choice([rng.uniform(1e-3, 1e4), 0.0, -1.0]) if rng.random() < 0.05
              else a + rng.uniform(1e-3, 1e4) for a in lo]  # fmt: skip
        values = [_random_reading(rng, a, b) if rng.random() < 0.97 else a
                  for a, b in zip(lo, hi, strict=True)]  # fmt: skip
        add_tern(
            script, values, lo, hi, s, clip=rng.random() < 0.5, stream_seed=rng.getrandbits(32)
        )
        ilo = [rng.randint(-(2**31), 2**31 - 2) for _ in range(d)]
        ihi = [
            rng.randint(a + 1, min(a + rng.choice([1, 10, 4096, 2**32]), 2**31 - 1)) for a in ilo
        ]
        ivals = [rng.randint(a - 2, b + 2) if rng.random() < 0.2 else rng.randint(a, b)
                 for a, b in zip(ilo, ihi, strict=True)]  # fmt: skip
        ivals = [min(max(v, -(2**31)), 2**31 - 1) for v in ivals]
        add_ternint(script, ivals, ilo, ihi, s, clip=rng.random() < 0.5,
                    stream_seed=rng.getrandbits(32))  # fmt: skip
        # the integer encoder draws like the double one: same keys, and signs that agree
        # wherever the two thresholds do
        kd = rng.randint(1, 40)
        pairs = [(k, rng.choice([-1.0, 1.0, 0.0, rng.uniform(-1, 1)]))
                 for k in rng.sample(range(kd), rng.randint(0, kd))]  # fmt: skip
        if pairs and rng.random() < 0.1:
            pairs[0] = (pairs[0][0], rng.choice([1.5, float("nan")]))
        if len(pairs) > 1 and rng.random() < 0.05:
            pairs[1] = (pairs[0][0], 0.0)
        ks = rng.randint(1, COCO_MAX_S) if rng.random() < 0.97 else rng.choice([0, COCO_MAX_S + 1])
        add_pad(script, pairs, kd, ks, overflow=rng.random() < 0.8, stream_seed=rng.getrandbits(32))
    return script


def random_wire(rng: random.Random, count: int) -> Script:
    script = Script()
    for _ in range(count):
        fields = [rng.choice([0, 1, 2**31, 2**32 - 1, rng.getrandbits(32)]) for _ in range(3)]
        z = rng.choice([0, 65535, 65536, 2**32 - 1, rng.getrandbits(16)])
        add_report(script, fields[0], fields[1], fields[2], z)
        payload = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 2, 15, 16, 17, 30])))
        if rng.random() < 0.7 and len(payload) >= 2:
            payload = bytes([1, rng.choice([1, 2])]) + payload[2:]
        add_decode_report(script, payload)
        n = rng.randint(0, 5)
        seeds = [rng.getrandbits(32) for _ in range(n)]
        zs = [rng.getrandbits(16) for _ in range(n)]
        batch_id = bytes(rng.getrandbits(8) for _ in range(16))
        add_batch(script, fields[0], fields[1], batch_id, seeds=seeds, zs=zs)
        from edge import codec  # noqa: PLC0415

        batch = codec.encode_batch(fields[0], fields[1], batch_id, seeds, zs)
        cut = rng.choice([len(batch), len(batch) - 1, len(batch) + 6, 29, 30])
        add_decode_batch(script, (batch + bytes(6))[:cut])
    return script


def random_rounds_units_topics(rng: random.Random, count: int) -> Script:
    script = Script()
    for _ in range(count):
        now = rng.choice([
            -1, 0, 946684800, 1735689599, 1735689600, 1764115230, 2**32 - 1,
            2**32 * 86400, 2**32 * 86400 - 1, 2**40, rng.randint(1735689600, 4 * 10**9),
        ])  # fmt: skip
        length = rng.choice([0, 1, 2, 60, 3600, 86400, 86401, rng.randint(1, 86400)])
        add_round(script, now, length)
        value = rng.choice([
            rng.uniform(0, 20), rng.uniform(0, 1e-6), rng.choice([0.5, 1.0, 20.0, 1e-05, 0.1]),
            float(rng.randint(0, 2**31)), rng.uniform(2**20, 2**31),
        ])  # fmt: skip
        text = repr(value)
        add_units(script, text, up=True)
        add_units(script, text, up=False)
        add_units(script, rng.choice(["-0.5", "-0", "0", "1e400", "1E-400", "2147483648",
                                      "2147483647.99999999999", "0.00000000000000000000000001"]),
                  up=rng.random() < 0.5)  # fmt: skip
        device_id = _random_name(rng)
        add_shard(script, device_id, rng.getrandbits(32), rng.choice([1, 2, 3, 7, 256]))
        shard = rng.choice([None, "g0s0", f"g{rng.randrange(65536)}s{rng.randrange(256)}"])
        add_topic(script, _random_name(rng), device_id, shard)
        add_label(script, rng.choice([0, 1, 65535, 65536]), rng.choice([0, 7, 255, 256]),
                  rng.choice([16, 11, 5, 4]))  # fmt: skip
    return script


def _random_name(rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        return bytes(rng.choice(b"abcxyz-_.019") for _ in range(rng.randint(1, 64)))
    if kind == 1:
        return "ä€😀".encode() * rng.randint(1, 22)  # 3 characters, 9 bytes per repeat
    if kind == 2:
        return b"dev" + bytes([rng.choice(b"/+#")]) + b"x"
    if kind == 3:
        return b"x" * rng.choice([64, 65])
    if kind == 4:
        return rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"])
    return bytes([rng.randrange(1, 128)]) + b"-dev"


# --- error paths ------------------------------------------------------------------------------


def error_paths() -> Script:
    """NULL arguments, failing and stuck random sources, and the ledger's refusals."""
    script = Script()
    spec = Spec("coco", 10, 3, 8, 33554431)
    add_spec(script, spec)
    import xxhash  # noqa: PLC0415

    empty = xxhash.xxh32_intdigest(b"", 0)
    script.add("nulls", " ".join(["null"] * 34 + [str(empty), str((empty * 4) >> 32)]))
    ledger = Ledger()
    script.add("ledger_new")
    script.add("ledger_charge 5", ledger.charge(5))  # never opened
    script.add("ledger_open 10", ledger.open(10))
    script.add("ledger_record", ledger_record(0, 0).hex())
    for cost in (3, 0, 4, 4, 3):
        script.add(f"ledger_charge {cost}", ledger.charge(cost))
    script.add("ledger_record", ledger_record(ledger.spent, ledger.reports).hex())
    # the budget survives a reopen (a reboot); the total in force is the new one
    script.add("ledger_open 12", ledger.open(12))
    script.add("ledger_charge 2", ledger.charge(2))
    script.add("ledger_charge 1", ledger.charge(1))
    # a damaged record is refused, never reset
    damaged = bytearray(ledger_record(ledger.spent, ledger.reports))
    damaged[9] ^= 1
    script.add(f"ledger_set {damaged.hex()}")
    script.add("ledger_open 100", f"{err('ledger_corrupt')} {ledger.spent} {ledger.reports}")
    script.add(f"ledger_set {ledger_record(1, 1).hex()[:-2]}00")
    script.add("ledger_open 100", f"{err('ledger_corrupt')} {ledger.spent} {ledger.reports}")
    # storage that fails: no charge is recorded, the report must not be made
    script.add(f"ledger_set {ledger_record(7, 2).hex()}")
    script.add("ledger_open 100", "ok 7 2")
    script.add("ledger_fail 0 1")
    script.add("ledger_charge 1", f"{err('storage')} 7 2")
    script.add("ledger_fail 1 0")
    script.add("ledger_open 100", f"{err('storage')} 7 2")
    script.add("ledger_new")
    script.add("ledger_fail 0 1")
    script.add("ledger_open 100", f"{err('storage')} 7 2")
    script.add("ledger_new")
    script.add("ledger_open 3", "ok 0 0")
    # coco_make_report: charge first (durably), then seed, randomise, encode
    keys, signs = [2, 4, 8], [1, -1, -1]
    bits = Stream(5)
    seed = bits(32)
    z = device.randomise_coco(keys, signs, 10, 3, 8, 33554431, seed, bits)
    report = struct.pack(">BBIIIH", 1, 1, spec.fp, 29401920, seed, z).hex()
    script.add("make 5 29401920 2 3 2 4 8 1 -1 -1", f"{report} {bits.used}")
    script.add("make 5 29401920 2 3 2 4 8 1 -1 -1", f"{err('budget')} 0")  # 2 + 2 > 3
    script.add("make 5 29401920 1 3 2 4 4 1 -1 1", f"{err('input')} 0")  # nothing charged
    script.add("make 5 29401920 1 2 2 4 1 -1", f"{err('input')} 0")
    script.add("ledger_open 100", "ok 2 1")
    script.add("rngfail", "rng rng rng rng rng")
    script.add("rngstuck", "rng ok rng rng ok")
    return script


def ledger_periods() -> Script:
    """The period cap (protocol 12.1), against edge/budget.py's arithmetic: refusal at the
    cap, renewal at the boundary, a reopen (a reboot), a clock set back, the lifetime cap
    still final, a changed period length, damaged and impossible records, a version-1
    record read and rewritten."""
    script = Script()
    model = Ledger()
    none = 2**64 - 1
    day = 86_400
    t0 = 20_300 * day

    def set_record(record: bytes) -> None:
        model.record = record
        script.add(f"ledger_set {record.hex()}")

    def open_period(total: int, seconds: int, units: int) -> None:
        script.add(
            f"ledger_open_period {total} {seconds} {units}",
            model.open(total, seconds, units, period=True),
        )

    def at(cost: int, when: int) -> None:
        script.add(f"ledger_at {cost} {when}", model.charge_at(cost, when))

    script.add("ledger_new")
    open_period(none, day, 4)
    script.add("ledger_charge 1", model.charge(1))  # no time given yet
    script.add("ledger_renews", model.renews())
    for k in range(4):
        at(1, t0 + 60 * k)
    at(1, t0 + day - 1)  # the cap, in the last second of the period
    script.add("ledger_renews", model.renews())
    at(1, t0 + day)  # the first second of the next period
    open_period(none, day, 4)  # a reboot keeps the period and its spending
    at(3, t0 + day + 5)
    at(1, t0 + day + 6)
    at(1, t0)  # the clock set back: charged to the highest period, refused
    script.add("ledger_renews", model.renews())
    at(4, t0 + 5 * day)  # a clock running ahead spends day 5's budget
    at(1, t0 + 2 * day)  # set back to day 2: still day 5's budget, refused
    script.add("ledger_renews", model.renews())
    at(1, 1_000)  # a clock that is not set
    open_period(16, day, 4)  # a lifetime cap too: 12 spent so far
    at(4, t0 + 6 * day)
    at(1, t0 + 7 * day)  # the lifetime cap refuses for good, whatever the period
    open_period(none, 3600, 4)  # hours now: day 6's spending stays until day 6 ends
    at(1, t0 + 6 * day + 7)
    at(1, t0 + 7 * day - 1)
    at(1, t0 + 7 * day)
    script.add("ledger_record", (model.record or b"").hex())
    script.add("ledger_open 100000", model.open(100000))  # no period cap: history kept
    script.add("ledger_charge 1", model.charge(1))
    script.add("ledger_record", (model.record or b"").hex())
    _ledger_records(script, model)
    return script


def _ledger_records(script: Script, model: Ledger) -> None:
    """Damaged, impossible and version-1 records, and a period over 366 days."""
    none = 2**64 - 1
    day = 86_400
    t0 = 20_300 * day

    def set_record(record: bytes) -> None:
        model.record = record
        script.add(f"ledger_set {record.hex()}")

    def open_period(total: int, seconds: int, units: int) -> None:
        script.add(
            f"ledger_open_period {total} {seconds} {units}",
            model.open(total, seconds, units, period=True),
        )

    # damage anywhere is refused, never reset; so are fields no charge can produce
    intact = model.record
    assert intact is not None
    for offset in (4, 22, 27, 30, 39):
        damaged = bytearray(intact)
        damaged[offset] ^= 0x10
        set_record(bytes(damaged))
        open_period(none, day, 4)
    for bad in (ledger_record(5, 1, day, 10, 6), ledger_record(5, 1, 0, 3, 0),
                ledger_record(5, 1, 366 * day + 1, 3, 0)):  # fmt: skip
        set_record(bad)
        open_period(none, day, 4)
    # a version-1 record (24 bytes, erased flash after it) is read and rewritten as version 2
    set_record(ledger_record_v1(7, 2))
    open_period(none, day, 4)
    script.add(f"ledger_at 1 {t0}", model.charge_at(1, t0))
    script.add("ledger_record", (model.record or b"").hex())
    script.add(
        f"ledger_open_period {none} {366 * day + 1} 4",
        model.open(none, 366 * day + 1, 4, period=True),
    )


def participation_cases(rng: random.Random, count: int) -> Script:
    """``coco_participates`` over the test stream: the rounds reported in and the words used
    are edge.participation's, for random q (and q = 1, which draws nothing)."""
    script = Script()
    for _ in range(count):
        q = rng.choice([1.0, 0.5, 0.1, 1e-6, rng.random() or 0.5])
        seed, rounds_ = rng.getrandbits(32), rng.randint(1, 200)
        bits = Stream(seed)
        yes = sum(participates(q, bits) for _ in range(rounds_))
        script.add(f"part {seed} {threshold(q)} {rounds_}", f"{yes} {bits.used}")
    return script


def mcu_script() -> Script:
    """What the emulated boards run: every published vector and worked example, the
    hand-written announcements and error paths, a sample of the random cases, and the
    benchmarks."""
    rng = random.Random(20250620)
    script = published_vectors()
    script.extend(announcement_cases(large=False))
    script.extend(error_paths())
    script.extend(ledger_periods())
    script.extend(participation_cases(rng, 10))
    script.extend(random_specs(rng, 20))
    script.extend(random_randomisers(rng, 15))
    script.extend(random_encoders(rng, 6))
    script.extend(random_wire(rng, 6))
    script.extend(random_rounds_units_topics(rng, 6))
    script.extend(benchmarks())
    return script


BENCH_KEYS = [0, 5, 17, 33, 40, 45, 50, 63]
BENCH_SIGNS = [1, -1, 1, 1, -1, -1, 1, -1]
BENCH_REPEATS = 200


def bench_specs() -> list[MechanismSpec]:
    return [MechanismSpec(mechanism=mech, d=64, s=8, epsilon=1.0) for mech in ("coco", "collision")]


def benchmarks() -> Script:
    """Instructions and stack of one report at d = 64, s = 8 for each mechanism, and of the
    other parts; results are measured, not compared (``None``)."""
    script = Script()
    args = f"{len(BENCH_KEYS)} {' '.join(map(str, BENCH_KEYS + BENCH_SIGNS))}"
    for sp in bench_specs():
        add_spec(script, Spec(sp.mechanism, sp.d, sp.s, sp.t, sp.exp_eps_weight))
        script.add(f"bench report {BENCH_REPEATS} {args}", None)
        script.add("ledger_new")
        script.add("ledger_open 1000000", "ok 0 0")
        script.add(f"bench make {BENCH_REPEATS} {args}", None)
        script.add("bench fingerprint 10", None)
    script.add("bench tern 20", None)
    script.add("bench ternint 20", None)
    script.add(f"bench ann 10 {doc_vectors.announcement().hex()}", None)
    return script
