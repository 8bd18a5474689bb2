"""Builds and runs libcoco's test harness: on the host (the system compiler, plain and under
AddressSanitizer + UndefinedBehaviorSanitizer) and on emulated Cortex-M boards (Debian's
``gcc-arm-none-eabi``, run under Debian's ``qemu-system-arm`` with semihosting output).

The harness is one command interpreter (``harness/driver.c``): the host build reads its
commands on stdin, the firmware has them compiled in (:func:`build_firmware`). Both print one
``> command: result`` line per command, which :mod:`tests.libcoco.commands` compares with the
Python reference. ``bench/bench_libcoco.py`` uses the same helpers for its size and
instruction-count table.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIBCOCO = REPO / "libcoco"
INCLUDE = LIBCOCO / "include"
SOURCES = sorted((LIBCOCO / "src").glob("*.c"))
HERE = Path(__file__).resolve().parent
HARNESS = HERE / "harness"
DRIVER = sorted(HARNESS.glob("driver*.c"))  # the command interpreter, host and firmware
MCU = HERE / "mcu"

# What the issue asks for, and a few more warnings on top: the library and the harness
# must compile cleanly with all of them.
WARNINGS = (
    "-std=c99",
    "-pedantic",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wshadow",
    "-Wconversion",
    "-Wstrict-prototypes",
    "-Wmissing-prototypes",
)
SANITIZE = (
    # float-cast-overflow and float-divide-by-zero are not part of GCC's "undefined" group:
    # the encoders convert a double threshold to an integer, so they are asked for by name
    "-fsanitize=address,undefined,float-cast-overflow,float-divide-by-zero",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
    "-g",
)
# Exact IEEE double evaluation, as the Python reference computes (libcoco/CMakeLists.txt
# sets the same for its own builds).
FLOAT = ("-ffp-contract=off",)
# What libcoco/CMakeLists.txt and library.json pass to every library source: FLOAT, and
# -ffreestanding so that GCC turns no loop into a call to memset or strlen (nothing from libc).
LIBRARY_FLAGS = (*FLOAT, "-ffreestanding")
RUN_TIMEOUT_S = 600.0  # a guard against a hung process, not a measurement


def tool(command: str, package: str) -> str:
    """The path of ``command``; the test skips where it is missing, and fails under
    ``CI=true`` (scripts/test installs ``package`` with apt-get when it runs as root)."""
    found = shutil.which(command)
    if found is not None:
        return found
    message = f"{command} is not installed (scripts/test installs it: apt-get install {package})"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {message}")
    pytest.skip(message)


def compile_host(
    out: Path, name: str, *, sanitize: bool, law: bool = False, extra: Sequence[str] = ()
) -> Path:
    """The host harness ``out/name`` with the system compiler ``cc`` (``extra`` flags last,
    so that they override :data:`FLOAT`)."""
    cc = tool("cc", "gcc")
    flags = [*WARNINGS, *FLOAT, f"-I{INCLUDE}", f"-I{HARNESS}"]
    flags += [*SANITIZE, "-O1"] if sanitize else ["-O2"]
    if law:
        flags.append("-DCOCO_TEST_RANDBELOW=driver_oracle")
    flags += extra
    binary = out / name
    sources = [*SOURCES, *DRIVER, HARNESS / "host_main.c"]
    _run([cc, *flags, *map(str, sources), "-o", str(binary)])
    return binary


def run_host(binary: Path, commands: Sequence[str]) -> list[str]:
    """The output lines of the host harness for ``commands``; AssertionError if it fails
    (a sanitizer finding aborts it with its report on stderr)."""
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:exitcode=99"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    proc = subprocess.run(
        [str(binary)],
        input="\n".join(commands) + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"{binary.name} exited with {proc.returncode}:\n{proc.stderr}"
    assert proc.stderr == "", proc.stderr
    return proc.stdout.splitlines()


@dataclass(frozen=True)
class Board:
    """A CPU to compile for and the QEMU board that runs it."""

    name: str
    cpu_flags: tuple[str, ...]
    linker_script: str
    machine: str
    description: str


BOARDS = {
    "cortex-m0plus": Board(
        "cortex-m0plus",
        ("-mcpu=cortex-m0plus", "-mthumb"),
        "microbit.ld",
        "microbit",
        "QEMU microbit (nRF51822: its Cortex-M0 CPU model executes ARMv6-M only)",
    ),
    "cortex-m4": Board(
        "cortex-m4",
        ("-mcpu=cortex-m4", "-mthumb"),
        "mps2.ld",
        "mps2-an386",
        "QEMU mps2-an386 (Cortex-M4)",
    ),
}
ARM_FLAGS = (
    "-Os",
    "-ffunction-sections",
    "-fdata-sections",
    "-ffreestanding",
    *FLOAT,
)
MCU_LIMITS = ("-DDRIVER_MAX_ITEMS=64", "-DDRIVER_MAX_BYTES=4096")


C99_STRING_LIMIT = 4095  # the longest string literal C99 compilers must support


def _c_string(line: str) -> str:
    assert "\n" not in line
    assert len(line) <= C99_STRING_LIMIT, f"a command of {len(line)} bytes: {line[:60]}..."
    return '"' + line.replace("\\", "\\\\").replace('"', '\\"') + '"'


def build_firmware(out: Path, board: Board, commands: Sequence[str]) -> Path:
    """A firmware image for ``board`` that runs ``commands`` and exits through semihosting."""
    gcc = tool("arm-none-eabi-gcc", "gcc-arm-none-eabi")
    script = out / f"script-{board.name}.c"
    lines = ",\n".join(f"    {_c_string(command)}" for command in commands)
    script.write_text(
        "/* generated by tests/libcoco/build.py */\n"
        "extern const char *const driver_lines[];\n"
        "extern const unsigned long driver_line_count;\n"
        f"const char *const driver_lines[] = {{\n{lines}\n}};\n"
        f"const unsigned long driver_line_count = {len(commands)};\n",
        encoding="utf-8",
    )
    elf = out / f"firmware-{board.name}.elf"
    sources = [*SOURCES, *DRIVER, MCU / "startup.c"]
    _run(
        [
            gcc,
            *board.cpu_flags,
            *ARM_FLAGS,
            *WARNINGS,
            *MCU_LIMITS,
            f"-I{INCLUDE}",
            f"-I{HARNESS}",
            *map(str, sources),
            str(script),
            "-nostdlib",
            "-Wl,--gc-sections",
            f"-L{MCU}",
            "-T",
            str(MCU / board.linker_script),
            f"-Wl,-Map={out / f'firmware-{board.name}.map'}",
            "-lgcc",
            "-o",
            str(elf),
        ]
    )
    return elf


def run_qemu(elf: Path, board: Board) -> list[str]:
    """The firmware's output lines under ``qemu-system-arm -M <board> -icount shift=0``
    (one guest instruction per virtual nanosecond, so SysTick counts instructions)."""
    qemu = tool("qemu-system-arm", "qemu-system-arm")
    proc = subprocess.run(
        [
            qemu,
            "-M",
            board.machine,
            "-nographic",
            "-monitor",
            "none",
            "-serial",
            "none",
            "-semihosting-config",
            "enable=on,target=native",
            "-icount",
            "shift=0",
            "-kernel",
            str(elf),
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    output = proc.stdout + proc.stderr  # semihosting writes to QEMU's stderr
    assert proc.returncode == 0, f"{board.name} firmware failed ({proc.returncode}):\n{output}"
    return output.splitlines()


def compile_library(out: Path, compiler: str, flags: Sequence[str]) -> list[Path]:
    """Every libcoco source compiled on its own into ``out`` with ``compiler`` and ``flags``
    (and the library's own :data:`LIBRARY_FLAGS`)."""
    out.mkdir(parents=True, exist_ok=True)
    objects = []
    for source in SOURCES:
        obj = out / f"{source.stem}.o"
        _run([compiler, *flags, *LIBRARY_FLAGS, f"-I{INCLUDE}", "-c", str(source), "-o", str(obj)])
        objects.append(obj)
    return objects


def _run(cmd: Sequence[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)}\nfailed ({proc.returncode}):\n{proc.stderr}")


# --- sizes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    text: int
    data: int
    bss: int

    @property
    def flash(self) -> int:
        return self.text + self.data

    @property
    def ram(self) -> int:
        return self.data + self.bss


def module_sizes(out: Path, board: Board) -> dict[str, Size]:
    """``arm-none-eabi-size`` of each library source compiled on its own (-Os)."""
    gcc = tool("arm-none-eabi-gcc", "gcc-arm-none-eabi")
    size = tool("arm-none-eabi-size", "binutils-arm-none-eabi")
    sizes: dict[str, Size] = {}
    for source in SOURCES:
        obj = out / f"{board.name}-{source.stem}.o"
        _run([gcc, *board.cpu_flags, *ARM_FLAGS, *WARNINGS, f"-I{INCLUDE}", "-c", str(source),
              "-o", str(obj)])  # fmt: skip
        proc = subprocess.run([size, str(obj)], capture_output=True, text=True, check=True)
        text, data, bss = (int(v) for v in proc.stdout.splitlines()[1].split()[:3])
        sizes[source.stem] = Size(text, data, bss)
    return sizes


_MAP_SECTION = re.compile(
    r"^ (?P<section>\.(?:text|rodata|data|bss)\S*)\s*\n?\s+0x[0-9a-f]+\s+0x(?P<size>[0-9a-f]+)\s+"
    r"(?P<file>\S+)",
    re.MULTILINE,
)


def linked_size(out: Path, board: Board, name: str, probe: str) -> tuple[Size, Size]:
    """Flash and RAM that a program calling what ``probe`` (C source with ``int main``)
    calls takes from libcoco and from libgcc, after ``--gc-sections``: sections kept in the
    link map, as (libcoco, libgcc helpers it pulls in)."""
    gcc = tool("arm-none-eabi-gcc", "gcc-arm-none-eabi")
    source = out / f"probe-{name}.c"
    source.write_text(probe, encoding="utf-8")
    objects = []
    for lib_source in SOURCES:
        obj = out / f"{board.name}-{lib_source.stem}.o"
        if not obj.exists():
            _run([gcc, *board.cpu_flags, *ARM_FLAGS, *WARNINGS, f"-I{INCLUDE}", "-c",
                  str(lib_source), "-o", str(obj)])  # fmt: skip
        objects.append(str(obj))
    elf = out / f"probe-{name}-{board.name}.elf"
    map_file = out / f"probe-{name}-{board.name}.map"
    _run(
        [
            gcc,
            *board.cpu_flags,
            *ARM_FLAGS,
            f"-I{INCLUDE}",
            str(source),
            *objects,
            "-nostdlib",
            "-nostartfiles",
            "-Wl,--gc-sections",
            "-Wl,-e,main",
            f"-Wl,-Map={map_file}",
            "-lgcc",
            "-o",
            str(elf),
        ]
    )
    lib = {"text": 0, "data": 0, "bss": 0}
    gcc_helpers = {"text": 0, "data": 0, "bss": 0}
    discarded = map_file.read_text(encoding="utf-8").split("Memory Configuration")[1]
    for match in _MAP_SECTION.finditer(discarded):
        section, size, file = match["section"], int(match["size"], 16), match["file"]
        kind = (
            "bss"
            if section.startswith(".bss")
            else "data"
            if section.startswith(".data")
            else "text"
        )
        if f"{board.name}-coco_" in file:
            lib[kind] += size
        elif "libgcc.a" in file:
            gcc_helpers[kind] += size
    return Size(**lib), Size(**gcc_helpers)


# --- the MQTT example ---------------------------------------------------------------------------


def compile_example(out: Path) -> Path:
    """libcoco/examples/mosquitto_publish.c against Debian's libmosquitto-dev."""
    cc = tool("cc", "gcc")
    if not Path("/usr/include/mosquitto.h").exists():
        message = "libmosquitto-dev is not installed (scripts/test installs it with apt-get)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    binary = out / "mosquitto_publish"
    _run(
        [
            cc,
            "-std=c99",
            "-pedantic",
            "-Wall",
            "-Wextra",
            "-Werror",
            *FLOAT,
            "-O2",
            f"-I{INCLUDE}",
            str(LIBCOCO / "examples" / "mosquitto_publish.c"),
            *map(str, SOURCES),
            "-lmosquitto",
            "-o",
            str(binary),
        ]
    )
    return binary
