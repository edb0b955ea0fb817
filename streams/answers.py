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

    def purge(self, now: int) -> None:
        """Forget a few answers older than :data:`KEEP_MS`."""
        stop = self._by_time + f"{max(now - KEEP_MS, 0):013x}".encode()
        expired = list(itertools.islice(self._txn.range(self._by_time, stop), _PURGE_PER_COMMAND))
        for key, _ in expired:
            self._txn.delete(key)
            self._txn.delete(self._answers + key[len(self._by_time) + 13:])
