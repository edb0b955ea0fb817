"""The engine's state in Faust tables: RocksDB on this worker, a compacted
changelog topic in Kafka.

Faust sends a table's changelog records from a buffer in the background, and
neither its offset commit nor ``producer.flush()`` waits for that buffer (its
flush gives up after 0.1 s), so a ``kill -9`` could lose state the engine had
already acted on. The engine therefore writes its tables here: each write
goes to the changelog through the engine's own sender
(:mod:`streams.record_sender`) and returns the record's future, which the
agent waits for. As Faust does for its own changelog records, each
acknowledged offset is kept in the partition's RocksDB, so that recovery
reads the changelog only from there on.

Reads go straight to the RocksDB of the command partition that owns the
window (a table's changelog partition is its source partition), so ranges of
keys come back in order, which the state machine's indexes rely on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from faust.stores.rocksdb import Store as RocksDBStore
from faust.types import TP, TableT

from streams.record_sender import RecordSender


class TableStore:
    """One partition of a Faust table as a :class:`streams.store.Store`."""

    def __init__(self, table: TableT, partition: int, sender: RecordSender) -> None:
        self.table = table
        self.partition = partition
        self._sender = sender
        self._changelog = TP(table.changelog_topic.get_topic_name(), partition)
        store = table.data
        assert isinstance(store, RocksDBStore), "the engine's tables are in RocksDB (streams.app)"
        self._store = store
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
        Kafka has acknowledged the record, to its offset (None writes a tombstone)."""
        sent = self.send(key, value)
        self.put(key, value)
        return sent

    def put(self, key: bytes, value: bytes | None) -> None:
        """Store locally only (None deletes): :meth:`send` follows."""
        if value is None:
            self._db.delete(key)
        else:
            self._db.put(key, value)

    def send(self, key: bytes, value: bytes | None) -> asyncio.Future:
        """Send to the changelog only; the future resolves as :meth:`write`'s."""
        sent = self._sender.send(self._changelog.topic, key, value, self.partition)
        sent.add_done_callback(self._persisted)
        return sent

    def _persisted(self, sent: asyncio.Future[Any]) -> None:
        if not sent.cancelled() and sent.exception() is None:
            self._store.set_persisted_offset(self._changelog, sent.result())
