"""libcoco on microcontrollers: cross-compiled with Debian's gcc-arm-none-eabi for Cortex-M0+
and Cortex-M4 and run under Debian's qemu-system-arm on emulated boards (one firmware image
and one QEMU run per board, every command compiled in), reproducing every published vector
bit-exactly; plus the size and stack goals of issue 20: randomiser + codec at d = 64 in
under 4 KB of flash and 256 bytes of RAM.

Instruction counts come from QEMU's ``-icount shift=0`` (every guest instruction advances
the virtual clock by 1 ns; the firmware reads SysTick, calibrated against a loop of known
length): they count instructions, not cycles.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.libcoco import build, scripts
from tests.libcoco.commands import Script

pytestmark = [pytest.mark.integration, pytest.mark.unhurried]

FLASH_GOAL = 4096
RAM_GOAL = 256


@dataclass(frozen=True)
class McuRun:
    board: build.Board
    script: Script
    lines: list[str]
    elf: Path

    @property
    def instructions_per_tick(self) -> float:
        calib = next(line for line in self.lines if line.startswith("> calib:"))
        ticks, instructions = (int(v) for v in calib.split(":")[1].split())
        return instructions / ticks


@pytest.fixture(scope="module", params=sorted(build.BOARDS))
def mcu(request: pytest.FixtureRequest, libcoco_build_dir: Path) -> McuRun:
    board = build.BOARDS[request.param]
    script = scripts.mcu_script()
    elf = build.build_firmware(libcoco_build_dir, board, script.commands)
    return McuRun(board, script, build.run_qemu(elf, board), elf)


def test_firmware_reproduces_every_vector(mcu: McuRun) -> None:
    """Every published vector, worked example, announcement, error path and random case of
    the script: the same results as on the host and in Python, bit for bit."""
    mcu.script.check(mcu.lines)


def bench_results(mcu: McuRun) -> list[tuple[str, float, int]]:
    """(command, instructions per operation, stack bytes) of each ``bench`` line."""
    free = mcu.script.check(mcu.lines)
    benches = [c for c, wants in mcu.script.cases if c.startswith("bench") and wants == [None]]
    out = []
    for command, result in zip(benches, free["bench"], strict=True):
        ticks, stack = (int(v) for v in result.split())
        repeats = int(command.split()[2])
        out.append((command, ticks * mcu.instructions_per_tick / repeats, stack))
    return out


def test_a_report_fits_in_256_bytes_of_stack(mcu: McuRun) -> None:
    """Seed, randomise and encode one report at d = 64, s = 8 (CoCo and Collision): the
    library has no static RAM, and the deepest stack (painted and measured on the board,
    the test stream's callback included) stays under the goal."""
    reports = [r for r in bench_results(mcu) if r[0].startswith("bench report")]
    assert len(reports) == 2
    for command, instructions, stack in reports:
        assert 0 < stack <= RAM_GOAL, command
        assert 500 < instructions < 20_000, command  # a sanity range, not a timing test


def test_randomiser_and_codec_fit_in_4_kb_of_flash(mcu: McuRun, libcoco_build_dir: Path) -> None:
    """What a firmware linking the randomiser, the seed draw and the report encoder takes
    from libcoco and libgcc after --gc-sections: under 4 KB of flash, no static RAM."""
    lib, helpers = build.linked_size(libcoco_build_dir, mcu.board, "report", REPORT_PROBE)
    assert lib.flash > 1000  # really measured: the randomiser alone is over a kilobyte
    assert lib.flash + helpers.flash < FLASH_GOAL
    assert lib.ram == 0
    assert helpers.ram == 0


REPORT_PROBE = """
#include "coco.h"
int main(void);
int main(void) {
    static const uint32_t keys[8] = {0, 5, 17, 33, 40, 45, 50, 63};
    static const int8_t signs[8] = {1, -1, 1, 1, -1, -1, 1, -1};
    static const coco_spec spec = {COCO_COCO, 64, 8, 22, 45605201, 1, 0};
    static coco_test_stream stream = {1, 0};
    static const coco_rng rng = {coco_test_stream_fill, &stream};
    uint8_t report[COCO_REPORT_SIZE];
    uint32_t seed;
    uint16_t z;
    int rc = coco_random_u32(&rng, &seed);
    rc |= coco_randomise(&spec, keys, signs, 8, seed, &rng, &z);
    rc |= coco_encode_report(spec.fingerprint, 1, seed, z, report);
    return rc + report[15];
}
"""
