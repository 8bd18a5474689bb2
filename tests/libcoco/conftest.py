"""Session fixtures: libcoco's host harness is compiled once per session in each variant
(plain -O2, and AddressSanitizer + UndefinedBehaviorSanitizer), and the law variant whose
randbelow is an enumerating oracle."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.libcoco import build


@pytest.fixture(scope="session")
def libcoco_build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("libcoco")


@pytest.fixture(scope="session")
def host_plain(libcoco_build_dir: Path) -> Path:
    return build.compile_host(libcoco_build_dir, "driver-plain", sanitize=False)


@pytest.fixture(scope="session")
def host_sanitized(libcoco_build_dir: Path) -> Path:
    return build.compile_host(libcoco_build_dir, "driver-asan-ubsan", sanitize=True)


@pytest.fixture(scope="session")
def host_law(libcoco_build_dir: Path) -> Path:
    return build.compile_host(libcoco_build_dir, "driver-law", sanitize=True, law=True)


@pytest.fixture(params=["plain", "sanitized"])
def host(request: pytest.FixtureRequest) -> Path:
    """Both host builds, one after the other."""
    binary: Path = request.getfixturevalue(f"host_{request.param}")
    return binary
