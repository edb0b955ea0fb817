"""Table writes the engine can wait for.

Faust sends a table's changelog record from a buffer in the background, and
neither its offset commit nor ``producer.flush()`` waits for that buffer to
drain (the buffer's flush gives up after 0.1 s). A command whose offset was
committed while its state was still in that buffer is lost by a ``kill -9``:
it is not processed again, yet its events were already published. These
helpers return the changelog record's own future, so the agent finishes a
command only once Kafka holds its state, and the offset commit that follows
covers only durable work.
"""

from __future__ import annotations

import asyncio

from faust.types import TableT


def put(table: TableT, key: bytes, value: bytes) -> asyncio.Future:
    """Store ``value`` locally and send it to the changelog; the future
    resolves when the broker has acknowledged it. Call from an agent."""
    sent = table.send_changelog(table.partition_for_key(key), key, value)
    table.data[key] = value
    return sent


def delete(table: TableT, key: bytes) -> asyncio.Future:
    """Remove ``key`` locally and write its tombstone to the changelog."""
    sent = table.send_changelog(table.partition_for_key(key), key, value=None,
                                value_serializer="raw")
    table.data.pop(key, None)
    return sent
