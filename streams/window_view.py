"""What the window's features (sessions, acceptance, scheduling) see of it.

:class:`streams.window.InflightWindow` is the one implementation; the features
take this narrow view instead of importing the window, which imports them.
"""

from __future__ import annotations

from typing import Protocol

from streams.due_index import DueIndex
from streams.entries import Entries, Entry
from streams.session_index import SessionIndex
from streams.states import Event
from topics.commands import Grant, GrantGroup


class WindowView(Protocol):
    entity: str
    partition: int
    #: keys the window's lock tokens (topics.commands.lock_token)
    secret: str
    lock_ms: int
    requires_session: bool
    forward_to: str | None
    forward_dead_letters_to: str | None
    next: int
    ahead: int
    scanned: int | None
    entries: Entries
    due: DueIndex
    sessions: SessionIndex

    def put(self, offset: int, entry: Entry | None) -> None: ...

    def settled(self, offset: int) -> None: ...

    def fit_chunks(self, read: int, selected: int) -> None: ...

    def leave_out(self, runs: list[int]) -> None: ...

    def grant(self, offset: int, entry: Entry) -> Grant: ...

    def grant_group(self, offsets: list[int], deliveries: list[int], batch: int, until: int
                    ) -> GrantGroup: ...

    def locked_at(self, entry: Entry) -> int: ...

    def release(self, offsets: list[int], events: list[Event], kind: str | None) -> None: ...

    def delete_on_receipt(self, picked: list[int], events: list[Event]) -> list[Grant]: ...

    def see_log_end(self, hw: int, events: list[Event]) -> None: ...

    def expire_later(self, items: list[list[int]]) -> None: ...

    def expire_message(self, offset: int, events: list[Event]) -> None: ...
