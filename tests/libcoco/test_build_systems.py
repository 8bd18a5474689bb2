"""libcoco in firmware build systems: CMake (host, and a Cortex-M cross build with Debian's
arm-none-eabi-gcc), and the Arduino and PlatformIO library layouts."""

from __future__ import annotations

import json
import platform
import random
import struct
import subprocess
import time
from pathlib import Path

import pytest

from tests.libcoco import build, scripts

pytestmark = [pytest.mark.integration, pytest.mark.unhurried]


def cmake(*args: str) -> None:
    subprocess.run(
        [build.tool("cmake", "cmake"), *args], check=True, capture_output=True, timeout=600
    )


def test_cmake_builds_the_library_and_the_example(tmp_path: Path) -> None:
    build.tool("cc", "gcc")
    with_example = Path("/usr/include/mosquitto.h").exists()
    # Release is -O3, where GCC warns the most; -Werror makes a warning fail the build
    cmake("-S", str(build.LIBCOCO), "-B", str(tmp_path), "-DCOCO_MAX_S=48",
          "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_C_FLAGS=-Werror",
          f"-DCOCO_BUILD_EXAMPLES={'ON' if with_example else 'OFF'}")  # fmt: skip
    cmake("--build", str(tmp_path))
    assert (tmp_path / "libcoco.a").is_file()
    if with_example:
        usage = subprocess.run(
            [str(tmp_path / "mosquitto_publish")], capture_output=True, text=True, check=False
        )
        assert usage.returncode == 2
        assert "usage: mosquitto_publish" in usage.stderr


CONSUMER_CMAKE = """cmake_minimum_required(VERSION 3.13)
project(consumer LANGUAGES C)
find_package(coco 1.0 CONFIG REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE coco::coco)
"""
CONSUMER_MAIN = """#include <stdio.h>
#include <coco.h>
#if COCO_MAX_S != 48
#error "the installed target does not carry the library's COCO_MAX_S"
#endif
int main(void) {
    printf("%s %s\\n", COCO_VERSION, coco_strerror(COCO_ERR_SPEC_S_MAX));
    return 0;
}
"""


def test_cmake_install_is_a_config_package(tmp_path: Path) -> None:
    """cmake --install writes coco-config.cmake beside the exported targets: a separate
    project finds the installed library with find_package(coco CONFIG REQUIRED), links
    coco::coco and inherits its public COCO_MAX_S."""
    build.tool("cc", "gcc")
    prefix = tmp_path / "prefix"
    cmake("-S", str(build.LIBCOCO), "-B", str(tmp_path / "lib"), "-DCOCO_MAX_S=48",
          f"-DCMAKE_INSTALL_PREFIX={prefix}")  # fmt: skip
    cmake("--build", str(tmp_path / "lib"))
    cmake("--install", str(tmp_path / "lib"))
    assert (prefix / "lib" / "cmake" / "coco" / "coco-config.cmake").is_file()
    consumer = tmp_path / "consumer"
    consumer.mkdir()
    (consumer / "CMakeLists.txt").write_text(CONSUMER_CMAKE)
    (consumer / "main.c").write_text(CONSUMER_MAIN)
    cmake("-S", str(consumer), "-B", str(consumer / "build"), f"-DCMAKE_PREFIX_PATH={prefix}")
    cmake("--build", str(consumer / "build"))
    run = subprocess.run(
        [str(consumer / "build" / "consumer")], capture_output=True, text=True, check=True
    )
    assert run.stdout.split(" ", 1)[0] == "1.0.0"
    assert run.stdout.split(" ", 1)[1].strip()  # the library's own name for the error


# ESP-IDF is not packaged in Debian, so this stands in for its build system with the part of
# its contract libcoco's CMakeLists.txt relies on: ESP_PLATFORM is set, the component's
# library is named by ${COMPONENT_LIB} (ESP-IDF's own names are __idf_<component>), and
# idf_component_register(SRCS ... INCLUDE_DIRS ...) creates it from the component's
# directory. esp_fill_random is a stand-in with ESP-IDF's signature.
IDF_STANDIN_CMAKE = """cmake_minimum_required(VERSION 3.16)
project(idf_standin LANGUAGES C)
set(ESP_PLATFORM 1)
set(COMPONENT_LIB __idf_libcoco)
function(idf_component_register)
  cmake_parse_arguments(arg "" "" "SRCS;INCLUDE_DIRS;REQUIRES;PRIV_REQUIRES" ${ARGN})
  add_library(${COMPONENT_LIB} STATIC ${arg_SRCS})
  target_include_directories(${COMPONENT_LIB} PUBLIC ${arg_INCLUDE_DIRS})
endfunction()
add_subdirectory(@LIBCOCO@ libcoco)
if(TARGET coco)
  message(FATAL_ERROR "the ESP-IDF branch fell through to the plain target")
endif()
add_executable(app main.c)
target_include_directories(app PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/stub)
target_link_libraries(app PRIVATE __idf_libcoco)
"""
IDF_STANDIN_RANDOM_H = """#include <stddef.h>
void esp_fill_random(void *buf, size_t len);
"""
IDF_STANDIN_MAIN = r"""#include <stdio.h>
#include "coco_esp.h"
static unsigned calls;
void esp_fill_random(void *buf, size_t len) {  /* the stand-in: 0x01 0x02 0x03 ... */
    unsigned char *b = buf;
    size_t i;
    calls++;
    for (i = 0; i < len; i++) b[i] = (unsigned char)(i + 1);
}
int main(void) {
    static const coco_rng rng = COCO_ESP_RNG;
    unsigned char none[1] = {0xee};
    uint32_t word = 0;
    int rc = coco_random_u32(&rng, &word);
    int empty = coco_esp_fill_random(NULL, none, 0);
    printf("%d %08x %d %02x %u\n", rc, (unsigned)word, empty, none[0], calls);
    return 0;
}
"""


def test_the_esp_idf_component_and_its_rng_wrapper(tmp_path: Path) -> None:
    """Under ESP_PLATFORM the CMakeLists registers a component and sets libcoco's flags on
    ${COMPONENT_LIB}, not on a target of its own; COCO_ESP_RNG turns esp_fill_random (no
    return value) into a coco_rng (0 on success), whose words libcoco reads big-endian."""
    build.tool("cc", "gcc")
    project = tmp_path / "project"
    (project / "stub").mkdir(parents=True)
    (project / "CMakeLists.txt").write_text(
        IDF_STANDIN_CMAKE.replace("@LIBCOCO@", str(build.LIBCOCO))
    )
    (project / "stub" / "esp_random.h").write_text(IDF_STANDIN_RANDOM_H)
    (project / "main.c").write_text(IDF_STANDIN_MAIN)
    out = tmp_path / "build"
    cmake("-S", str(project), "-B", str(out), "-DCOCO_MAX_S=40", "-DCMAKE_C_FLAGS=-Werror",
          "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON")  # fmt: skip
    cmake("--build", str(out))
    commands = json.loads((out / "compile_commands.json").read_text())
    library = [c for c in commands if "/libcoco/src/" in c["file"]]
    assert sorted(Path(c["file"]).name for c in library) == [s.name for s in build.SOURCES]
    for entry in library:
        for flag in (*build.LIBRARY_FLAGS, "-DCOCO_MAX_S=40"):
            assert flag in entry["command"].split(), (flag, entry["command"])
    (app,) = [c for c in commands if c["file"].endswith("main.c")]
    assert "-DCOCO_MAX_S=40" in app["command"].split()  # public, as in the plain target
    run = subprocess.run([str(out / "app")], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["0", "01020304", "0", "ee", "1"]


def test_cmake_cross_builds_for_a_cortex_m(tmp_path: Path) -> None:
    """A firmware project's toolchain file, in four lines (libcoco needs no libc)."""
    gcc = build.tool("arm-none-eabi-gcc", "gcc-arm-none-eabi")
    toolchain = tmp_path / "arm.cmake"
    toolchain.write_text(
        "set(CMAKE_SYSTEM_NAME Generic)\n"
        f"set(CMAKE_C_COMPILER {gcc})\n"
        "set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)\n"
        'set(CMAKE_C_FLAGS_INIT "-mcpu=cortex-m0plus -mthumb -Os -ffreestanding")\n'
    )
    out = tmp_path / "build"
    cmake("-S", str(build.LIBCOCO), "-B", str(out), f"-DCMAKE_TOOLCHAIN_FILE={toolchain}")
    cmake("--build", str(out))
    archive = out / "libcoco.a"
    assert archive.is_file()
    objdump = build.tool("arm-none-eabi-objdump", "binutils-arm-none-eabi")
    headers = subprocess.run(
        [objdump, "-f", str(archive)], capture_output=True, text=True, check=True
    )
    assert "elf32-littlearm" in headers.stdout


def _toolchain(target: str) -> tuple[str, str, tuple[str, ...]]:
    """The compiler, nm and CPU flags for ``host`` or a board of :data:`build.BOARDS`."""
    if target == "host":
        return build.tool("cc", "gcc"), build.tool("nm", "binutils"), ()
    return (
        build.tool("arm-none-eabi-gcc", "gcc-arm-none-eabi"),
        build.tool("arm-none-eabi-nm", "binutils-arm-none-eabi"),
        build.BOARDS[target].cpu_flags,
    )


def _symbols(nm: str, *args: str) -> set[str]:
    listing = subprocess.run([nm, *args], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in listing.splitlines() if line.strip() and ":" not in line}


@pytest.mark.parametrize("opt", ["-Os", "-O2", "-O3"])
@pytest.mark.parametrize("target", ["host", *build.BOARDS])
def test_the_library_needs_nothing_from_libc(tmp_path: Path, target: str, opt: str) -> None:
    """Every source compiled with the library's flags and linked into one object with
    -nostdlib: what is still undefined comes from libgcc (soft-float and 64-bit helpers on
    a Cortex-M), never memset, memcpy or strlen, which GCC emits for plain loops and struct
    copies unless told it is freestanding. The sources compile with the harness's warnings
    and -Werror at every level: -O3 (CMake's Release) is where GCC's flow analysis warns
    -Wmaybe-uninitialized."""
    gcc, nm, cpu_flags = _toolchain(target)
    objects = build.compile_library(tmp_path, gcc, [*cpu_flags, opt, *build.WARNINGS])
    combined = tmp_path / "libcoco-all.o"
    subprocess.run(
        [gcc, *cpu_flags, "-r", "-nostdlib", *map(str, objects), "-o", str(combined)],
        check=True,
        capture_output=True,
    )
    undefined = _symbols(nm, "-u", str(combined))
    libgcc = subprocess.run(
        [gcc, *cpu_flags, "-print-libgcc-file-name"], capture_output=True, text=True, check=True
    ).stdout.strip()
    helpers = _symbols(nm, "--defined-only", libgcc)
    assert sorted(undefined - helpers) == []


def test_the_build_manifests_pass_the_library_flags() -> None:
    """CMake and PlatformIO compile libcoco with the flags the tests compile it with."""
    cmake_lists = (build.LIBCOCO / "CMakeLists.txt").read_text()
    options = cmake_lists.split("set(COCO_FLAGS", 1)[1].split(")", 1)[0]
    # both the plain CMake target and the ESP-IDF component use them
    assert "target_compile_options(coco PRIVATE -Wall -Wextra ${COCO_FLAGS}" in cmake_lists
    assert "target_compile_options(${COMPONENT_LIB} PRIVATE ${COCO_FLAGS})" in cmake_lists
    manifest = json.loads((build.LIBCOCO / "library.json").read_text())
    for flag in build.LIBRARY_FLAGS:
        assert flag in options.split()
        assert flag in manifest["build"]["flags"]


def test_cmake_lists_every_source() -> None:
    cmake_lists = (build.LIBCOCO / "CMakeLists.txt").read_text()
    listed = sorted(
        line.strip() for line in cmake_lists.splitlines() if line.strip().startswith("src/")
    )
    assert listed == [f"src/{source.name}" for source in build.SOURCES]


def test_arduino_and_platformio_layouts() -> None:
    properties = dict(
        line.split("=", 1)
        for line in (build.LIBCOCO / "library.properties").read_text().splitlines()
        if "=" in line
    )
    for field in ("name", "version", "author", "maintainer", "sentence", "category"):
        assert properties[field]
    assert properties["includes"] == "coco.h"
    manifest = json.loads((build.LIBCOCO / "library.json").read_text())
    assert manifest["version"] == properties["version"]
    assert manifest["build"]["includeDir"] == "include"
    assert manifest["build"]["srcDir"] == "src"
    # Arduino puts src/ on the include path: its coco.h forwards to the one public header
    assert '#include "../include/coco.h"' in (build.LIBCOCO / "src" / "coco.h").read_text()
    header = (build.INCLUDE / "coco.h").read_text()
    assert f'#define COCO_VERSION "{properties["version"]}"' in header


# --- floating point: contraction (FMA) changes nothing ---------------------------------------

# Targets whose FPU has a fused multiply-add that GCC uses for doubles when contraction is on:
# a Cortex-M7 with the double-precision FPv5 (hard-float ABI, as firmware for it is built),
# and the host with -mfma where it is x86-64 (elsewhere the host is left out).
FMA_TARGETS = {
    "cortex-m7-fpv5-d16": ("-mcpu=cortex-m7", "-mthumb", "-mfpu=fpv5-d16", "-mfloat-abi=hard"),
    "host-mfma": ("-mfma",),
}
FUSABLE = "double fused(double a, double b, double c) { return a * b + c; }\n"


def _fma_toolchain(target: str) -> tuple[str, str, tuple[str, ...]]:
    if target == "host-mfma":
        if platform.machine() not in ("x86_64", "AMD64"):
            pytest.skip(f"-mfma is an x86-64 flag; the host is {platform.machine()}")
        return build.tool("cc", "gcc"), build.tool("objdump", "binutils"), FMA_TARGETS[target]
    return (
        build.tool("arm-none-eabi-gcc", "gcc-arm-none-eabi"),
        build.tool("arm-none-eabi-objdump", "binutils-arm-none-eabi"),
        FMA_TARGETS[target],
    )


def _instructions(gcc: str, objdump: str, flags: list[str], source: Path, out: Path) -> str:
    """The disassembly of ``source`` compiled with ``flags`` (without the file name line)."""
    subprocess.run(
        [gcc, *flags, "-c", str(source), "-o", str(out)], check=True, capture_output=True
    )
    listing = subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", str(out)], capture_output=True, text=True, check=True
    ).stdout
    return listing.split("\n", 2)[2]


@pytest.mark.parametrize("opt", ["-Os", "-O2", "-O3"])
@pytest.mark.parametrize("target", list(FMA_TARGETS))
def test_fp_contraction_changes_no_instruction(tmp_path: Path, target: str, opt: str) -> None:
    """Where -ffp-contract=off cannot be passed (Arduino builds libraries in GNU C mode, where
    GCC's default is -ffp-contract=fast), the result is the same: every source compiled with
    contraction fast and off, on targets whose FPU fuses doubles, gives the same
    instructions. The comparison sees fusion: a plain a * b + c compiles differently."""
    gcc, objdump, cpu_flags = _fma_toolchain(target)
    base = [*cpu_flags, opt, "-std=gnu11", "-ffreestanding", f"-I{build.INCLUDE}"]
    probe = tmp_path / "fused.c"
    probe.write_text(FUSABLE)
    fused = _instructions(gcc, objdump, [*base, "-ffp-contract=fast"], probe, tmp_path / "f.o")
    plain = _instructions(gcc, objdump, [*base, "-ffp-contract=off"], probe, tmp_path / "p.o")
    assert fused != plain  # the control: this target fuses when allowed to
    assert "fma" in fused  # vfma.f64 on the M7, vfmadd*sd on x86-64
    assert "fma" not in plain
    for source in build.SOURCES:
        fast = _instructions(gcc, objdump, [*base, "-ffp-contract=fast"], source,
                             tmp_path / f"{source.stem}-fast.o")  # fmt: skip
        off = _instructions(gcc, objdump, [*base, "-ffp-contract=off"], source,
                            tmp_path / f"{source.stem}-off.o")  # fmt: skip
        assert fast == off, source.name
        assert "fma" not in fast, source.name


def test_a_contracting_build_gives_the_reference_results(tmp_path: Path) -> None:
    """The host harness built with -mfma -ffp-contract=fast, on a CPU with FMA, runs the
    published vectors and 300 seeded encoder cases (double readings and key-value data) with
    the Python reference's results."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"-mfma is an x86-64 flag; the host is {platform.machine()}")
    flags = Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split()
    if "fma" not in flags:
        pytest.skip("this CPU has no FMA instructions: an -mfma build cannot run here")
    binary = build.compile_host(
        tmp_path, "driver-fma", sanitize=False, extra=("-mfma", "-ffp-contract=fast")
    )
    for script in (scripts.published_vectors(), scripts.random_encoders(random.Random(7), 300)):
        script.check(build.run_host(binary, script.commands))


# --- the Arduino sketch -------------------------------------------------------------------------

# The ESP32 Arduino core is not in Debian (Debian's arduino package builds for AVR, whose
# 16-bit int and 32-bit double libcoco does not support), so the sketch is compiled as the
# Arduino builder compiles a .ino (C++, Arduino.h first) against stand-ins of the few core
# APIs it calls, with the real libcoco, and run once on the host.
ARDUINO_STANDIN_H = r"""#pragma once
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#define HEX 16
#define WL_CONNECTED 3
struct SerialStandIn {
    void begin(long) {}
    void print(const char *s) { fputs(s, stdout); }
    void print(char c) { putchar(c); }
    void print(unsigned v, int) { printf("%X", v); }
    void println(const char *s) { puts(s); }
    void println() { putchar('\n'); }
};
extern SerialStandIn Serial;
struct WiFiStandIn {
    void begin(const char *, const char *) {}
    int status() { return WL_CONNECTED; }
};
extern WiFiStandIn WiFi;
inline void configTime(long, int, const char *) {}
inline void delay(unsigned long) {}
inline int analogRead(int pin) { return pin * 100; }
struct Preferences {
    unsigned char stored[64];
    size_t length = 0;
    bool begin(const char *, bool) { return true; }
    size_t getBytes(const char *, void *buf, size_t len) {
        size_t n = length < len ? length : len;
        memcpy(buf, stored, n);
        return n;
    }
    size_t putBytes(const char *, const void *buf, size_t len) {
        memcpy(stored, buf, len);
        length = len;
        return len;
    }
};
"""
STANDIN_HEADER = """#pragma once
#include "Arduino.h"
extern "C" void esp_fill_random(void *, size_t);
"""
ARDUINO_STANDIN_MAIN = r"""#include "Arduino.h"
#include <stdlib.h>
#include <sys/random.h>
SerialStandIn Serial;
WiFiStandIn WiFi;
extern "C" void esp_fill_random(void *buf, size_t len) {
    if (getrandom(buf, len, 0) != (ssize_t)len) abort();
}
void setup();
void loop();
int main() {
    setup();
    loop();
    loop();  /* the same round: nothing more */
    return 0;
}
"""


def test_the_arduino_sketch_builds_and_reports(tmp_path: Path) -> None:
    """examples/<Name>/<Name>.ino (Arduino's layout) compiles as C++ with -Werror against
    libcoco compiled as C in GNU mode without the library's flags (as Arduino builds it),
    and one run prints its ingress topic and a report of this hour's round, once."""
    cc, cxx = build.tool("cc", "gcc"), build.tool("c++", "g++")
    (sketch,) = [p for p in (build.LIBCOCO / "examples").glob("*/*.ino")
                 if p.stem == p.parent.name]  # fmt: skip
    standin = tmp_path / "standin"
    standin.mkdir()
    (standin / "Arduino.h").write_text(ARDUINO_STANDIN_H)
    for name in ("Preferences.h", "WiFi.h", "esp_random.h"):
        (standin / name).write_text(STANDIN_HEADER)
    (standin / "main.cpp").write_text(ARDUINO_STANDIN_MAIN)
    cpp = tmp_path / "sketch.cpp"
    cpp.write_text(f'#include "Arduino.h"\n#line 1 "{sketch.name}"\n{sketch.read_text()}')
    objects = []
    for source in build.SOURCES:
        obj = tmp_path / f"{source.stem}.o"
        subprocess.run([cc, "-std=gnu11", "-Os", "-Wall", "-Wextra", "-Werror",
                        f"-I{build.LIBCOCO / 'src'}", "-c", str(source), "-o", str(obj)],
                       check=True, capture_output=True)  # fmt: skip
        objects.append(str(obj))
    binary = tmp_path / "sketch"
    proc = subprocess.run(
        [cxx, "-std=gnu++17", "-Wall", "-Wextra", "-Werror", "-DARDUINO_ARCH_ESP32",
         f"-I{standin}", f"-I{build.LIBCOCO / 'src'}", str(cpp), str(standin / "main.cpp"),
         *objects, "-o", str(binary)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    before = int(time.time()) // 3600
    lines = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    after = int(time.time()) // 3600
    (line,) = lines.splitlines()
    topic, hex_report = line.split()
    assert topic == "coco/v1/lab/ingress/esp32-0001"
    version, kind, fingerprint, round_, _seed, z = struct.unpack(
        ">BBIIIH", bytes.fromhex(hex_report)
    )
    assert (version, kind, fingerprint) == (1, 1, 0x52B85FD0)
    assert before <= round_ <= after
    assert 0 <= z < 4  # t = 4
    assert "url=https://" in (build.LIBCOCO / "library.properties").read_text()
