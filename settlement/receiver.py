"""Receiving and settling: peek-lock and receive-and-delete, from a queue
or a subscription (``TOPIC/subscriptions/SUB``, a window over its topic's log).

A receive asks the engine to lock a batch of offsets of one entity partition
(redeliveries first, then fresh offsets up to the log end this receiver has
seen), then reads exactly those records from the log. A settlement is one
command per partition, however many messages it settles, and the engine
answers each message: settled, or its lock was lost.
"""

from __future__ import annotations

import datetime as dt
import enum
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

from settlement import _read_ahead as read_ahead
from settlement import _waits as waits
from settlement import message_records
from settlement._engine_link import EngineLink, check_reply
from settlement._keywords import check_timeout, refuse
from settlement._log_reader import PartitionReader, ReaderPool
from settlement._session import ServiceBusSession, ServiceBusSessionFilter
from settlement._settle_batcher import SettleBatcher
from settlement._subscription_rules import SubscriptionRules, apply_actions
from settlement.exceptions import (
    InvalidOperationError,
    MessageAlreadySettled,
    MessageLockLostError,
    ServiceBusError,
)
from settlement.message import ServiceBusReceivedMessage
from settlement.processor import MessageProcessor
from topics import names
from topics.commands import (
    AcquireArgs,
    AcquireDeferredArgs,
    Action,
    ClientArgs,
    Command,
    Grant,
    PeekArgs,
    Reply,
    SettleArgs,
    SettleItem,
)
from topics.connection import ConnectionSettings
from topics.entities import QueueProperties, SubscriptionProperties
from topics.errors import ErrorCode
from topics.message_record import MALFORMED, MalformedRecord
from topics.sequence_numbers import split_sequence_number
from topics.times import as_utc, epoch_ms, utc_from_ms

log = logging.getLogger(__name__)

MALFORMED_REASON = MALFORMED


class ServiceBusReceiveMode(enum.StrEnum):
    PEEK_LOCK = "peek_lock"
    RECEIVE_AND_DELETE = "receive_and_delete"


class ServiceBusSubQueue(enum.StrEnum):
    DEAD_LETTER = "deadletter"
    TRANSFER_DEAD_LETTER = "transferdeadletter"


#: most messages a receiver's loop locks ahead of the application (see __iter__)
_LOOP_PREFETCH = 32
#: the smallest receive that reads its records while the engine locks them
#: (see ServiceBusReceiver._ahead_of_grants)
_AHEAD_OF_GRANTS = 50
#: reason and description characters in one settle command (see settle_messages)
_TEXT_PER_COMMAND = 250_000
#: Settlements that are final once Kafka appended them within the lock
#: (docs/settlement-by-log.md). Not dead-lettering: the reason and description
#: it stores may make what it writes too large, which only the engine knows.
_FINAL_ONCE_APPENDED = frozenset({"complete", "abandon", "defer"})
#: each action by its name: calling the Enum class to look one up took 2 us,
#: 7 % of the client's time completing lists of 1,000 (py-spy)
_ACTIONS = {action.value: action for action in Action}


class LockRenewer(Protocol):
    """What a receiver needs of its ``auto_lock_renewer`` (an
    :class:`settlement.AutoLockRenewer`, or the asyncio client's adapter):
    a protocol, as the renewer builds on this module."""

    def register(self, receiver: ServiceBusReceiver,
                 renewable: ServiceBusReceivedMessage | ServiceBusSession) -> None: ...


@dataclass
class SettlementResult:
    """The engine's answer for one message of a batch settlement."""

    message: ServiceBusReceivedMessage
    error: ServiceBusError | None = None

    @property
    def succeeded(self) -> bool:
        return self.error is None


class ServiceBusReceiver:
    """Receives from a queue or its dead-letter sub-queue."""

    def __init__(self, settings: ConnectionSettings, link: EngineLink, batcher: SettleBatcher,
                 readers: ReaderPool, props: QueueProperties | SubscriptionProperties, *,
                 sub_queue: ServiceBusSubQueue | None = None,
                 receive_mode: ServiceBusReceiveMode = ServiceBusReceiveMode.PEEK_LOCK,
                 max_wait_time: float | None = None, prefetch_count: int = 0,
                 rules: SubscriptionRules | None = None,
                 session_id: str | ServiceBusSessionFilter | None = None,
                 auto_lock_renewer: LockRenewer | None = None,
                 client_identifier: str | None = None) -> None:
        self._entity = props.path
        self.entity_path = props.path + {
            None: "", ServiceBusSubQueue.DEAD_LETTER: names.DEAD_LETTER_SUFFIX,
            ServiceBusSubQueue.TRANSFER_DEAD_LETTER: names.TRANSFER_DEAD_LETTER_SUFFIX,
        }[sub_queue]
        self.receive_mode = ServiceBusReceiveMode(receive_mode)
        self._settings = settings
        self._link = link
        self._batcher = batcher
        self._props = props
        self._sub = "active" if sub_queue is None else sub_queue.value
        self._max_wait_time = max_wait_time
        self._prefetch = max(prefetch_count, 1)
        self._rules = rules
        self._topic = names.entity_log(settings.namespace, props.path)
        self._pool = readers  # the client's: readers are taken from it and given back
        self._readers: dict[int, PartitionReader] = {}
        self._turn = itertools.cycle(range(props.partition_count))
        #: partition -> where this receiver's next grants there likely
        #: begin (after its last ones), and whether its last ones began
        #: where those before them ended: it drains the partition in order
        self._in_order: dict[int, tuple[int, bool]] = {}
        self._peek_from = (0, 0)
        self._closed = False
        self._session = self._session_for(link, props, session_id, sub_queue, max_wait_time)
        #: a session's messages locked with it and not handed out yet, in order
        self._unseen: list[ServiceBusReceivedMessage] = []
        if (auto_lock_renewer is not None and self._session is None
                and self.receive_mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE):
            raise ValueError(  # the SDK's words
                "Messages received in RECEIVE_AND_DELETE receive mode cannot have their locks "
                "removed as they have been deleted, providing an AutoLockRenewer in this mode "
                "is invalid.")
        self._auto_lock_renewer = auto_lock_renewer
        self._name = client_identifier or f"SBReceiver-{uuid.uuid4()}"
        # Only a receiver asked to prefetch locks messages the application has
        # not asked for yet, as in the SDK (prefetch_count=0: none).
        self._read_ahead = (read_ahead.ReadAhead(self._start_round, self._release)
                            if prefetch_count > 0
                            and self.receive_mode == ServiceBusReceiveMode.PEEK_LOCK
                            and self._sub == "active" and self._session is None else None)

    @staticmethod
    def _session_for(link: EngineLink, props: QueueProperties | SubscriptionProperties,
                     session_id: str | ServiceBusSessionFilter | None,
                     sub_queue: ServiceBusSubQueue | None, max_wait_time: float | None
                     ) -> ServiceBusSession | None:
        if session_id is None or sub_queue is not None:
            return None  # the sub-queues of a session-enabled entity have no sessions
        if not props.requires_session:
            raise InvalidOperationError(
                f"{props.path} does not require sessions: receive from it without session_id "
                "(or create it with requires_session=True)")
        return ServiceBusSession(link, props.path, props.partition_count, session_id,
                                 max_wait_time)

    @property
    def session(self) -> ServiceBusSession | None:
        """The session this receiver holds (None: not a session receiver)."""
        return self._session

    @property
    def client_identifier(self) -> str:
        return self._name

    def __str__(self) -> str:
        return f"Receiver client id: {self.client_identifier}, entity: {self.entity_path}"

    def _open(self) -> None:
        """Lock the session of a session receiver, on its first use (for
        NEXT_AVAILABLE_SESSION, waiting for a free one up to the receiver's
        ``max_wait_time``); the receiver's ``auto_lock_renewer`` then keeps
        the session's lock."""
        if self._session is None or self._closed or self._session.locked_until_utc is not None:
            return
        for pause in self._session.pauses():
            time.sleep(pause)
            if self._try_open():
                return
        raise self._session.none_available()

    def _try_open(self) -> bool:
        """One try at locking the session (True: locked, or none to lock;
        False: no session was free)."""
        if self._session is None or self._closed or self._session.locked_until_utc is not None:
            return True
        # Peek-lock: the session's first messages come with its lock (one
        # round trip instead of two); handed out by the receives that follow.
        first = _LOOP_PREFETCH if self.receive_mode == ServiceBusReceiveMode.PEEK_LOCK else 0
        grants = self._session.try_open(first)
        if grants is None:
            return False
        if grants:
            self._unseen = self._materialize(self._session.partition, grants)
        if self._auto_lock_renewer is not None:
            self._auto_lock_renewer.register(self, self._session)
        return True

    def _renew_automatically(self, messages: list[ServiceBusReceivedMessage]) -> None:
        """Hand locked messages to the receiver's ``auto_lock_renewer``, as the SDK does."""
        if (self._auto_lock_renewer is not None and self._session is None
                and self.receive_mode == ServiceBusReceiveMode.PEEK_LOCK):
            for message in messages:
                self._auto_lock_renewer.register(self, message)

    # ----------------------------------------------------------------- receive
    def receive_messages(self, max_message_count: int | None = 1,
                         max_wait_time: float | None = None) -> list[ServiceBusReceivedMessage]:
        """Up to ``max_message_count`` messages; waits at most ``max_wait_time``
        seconds for the first (the receiver's own ``max_wait_time`` when None;
        when both are None, waits until a message arrives)."""
        got = self._receive(max(1, max_message_count or 1), max_wait_time)
        self._renew_automatically(got)
        return got

    def _receive(self, want: int, max_wait_time: float | None
                 ) -> list[ServiceBusReceivedMessage]:
        got = self._first_round(want)
        if not got:
            for pause in self._pauses(max_wait_time):
                time.sleep(pause)
                got = self._receive_round(want)
                if got:
                    break
        self._read_ahead_next(want, got)
        return got

    def _first_round(self, want: int) -> list[ServiceBusReceivedMessage]:
        """The first step of a receive: check the receiver is open, lock its
        session on first use, and take what was read ahead (locked), else
        ask the engine at once. One step, so that the asyncio receiver's
        first try is one trip to a worker thread, not two."""
        self._check_open()
        self._open()
        if self._read_ahead:
            got = self._fresh(self._read_ahead.take(want))
            if got:
                return got
        return self._receive_round(want)

    def _pauses(self, max_wait_time: float | None) -> Iterator[float]:
        """The pauses before each round of a receive after its first (which
        :meth:`_first_round` made at once), until ``max_wait_time`` (the
        receiver's own when None) has passed, counted from the end of that
        first step: a receiver's wait for a free session, in the same step,
        does not shorten it."""
        pauses = waits.pauses(self._max_wait_time if max_wait_time is None else max_wait_time,
                              0.005, 0.2)
        next(pauses)  # the 0 before the first round
        return pauses

    def _then_read_ahead(self, round_: Callable[[int], list[ServiceBusReceivedMessage]],
                         want: int) -> list[ServiceBusReceivedMessage]:
        """``round_(want)``, then :meth:`_read_ahead_next`: one step for the
        asyncio receiver's worker thread, which keeps the read-ahead's
        acquire (and a reader it may open) off the event loop and still has
        it sent before the receive returns."""
        got = round_(want)
        self._read_ahead_next(want, got)
        return got

    def _read_ahead_next(self, want: int, got: list[ServiceBusReceivedMessage]) -> None:
        """After a receive: a busy queue (a large batch came back full) has
        its next batch locked in the background meanwhile."""
        if self._read_ahead and want >= read_ahead.MIN_BATCH and len(got) == want:
            self._read_ahead.start(want)

    def _fresh(self, batch: list[ServiceBusReceivedMessage]) -> list[ServiceBusReceivedMessage]:
        """A batch read ahead, if at least half of its locks' time is left;
        otherwise it goes back (the application took long over the last one)."""
        if not batch or batch[0].locked_until_utc is None:
            return batch
        left = batch[0].locked_until_utc - dt.datetime.now(dt.UTC)
        if left >= self._props.lock_duration / 2:
            return batch
        self._release(batch)
        return []

    def _receive_round(self, want: int) -> list[ServiceBusReceivedMessage]:
        if self._session is not None:
            return self._receive_session(want)
        return self._start_round(want)()

    def _start_round(self, want: int) -> Callable[[], list[ServiceBusReceivedMessage]]:
        """Send a round's first acquire now; the function returned finishes
        the round (the answer, the messages, the next partitions while the
        batch is short), on whichever thread calls it: the read-ahead sends
        on the application's thread and finishes in its own
        (:mod:`settlement._read_ahead` says why)."""
        partitions = self._props.partition_count
        first = self._start_acquire(next(self._turn), want)

        def finish() -> list[ServiceBusReceivedMessage]:
            got = first()
            for _ in range(partitions - 1):
                if len(got) >= want:
                    break
                got += self._start_acquire(next(self._turn), want - len(got))()
            return got
        return finish

    def _start_acquire(self, partition: int, want: int
                       ) -> Callable[[], list[ServiceBusReceivedMessage]]:
        """Send the acquire of up to ``want`` messages of ``partition``; the
        function returned waits for its grants and reads their messages."""
        reader = self._reader(partition)
        hw = reader.high_watermark() if self._sub == "active" else 0
        cmd = self._link.command(self._entity, partition, AcquireArgs(
            self._sub, self.receive_mode.value, want, hw))
        ahead: dict[int, ServiceBusReceivedMessage] = {}
        answer = self._link.start_call(cmd, meanwhile=self._ahead_of_grants(
            reader, partition, want, ahead))

        def messages() -> list[ServiceBusReceivedMessage]:
            reply = answer()
            check_reply(reply, self.entity_path)
            if reply.grants:
                first, last = reply.grants[0].offset, reply.grants[-1].offset
                expected = self._in_order.get(partition, (-1, False))[0]
                self._in_order[partition] = (last + 1, first == expected)
            return self._materialize(partition, reply.grants, ahead=ahead)
        return messages

    def _ahead_of_grants(self, reader: PartitionReader, partition: int, want: int,
                         into: dict[int, ServiceBusReceivedMessage]
                         ) -> Callable[[], None] | None:
        """While the engine locks the next ``want`` messages of a partition
        this receiver drains in order: read the records its grants most
        likely name (those after its last ones) from what the reader holds
        already, into ``into`` (offset -> the message, its delivery not yet
        set: built now rather than kept as the record's contents, two
        objects more per message for the garbage collector). A receive of hundreds
        then reads while the engine works instead of after (a harness of
        receive 1,000 + complete_messages on Apache Kafka: building the
        messages after the grants came was 31-36 % of each round, 19-23 %
        with this). Nothing when the batch is small, or the last grants were
        elsewhere (receivers that compete for the partition, or
        redeliveries): it would be read for nothing."""
        first, in_order = self._in_order.get(partition, (-1, False))
        if want < _AHEAD_OF_GRANTS or not in_order or self._sub != "active":
            return None

        def read() -> None:
            try:
                records = reader.at_hand(range(first, first + want))
            except ServiceBusError as exc:  # the read of the grants meets it again
                log.debug("reading ahead of the grants of %s[%d] failed: %s", self._topic,
                          partition, exc)
                return
            for offset, record in records.items():
                try:
                    into[offset] = message_records.received(message_records.contents(
                        record.value(), record.headers(), record.timestamp()[1], partition,
                        offset))
                except MalformedRecord:  # dead-lettered when granted, as it is read again
                    continue
        return read

    def _receive_session(self, want: int) -> list[ServiceBusReceivedMessage]:
        """The held session's next messages, in order, from its partition."""
        assert self._session is not None
        if self._unseen:
            got, self._unseen = self._unseen[:want], self._unseen[want:]
            return got
        partition = self._session.partition
        # hw 0: the engine learns a session entity's log end from its scanner,
        # so the receiver need not wait for a fetch before asking.
        cmd = self._link.command(self._entity, partition, AcquireArgs(
            "active", self.receive_mode.value, want, 0, *self._session.held()))
        reply = self._link.call(cmd)
        if not reply.ok and reply.error_code == ErrorCode.SESSION_LOCK_LOST:
            raise self._session.lost()
        check_reply(reply, self.entity_path)
        return self._materialize(partition, reply.grants)

    def _materialize(self, partition: int, grants: list[Grant], *, peeked: bool = False,
                     ahead: dict[int, ServiceBusReceivedMessage] | None = None
                     ) -> list[ServiceBusReceivedMessage]:
        """Read the granted records and build the messages. Records that must
        not reach the application are settled here instead: a record that
        breaks the wire format is dead-lettered, an expired message expires, a
        message not yet due is parked until it is, an offset with no record is
        completed. Peeked records are shown as they are. ``ahead``: the
        messages of records read while the grants were on their way."""
        if not grants:
            return []
        records = self._reader(partition).read([g.offset for g in grants])
        out: list[ServiceBusReceivedMessage] = []
        withheld: list[SettleItem] = []
        now = dt.datetime.now(dt.UTC)
        # an acquire's locks end together: one datetime for all of them
        lock_ends: dict[int, dt.datetime] = {}
        actions = self._rules.actions() if self._rules is not None else None
        for grant in grants:
            offset, token, count = grant.offset, grant.lock_token, grant.deliveries
            record = records[offset]
            if record is None:
                withheld.append(SettleItem(offset, token, Action.COMPLETE))
                continue
            until = grant.locked_until_ms
            if token and until not in lock_ends:
                lock_ends[until] = utc_from_ms(until)
            delivery = {
                # The engine counts deliveries, this one included; the SDK
                # reports the AMQP header's count of earlier attempts (0 on the
                # first delivery), and a peek the deliveries so far.
                "lock_token": token, "delivery_count": count if peeked else max(0, count - 1),
                "locked_until_utc": lock_ends[until] if token else None,
            }
            if grant.state != "active" or not (grant.reason is grant.description is grant.source
                                                is None):  # else the class's defaults hold
                delivery |= {"dead_letter_reason": grant.reason,
                             "dead_letter_error_description": grant.description,
                             "dead_letter_source": grant.source,
                             "state": message_records.STATES[grant.state]}
            message = ahead.pop(offset, None) if ahead else None
            if message is not None:
                message._deliver(**delivery)
            else:
                try:
                    message = message_records.received(message_records.contents(
                        record.value(), record.headers(), record.timestamp()[1], partition,
                        offset, lenient=peeked or self._sub != "active"), **delivery)
                except MalformedRecord as exc:
                    log.warning("dead-lettering malformed record %s[%d]@%d: %s",
                                self._topic, partition, offset, exc)
                    withheld.append(SettleItem(offset, token, Action.DEAD_LETTER, exc.reason,
                                               str(exc)))
                    continue
            self._apply_queue_ttl(message)
            if actions is not None:
                apply_actions(actions, message, record)
            if not peeked and self._sub == "active":
                held = _withhold(message, offset, token, now)
                if held is not None:
                    withheld.append(held)
                    continue
            message._receiver = None if peeked else self
            message._settled = self.receive_mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE
            out.append(message)
        if withheld and not peeked and self.receive_mode == ServiceBusReceiveMode.PEEK_LOCK:
            check_reply(self._link.call(self._link.command(
                self._entity, partition, SettleArgs(tuple(withheld)))),
                self.entity_path)
        return out

    def _apply_queue_ttl(self, message: ServiceBusReceivedMessage) -> None:
        """The smaller of the message's and the queue's time to live applies."""
        if self._props.expires_messages:
            default = self._props.default_message_time_to_live
            message.time_to_live = min(message.time_to_live or default, default)

    def __iter__(self) -> Generator[ServiceBusReceivedMessage, None, None]:
        """Messages as they come; stops after ``max_wait_time`` without one.

        Without a ``prefetch_count``, the loop locks one message at a time
        while the application is slow, and more at once (up to
        :data:`_LOOP_PREFETCH`) while it settles them quickly: a tight loop
        then costs one round trip per message, not three. Messages locked but
        not yet handed out when the loop ends are released at once, without
        counting a delivery."""
        want = self._prefetch
        while not self._closed:
            batch = self._receive(want, self._max_wait_time)
            if not batch:
                return
            started = time.monotonic()
            handed = 0
            try:
                for message in batch:
                    handed += 1
                    self._renew_automatically([message])  # not those released unseen
                    yield message
            finally:
                self._release(batch[handed:])
            want = self._loop_want(want, started)

    def _loop_want(self, want: int, started: float) -> int:
        """How many messages a receiver's loop locks next, after handing out
        a batch of ``want`` from ``started`` (``time.monotonic()``) on: with a
        ``prefetch_count``, that many; without, twice as many while the
        application keeps up (up to :data:`_LOOP_PREFETCH`), one otherwise."""
        if self._prefetch > 1:
            return want
        fast = time.monotonic() - started < self._props.lock_duration.total_seconds() / 10
        return min(want * 2, _LOOP_PREFETCH) if fast else 1

    def _release(self, messages: list[ServiceBusReceivedMessage]) -> None:
        if messages and not self._closed and self.receive_mode == ServiceBusReceiveMode.PEEK_LOCK:
            self.settle_messages(messages, "release")

    def peek_messages(self, max_message_count: int = 1, *, sequence_number: int = 0,
                      timeout: float | None = None, **kwargs: Any
                      ) -> list[ServiceBusReceivedMessage]:
        """Browse messages without locking them, from ``sequence_number`` (0,
        as in the SDK: where the previous peek stopped); each carries its
        ``state``. ``timeout`` bounds the whole call, retries included."""
        refuse("peek_messages", kwargs)
        deadline = _deadline(timeout)
        self._check_open()
        self._open()
        if sequence_number:
            self._peek_from = split_sequence_number(sequence_number)
        partition, offset = self._peek_from
        last = self._props.partition_count
        only: str | None = None
        if self._session is not None:  # a session receiver peeks its session
            partition = max(partition, self._session.partition)
            last = self._session.partition + 1
            only = self._session.session_id
        out: list[ServiceBusReceivedMessage] = []
        while partition < last and len(out) < max_message_count:
            hw = self._reader(partition).high_watermark(_left(deadline, 5.0))
            reply = self._call(self._link.command(self._entity, partition, PeekArgs(
                self._sub, offset, max_message_count - len(out), hw, only)), deadline)
            check_reply(reply, self.entity_path)
            entries = reply.result["messages"]
            grants = [Grant(o, None, 0, count, reason, description, source, state)
                      for o, state, count, reason, description, source in entries]
            out += self._materialize(partition, grants, peeked=True)
            if entries:
                offset = entries[-1][0] + 1
            if len(out) < max_message_count:
                if partition + 1 == last:
                    break  # the next peek goes on from here: it sees what arrives later
                partition, offset = partition + 1, 0
        self._peek_from = (partition, offset)
        return out

    def receive_deferred_messages(self, sequence_numbers: int | list[int], *,
                                  timeout: float | None = None, **kwargs: Any
                                  ) -> list[ServiceBusReceivedMessage]:
        """Lock and return deferred messages by sequence number; ``timeout``
        bounds the whole call, retries included."""
        refuse("receive_deferred_messages", kwargs)
        deadline = _deadline(timeout)
        self._check_open()
        seqs = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        by_partition: dict[int, list[int]] = {}
        for seq in seqs:
            partition, offset = split_sequence_number(seq)
            if partition >= self._props.partition_count:
                raise ValueError(f"sequence number {seq} is not one of {self._entity!r}")
            by_partition.setdefault(partition, []).append(offset)
        out = []
        for partition, offsets in sorted(by_partition.items()):
            reply = self._call(self._link.command(
                self._entity, partition, AcquireDeferredArgs(tuple(offsets))), deadline)
            check_reply(reply, self.entity_path)
            out += self._materialize(partition, reply.grants)
        self._renew_automatically(out)
        return out

    # ------------------------------------------------------------------ settle
    def complete_message(self, message: ServiceBusReceivedMessage) -> None:
        self._settle_one(message, "complete")

    def abandon_message(self, message: ServiceBusReceivedMessage) -> None:
        self._settle_one(message, "abandon")

    def defer_message(self, message: ServiceBusReceivedMessage) -> None:
        self._settle_one(message, "defer")

    def dead_letter_message(self, message: ServiceBusReceivedMessage, reason: str | None = None,
                            error_description: str | None = None) -> None:
        if self._sub != "active":
            raise InvalidOperationError(
                f"message {message.sequence_number} is in the dead-letter sub-queue of "
                f"{self._entity!r} and cannot be dead-lettered again: complete it instead")
        self._settle_one(message, "dead_letter", reason, error_description)

    def renew_message_lock(self, message: ServiceBusReceivedMessage, *,
                           timeout: float | None = None, **kwargs: Any) -> dt.datetime:
        """Extend the lock by the queue's lock duration; return the new end.
        ``timeout`` bounds the call, retries included."""
        refuse("renew_message_lock", kwargs)
        check_timeout(timeout)
        if self._session is not None:
            raise TypeError("Renewing message lock is an invalid operation when working with "
                            "sessions: renew the session lock (receiver.session.renew_lock(), "
                            "or AutoLockRenewer.register(receiver, receiver.session))")
        result = self.settle_messages([message], "renew", timeout=timeout)[0]
        if result.error is not None:
            raise result.error
        assert message.locked_until_utc is not None
        return message.locked_until_utc

    def _settle_one(self, message: ServiceBusReceivedMessage, action: str,
                    reason: str | None = None, description: str | None = None) -> None:
        """:meth:`settle_messages` of one message, raising its error: the
        checks, then its command (one message has one partition and one
        group: the list's sorting and grouping cost a lone call 5-8 us)."""
        self._before_settling([message], action)
        with self._settlement() as session_end:
            error = self._settle_group(message.partition, [message], action, reason,
                                       description, None, session_end)[0].error
        if error is not None:
            raise error

    def complete_messages(self, messages: list[ServiceBusReceivedMessage]
                          ) -> list[SettlementResult]:
        """Complete many messages in one command per partition; each message
        gets its own answer (check ``SettlementResult.error``)."""
        return self.settle_messages(messages, "complete")

    def abandon_messages(self, messages: list[ServiceBusReceivedMessage]
                         ) -> list[SettlementResult]:
        return self.settle_messages(messages, "abandon")

    def settle_messages(self, messages: list[ServiceBusReceivedMessage], action: str,
                        reason: str | None = None, description: str | None = None, *,
                        timeout: float | None = None) -> list[SettlementResult]:
        """Settle a list in one command per partition; answers per message.
        Without a ``timeout``, concurrent calls share commands (see
        ``settlement._settle_batcher``); with one, each command is sent alone
        and the call takes at most ``timeout`` seconds, retries included."""
        deadline = _deadline(timeout)
        self._before_settling(messages, action)
        by_partition: dict[int, list[ServiceBusReceivedMessage]] = {}
        for message in messages:
            by_partition.setdefault(message.partition, []).append(message)
        results: dict[int, SettlementResult] = {}
        # The engine stores each dead letter's reason and description: long
        # ones travel in smaller commands, so that none is too large to store.
        per_command = max(1, _TEXT_PER_COMMAND // (len(reason or "") + len(description or "")
                                                   + 100))
        with self._settlement() as session_end:
            for partition, messages_of_partition in sorted(by_partition.items()):
                for first in range(0, len(messages_of_partition), per_command):
                    group = messages_of_partition[first:first + per_command]
                    for result in self._settle_group(partition, group, action, reason,
                                                     description, deadline, session_end):
                        results[id(result.message)] = result
        return [results[id(m)] for m in messages]

    def _before_settling(self, messages: list[ServiceBusReceivedMessage], action: str) -> None:
        """Refuse what may not be settled so; before giving messages back,
        give back the session's unseen ones (they come before them again)."""
        self._check_open()
        for message in messages:
            self._check_settleable(message, action)
        if action in ("abandon", "release"):
            self._return_unseen()

    def _settle_group(self, partition: int, group: list[ServiceBusReceivedMessage],
                      action: str, reason: str | None, description: str | None,
                      deadline: float | None, session_end: int | None
                      ) -> list[SettlementResult]:
        """Settle ``group`` (messages of ``partition``) in one command."""
        items = [_settle_item(m, action, reason, description) for m in group]
        final = self._spend_locks(group, action, session_end)
        reply = (self._batcher.settle(self._entity, partition, items, final)
                 if deadline is None else self._link.call(
                     self._link.command(self._entity, partition, SettleArgs(tuple(items))),
                     final_before_ms=final, timeout=_left(deadline, 0.0)))
        check_reply(reply, self.entity_path)
        return [SettlementResult(message, self._apply_answer(message, action, status, until))
                for message, (status, until) in zip(group, reply.statuses, strict=True)]

    def _settlement(self) -> AbstractContextManager[int | None]:
        """Around sending settlements: for a session receiver, its
        :meth:`ServiceBusSession.settlement` (the lock's end, and no release
        meanwhile); None otherwise."""
        return nullcontext(None) if self._session is None else self._session.settlement()

    def _spend_locks(self, messages: list[ServiceBusReceivedMessage], action: str,
                     session_end: int | None) -> int | None:
        """When the earliest lock of ``messages`` ends (ms), if settling them
        with ``action`` is final once Kafka appended it before then; None if
        it needs the engine's answer: a renewal (its answer is the new lock's
        end), a dead-lettering, the dead-letter sub-queue (deferring a dead
        letter is refused), or a lock that is not as granted, or was settled
        before (the engine says if it still holds). In a session the locks
        are the session's: they end when it does (``session_end``, None once
        it is lost or released). The locks count as spent from here on."""
        fresh = all(m.lock_token is not None and m.lock_token == m._granted_token
                    and not m._lock_spent for m in messages)
        if action != "renew":
            for message in messages:
                message._lock_spent = True
        if not fresh or action not in _FINAL_ONCE_APPENDED or self._sub != "active":
            return None
        if self._session is not None:
            return session_end
        ends = [m.locked_until_utc for m in messages]
        if any(end is None for end in ends):
            return None
        return epoch_ms(min(end for end in ends if end is not None))

    def _check_settleable(self, message: ServiceBusReceivedMessage, action: str) -> None:
        if not isinstance(message, ServiceBusReceivedMessage):
            raise TypeError("settle a ServiceBusReceivedMessage received by this receiver")
        if self.receive_mode == ServiceBusReceiveMode.RECEIVE_AND_DELETE:
            raise InvalidOperationError(
                "messages received in RECEIVE_AND_DELETE mode are settled on receipt and "
                "cannot be settled again")
        if message._receiver is not self:
            raise InvalidOperationError(
                f"message {message.sequence_number} was peeked or received by another "
                "receiver: only a message this receiver received with a lock can be settled")
        if message._settled:
            raise MessageAlreadySettled(action)

    def _apply_answer(self, message: ServiceBusReceivedMessage, action: str, status: str,
                      until: int) -> ServiceBusError | None:
        if status == "ok":
            if action == "renew":
                message.locked_until_utc = utc_from_ms(until)
            else:
                message._settled = True
            return None
        if status == "invalid":
            return InvalidOperationError(
                f"cannot {action} message {message.sequence_number} of {self.entity_path}")
        if self._session is not None:
            # In a session, message locks end only with the session lock.
            return self._session.lost()
        return MessageLockLostError(
            f"the lock on message {message.sequence_number} of {self.entity_path} was lost "
            "(it expired or another receiver holds it): the message will be redelivered; "
            "renew locks sooner or raise the queue's lock_duration")

    # --------------------------------------------------------------- plumbing
    def process(self, handler: Callable[[ServiceBusReceivedMessage], Any], *,
                max_concurrent_calls: int = 8, batch_size: int = 100,
                max_wait_time: float | None = 5.0, max_message_count: int | None = None
                ) -> dict[str, int]:
        """Run ``handler`` on each message with bounded concurrency, settling in
        batches; see :class:`settlement.processor.MessageProcessor`."""
        return MessageProcessor(self, handler, max_concurrent_calls=max_concurrent_calls,
                                batch_size=batch_size, max_wait_time=max_wait_time,
                                max_message_count=max_message_count).run()

    def _call(self, cmd: Command[ClientArgs], deadline: float | None) -> Reply:
        """``cmd``'s answer; by ``deadline`` (``time.monotonic()``) if there is one."""
        if deadline is None:
            return self._link.call(cmd)
        return self._link.call_many([cmd], timeout=_left(deadline, 0.0))[0]

    def _reader(self, partition: int) -> PartitionReader:
        if partition not in self._readers:
            self._readers[partition] = self._pool.take(
                self._topic, partition, shared=isinstance(self._props, SubscriptionProperties))
        return self._readers[partition]

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the receiver is closed: create a new one from the client")

    def _return_unseen(self) -> None:
        """Give back the session's messages locked with it and not handed
        out, counting no delivery: before an abandon (what goes back must be
        handed out before them) and when the receiver closes. Sent without
        waiting for the engine's answer: it applies them before any later
        command of the session."""
        unseen, self._unseen = self._unseen, []
        if unseen and self._session is not None and not self._session.lost_or_released:
            self._link.append(self._link.command(self._entity, self._session.partition, SettleArgs(
                tuple(SettleItem(m.offset, m.lock_token, Action.RELEASE) for m in unseen))))

    def close(self) -> None:
        if self._read_ahead is not None and not self._closed:
            self._read_ahead.close()
        if self._session is not None and not self._closed:
            self._return_unseen()
            self._session.release()
        self._closed = True
        # A snapshot: the client may close this receiver while a thread of
        # the application is still in one of its calls.
        readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            self._pool.give_back(reader)

    def __enter__(self) -> ServiceBusReceiver:
        self._open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _deadline(timeout: float | None) -> float | None:
    """When a call given the SDK's ``timeout=`` keyword must be done."""
    checked = check_timeout(timeout)
    return None if checked is None else time.monotonic() + checked


def _left(deadline: float | None, default: float) -> float:
    """Seconds left until ``deadline`` (``default`` without one)."""
    return default if deadline is None else max(0.0, deadline - time.monotonic())


def _withhold(message: ServiceBusReceivedMessage, offset: int, token: str | None,
              now: dt.datetime) -> SettleItem | None:
    """The settlement for a message the application must not get yet (or ever)."""
    expires = message.expires_at_utc
    if expires is not None and expires <= now:
        return SettleItem(offset, token, Action.EXPIRE)
    due = message.scheduled_enqueue_time_utc
    if due is not None and as_utc(due) > now:
        return SettleItem(offset, token, Action.SCHEDULE, at_ms=epoch_ms(due))
    return None


def _settle_item(message: ServiceBusReceivedMessage, action: str, reason: str | None = None,
                 description: str | None = None) -> SettleItem:
    """The settlement of a received message, with the log timestamp the engine
    reports with it (end-to-end latency)."""
    stamp = message._enqueued_ms
    return SettleItem(message.offset, message.lock_token, _ACTIONS.get(action) or Action(action),
                      reason, description, None, max(0, stamp) if stamp is not None else None)

