"""The engine's clock: the time the commands log says, per partition.

A settlement is judged by when it reached the log, not by when the engine
gets to it (docs/settlement-by-log.md). Where the commands topic stamps its
records with the broker's append time (``message.timestamp.type=
LogAppendTime``, as the project creates it on Apache Kafka), the time of a
commands partition is the newest append time the engine has read from it, and
every decision about the windows of that partition (a lock's end, a message
due, a time to live) is taken at that time: a lock that ends at ``T`` lapses
only once the engine has read a record appended at ``T`` or later, so every
settlement appended before ``T`` was applied first. An idle partition's time
moves on with *ticks*, empty records the engine appends to it
(:data:`topics.commands.TICK_KEY`).

Where records carry their producer's time instead (Tansu, or a commands topic
made before LogAppendTime), a partition's time is the engine's wall clock, as
before, and clients wait for the engine's answer to every settlement.
"""

from __future__ import annotations

import time


class LogClock:
    """The time of each commands partition the engine reads."""

    def __init__(self) -> None:
        #: partition -> newest append time read (ms); absent: not known yet
        self._read: dict[int, int] = {}
        #: partition -> the offset of the last record read
        self._offset: dict[int, int] = {}
        #: partitions whose records carry their producer's time
        self._wall: set[int] = set()

    def observe(self, partition: int, offset: int, timestamp_ms: int,
                log_append_time: bool) -> None:
        """The record at ``offset`` of ``partition`` was read
        (``log_append_time``: stamped by the broker): its time moves on to it."""
        if log_append_time:
            self._wall.discard(partition)
            if offset <= self._offset.get(partition, -1):
                # Read again from an earlier offset (a seek back to the
                # committed offset): the time is that of this record, not of
                # records after it read before (docs/settlement-by-log.md, 2).
                self._read[partition] = timestamp_ms
            else:
                # max: append times of one partition do not go back, but a
                # new leader's clock may be a little behind (the clock assumption)
                self._read[partition] = max(self._read.get(partition, 0), timestamp_ms)
        else:
            self._wall.add(partition)
            self._read.pop(partition, None)
        self._offset[partition] = offset

    def now(self, partition: int) -> int | None:
        """The time of ``partition`` (ms), or None while nothing has been read
        from it since this worker got it (a tick tells)."""
        if partition in self._wall:
            return int(time.time() * 1000)
        return self._read.get(partition)

    def behind(self, partition: int, due_ms: int) -> bool:
        """Whether the log of ``partition`` has yet to reach ``due_ms``: the
        engine appends a tick to learn that it has."""
        now = self.now(partition)
        return now is None or now < due_ms

    def forget(self) -> None:
        """Partitions may have moved (a rebalance): learn them again."""
        self._read.clear()
        self._offset.clear()
        self._wall.clear()
