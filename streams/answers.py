"""Answers to commands, kept by command id for a while, so a retried or
re-processed command is answered again instead of applied again.

Clients retry a command for about 30 s (3 attempts of 10 s); answers are kept
for :data:`KEEP_MS`, far beyond that, however many other commands the window
sees meanwhile, and are then dropped a few per command, oldest first, through
an index ordered by time.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from streams.store import Txn

KEEP_MS = 300_000
_PURGE_PER_COMMAND = 16


class Answers:
    """One window's remembered answers over a transaction."""

    def __init__(self, txn: Txn, prefix: bytes) -> None:
        self._txn = txn
        self._answers = prefix + b"a"
        self._by_time = prefix + b"e"

    def get(self, command_id: str) -> Any | None:
        raw = self._txn.get(self._answers + command_id.encode())
        return None if raw is None else json.loads(raw)["answer"]

    def put(self, command_id: str, now: int, answer: Any) -> None:
        self._txn.put(self._answers + command_id.encode(),
                      json.dumps({"at": now, "answer": answer}, separators=(",", ":")).encode())
        self._txn.put(self._by_time + f"{now:013x}".encode() + command_id.encode(), b"")

    def purge(self, now: int, oldest: int) -> int | None:
        """Forget a few answers older than :data:`KEEP_MS`; when the oldest
        one left may be forgotten (None: none is left). ``oldest``: when the
        oldest answer kept was given (earlier ones are all gone). The scan
        starts there, not at the first key: RocksDB would step over the
        deletions of every answer forgotten since its last compaction."""
        start = self._by_time + f"{oldest:013x}".encode()
        stop = self._by_time + f"{max(now - KEEP_MS, 0):013x}".encode()
        found = list(itertools.islice(self._txn.range(start, self._by_time + b"~"),
                                      _PURGE_PER_COMMAND + 1))
        for forgotten, (key, _) in enumerate(found):
            if key >= stop or forgotten == _PURGE_PER_COMMAND:
                return int(key[len(self._by_time):len(self._by_time) + 13], 16) + KEEP_MS
            self._txn.delete(key)
            self._txn.delete(self._answers + key[len(self._by_time) + 13:])
        return None
