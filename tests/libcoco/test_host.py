"""libcoco on the host: every published vector bit-exact, announcements, error paths and
seeded random cases against the Python reference, each under a plain build (-O2) and under
AddressSanitizer + UndefinedBehaviorSanitizer (where any undefined behaviour aborts the run);
randbelow and the randomisers' output law checked exactly by enumeration.

Both builds compile with -std=c99 -pedantic -Wall -Wextra -Werror (and -Wshadow
-Wconversion -Wstrict-prototypes -Wmissing-prototypes): a warning fails the session fixture.
"""

from __future__ import annotations

import itertools
import math
import random
import subprocess
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from edge import CoCo, Collision, LocalMechanism, device
from edge.participation import participates, threshold
from tests.libcoco import announcements, build, scripts
from tests.libcoco.commands import Script, Spec, Stream, add_spec, sparse_args, ternarise_int

pytestmark = [pytest.mark.integration, pytest.mark.unhurried]


def run(binary: Path, script: Script) -> None:
    script.check(build.run_host(binary, script.commands))


def test_published_vectors_are_bit_exact(host: Path) -> None:
    run(host, scripts.published_vectors())


def test_announcements(host: Path) -> None:
    run(host, announcements.announcement_cases())


def test_error_paths_return_documented_codes(host: Path) -> None:
    run(host, scripts.error_paths())


def test_period_budgets_match_the_reference(host: Path) -> None:
    """The ledger's period cap: refused at the cap, renewed at the boundary, across a reopen,
    never renewed by a clock set back, the lifetime cap final, damage refused."""
    run(host, scripts.ledger_periods())


def test_participation_matches_the_reference(host: Path) -> None:
    run(host, scripts.participation_cases(random.Random(20250621), 100))


@pytest.mark.parametrize("q", [0.05, 0.3, 0.5, 0.9])
def test_realised_participation_matches_q(host_plain: Path, q: float) -> None:
    """Over a seeded stream, the rounds a device reports in are Binomial(n, q): the count is
    within 5 standard errors of n q (a false alarm below 1e-6 per case), and it is exactly
    what the Python reference decides on the same words."""
    n, seed = 200_000, 20250622
    (line,) = [x for x in build.run_host(host_plain, [f"part {seed} {threshold(q)} {n}"])
               if x.startswith("> ")]  # fmt: skip
    yes, words = (int(v) for v in line.split(":")[1].split())
    assert words == n
    bits = Stream(seed)
    assert yes == sum(participates(q, bits) for _ in range(n))
    se = math.sqrt(n * q * (1 - q))
    assert abs(yes - n * q) <= 5 * se


def test_random_cases_match_the_reference(host: Path) -> None:
    """Seeded random specs, inputs (valid, colliding, invalid), readings, key-value pairs,
    wire messages, clocks, decimal numbers, device ids, topics and announcements (valid and
    damaged): the same results as the Python reference, the same number of random words."""
    rng = random.Random(20250620)
    script = Script()
    script.extend(scripts.random_specs(rng, 300))
    script.extend(scripts.random_randomisers(rng, 150))
    script.extend(scripts.random_encoders(rng, 150))
    script.extend(scripts.random_wire(rng, 150))
    script.extend(scripts.random_rounds_units_topics(rng, 300))
    script.extend(announcements.random_announcements(rng, 300))
    run(host, script)


def test_a_wrong_expectation_fails(host_plain: Path) -> None:
    """The comparison can fail: the harness's output is really what is compared."""
    script = Script()
    script.add("xxh32 1 0", "4089149075 12 9 1")
    run(host_plain, script)
    script.cases[0] = ("xxh32 1 0", ["4089149075 12 9 -1"])
    with pytest.raises(AssertionError, match="1 mismatches"):
        run(host_plain, script)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 100, 1000, 4097])
def test_randbelow_is_exactly_uniform(host_plain: Path, n: int) -> None:
    """Each k-bit pattern is accepted as itself if below n and otherwise rejected (a second
    word is drawn), so every value of [0, n) comes from exactly one pattern."""
    lines = build.run_host(host_plain, [f"patterns {n}"])
    results = [line.split(":")[1].split() for line in lines[1:]]
    k = (n - 1).bit_length()
    assert len(results) == 1 << k
    for pattern, (shown, value, words) in enumerate(results):
        assert int(shown) == pattern
        if pattern < n:
            assert (int(value), int(words)) == (pattern, 1)
        else:  # rejected: the next word (0) is drawn and accepted
            assert (int(value), int(words)) == (0, 2)


# --- the exact output law ---------------------------------------------------------------------


def exact_law(
    mechanism: str, *, t: int, e: int, unit: int, keys: list[int], signs: list[int], seed: int
) -> list[Fraction]:
    """P[z | input, seed] of docs/protocol.md 5.2 (Collision) and 5.4 (CoCo), with weights
    E and U."""
    s = len(keys)
    if mechanism == "collision":
        omega = s * e + (t - s) * unit
        hit = {
            device.collision_bucket(2 * j + (b > 0), seed, t)
            for j, b in zip(keys, signs, strict=True)
        }
        free = Fraction(omega - len(hit) * e, (t - len(hit)) * omega)
        return [Fraction(e, omega) if z in hit else free for z in range(t)]
    half = t // 2
    omega = s * (e + unit) + (t - 2 * s) * unit
    by_pair: dict[int, list[int]] = defaultdict(list)
    for j, b in zip(keys, signs, strict=True):
        pair, h2 = device.coco_hash(j, seed, half)
        by_pair[pair].append(device.coco_position(pair, h2, b, half))
    m = len(by_pair)
    law = [Fraction(omega - m * (e + unit), (t - 2 * m) * omega)] * t
    for pair, positions in by_pair.items():
        c = len(positions)
        law[pair] = law[pair + half] = Fraction(0)
        for pos in positions:
            law[pos] += Fraction(e, c * omega)
            law[2 * pair + half - pos] += Fraction(unit, c * omega)
    return law


def test_exact_law_is_the_reference_law() -> None:
    """The law above is the project's own (LocalMechanism.exact_probabilities), at U = 2^24."""
    rng = random.Random(3)
    for kind, t in [(CoCo, 8), (Collision, 4), (CoCo, 14), (Collision, 9)]:
        m: LocalMechanism = kind(d=12, s=3, epsilon=0.6931471805599453, t=t)
        for _ in range(20):
            keys = rng.sample(range(12), 3)
            signs = [rng.choice((-1, 1)) for _ in keys]
            seed = rng.getrandbits(32)
            x = np.zeros(12)
            x[keys] = signs
            want = m.exact_probabilities(x, seed)
            got = exact_law(
                m.spec.mechanism, t=t, e=m.spec.exp_eps_weight, unit=device.WEIGHT_UNIT,
                keys=keys, signs=signs, seed=seed,
            )  # fmt: skip
            assert got == want


LAW_GRID = [
    # (mechanism, d, s, t, E, U): small integer weights, so that randbelow(Omega) has few
    # outcomes; E / U as for epsilon = ln 2, ln 3, ln 1.5 and ln 5
    ("collision", 6, 2, 3, 2, 1),
    ("collision", 6, 2, 4, 3, 1),
    ("collision", 10, 3, 5, 3, 2),
    ("collision", 8, 4, 7, 5, 1),
    ("coco", 6, 2, 6, 2, 1),
    ("coco", 10, 3, 8, 3, 1),
    ("coco", 10, 3, 10, 3, 2),
    ("coco", 8, 4, 12, 5, 1),
]


@pytest.mark.parametrize("case", LAW_GRID, ids=lambda case: "-".join(map(str, case)))
def test_output_law_is_exact(host_law: Path, case: tuple[str, int, int, int, int, int]) -> None:
    """Every path of draws: in this build coco_randbelow takes each of its n outcomes from an
    enumerating oracle (probability 1/n each; randbelow's own uniformity is the test above),
    so the probabilities of the outputs are exact fractions. They must equal the protocol's
    law for every input of the domain (every support and sign pattern, colliding ones
    included) under 12 seeds: no tolerance."""
    mechanism, d, s, t, e, unit = case
    spec = Spec(mechanism, d, s, t, e)
    inputs = [
        (list(keys), list(signs))
        for keys in itertools.combinations(range(d), s)
        for signs in itertools.product((-1, 1), repeat=s)
    ]
    rng = random.Random(f"{mechanism}-{d}-{s}-{t}")
    chosen = rng.sample(inputs, min(len(inputs), 24))
    commands = [spec.command()]
    cases = []
    for seed in [0, 1, 0xFFFFFFFF, *(rng.getrandbits(32) for _ in range(9))]:
        for keys, signs in chosen:
            commands.append(f"law {unit} {seed} {sparse_args(keys, signs)}")
            cases.append((seed, keys, signs))
    lines = build.run_host(host_law, commands)
    laws: list[list[Fraction]] = []
    for line in lines[1:]:
        if line == "> law:":
            laws.append([Fraction(0)] * t)
        elif line.startswith("leaf "):
            _, z, denominator = line.split()
            laws[-1][int(z)] += Fraction(1, int(denominator))
        else:
            assert line == "> law: end", line
    assert len(laws) == len(cases)
    for law, (seed, keys, signs) in zip(laws, cases, strict=True):
        want = exact_law(mechanism, t=t, e=e, unit=unit, keys=keys, signs=signs, seed=seed)
        assert law == want, (seed, keys, signs)
        assert sum(law) == 1


def test_law_enumeration_sees_a_wrong_law(host_law: Path) -> None:
    """The enumeration can fail: the same paths under a law for another seed differ."""
    spec = Spec("coco", 6, 2, 6, 2)
    script_lines = [spec.command(), f"law 1 5 {sparse_args([0, 1], [1, 1])}"]
    lines = build.run_host(host_law, script_lines)
    law = [Fraction(0)] * 6
    for line in lines:
        if line.startswith("leaf "):
            _, z, denominator = line.split()
            law[int(z)] += Fraction(1, int(denominator))
    assert law == exact_law("coco", t=6, e=2, unit=1, keys=[0, 1], signs=[1, 1], seed=5)
    assert law != exact_law("coco", t=6, e=2, unit=1, keys=[0, 1], signs=[1, 1], seed=6)


# --- the build ------------------------------------------------------------------------------


@pytest.mark.parametrize("max_s", [1, 4096])
def test_compile_time_limit_is_configurable(max_s: int) -> None:
    cc = build.tool("cc", "gcc")
    for source in build.SOURCES:
        subprocess.run(
            [cc, *build.WARNINGS, f"-DCOCO_MAX_S={max_s}", f"-I{build.INCLUDE}", "-fsyntax-only",
             str(source)],
            check=True, capture_output=True,
        )  # fmt: skip


def test_an_out_of_range_limit_is_a_compile_error() -> None:
    cc = build.tool("cc", "gcc")
    proc = subprocess.run(
        [cc, "-DCOCO_MAX_S=4097", f"-I{build.INCLUDE}", "-fsyntax-only", str(build.SOURCES[0])],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "COCO_MAX_S must be in [1, 4096]" in proc.stderr


def test_header_is_valid_cplusplus(tmp_path: Path) -> None:
    """coco.h declares C linkage for C++ firmware (Arduino sketches are C++)."""
    cxx = build.tool("c++", "g++")
    source = tmp_path / "use.cpp"
    source.write_text('#include "coco.h"\nint main() { return coco_spec_check(nullptr); }\n')
    subprocess.run([cxx, "-std=c++11", "-Wall", "-Wextra", "-Werror", f"-I{build.INCLUDE}",
                    "-fsyntax-only", str(source)], check=True)  # fmt: skip


def test_spec_command_expectations_cover_every_status() -> None:
    """The random spec cases reach every status coco_spec_check() documents."""
    statuses = {
        case[1][0].split()[0]
        for case in scripts.random_specs(random.Random(20250620), 300).cases
        if case[1][0] is not None
    }
    assert statuses == {
        "ok", "spec_mechanism", "spec_hash_version", "spec_d", "spec_s", "spec_t",
        "spec_weight", "spec_s_max",
    }  # fmt: skip
    script = Script()
    add_spec(script, Spec("coco", 10, 3, 8, 33554431))
    assert script.cases[0][1] == ["ok 3728897868 match"]


def test_integer_encoder_draws_like_the_double_one() -> None:
    """For integer readings the two encoders of the reference (which the harness matches
    command by command) draw the same channels in the same order, and their signs differ
    only where a 32-bit draw falls between the double threshold and the exact one."""
    rng = random.Random(9)
    differ = 0
    for _ in range(400):
        d = rng.randint(1, 24)
        s = rng.randint(1, d)
        lo = [rng.randint(-5000, 5000) for _ in range(d)]
        hi = [a + rng.choice([1, 3, 1023, 4095, 65535]) for a in lo]
        values = [rng.randint(a, b) for a, b in zip(lo, hi, strict=True)]
        double_bits, int_bits = Stream(seed := rng.getrandbits(32)), Stream(seed)
        dkeys, dsigns = device.ternarise(
            [float(v) for v in values], [float(v) for v in lo], [float(v) for v in hi], s,
            double_bits,
        )  # fmt: skip
        ikeys, isigns = ternarise_int(values, lo, hi, s, clip=False, bits=int_bits)
        assert dkeys == ikeys
        assert double_bits.used == int_bits.used
        words = device.xxh32_stream(seed)
        draws = [words(32) for _ in range(double_bits.used)][-s:]  # the sign draws
        for j, b, dsign, isign in zip(ikeys, draws, dsigns, isigns, strict=True):
            v = 2.0 * (values[j] - lo[j]) / (hi[j] - lo[j]) - 1.0
            t_double = int((1.0 + max(-1.0, min(1.0, v))) * 2147483648.0)
            t_exact = ((values[j] - lo[j]) << 32) // (hi[j] - lo[j])
            assert abs(t_double - t_exact) <= 2
            if dsign != isign:
                differ += 1
                assert min(t_double, t_exact) <= b < max(t_double, t_exact)
    assert differ == 0  # a unit of 2^-32 is never hit by 400 x s draws in practice
