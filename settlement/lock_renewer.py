"""AutoLockRenewer: keeps message and session locks alive while a handler works."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from settlement._keywords import refuse
from settlement._session import ServiceBusSession
from settlement.exceptions import AutoLockRenewFailed, AutoLockRenewTimeout, ServiceBusError
from settlement.message import ServiceBusReceivedMessage
from settlement.receiver import ServiceBusReceiver

log = logging.getLogger(__name__)
FailureCallback = Callable[[Any, Exception | None], Any]


class AutoLockRenewer:
    """Renews registered messages' locks until they are settled or
    ``max_lock_renewal_duration`` seconds have passed.

    A lock is renewed once less than half its duration (at most 10 s) is left,
    so a renewal has time for a round trip to the engine. The locks of one
    receiver that are due together are renewed in one command per partition.

    As in the SDK, ``on_lock_renew_failure(renewable, error)`` is called only
    when a lock is lost: a renewal failed (``error`` is an
    :class:`AutoLockRenewFailed`), or the lock had expired when renewing
    stopped (``error`` is None, or the :class:`AutoLockRenewTimeout`). When
    renewing stops while the lock is still valid (the message was settled,
    the receiver closed, ``max_lock_renewal_duration`` passed), the lock is
    left to run out quietly; for the last, ``renewable.auto_renew_error`` is
    set to the ``AutoLockRenewTimeout``.
    """

    def __init__(self, max_lock_renewal_duration: float = 300,
                 on_lock_renew_failure: FailureCallback | None = None,
                 **kwargs: Any) -> None:
        for name in ("executor", "max_workers"):
            if name in kwargs:
                raise TypeError(
                    f"AutoLockRenewer() keyword {name!r} is not supported here: there is no "
                    "thread pool to size; one thread renews the due message locks of each "
                    "receiver together (one command per partition), and one per session")
        refuse("AutoLockRenewer", kwargs)
        self._max_duration = max_lock_renewal_duration
        self._on_failure = on_lock_renew_failure
        self._entries: list[tuple[ServiceBusReceiver, ServiceBusReceivedMessage, float,
                                  FailureCallback | None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lock-renewer", daemon=True)
        self._thread.start()

    def register(self, receiver: ServiceBusReceiver,
                 renewable: ServiceBusReceivedMessage | ServiceBusSession,
                 max_lock_renewal_duration: float | None = None,
                 on_lock_renew_failure: FailureCallback | None = None) -> None:
        """Keep ``renewable``'s lock: a received message, or a session
        receiver's ``receiver.session`` (whose messages share its lock)."""
        if not isinstance(renewable, ServiceBusReceivedMessage | ServiceBusSession):
            raise TypeError("AutoLockRenewer renews a ServiceBusReceivedMessage (received "
                            "with a lock) or a session receiver's receiver.session, not "
                            f"{type(renewable).__name__}")
        if self._stop.is_set():
            raise ServiceBusError("the AutoLockRenewer is closed: create a new one")
        if isinstance(renewable, ServiceBusReceivedMessage) and renewable.lock_token is None:
            raise ValueError("only messages received in PEEK_LOCK mode have a lock to renew "
                             "(not peeked ones, nor those received in RECEIVE_AND_DELETE mode)")
        limit = time.monotonic() + (max_lock_renewal_duration or self._max_duration)
        on_failure = on_lock_renew_failure or self._on_failure
        if isinstance(renewable, ServiceBusSession):
            thread = threading.Thread(target=self._keep_session, name="session-renewer",
                                      args=(receiver, renewable, limit, on_failure),
                                      daemon=True)
            thread.start()
            return
        with self._lock:
            self._entries.append((receiver, renewable, limit, on_failure))

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                entries = list(self._entries)
            keep = []
            due: dict[int, list[tuple[ServiceBusReceiver, ServiceBusReceivedMessage,
                                      FailureCallback | None]]] = {}
            for receiver, message, limit, on_failure in entries:
                if message._settled or receiver._closed or _lock_expired(message):
                    _stopped(message, on_failure, None)
                    continue
                if time.monotonic() > limit:
                    _stopped(message, on_failure, self._timed_out(
                        message, f"message {message.sequence_number}"))
                    continue
                if self._due(message.locked_until_utc, receiver):
                    due.setdefault(id(receiver), []).append((receiver, message, on_failure))
                keep.append((receiver, message, limit, on_failure))
            failed = {id(m) for group in due.values() for m in self._renew(group)}
            with self._lock:
                registered_meanwhile = self._entries[len(entries):]
                self._entries = [e for e in keep if id(e[1]) not in failed] + registered_meanwhile

    def _renew(self, group: list[tuple[ServiceBusReceiver, ServiceBusReceivedMessage,
                                       FailureCallback | None]]
               ) -> list[ServiceBusReceivedMessage]:
        """Renew one receiver's due locks together: one command per partition
        however many messages are due. Returns the messages whose renewal failed."""
        receiver = group[0][0]
        messages = [message for _, message, _ in group]
        results: list[ServiceBusError | ValueError | None]
        try:
            results = [r.error for r in receiver.settle_messages(messages, "renew")]
        except (ServiceBusError, ValueError) as exc:
            results = [exc for _ in messages]
        failed = []
        for (_, message, on_failure), error in zip(group, results, strict=True):
            if error is not None:
                _renew_failed(message, on_failure, error)
                failed.append(message)
        return failed

    def _keep_session(self, receiver: ServiceBusReceiver, session: ServiceBusSession,
                      limit: float, on_failure: FailureCallback | None) -> None:
        """Renew one session's lock until its receiver closes, the renewer
        closes or the time allowed runs out."""
        while not self._stop.wait(0.1):
            if receiver._closed or _lock_expired(session):
                _stopped(session, on_failure, None)
                return
            if session.locked_until_utc is None:
                continue  # not locked yet: the receiver opens it on first use
            if time.monotonic() > limit:
                _stopped(session, on_failure,
                         self._timed_out(session, f"session {session.session_id!r}"))
                return
            if not self._due(session.locked_until_utc, receiver):
                continue
            try:
                session.renew_lock()
            except (ServiceBusError, ValueError) as exc:
                _renew_failed(session, on_failure, exc)
                return
        _stopped(session, on_failure, None)

    def _timed_out(self, renewable: ServiceBusReceivedMessage | ServiceBusSession, name: str
                   ) -> AutoLockRenewTimeout:
        error = AutoLockRenewTimeout(f"stopped renewing the lock of {name}: "
                                     "max_lock_renewal_duration passed; the lock runs out")
        renewable.auto_renew_error = error
        return error

    @staticmethod
    def _due(locked_until: dt.datetime | None, receiver: ServiceBusReceiver) -> bool:
        if locked_until is None:
            return False
        margin = min(10.0, receiver._props.lock_duration.total_seconds() / 2)
        return (locked_until - dt.datetime.now(dt.UTC)).total_seconds() < margin

    def close(self, wait: bool = True) -> None:
        self._stop.set()
        if wait:
            self._thread.join(timeout=5)

    def __enter__(self) -> AutoLockRenewer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lock_expired(renewable: ServiceBusReceivedMessage | ServiceBusSession) -> bool:
    until = renewable.locked_until_utc
    return until is not None and until <= dt.datetime.now(dt.UTC)


def _stopped(renewable: ServiceBusReceivedMessage | ServiceBusSession,
             on_failure: FailureCallback | None, error: Exception | None) -> None:
    """Renewing stopped: the callback hears of it only if the lock is gone
    (the SDK's "clean shutdown" otherwise)."""
    if on_failure is not None and _lock_expired(renewable):
        log.warning("the lock of %s expired: %s", _name(renewable), error or "not renewed")
        on_failure(renewable, error)


def _renew_failed(renewable: ServiceBusReceivedMessage | ServiceBusSession,
                  on_failure: FailureCallback | None, exc: Exception) -> None:
    error = AutoLockRenewFailed(f"Failed to auto-renew lock of {_name(renewable)}: {exc}")
    error.__cause__ = exc
    renewable.auto_renew_error = error
    log.warning("%s", error.message)
    if on_failure is not None:
        on_failure(renewable, error)


def _name(renewable: ServiceBusReceivedMessage | ServiceBusSession) -> str:
    if isinstance(renewable, ServiceBusSession):
        return f"session {renewable.session_id!r}"
    return f"message {renewable.sequence_number}"
