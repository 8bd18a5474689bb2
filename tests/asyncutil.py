"""Helpers for tests that drive the async services from synchronous pytest tests
(pytest-asyncio is not used): bounded ``asyncio.run``, polling, metric reads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float) -> T:
    """``asyncio.run(coro)`` that fails instead of hanging after ``timeout`` seconds."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample of ``registry``; 0 for a series that does not exist yet."""
    sample = registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


async def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    """Poll ``predicate`` every 20 ms until it holds; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)
