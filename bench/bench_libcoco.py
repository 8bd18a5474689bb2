"""libcoco on Cortex-M0+ and Cortex-M4: flash, RAM and instructions per operation.

Run: ``.venv/bin/python bench/bench_libcoco.py [--json PATH]`` (needs Debian's
gcc-arm-none-eabi and qemu-system-arm, as the tests do). It prints the tables of
libcoco/README.md:

* flash and static RAM per source module (``arm-none-eabi-size`` of each object, -Os);
* flash of what a firmware links for each use (a probe program calling the functions of the
  row, linked with ``--gc-sections``; the sections kept from libcoco and from libgcc in the
  link map), static RAM (always 0: libcoco has no static state);
* per operation at d = 64, s = 8 (the encoders: 64 channels, s = 8): instructions, measured
  under QEMU with ``-icount shift=0`` (every guest instruction advances the virtual clock by
  1 ns; SysTick, calibrated against a loop of known length, reads it), averaged over 200
  reports (20 encodings, 10 parses), and the deepest stack (painted and measured on the
  emulated board). Instructions are not cycles: QEMU models no pipeline or wait state.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from tests.libcoco import build, scripts

PROBE_HEAD = """
#include "coco.h"
int main(void);
static coco_test_stream stream = {1, 0};
static const coco_rng rng = {coco_test_stream_fill, &stream};
static const coco_spec spec = {COCO_COCO, 64, 8, 22, 45605201, 1, 0};
static const uint32_t keys[8] = {0, 5, 17, 33, 40, 45, 50, 63};
static const int8_t signs[8] = {1, -1, 1, 1, -1, -1, 1, -1};
static uint8_t report[COCO_REPORT_SIZE];
static uint8_t record[COCO_LEDGER_RECORD_SIZE];
static int load(void *ctx, uint8_t r[COCO_LEDGER_RECORD_SIZE]) { (void)ctx; (void)r; return 1; }
static int store(void *ctx, const uint8_t r[COCO_LEDGER_RECORD_SIZE]) {
    (void)ctx; record[0] = r[0]; return 0; }
static const coco_ledger_io io = {load, store, 0};
static coco_ledger ledger;
static coco_announcement ann;
static const uint8_t json[2] = {'{', '}'};
static double values[64], lo[64], hi[64];
static int32_t ivalues[64], ilo[64], ihi[64];
static uint32_t out_keys[8];
static int8_t out_signs[8];
static char topic[COCO_TOPIC_SIZE];
int main(void) {
    uint32_t seed = 0, round = 0;
    uint16_t z = 0;
    int rc = 0;
    (void)seed; (void)z; (void)round;
"""
PROBES = {
    "randomiser + codec (seed, randomise, encode)": """
    rc |= coco_random_u32(&rng, &seed);
    rc |= coco_randomise(&spec, keys, signs, 8, seed, &rng, &z);
    rc |= coco_encode_report(spec.fingerprint, 1, seed, z, report);
""",
    "... + ledger (coco_make_report, coco_ledger_open)": """
    rc |= coco_ledger_open(&ledger, &io, 1000);
    rc |= coco_make_report(&spec, 1, keys, signs, 8, &rng, &ledger, 1, report);
""",
    "announcement parser (with SHA-256 fingerprint check)": """
    rc |= coco_announcement_parse(json, sizeof json, &ann);
""",
    "rounds, shards and ingress topic": """
    rc |= coco_round_of(1800000000, 60, &round);
    rc |= coco_device_ingress_topic(&ann, "lab", "dev-1", round, topic, sizeof topic);
""",
    "encoder, double readings (coco_ternarise)": """
    rc |= coco_ternarise(values, lo, hi, 64, 8, 0, &rng, out_keys, out_signs);
""",
    "encoder, integer readings (coco_ternarise_int)": """
    rc |= coco_ternarise_int(ivalues, ilo, ihi, 64, 8, 0, &rng, out_keys, out_signs);
""",
    "key-value encoder (coco_pad_key_values)": """
    rc |= coco_pad_key_values(out_keys, values, 4, 64, 8, 1, &rng, out_keys, out_signs);
""",
}
PROBE_TAIL = """
    return rc + report[15] + record[0] + topic[0];
}
"""
ALL = "".join(PROBES.values())
OPERATIONS = {
    "report coco": "report, CoCo: seed, randomise, encode",
    "report collision": "report, Collision: seed, randomise, encode",
    "make coco": "report, CoCo, with the ledger charge (coco_make_report)",
    "make collision": "report, Collision, with the ledger charge",
    "fingerprint coco": "fingerprint check (SHA-256 of the canonical string)",
    "tern": "coco_ternarise, 64 double channels, s = 8",
    "ternint": "coco_ternarise_int, 64 integer channels, s = 8",
    "ann": "coco_announcement_parse of the announcement of protocol 10.5",
}
MECHANISMS = {"1": "coco", "2": "collision"}


def measure(out: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"boards": {}}
    for name, board in build.BOARDS.items():
        modules = build.module_sizes(out, board)
        linked: dict[str, dict[str, int]] = {}
        for label, body in [*PROBES.items(), ("everything", ALL)]:
            lib, helpers = build.linked_size(
                out, board, str(len(linked)), PROBE_HEAD + body + PROBE_TAIL
            )
            linked[label] = {"libcoco": lib.flash, "libgcc": helpers.flash, "ram": lib.ram}
        script = scripts.benchmarks()
        elf = build.build_firmware(out, board, script.commands)
        lines = build.run_qemu(elf, board)
        calib = next(line for line in lines if line.startswith("> calib:"))
        ticks, instructions = (int(v) for v in calib.split(":")[1].split())
        per_tick = instructions / ticks
        free = script.check(lines)
        operations: dict[str, dict[str, float]] = {}
        results = iter(free["bench"])
        mechanism = ""
        for command, _ in script.cases:
            if command.startswith("spec "):
                mechanism = MECHANISMS[command.split()[1]]
            if not command.startswith("bench "):
                continue
            kind, repeats = command.split()[1], int(command.split()[2])
            if kind in ("report", "make", "fingerprint"):
                kind = f"{kind} {mechanism}"
            bench_ticks, stack = (int(v) for v in next(results).split())
            operations[kind] = {"instructions": bench_ticks * per_tick / repeats, "stack": stack}
        result["boards"][name] = {
            "description": board.description,
            "modules": {
                k: {"text": v.text, "data": v.data, "bss": v.bss} for k, v in modules.items()
            },
            "linked": linked,
            "operations": operations,
            "instructions_per_tick": per_tick,
        }
    return result


def print_tables(result: dict[str, Any]) -> None:
    boards = list(result["boards"])
    print("| module | " + " | ".join(f"{b} flash / RAM (bytes)" for b in boards) + " |")
    print("| --- |" + " ---: |" * len(boards))
    first = result["boards"][boards[0]]["modules"]
    for module in first:
        cells = []
        for b in boards:
            m = result["boards"][b]["modules"][module]
            cells.append(f"{m['text'] + m['data']} / {m['data'] + m['bss']}")
        print(f"| `{module}.c` | " + " | ".join(cells) + " |")
    print()
    print("| linked for | " + " | ".join(f"{b} flash: libcoco + libgcc" for b in boards) + " |")
    print("| --- |" + " ---: |" * len(boards))
    for label in result["boards"][boards[0]]["linked"]:
        cells = []
        for b in boards:
            v = result["boards"][b]["linked"][label]
            cells.append(f"{v['libcoco']} + {v['libgcc']} = {v['libcoco'] + v['libgcc']}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()
    print(
        "| operation (d = 64, s = 8) | "
        + " | ".join(f"{b} instructions / stack bytes" for b in boards)
        + " |"
    )
    print("| --- |" + " ---: |" * len(boards))
    for kind, label in OPERATIONS.items():
        cells = []
        for b in boards:
            run = result["boards"][b]["operations"][kind]
            cells.append(f"{run['instructions']:.0f} / {int(run['stack'])}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()
    for b in boards:
        print(
            f"{b}: {result['boards'][b]['description']}; "
            f"{result['boards'][b]['instructions_per_tick']:.1f} instructions per SysTick tick"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(Path(tmp))
    print_tables(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
