"""The engine's state in Faust tables: RocksDB on this worker, a compacted
changelog topic in Kafka.

Faust sends a table's changelog records from a buffer in the background, and
neither its offset commit nor ``producer.flush()`` waits for that buffer (its
flush gives up after 0.1 s), so a ``kill -9`` could lose state the engine had
already acted on. The engine therefore writes its tables here: each write
returns the changelog record's own future, and the agent waits for it.

Reads go straight to the RocksDB of the command partition that owns the
window (a table's changelog partition is its source partition), so ranges of
keys come back in order, which the state machine's indexes rely on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from faust.stores.rocksdb import Store as RocksDBStore
from faust.types import TableT


class TableStore:
    """One partition of a Faust table as a :class:`streams.store.Store`."""

    def __init__(self, table: TableT, partition: int) -> None:
        self.table = table
        self.partition = partition
        store = table.data
        assert isinstance(store, RocksDBStore), "the engine's tables are in RocksDB (streams.app)"
        self._db: Any = store._db_for_partition(partition)

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db.get(key)
        return value

    def range(self, start: bytes, stop: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self._db.items(from_key=start):
            if key >= stop:
                return
            yield key, value

    def write(self, key: bytes, value: bytes | None) -> asyncio.Future:
        """Store locally and send to the changelog; the future resolves once
        Kafka has acknowledged the record (None writes a tombstone)."""
        sent = self.table.send_changelog(self.partition, key, value,
                                         value_serializer="raw")
        if value is None:
            self._db.delete(key)
        else:
            self._db.put(key, value)
        return sent
