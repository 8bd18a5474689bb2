"""Commands for libcoco's harness (``harness/driver.c``) and the results the Python reference
gives for them: ``edge.device``, ``edge.codec``, ``edge.rounds``, ``edge.announce``,
``edge.topics``, ``xxhash`` for the shard of a device, ``fractions`` for ledger units.

A :class:`Script` collects ``(command, expected result)`` pairs; the same script runs on the
host and, compiled in, on the emulated microcontrollers, and :meth:`Script.check` compares
the ``> name: result`` lines the harness prints with the expectations, exactly.
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import xxhash

from edge import codec, device, rounds, topics
from edge.budget import MAX_PERIOD_SECONDS, BudgetPolicy, BudgetState, PeriodPolicy, Refusal, decide
from edge.errors import SpecError
from edge.spec import MechanismSpec

MECH_CODE = {"coco": 1, "collision": 2}
UNIT = device.WEIGHT_UNIT
COCO_MAX_S = 32  # libcoco's default compile-time limit (coco.h)
U32 = 0xFFFFFFFF


@dataclass
class Script:
    """Commands and the result line each must print (``"err *"``: any error)."""

    cases: list[tuple[str, list[str | None]]] = field(default_factory=list)

    def add(self, command: str, *expected: str | None) -> None:
        """``command`` and its expected result(s) (an empty one if none is given); ``None``
        is not compared (benchmarks)."""
        self.cases.append((command, list(expected) or [""]))

    def extend(self, other: Script) -> None:
        self.cases += other.cases

    @property
    def commands(self) -> list[str]:
        return [command for command, _ in self.cases]

    def check(self, lines: Sequence[str]) -> dict[str, list[str]]:
        """Compares the harness output with the expectations (AssertionError listing the
        first mismatches); returns the results of the uncompared lines by command name."""
        results = [_split(line) for line in lines if line.startswith("> ")]
        results = [r for r in results if r[0] != "calib"]
        expected = [
            (command.split(" ", 1)[0], want) for command, wants in self.cases for want in wants
        ]
        assert len(results) == len(expected), (
            f"{len(results)} result lines for {len(expected)} expected; last lines:\n"
            + "\n".join(lines[-5:])
        )
        mismatches: list[str] = []
        free: dict[str, list[str]] = {}
        commands = iter(c for c, wants in self.cases for _ in wants)
        for (name, got), (want_name, want), command in zip(
            results, expected, commands, strict=True
        ):
            if want is None:
                free.setdefault(name, []).append(got)
            elif name != want_name or not _matches(got, want):
                mismatches.append(f"{command[:160]}\n    got:  {got}\n    want: {want}")
        assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches[:12])
        return free


def _split(line: str) -> tuple[str, str]:
    name, _, rest = line[2:].partition(":")
    return name, rest.strip()


def _matches(got: str, want: str) -> bool:
    if want.endswith("*"):
        return got.startswith(want[:-1])
    return got == want


# --- the deterministic stream, counted --------------------------------------------------


class Stream:
    """``device.xxh32_stream(seed)`` that counts its words (the harness prints its count)."""

    def __init__(self, seed: int) -> None:
        self._bits = device.xxh32_stream(seed)
        self.used = 0

    def __call__(self, k: int) -> int:
        self.used += 1
        return self._bits(k)


def double_hex(value: float) -> str:
    return struct.pack(">d", value).hex()


def err(name: str) -> str:
    return f"err {name}"


# --- specs and randomisers ------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    mechanism: str
    d: int
    s: int
    t: int
    e: int
    hv: int = 1
    fingerprint: int | None = None  # None: the true one

    @property
    def code(self) -> int:
        return MECH_CODE.get(self.mechanism, 0)

    @property
    def status(self) -> str:
        """The status coco_spec_check() documents for these fields, in its order."""
        d, s, t, e = self.d, self.s, self.t, self.e
        if self.code not in (1, 2):
            return "spec_mechanism"
        if self.hv != 1:
            return "spec_hash_version"
        if not 1 <= d <= 1 << 30:
            return "spec_d"
        if not 1 <= s <= d:
            return "spec_s"
        if t > 65535 or (t % 2 or t < 2 * s + 2 if self.code == 1 else t < s + 1):
            return "spec_t"
        if not UNIT < e < 1 << 53 or s * e + (t - s) * UNIT >= 1 << 53:
            return "spec_weight"
        if s > COCO_MAX_S:
            return "spec_s_max"
        return "ok"

    @property
    def true_fingerprint(self) -> int:
        """The first 4 bytes of SHA-256 of the canonical string (protocol 2.4)."""
        text = (
            f"coco-fleet/spec/v1;mechanism={self.mechanism};d={self.d};s={self.s};t={self.t};"
            f"E={self.e};U={UNIT};hash={self.hv}"
        )
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")

    @property
    def fp(self) -> int:
        return self.true_fingerprint if self.fingerprint is None else self.fingerprint

    def command(self) -> str:
        return f"spec {self.code} {self.d} {self.s} {self.t} {self.e} {self.hv} {self.fp}"

    def expected(self) -> str:
        status = self.status
        if status not in ("ok", "spec_s_max"):
            return f"{status} {err(status)}"
        match = "match" if self.fp == self.true_fingerprint else "mismatch"
        return f"{status} {self.true_fingerprint} {match}"


def sparse_args(keys: Sequence[int], signs: Sequence[int]) -> str:
    return " ".join(str(v) for v in [len(keys), *keys, *signs])


def reference_draws(
    spec: Spec, keys: list[int], signs: list[int], *, seed: int, bits: Stream, n: int
) -> list[int]:
    """``n`` reports of edge.device's randomiser under one seed, from one stream."""
    fn = device.randomise_coco if spec.mechanism == "coco" else device.randomise_collision
    return [fn(keys, signs, spec.d, spec.s, spec.t, spec.e, seed, bits) for _ in range(n)]


def add_spec(script: Script, spec: Spec) -> None:
    script.add(spec.command(), spec.expected())


def add_rand(
    script: Script,
    spec: Spec,
    keys: list[int],
    signs: list[int],
    *,
    seed: int,
    stream_seed: int,
    draws: int,
) -> None:
    """``rand`` under the current spec (added with :func:`add_spec` before)."""
    command = f"rand {stream_seed} {seed} {draws} {sparse_args(keys, signs)}"
    status = spec.status
    if status != "ok":
        script.add(command, err(status))
        return
    try:
        device.check_sparse(keys, signs, spec.d, spec.s)
    except ValueError:
        script.add(command, err("input"))
        return
    bits = Stream(stream_seed)
    z = reference_draws(spec, keys, signs, seed=seed, bits=bits, n=draws)
    script.add(command, " ".join(str(v) for v in [*z, "|", bits.used]))


# --- encoders ---------------------------------------------------------------------------


def _sparse_result(keys: list[int], signs: list[int], used: int) -> str:
    return " ".join(str(v) for v in [*keys, "|", *signs, "|", used])


def ternarise_error(
    values: Sequence[float], lo: Sequence[float], hi: Sequence[float], s: int, clip: bool
) -> str | None:
    """The status coco_ternarise() documents for invalid input (None when valid)."""
    d = len(values)
    if d < 1:
        return "spec_d"
    if not 1 <= s <= d:
        return "spec_s"
    if s > COCO_MAX_S:
        return "spec_s_max"
    for x, a, b in zip(values, lo, hi, strict=True):
        if not math.isfinite(x):
            return "reading"
        if not a < b or not math.isfinite(b - a):
            return "range"
        if (x < a or x > b) and not clip:
            return "reading"
    return None


def add_tern(
    script: Script,
    values: list[float],
    lo: list[float],
    hi: list[float],
    s: int,
    *,
    clip: bool,
    stream_seed: int,
) -> None:
    args = " ".join(double_hex(v) for v in [*values, *lo, *hi])
    command = f"tern {stream_seed} {int(clip)} {len(values)} {s} {args}"
    problem = ternarise_error(values, lo, hi, s, clip)
    if problem is not None:
        script.add(command, err(problem))
        return
    bits = Stream(stream_seed)
    keys, signs = device.ternarise(values, lo, hi, s, bits, clip)
    script.add(command, _sparse_result(keys, signs, bits.used))


def ternarise_int(
    values: list[int], lo: list[int], hi: list[int], s: int, *, clip: bool, bits: Stream
) -> tuple[list[int], list[int]]:
    """The integer encoder's reference: the draws of device.ternarise, and sign +1 iff
    bits < floor(2^32 (x - lo) / (hi - lo)), exactly."""
    keys = device._sample_without_replacement(len(values), s, bits)
    signs = []
    for j in keys:
        x = min(max(values[j], lo[j]), hi[j]) if clip else values[j]
        threshold = ((x - lo[j]) << 32) // (hi[j] - lo[j])
        signs.append(1 if bits(32) < threshold else -1)
    return keys, signs


def add_ternint(
    script: Script,
    values: list[int],
    lo: list[int],
    hi: list[int],
    s: int,
    *,
    clip: bool,
    stream_seed: int,
) -> None:
    args = " ".join(str(v) for v in [*values, *lo, *hi])
    command = f"ternint {stream_seed} {int(clip)} {len(values)} {s} {args}"
    d = len(values)
    problem = None
    if d < 1:
        problem = "spec_d"
    elif not 1 <= s <= d:
        problem = "spec_s"
    elif s > COCO_MAX_S:
        problem = "spec_s_max"
    else:
        for x, a, b in zip(values, lo, hi, strict=True):
            if not a < b:
                problem = "range"
                break
            if (x < a or x > b) and not clip:
                problem = "reading"
                break
    if problem is not None:
        script.add(command, err(problem))
        return
    bits = Stream(stream_seed)
    keys, signs = ternarise_int(values, lo, hi, s, clip=clip, bits=bits)
    script.add(command, _sparse_result(keys, signs, bits.used))


def add_pad(
    script: Script,
    pairs: list[tuple[int, float]],
    d: int,
    s: int,
    *,
    overflow: bool,
    stream_seed: int,
) -> None:
    args = " ".join([*(str(k) for k, _ in pairs), *(double_hex(v) for _, v in pairs)])
    command = f"pad {stream_seed} {int(overflow)} {d} {s} {len(pairs)} {args}".rstrip()
    problem = None
    if not 1 <= d <= 1 << 30 or s > (1 << 30) - d:
        problem = "spec_d"
    elif s < 1:
        problem = "spec_s"
    elif s > COCO_MAX_S:
        problem = "spec_s_max"
    else:
        seen: set[int] = set()
        for key, value in pairs:
            if key >= d or key in seen:
                problem = "input"
                break
            if not (math.isfinite(value) and -1.0 <= value <= 1.0):
                problem = "reading"
                break
            seen.add(key)
        if problem is None and len(pairs) > s and not overflow:
            problem = "overflow"
    if problem is not None:
        script.add(command, err(problem))
        return
    bits = Stream(stream_seed)
    keys, signs = device.pad_key_values(pairs, d, s, bits, overflow)
    script.add(command, _sparse_result(keys, signs, bits.used))


# --- wire format, rounds, units -------------------------------------------------------------


def add_report(script: Script, fp: int, round_: int, seed: int, z: int) -> None:
    command = f"report {fp} {round_} {seed} {z}"
    try:
        script.add(command, codec.encode_report(fp, round_, seed, z).hex())
    except codec.CodecError as exc:
        script.add(command, err(exc.reason))


def add_decode_report(script: Script, payload: bytes) -> None:
    command = f"decrep {payload.hex() or '-'}"
    try:
        _, fp, round_, seed, z = codec.decode_report(payload)
    except codec.CodecError as exc:
        script.add(command, err(exc.reason))
        return
    script.add(command, f"{fp} {round_} {seed} {z}")


def add_batch(
    script: Script, fp: int, round_: int, batch_id: bytes, *, seeds: list[int], zs: list[int]
) -> None:
    records = " ".join(f"{seed} {z}" for seed, z in zip(seeds, zs, strict=True))
    command = f"batch {fp} {round_} {batch_id.hex()} {len(seeds)} {records}".rstrip()
    script.add(command, codec.encode_batch(fp, round_, batch_id, seeds, zs).hex())


def add_decode_batch(script: Script, payload: bytes) -> None:
    command = f"decbatch {payload.hex() or '-'}"
    try:
        fp, round_, batch_id, seeds, zs = codec.decode_batch(payload)
    except codec.CodecError as exc:
        script.add(command, err(exc.reason))
        return
    records = [str(v) for seed, z in zip(seeds, zs, strict=True) for v in (seed, z)]
    script.add(command, " ".join([str(fp), str(round_), batch_id.hex(), str(len(seeds)), *records]))


def add_round(script: Script, now: int, length: int) -> None:
    command = f"round {now} {length}"
    try:
        r = rounds.round_of(now, length)
        nxt = rounds.seconds_to_next_round(length, now)
    except rounds.ClockError:
        script.add(command, err("clock"))
        return
    except ValueError:
        script.add(command, err("round_seconds"))
        return
    script.add(command, f"{r} {int(nxt)}")


def units(text: str, *, up: bool) -> int | None:
    """``text`` (a JSON number) in units of 2^-32, rounded up or down; None if negative or
    at least 2^31 (where libcoco returns COCO_ERR_ARG)."""
    value = Fraction(text)
    if value < 0 or value >= 1 << 31:
        return None
    scaled = value * (1 << 32)
    return math.ceil(scaled) if up else math.floor(scaled)


def add_units(script: Script, text: str, *, up: bool) -> None:
    value = units(text, up=up)
    script.add(f"units {text} {int(up)}", err("arg") if value is None else str(value))


# --- shards and topics ----------------------------------------------------------------------


def shard_index(device_id: bytes, seed: int, count: int) -> int:
    """The shard of a device (docs D2): (XXH32(id, seed) * count) >> 32, with the xxHash
    library's XXH32; and edge.device's where this checkout has it."""
    index = (xxhash.xxh32_intdigest(device_id, seed) * count) >> 32
    reference = getattr(device, "shard_index", None)
    if reference is not None and count >= 1:
        assert reference(device_id, seed, count) == index
    return index


def add_shard(script: Script, device_id: bytes, seed: int, count: int) -> None:
    script.add(
        f"shard {seed} {count} {device_id.hex() or '-'}", str(shard_index(device_id, seed, count))
    )


def label(generation: int, index: int) -> str:
    return f"g{generation}s{index}"


def add_label(script: Script, generation: int, index: int, cap: int = 16) -> None:
    command = f"label {generation} {index} {cap}"
    if generation > 65535 or index > 255:
        script.add(command, err("arg"))
    elif len(label(generation, index)) + 1 > cap:
        script.add(command, err("buffer"))
    else:
        script.add(command, label(generation, index).encode().hex())


def topic_name(raw: bytes) -> str | None:
    """A topic level as edge.topics accepts it, or None."""
    try:
        name = raw.decode("utf-8")
        return topics.check_name("name", name)
    except (UnicodeDecodeError, SpecError):
        return None


def add_topic(script: Script, deployment: bytes, device_id: bytes, shard: str | None) -> None:
    command = f"topic {deployment.hex() or '-'} {device_id.hex() or '-'} {shard or '-'}"
    dep, dev = topic_name(deployment), topic_name(device_id)
    if dep is None or dev is None:
        script.add(command, err("name"))
        return
    level = "" if shard is None else f"/{shard}"
    script.add(command, f"coco/v1/{dep}/ingress{level}/{dev}".encode().hex())


def random_spec(rng: random.Random) -> MechanismSpec:
    """A valid spec of random mechanism, d, s (at most COCO_MAX_S), epsilon and t."""
    mech = rng.choice(["coco", "collision"])
    d = rng.choice([1, 2, 3, 6, 10, 64, 100, 1000, 2**20, 2**30])
    s = rng.randint(1, min(d, COCO_MAX_S, 12 if rng.random() < 0.8 else COCO_MAX_S))
    if mech == "coco" and d < 2:
        mech = "collision"
    eps = rng.choice([0.05, 0.5, 0.6931471805599453, 1.0, 2.0, 5.0, 12.0])
    low = 2 * s + 2 if mech == "coco" else s + 1
    t = None if rng.random() < 0.5 else low + (2 if mech == "coco" else 1) * rng.randint(0, 40)
    return MechanismSpec(mechanism=mech, d=d, s=s, epsilon=eps, t=t)  # type: ignore[arg-type]


# --- the ledger -----------------------------------------------------------------------------

LEDGER_MAGIC_V1 = b"coLd\x01\x00\x00\x00"
LEDGER_MAGIC = b"coLd\x02\x00\x00\x00"
CLOCK_FLOOR = rounds.CLOCK_FLOOR


def ledger_record_v1(spent: int, reports: int) -> bytes:
    """The 24-byte record of libcoco before period budgets (still read)."""
    head = LEDGER_MAGIC_V1 + struct.pack(">QI", spent, reports)
    return head + struct.pack(">I", zlib.crc32(head))


def ledger_record(
    spent: int, reports: int, period_seconds: int = 0, period: int = 0, period_spent: int = 0
) -> bytes:
    """The 40-byte record (protocol 12.1)."""
    head = LEDGER_MAGIC + struct.pack(
        ">QIIIQ", spent, reports, period_seconds, period, period_spent
    )
    return head + struct.pack(">I", zlib.crc32(head))


def _read_record(rec: bytes) -> BudgetState | None:
    """The state in a stored record, or ``None`` if libcoco must refuse it."""
    if rec[:8] == LEDGER_MAGIC_V1 and len(rec) >= 24:
        if struct.unpack(">I", rec[20:24])[0] != zlib.crc32(rec[:20]):
            return None
        spent, reports = struct.unpack(">QI", rec[8:20])
        return BudgetState(spent=Fraction(spent), reports=reports)
    if rec[:8] != LEDGER_MAGIC or len(rec) != 40:
        return None
    if struct.unpack(">I", rec[36:])[0] != zlib.crc32(rec[:36]):
        return None
    spent, reports, seconds, period, period_spent = struct.unpack(">QIIIQ", rec[8:36])
    if (
        seconds > MAX_PERIOD_SECONDS
        or period_spent > spent
        or (seconds == 0 and (period or period_spent))
    ):
        return None
    return BudgetState(
        spent=Fraction(spent),
        reports=reports,
        period_seconds=seconds or None,
        period=period if seconds else None,
        period_spent=Fraction(period_spent),
    )


@dataclass
class Ledger:
    """The reference model of the ledger of coco.h over an in-memory record: the caps'
    arithmetic is edge/budget.py's :func:`~edge.budget.decide`, in units of 2^-32."""

    record: bytes | None = None
    total: int = 0
    state: BudgetState = field(default_factory=BudgetState)
    cap: PeriodPolicy | None = None
    now: int = 0
    is_open: bool = False

    @property
    def spent(self) -> int:
        return int(self.state.spent)

    @property
    def reports(self) -> int:
        return self.state.reports

    def _line(self, status: str, period: bool) -> str:
        line = f"{status} {self.spent} {self.reports}"
        if period:
            st = self.state
            line += f" {st.period_seconds or 0} {st.period or 0} {int(st.period_spent)}"
        return line

    def open(self, total: int, seconds: int = 0, units: int = 0, *, period: bool = False) -> str:
        if seconds > MAX_PERIOD_SECONDS:
            return self._line(err("arg"), period)
        if self.record is None:
            self.record = ledger_record(0, 0)
        state = _read_record(self.record)
        if state is None:
            return self._line(err("ledger_corrupt"), period)
        self.cap = PeriodPolicy(Fraction(units), seconds) if seconds else None
        self.state = state if self.cap is None else state.under(self.cap)
        self.total = total
        self.now = 0
        self.is_open = True
        return self._line("ok", period)

    def charge(self, cost: int, *, period: bool = False) -> str:
        if not self.is_open:
            return self._line(err("null"), period)
        if cost == 0:
            return self._line(err("arg"), period)
        if self.cap is not None and self.now < CLOCK_FLOOR and self.spent + cost <= self.total:
            return self._line(err("clock"), period)
        outcome = decide(
            self.state, BudgetPolicy(Fraction(self.total), self.cap), Fraction(cost), self.now
        )
        if isinstance(outcome, Refusal):
            kind = "budget" if outcome.kind == "lifetime" else "period_budget"
            return self._line(err(kind), period)
        self.state = outcome
        st = outcome
        self.record = ledger_record(
            self.spent, self.reports, st.period_seconds or 0, st.period or 0, int(st.period_spent)
        )
        return self._line("ok", period)

    def charge_at(self, cost: int, when: int) -> str:
        if when < CLOCK_FLOOR:
            return self._line(err("clock"), True)
        self.now = when
        return self.charge(cost, period=True)

    def renews(self) -> str:
        if self.cap is None:
            return err("arg")
        if self.now < CLOCK_FLOOR:
            return err("clock")
        index = self.cap.index(self.now)
        if self.state.period is not None and index < self.state.period:
            index = self.state.period
        return str(self.cap.start(index + 1))
