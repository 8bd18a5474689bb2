"""Helpers the benches share: a child process that says READY and prints one JSON result
(:class:`Child`), and a Mosquitto of a bench's own on a free 127.0.0.1 port
(:func:`own_mosquitto`, never the system broker)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

MOSQUITTO = "/usr/sbin/mosquitto"


class Child:
    """A bench's role (or any command) in its own process: it prints ``READY`` when it is,
    then one JSON line, its result."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        stdin: Any = None,
        stdout: Any = subprocess.PIPE,
    ) -> None:
        self.proc = subprocess.Popen(
            list(argv), stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, text=True
        )

    def wait_ready(self, timeout: float = 20.0) -> None:
        assert self.proc.stdout is not None
        line = _readline(self.proc.stdout.fileno(), timeout)
        if line.strip() != "READY":
            self.kill()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"child not ready: {line!r} {err[-2000:]}")

    def result(self, timeout: float) -> dict[str, Any]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.proc.communicate()
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(f"child gave no result (rc={self.proc.returncode}): {err[-2000:]}")
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _readline(fd: int, timeout: float) -> str:
    data = b""
    deadline = time.monotonic() + timeout
    os.set_blocking(fd, False)
    try:
        while not data.endswith(b"\n"):
            if time.monotonic() > deadline:
                break
            try:
                byte = os.read(fd, 1)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            if not byte:
                break
            data += byte
    finally:
        os.set_blocking(fd, True)
    return data.decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def own_mosquitto(workdir: Path) -> Iterator[int]:
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        "max_queued_messages 1000000\nmax_queued_bytes 0\nmax_inflight_messages 0\n"
        "log_dest none\n"
    )
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("own mosquitto did not start") from None
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
