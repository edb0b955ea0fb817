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

import rocksdict
from faust.stores.rocksdb import Store as RocksDBStore
from faust.types import TP, TableT

from streams.record_sender import RecordSender

#: changelog partition -> (its store, the highest offset Kafka acknowledged
#: there that the store has not noted yet): noted once per turn of the event
#: loop, not once per record (a RocksDB write each; 6 % of the engine's time
#: accepting 100,000 new sessions, a write for every key written)
_unnoted: dict[TP, tuple[RocksDBStore, int]] = {}

#: The tables' writes skip RocksDB's write-ahead log. Kafka holds the state
#: (the changelogs), and RocksDB is this worker's copy of it: what a killed
#: worker had not flushed yet is gone together with the acknowledged offset
#: it noted (one column family per store, flushed in order, so what remains
#: is every write up to some point), and recovery reads the changelog from
#: that earlier offset on, as a worker that takes the partition over reads
#: all of it. The log doubled every write: with it, sending 2,000 sessions
#: grew the data directory 2.2-2.5 MB (0.6 without) and the drain ran at
#: 2,079 msg/s (2,271 without; bench/sessions.py, the same hour).
_NO_WAL = rocksdict.WriteOptions()
# a property at run time; rocksdict's stubs say a method
_NO_WAL.disable_wal = True  # type: ignore[method-assign,assignment]


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
        self._db.set_write_options(_NO_WAL)  # Faust's writes to it too (0.07 us)

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
        if sent.cancelled() or sent.exception() is not None:
            return
        offset = sent.result()
        noted = _unnoted.get(self._changelog)
        if noted is None or offset > noted[1]:
            if not _unnoted:  # after the other acknowledgements of this turn
                asyncio.get_running_loop().call_soon(_note_persisted)
            _unnoted[self._changelog] = (self._store, offset)


def _note_persisted() -> None:
    """Note in each partition's RocksDB how far Kafka holds its changelog:
    recovery reads the changelog from there on."""
    noted = list(_unnoted.items())
    _unnoted.clear()
    for changelog, (store, offset) in noted:
        store.set_persisted_offset(changelog, offset)
