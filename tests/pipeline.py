"""The scaffolding the in-process pipeline suites share (tests/test_hostile_devices.py,
tests/test_end_to_end.py, tests/test_whole_round_batches.py): a shuffler and an aggregator
started and ready, stopped cleanly, and a recorder of every message on the batches topic.

Every wait is tests/waiting.py's: a service is ready when it has connected (the shuffler) or
subscribed (the aggregator), and a wait fails if that does not happen within the (scaled)
stall window or as soon as the service's task ends with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiomqtt

from aggregator.service.service import Aggregator
from broker.service.shuffler import Shuffler
from edge.topics import batches_topic
from tests import waiting

READY_STALL = 30.0
"""Seconds a service may take to connect or subscribe (tests/waiting.py, scaled)."""
STOP_GUARD = 30.0
"""Seconds (scaled) a stopping service may take before the test fails instead of hanging."""


async def start(service: Shuffler | Aggregator) -> asyncio.Task[None]:
    """Enter ``service``'s context and run it until it is ready: connected (a shuffler) or
    subscribed (an aggregator). Its events are made anew on entering, so this works for a
    restart of the same object too."""
    await service.__aenter__()
    name = type(service).__name__
    task = asyncio.create_task(service.run(), name=f"test-{name}")
    ready = service.connected if isinstance(service, Shuffler) else service.subscribed
    await waiting.until(
        lambda: ready.is_set() or task.done(), stall=READY_STALL, what=f"the {name} ready"
    )
    if task.done():  # it failed while starting: its error, not a timeout
        task.result()
        raise AssertionError(f"the {name} stopped while starting")
    return task


async def stop_shuffler(shuffler: Shuffler, task: asyncio.Task[None]) -> None:
    """A graceful stop (its drain), then leave its context."""
    shuffler.stop()
    await asyncio.wait_for(task, waiting.scaled(STOP_GUARD))
    await shuffler.__aexit__(None, None, None)


async def stop_aggregator(aggregator: Aggregator, task: asyncio.Task[None]) -> None:
    """Cancel its run (the final checkpoint, then the PUBACKs it covers), leave its context."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await aggregator.__aexit__(None, None, None)


@contextlib.asynccontextmanager
async def services(shuffler: Shuffler, aggregator: Aggregator) -> AsyncIterator[None]:
    """The aggregator and the shuffler running and ready; both stopped on the way out."""
    agg_task = await start(aggregator)
    try:
        shuf_task = await start(shuffler)
        try:
            yield
        finally:
            await stop_shuffler(shuffler, shuf_task)
    finally:
        await stop_aggregator(aggregator, agg_task)


@dataclass
class BatchRecorder:
    """Every message on the batches topic, in order of arrival (payload bytes)."""

    payloads: list[bytes] = field(default_factory=list)
    subscribed: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def recording(
    port: int,
    deployment: str,
    on_message: Callable[[bytes], None] | None = None,
    **client: Any,
) -> AsyncIterator[BatchRecorder]:
    """A client on ``port`` subscribed (QoS 1) to ``deployment``'s batches topic for the
    duration: each payload goes to ``on_message`` if given, and to the recorder's list.
    ``client`` are further ``aiomqtt.Client`` options (identifier, protocol, credentials)."""
    recorder = BatchRecorder()

    async def listen() -> None:
        async with aiomqtt.Client("127.0.0.1", port, **{"timeout": 10, **client}) as mqtt:
            await mqtt.subscribe(batches_topic(deployment), qos=1)
            recorder.subscribed.set()
            async for message in mqtt.messages:
                assert isinstance(message.payload, bytes)
                recorder.payloads.append(message.payload)
                if on_message is not None:
                    on_message(message.payload)

    task = asyncio.create_task(listen(), name="test-batch-recorder")
    try:
        await waiting.until(
            lambda: recorder.subscribed.is_set() or task.done(),
            stall=READY_STALL,
            what="the batch recorder subscribed",
        )
        if task.done():
            task.result()
        yield recorder
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
