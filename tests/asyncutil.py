"""Helpers for tests that drive the async services from synchronous pytest tests
(pytest-asyncio is not used): bounded ``asyncio.run``, polling, metric reads. The polling
wait is tests/waiting.py's :func:`~tests.waiting.until`: it fails when progress stops, not
when a clock runs out."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from tests import waiting
from tests.waiting import until as wait_until

__all__ = ["run", "value", "wait_until"]

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float) -> T:
    """``asyncio.run(coro)`` that fails instead of hanging. ``timeout`` is a guard against a
    hang, not a wait: it is at least tests/waiting.py's ceiling and scaled like it (the
    waits inside ``coro`` fail first, when their progress stops)."""

    async def bounded() -> T:
        async with asyncio.timeout(waiting.scaled(max(timeout, waiting.CEILING))):
            return await coro

    return asyncio.run(bounded())


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample of ``registry``; 0 for a series that does not exist yet."""
    sample = registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample
