"""ServiceBusSession: the lock and the state of one session a receiver holds.

A session receiver (``get_queue_receiver(queue, session_id=...)``) locks its
session when it opens: the named one, or with ``NEXT_AVAILABLE_SESSION`` the
session whose oldest message waits longest among those nobody holds. The
lock lives in the engine's window of the session's partition (a session's
messages are keyed, so partitioned, by its id), and the messages received
under it share its lock: renew the session, not the messages.
"""

from __future__ import annotations

import base64
import datetime as dt
import enum
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from settlement import _waits as waits
from settlement._engine_link import EngineLink, check_reply
from settlement._keywords import check_timeout, refuse
from settlement.exceptions import (
    MessageSizeExceededError,
    OperationTimeoutError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)
from topics.commands import (
    MAX_SESSION_STATE,
    ClientArgs,
    Grant,
    LockSessionArgs,
    ReleaseSessionArgs,
    RenewSessionArgs,
    SessionStateArgs,
    SetSessionStateArgs,
)
from topics.errors import ErrorCode
from topics.partitions import session_partition
from topics.times import epoch_ms, utc_from_ms

#: how long a NEXT_AVAILABLE_SESSION receiver without max_wait_time waits for a session
DEFAULT_SESSION_WAIT_S = 60.0


class ServiceBusSessionFilter(enum.Enum):
    NEXT_AVAILABLE = 0


#: lock whichever session is free next, as ``azure.servicebus.NEXT_AVAILABLE_SESSION``
NEXT_AVAILABLE_SESSION = ServiceBusSessionFilter.NEXT_AVAILABLE


class ServiceBusSession:
    """The session of a session receiver: ``session_id``, ``locked_until_utc``,
    ``get_state``, ``set_state`` and ``renew_lock``."""

    def __init__(self, link: EngineLink, entity: str, partition_count: int,
                 session_id: str | ServiceBusSessionFilter,
                 max_wait_time: float | None = None) -> None:
        if not isinstance(session_id, ServiceBusSessionFilter) and not (
                isinstance(session_id, str) and 0 < len(session_id) <= 128):
            raise ValueError("session_id must be a session id of 1..128 characters, or "
                             "NEXT_AVAILABLE_SESSION")
        self._link = link
        self._entity = entity
        self._partitions = partition_count
        self._max_wait_time = max_wait_time
        self._session_id = session_id if isinstance(session_id, str) else None
        self._token: str | None = None
        self._until: dt.datetime | None = None
        self._lost = False
        self._released = False
        #: settlements being sent, which the session's release waits for
        self._settling = 0
        self._settling_changed = threading.Condition()
        #: set by AutoLockRenewer when renewing this session failed
        self.auto_renew_error: Exception | None = None

    @property
    def session_id(self) -> str | None:
        """The session's id (for NEXT_AVAILABLE_SESSION: once it is locked)."""
        return self._session_id

    @property
    def locked_until_utc(self) -> dt.datetime | None:
        return self._until

    @property
    def partition(self) -> int:
        assert self._session_id is not None
        return session_partition(self._session_id, self._partitions)

    # ------------------------------------------------------------------ public
    def get_state(self, *, timeout: float | None = None, **kwargs: Any) -> bytes | None:
        """The session state, as bytes (None: never set, or cleared)."""
        refuse("get_state", kwargs)
        state = self._call(SessionStateArgs, timeout)["state"]
        return None if state is None else base64.b64decode(state)

    def set_state(self, state: str | bytes | bytearray | None, *,
                  timeout: float | None = None, **kwargs: Any) -> None:
        """Store ``state`` with the session (None clears it); it outlives the
        lock, engine restarts and hand-overs between engine workers."""
        refuse("set_state", kwargs)
        raw = state.encode() if isinstance(state, str) else state
        if raw is not None and len(raw) > MAX_SESSION_STATE:
            raise MessageSizeExceededError(
                f"session state of {len(raw)} bytes is over the limit of {MAX_SESSION_STATE}: "
                "keep a reference to larger data (a key in a store) in the state instead")
        encoded = None if raw is None else base64.b64encode(bytes(raw)).decode()
        self._call(lambda session, token: SetSessionStateArgs(session, token, encoded), timeout)

    def renew_lock(self, *, timeout: float | None = None, **kwargs: Any) -> dt.datetime:
        """Extend the session lock (and the locks of its received messages) by
        the entity's lock duration; returns the new end."""
        refuse("renew_lock", kwargs)
        until = utc_from_ms(self._call(RenewSessionArgs, timeout)["until"])
        assert until is not None, "the engine's renewal reply carries the lock's new end"
        self._until = until
        return until

    # ------------------------------------------------------------- internals
    def open(self, first: int = 0) -> list[Grant]:
        """Lock the session, unless this receiver holds it already (or held
        it: a lost session is not taken again, as in the SDK). ``first``:
        lock up to that many of its first messages with it, and return their
        grants (none when the session was locked before). A
        NEXT_AVAILABLE_SESSION receiver waits for a free session up to its
        ``max_wait_time``."""
        for pause in self.pauses():
            time.sleep(pause)
            grants = self.try_open(first)
            if grants is not None:
                return grants
        raise self.none_available()

    def try_open(self, first: int = 0) -> list[Grant] | None:
        """:meth:`open` without waiting: None when no session was free."""
        if self._token is not None:
            return []
        if self._session_id is not None:
            return self._lock(self.partition, self._session_id, first) or []
        for partition in range(self._partitions):
            grants = self._lock(partition, None, first)
            if grants is not None:
                return grants
        return None

    def pauses(self) -> Iterator[float]:
        """The pauses between tries of a NEXT_AVAILABLE_SESSION receiver
        waiting for a free session, up to its ``max_wait_time``."""
        return waits.pauses(self._wait(), 0.01, 0.25)

    def _wait(self) -> float:
        return DEFAULT_SESSION_WAIT_S if self._max_wait_time is None else self._max_wait_time

    def none_available(self) -> OperationTimeoutError:
        """The error of a NEXT_AVAILABLE_SESSION receiver that found no free
        session within its ``max_wait_time``."""
        return OperationTimeoutError(
            f"no session of {self._entity} became available within {self._wait():g} s "
            "(every session with messages is locked, or none has messages)")

    def _lock(self, partition: int, session_id: str | None, first: int) -> list[Grant] | None:
        """The grants of the session's first messages once locked; None
        when no session was free."""
        reply = self._link.call(self._link.command(self._entity, partition,
                                                   LockSessionArgs(session_id, first)))
        check_reply(reply, self._entity)
        result = reply.result
        if result["session"] is None:
            return None
        if result.get("taken"):
            taken_until = utc_from_ms(result["until"])
            assert taken_until is not None, "the engine says until when a taken session is locked"
            raise SessionCannotBeLockedError(
                f"session {result['session']!r} of {self._entity} is locked by another "
                f"receiver until {taken_until.isoformat()}: try again "
                "when it closes, or receive NEXT_AVAILABLE_SESSION")
        self._session_id, self._token = result["session"], result["token"]
        self._until = utc_from_ms(result["until"])
        return reply.grants

    def lost(self) -> SessionLockLostError:
        """The error for an operation under a lock that is gone; the session
        is then unusable, as in the SDK."""
        self._lost = True
        return SessionLockLostError(
            f"the lock on session {self._session_id!r} of {self._entity} was lost (it lapsed "
            "or was released), and the locks of its received messages with it: open a new "
            "session receiver, and renew the session lock sooner (AutoLockRenewer)")

    @property
    def lost_or_released(self) -> bool:
        return self._lost or self._released

    @contextmanager
    def settlement(self) -> Iterator[int | None]:
        """Around sending a settlement of the session's messages: gives when
        the session's lock ends (ms since the epoch, in the log's time), for
        a settlement that may be final once appended, or None when this
        receiver no longer holds it. The session is not released meanwhile,
        so its release comes after the settlement in the log
        (docs/settlement-by-log.md)."""
        with self._settling_changed:
            end = None if self.lost_or_released or self._until is None else epoch_ms(self._until)
            self._settling += 1
        try:
            yield end
        finally:
            with self._settling_changed:
                self._settling -= 1
                self._settling_changed.notify_all()

    def held(self) -> tuple[str, str]:
        """What identifies the held session in a command: its id and lock token."""
        if self._lost or self._released:
            raise self.lost()
        assert self._session_id is not None and self._token is not None
        return self._session_id, self._token

    def _call(self, args: Callable[[str, str], ClientArgs], timeout: float | None = None
              ) -> dict[str, Any]:
        """The command ``args(session, token)`` makes, on the held session;
        ``timeout`` bounds it, retries included."""
        check_timeout(timeout)
        self.open()
        reply = self._link.call_many([self._link.command(self._entity, self.partition,
                                                         args(*self.held()))],
                                     timeout=timeout)[0]
        if not reply.ok and reply.error_code == ErrorCode.SESSION_LOCK_LOST:
            raise self.lost()
        check_reply(reply, self._entity)
        return reply.result

    def release(self) -> None:
        """Give the session up (the receiver closes): its unsettled messages
        are abandoned, and the next receiver may lock it at once. Returns once
        Kafka has the release, not waiting for the engine: its answer changes
        nothing here (a session that lapsed meanwhile is released already),
        and the engine applies it before any later command of the session's
        partition, another receiver's lock included."""
        with self._settling_changed:
            if self._token is None or self.lost_or_released:
                return
            self._settling_changed.wait_for(lambda: not self._settling)
            held = self.held()
            self._released = True
        self._link.append(self._link.command(self._entity, self.partition,
                                             ReleaseSessionArgs(*held)))
