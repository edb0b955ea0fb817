"""Answers to commands, kept by command id for a while, so a retried or
re-processed command is answered again instead of applied again. (Not those
of quiet settlements final at their append whose every item applied: their
clients never ask again; see ``streams.window._final_and_ok``.)

Clients retry a command for about 30 s (3 attempts of 10 s); answers are kept
for :data:`KEEP_MS`, far beyond that, however many other commands the window
sees meanwhile, and are then dropped a few at a time, oldest first, through
an index ordered by time.

The index has one key per transaction, not per command: the settle commands
a window applies together (one thread settling one message at a time sends
dozens a batch) would otherwise write two keys each, and every key is a
RocksDB write, a changelog record and a line of the commit record. The key
is ``e<time><first id>``, its value the other ids as a JSON list (empty for
one command, as every key written before the grouping); its time is the
latest of the transaction's, so no answer is dropped earlier than it was
alone.
"""

from __future__ import annotations

import itertools
from typing import Any

from streams.store import Txn
from topics import jsonbytes

KEEP_MS = 300_000
#: the answers a purge forgets, at least (unless fewer are old enough) and
#: about: one transaction's index key is forgotten whole
_PURGE_PER_COMMAND = 16


class Answers:
    """One window's remembered answers over a transaction."""

    def __init__(self, txn: Txn, prefix: bytes) -> None:
        self._txn = txn
        self._answers = prefix + b"a"
        self._by_time = prefix + b"e"
        #: the ids answered in this transaction, and the latest time
        self._given: list[str] = []
        self._given_at = 0

    def get(self, command_id: str) -> Any | None:
        raw = self._txn.get(self._answers + command_id.encode())
        return None if raw is None else jsonbytes.loads(raw)["answer"]

    def put(self, command_id: str, now: int, answer: Any) -> None:
        self._txn.put(self._answers + command_id.encode(),
                      jsonbytes.dumps({"at": now, "answer": answer}))
        self._given.append(command_id)
        self._given_at = max(self._given_at, now)

    def flush(self) -> None:
        """Index the transaction's answers by time (at its end)."""
        if not self._given:
            return
        first, *others = self._given
        self._txn.put(self._by_time + f"{self._given_at:013x}".encode() + first.encode(),
                      jsonbytes.dumps(others) if others else b"")
        self._given = []

    def purge(self, now: int, oldest: int) -> int | None:
        """Forget a few answers older than :data:`KEEP_MS`; when the oldest
        one left may be forgotten (None: none is left). ``oldest``: when the
        oldest answer kept was given (earlier ones are all gone). The scan
        starts there, not at the first key: RocksDB would step over the
        deletions of every answer forgotten since its last compaction."""
        start = self._by_time + f"{oldest:013x}".encode()
        stop = self._by_time + f"{max(now - KEEP_MS, 0):013x}".encode()
        # each key indexes one answer at least: this many are enough to
        # forget _PURGE_PER_COMMAND and see when the next one is due
        found = list(itertools.islice(self._txn.range(start, self._by_time + b"~"),
                                      _PURGE_PER_COMMAND + 1))
        forgotten = 0
        for key, others in found:
            if key >= stop or forgotten >= _PURGE_PER_COMMAND:
                return int(key[len(self._by_time):len(self._by_time) + 13], 16) + KEEP_MS
            ids = [key[len(self._by_time) + 13:]]
            ids += [command_id.encode() for command_id in jsonbytes.loads(others)] if others else []
            self._txn.delete(key)
            for command_id in ids:
                self._txn.delete(self._answers + command_id)
            forgotten += len(ids)
        return None
