"""AutoLockRenewer: keeps message and session locks alive while a handler works."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from settlement._session import ServiceBusSession
from settlement.exceptions import AutoLockRenewTimeout, ServiceBusError
from settlement.message import ServiceBusReceivedMessage

if TYPE_CHECKING:
    from settlement.receiver import ServiceBusReceiver

log = logging.getLogger(__name__)
FailureCallback = Callable[[Any, Exception | None], Any]


class AutoLockRenewer:
    """Renews registered messages' locks until they are settled or
    ``max_lock_renewal_duration`` seconds have passed.

    A lock is renewed once less than half its duration (at most 10 s) is left,
    so a renewal has time for a round trip to the engine. The locks of one
    receiver that are due together are renewed in one command per partition.
    """

    def __init__(self, max_lock_renewal_duration: float = 300,
                 on_lock_renew_failure: FailureCallback | None = None,
                 **_: Any) -> None:
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
        if self._stop.is_set():
            raise ServiceBusError("the AutoLockRenewer is closed: create a new one")
        limit = time.monotonic() + (max_lock_renewal_duration or self._max_duration)
        if isinstance(renewable, ServiceBusSession):
            thread = threading.Thread(target=self._keep_session, name="session-renewer",
                                      args=(receiver, renewable, limit,
                                            on_lock_renew_failure or self._on_failure),
                                      daemon=True)
            thread.start()
            return
        with self._lock:
            self._entries.append((receiver, renewable, limit,
                                  on_lock_renew_failure or self._on_failure))

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                entries = list(self._entries)
            keep = []
            due: dict[int, list[tuple[ServiceBusReceiver, ServiceBusReceivedMessage,
                                      FailureCallback | None]]] = {}
            for receiver, message, limit, on_failure in entries:
                if message._settled or receiver._closed:
                    continue
                if time.monotonic() > limit:
                    self._failed(message, on_failure, AutoLockRenewTimeout(
                        f"stopped renewing the lock of message {message.sequence_number}: "
                        "max_lock_renewal_duration passed"))
                    continue
                if self._due(message, receiver):
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
        try:
            results = [r.error for r in receiver.settle_messages(messages, "renew")]
        except (ServiceBusError, ValueError) as exc:
            results = [exc for _ in messages]
        failed = []
        for (_, message, on_failure), error in zip(group, results, strict=True):
            if error is not None:
                self._failed(message, on_failure, error)
                failed.append(message)
        return failed

    def _keep_session(self, receiver: ServiceBusReceiver, session: ServiceBusSession,
                      limit: float, on_failure: FailureCallback | None) -> None:
        """Renew one session's lock until its receiver closes, the renewer
        closes or the time allowed runs out."""
        margin = min(10.0, receiver._props.lock_duration.total_seconds() / 2)
        while not self._stop.wait(0.1) and not receiver._closed:
            if session.locked_until_utc is None:
                continue  # not locked yet: the receiver opens it on first use
            left = (session.locked_until_utc - dt.datetime.now(dt.UTC)).total_seconds()
            if left >= margin:
                continue
            if time.monotonic() > limit:
                error: Exception = AutoLockRenewTimeout(
                    f"stopped renewing the lock of session {session.session_id!r}: "
                    "max_lock_renewal_duration passed")
            else:
                try:
                    session.renew_lock()
                    continue
                except (ServiceBusError, ValueError) as exc:
                    error = exc
            session.auto_renew_error = error
            self._failed(session, on_failure, error)
            return

    @staticmethod
    def _due(message: ServiceBusReceivedMessage, receiver: ServiceBusReceiver) -> bool:
        if message.locked_until_utc is None:
            return False
        margin = min(10.0, receiver._props.lock_duration.total_seconds() / 2)
        left = (message.locked_until_utc - dt.datetime.now(dt.UTC)).total_seconds()
        return left < margin

    @staticmethod
    def _failed(renewable: ServiceBusReceivedMessage | ServiceBusSession,
                on_failure: FailureCallback | None, exc: Exception) -> None:
        log.warning("lock renewal of %s failed: %s", _name(renewable), exc)
        if on_failure is not None:
            on_failure(renewable, exc)

    def close(self, wait: bool = True) -> None:
        self._stop.set()
        if wait:
            self._thread.join(timeout=5)

    def __enter__(self) -> AutoLockRenewer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _name(renewable: ServiceBusReceivedMessage | ServiceBusSession) -> str:
    if isinstance(renewable, ServiceBusSession):
        return f"session {renewable.session_id!r}"
    return f"message {renewable.sequence_number}"
