"""The engine's reader of its commands partitions (streams.command_intake)."""

from __future__ import annotations

import asyncio
import threading
import uuid

from streams.command_intake import CommandIntake
from tests.helpers import Broker
from topics.connection import parse_connection_string


class _OffsetsInMemory:
    """A group's committed offsets, kept here (this test assigns nothing)."""

    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}

    async def committed(self, partitions: list[int]) -> dict[int, int]:
        return {p: self.offsets.get(p, -1) for p in partitions}

    async def commit(self, offsets: dict[int, int]) -> None:
        self.offsets.update(offsets)


def test_a_job_whose_caller_was_cancelled_leaves_the_reader_reading(broker: Broker) -> None:
    """A rebalance cancels an assignment while the reader thread runs it:
    the reader goes on with the next job. (It ended on setting the cancelled
    job's future, and the worker never read a command again: CI on 35e41de,
    a worker of three silent after its first restore.)"""
    settings = parse_connection_string(broker.connection_string(f"t{uuid.uuid4().hex[:8]}"))
    intake = CommandIntake(settings, f"commands-{uuid.uuid4().hex[:6]}", _OffsetsInMemory(), 10)
    running, release = threading.Event(), threading.Event()

    def assignment_cut_short() -> str:
        running.set()
        release.wait(10)
        return "done, but nobody waits"

    async def scenario() -> int:
        waiting = asyncio.ensure_future(intake._in_reader(assignment_cut_short))
        assert await asyncio.to_thread(running.wait, 10)
        waiting.cancel()
        await asyncio.sleep(0)  # the cancellation reaches the job's future
        release.set()
        return await asyncio.wait_for(intake._in_reader(lambda: 42), 10)

    try:
        assert asyncio.run(scenario()) == 42
    finally:
        intake.close()
