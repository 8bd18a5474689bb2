"""Reading a running service's HTTP endpoints from tests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


def ready(port: int) -> int | None:
    """The status of ``GET /ready`` of the service on ``port``; ``None`` while nothing
    answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code
    except OSError:
        return None


def estimates(port: int, *, timeout: float = 5.0) -> dict[str, Any] | None:
    """The ``/estimates`` document of the aggregator on ``port``; ``None`` while it does not
    answer (not started yet, or gone)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/estimates", timeout=timeout) as resp:
            document: dict[str, Any] = json.loads(resp.read())
            return document
    except OSError:
        return None


def _get(url: str, timeout: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode())
    except OSError:
        return None


def samples(port: int, *, timeout: float = 2.0) -> dict[tuple[str, Labels], float] | None:
    """Every sample of the Prometheus endpoint on ``port``, by name and sorted labels;
    ``None`` while it does not answer."""
    text = _get(f"http://127.0.0.1:{port}/metrics", timeout)
    if text is None:
        return None
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metrics(port: int, *, timeout: float = 2.0) -> dict[str, float] | None:
    """:func:`samples` keyed ``name{label=value,...}`` (``name`` alone without labels)."""
    found = samples(port, timeout=timeout)
    if found is None:
        return None
    return {
        f"{name}{{{','.join(f'{k}={v}' for k, v in labels)}}}" if labels else name: value
        for (name, labels), value in found.items()
    }
