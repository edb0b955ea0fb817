"""Sending: a send returns only once the broker has durably accepted it."""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from settlement import message_records
from settlement._engine_link import EngineLink
from settlement._entities import EntityRegistry
from settlement._quota import QuotaGuard
from settlement._retry import RetryPolicy
from settlement.batch import ServiceBusMessageBatch
from settlement.exceptions import (
    InvalidOperationError,
    MessageNotFoundError,
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusCommunicationError,
    ServiceBusError,
    denied,
)
from settlement.message import Sendable, ServiceBusMessage, sendable_list
from topics import names
from topics.commands import AnnounceArgs, CancelArgs
from topics.connection import ConnectionSettings
from topics.entities import QueueProperties
from topics.message_record import with_replay_id
from topics.offsets import position_of
from topics.sequence_numbers import sequence_number, split_sequence_number
from topics.times import as_utc, epoch_ms

_RETRYABLE = {KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT,
              KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_LEADER_FOR_PARTITION,
              KafkaError._TRANSPORT,
              # a paired sender gave up on its producer (the primary stopped answering)
              KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}


class Delivery:
    """Where each record of one send call was placed, across its attempts."""

    def __init__(self, count: int) -> None:
        self.placed: list[tuple[int, int] | None] = [None] * count
        self.stamps: list[int] = [0] * count

    def missing(self) -> list[int]:
        """Indices of the records not acknowledged yet."""
        return [i for i, p in enumerate(self.placed) if p is None]


class PairedSends(Protocol):
    """What a sender of a paired client needs of its pairing (a
    :class:`settlement.pairing.Pairing`): a protocol, as the pairing builds on
    this module."""

    def send(self, sender: ServiceBusSender, messages: list[ServiceBusMessage],
             records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]) -> None: ...


class ServiceBusSender:
    """Sends to one queue or topic with ``acks=all`` and an idempotent producer.

    Sends are pipelined but bounded: at most ``max_in_flight`` records are
    unacknowledged at once (callers block for a slot), never fire-and-forget.
    Thread-safe: several threads may send through one sender.
    """

    def __init__(self, settings: ConnectionSettings, registry: EntityRegistry,
                 entity_name: str, engine: Callable[[], EngineLink], *,
                 max_in_flight: int = 10_000, topic: bool = False,
                 retry: RetryPolicy | None = None, pairing: PairedSends | None = None,
                 quota: QuotaGuard | None = None, client_identifier: str | None = None
                 ) -> None:
        self.entity_name = entity_name
        #: the SDK's ``client_identifier``: this sender's name in ``str(sender)``
        self.client_identifier = client_identifier or f"SBSender-{uuid.uuid4()}"
        self._registry = registry
        self._engine = engine  # only scheduling talks to the engine
        self._is_topic = topic
        self._kind = "topic" if topic else "queue"
        self._topic = (names.topic_log if topic else names.entity_log)(settings.namespace,
                                                                       entity_name)
        self._settings = settings
        self._retry = retry or RetryPolicy()
        self._pairing = pairing
        #: made on the first send, dropped (its librdkafka threads and
        #: sockets with it) on close; a send after close makes another
        self._producer: Producer | None = None
        self._closed = False
        self._quota = quota or QuotaGuard(settings, registry, engine, entity_name, topic=topic)
        #: partition -> the last offset acknowledged to this sender (where a
        #: paired namespace's syphon starts looking for late arrivals)
        self.acked: dict[int, int] = {}
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        self.peak_in_flight = 0
        self._count_lock = threading.Lock()
        self._max_bytes: int | None = None
        self._requires_session = False

    def _check_entity(self) -> int:
        if self._max_bytes is None:
            props = (self._registry.get_topic if self._is_topic else self._registry.get)(
                self.entity_name)
            self._max_bytes = props.max_message_size_in_kilobytes * 1024
            self._requires_session = isinstance(props, QueueProperties) and props.requires_session
        return self._max_bytes

    def create_message_batch(self, max_size_in_bytes: int | None = None) -> ServiceBusMessageBatch:
        """An empty batch of at most ``max_size_in_bytes`` (by default, and at
        most, the entity's largest message)."""
        limit = self._check_entity()
        if max_size_in_bytes and max_size_in_bytes > limit:
            raise ValueError(  # as the SDK
                f"Max message size: {max_size_in_bytes} is too large, acceptable max batch "
                f"size is: {limit} bytes ({self._kind} {self.entity_name!r} accepts "
                "max_message_size_in_kilobytes)")
        return ServiceBusMessageBatch(max_size_in_bytes or limit)

    def send_messages(self, message: Sendable | Iterable[Sendable] | ServiceBusMessageBatch,
                      *, timeout: float | None = None) -> None:
        """Send one message, a list or a batch; return when all are acknowledged.
        A message is a ServiceBusMessage or an AmqpAnnotatedMessage.

        Transient failures are retried by the client's retry policy;
        ``timeout`` (seconds) bounds the whole call, retries included. Raises
        the first rejection as a :class:`ServiceBusError` carrying the
        broker's error code, a tracking id and whether a retry may succeed.
        Messages with a future ``scheduled_enqueue_time_utc`` stay invisible
        until then.
        """
        if isinstance(message, ServiceBusMessageBatch):
            messages = message.messages
        else:
            messages = sendable_list(message)
        self._send(messages, timeout=timeout, paired=True)

    def schedule_messages(self, messages: Sendable | Iterable[Sendable],
                          schedule_time_utc: dt.datetime, *, timeout: float | None = None
                          ) -> list[int]:
        """Send messages that become visible at ``schedule_time_utc``; return
        their sequence numbers (for :meth:`cancel_scheduled_messages`).
        ``timeout`` bounds the call as in :meth:`send_messages`."""
        batch = sendable_list(messages)
        for m in batch:
            m.scheduled_enqueue_time_utc = schedule_time_utc
        return [sequence_number(p, o) for p, o in self._send(batch, timeout=timeout)]

    def cancel_scheduled_messages(self, sequence_numbers: int | Iterable[int], *,
                                  timeout: float | None = None) -> None:
        """Cancel scheduled messages that are not yet due; they are never
        delivered. ``timeout`` (seconds) bounds the call, retries included."""
        seqs = [sequence_numbers] if isinstance(sequence_numbers, int) else list(sequence_numbers)
        by_partition: dict[int, list[int]] = {}
        for seq in seqs:
            partition, offset = split_sequence_number(seq)
            by_partition.setdefault(partition, []).append(offset)
        link = self._engine()
        asked = [(entity, p, offsets) for entity in self._windows(scheduling=False)
                 for p, offsets in sorted(by_partition.items())]
        replies = link.call_many([link.command(entity, p, CancelArgs(tuple(offsets)))
                                  for entity, p, offsets in asked], timeout=timeout)
        cancelled = {sequence_number(p, o)
                     for (_, p, offsets), reply in zip(asked, replies, strict=True)
                     for o, (status, _) in zip(offsets, reply.statuses, strict=False)
                     if status == "ok"}
        missing = [seq for seq in seqs if seq not in cancelled]
        if missing or not asked:
            raise MessageNotFoundError(
                f"no scheduled message to cancel with sequence number(s) {missing or seqs} in "
                f"{self._kind} {self.entity_name!r}: they were never scheduled, are due "
                "already, or were cancelled before")

    def _windows(self, *, scheduling: bool) -> list[str]:
        """The entities whose engine windows hear of scheduled messages: the
        queue, or the topic's subscriptions (for ``scheduling``, those that
        do not read the headers themselves: the others' scanners find the
        due times in the log)."""
        if not self._is_topic:
            return [self.entity_name]
        topic = self._registry.get_topic(self.entity_name)
        subs = self._registry.subscriptions_of(self.entity_name, fresh=False)
        return [sub.path for sub in subs if not scheduling or not sub.policy(
            topic, self._registry.rules_of(self.entity_name, sub.name, fresh=False)).scanned]

    def _send(self, messages: list[ServiceBusMessage], *, timeout: float | None = None,
              paired: bool = False) -> list[tuple[int, int]]:
        """Produce and wait for every acknowledgement; ``(partition, offset)``
        of each. Transient failures are retried as the client's retry policy
        says, re-sending only what was not acknowledged; ``timeout`` bounds
        the whole call. With a paired namespace (``paired``), sends that keep
        failing go to the backlog instead (:mod:`settlement.pairing`)."""
        records = self._records(messages)
        if not records:
            return []
        if paired and self._pairing is not None:
            self._pairing.send(self, messages, records)
            return []
        return self._deliver_all(messages, records, timeout)

    def send_with_replay_ids(self, messages: list[ServiceBusMessage], replay_ids: list[str]
                             ) -> None:
        """Send as a paired namespace's syphon moves backlog messages: each
        record keeps the replay id it was first sent with."""
        records = [with_replay_id(record, rid)
                   for record, rid in zip(self._records(messages), replay_ids, strict=True)]
        self._deliver_all(messages, records, None)

    def _deliver_all(self, messages: list[ServiceBusMessage],
                     records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]],
                     timeout: float | None) -> list[tuple[int, int]]:
        delivery = Delivery(len(records))
        deadline = None if timeout is None else time.monotonic() + timeout
        self._retry.call(lambda: self.deliver(records, delivery, deadline),
                         f"sending to {self._kind} {self.entity_name!r}", deadline=deadline)
        return self.announce_sent(messages, delivery)

    def announce_sent(self, messages: list[ServiceBusMessage], delivery: Delivery
                      ) -> list[tuple[int, int]]:
        """Tell the engine of what was just sent; ``(partition, offset)`` of each."""
        placed = [p for p in delivery.placed if p is not None]
        self._announce(messages, placed, delivery.stamps)
        return placed

    def _records(self, messages: list[ServiceBusMessage]
                 ) -> list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]:
        """The records of ``messages``, once they pass the entity's checks."""
        if not all(isinstance(m, ServiceBusMessage) for m in messages):
            raise TypeError("send_messages takes ServiceBusMessage or AmqpAnnotatedMessage "
                            "objects, or a batch")
        try:
            limit = self._check_entity()
        except MessagingEntityNotFoundError:
            self._max_bytes = None
            raise
        if self._requires_session:
            for m in messages:
                if m.session_id is None:
                    raise InvalidOperationError(
                        f"queue {self.entity_name!r} requires sessions: set session_id on "
                        f"message {m.message_id or ''} (ServiceBusMessage(..., session_id=...))")
        records = [message_records.encode(m) for m in messages]
        total = 0
        for m, (key, value, headers) in zip(messages, records, strict=True):
            size = len(key or b"") + len(value) + sum(len(k) + len(v) for k, v in headers)
            if size > limit:
                raise MessageSizeExceededError(
                    f"message {m.message_id or ''} is {size} bytes; {self._kind} "
                    f"{self.entity_name!r} accepts at most {limit}: split the payload or "
                    "raise max_message_size_in_kilobytes")
            total += size
        if records:
            self._quota.check(total)
        return records

    def deliver(self, records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]],
                delivery: Delivery, deadline: float | None) -> None:
        """One attempt: produce the records ``delivery`` has not placed yet
        and wait for their acknowledgements until ``deadline``. Raises the
        first refusal, or OperationTimeoutError at the deadline (what was not
        acknowledged may still arrive: the broker may have it)."""
        todo = delivery.missing()
        done = threading.Event()
        errors: list[KafkaError] = []
        remaining = [len(todo)]
        lock = threading.Lock()

        def delivered_to(index: int) -> Callable[[KafkaError | None, Message], None]:
            def delivered(err: KafkaError | None, msg: Message) -> None:
                self._release()
                with lock:
                    if err is not None:
                        errors.append(err)
                    else:
                        partition, offset = delivery.placed[index] = position_of(msg)
                        delivery.stamps[index] = msg.timestamp()[1]
                        self.acked[partition] = offset
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        done.set()
            return delivered

        producer = self._live_producer()
        for index in todo:
            self._acquire_slot(producer, deadline)
            self._produce(producer, *records[index], delivered_to(index))
        while not done.wait(0.001):
            producer.poll(0.05)
            if deadline is not None and time.monotonic() > deadline:
                raise OperationTimeoutError(
                    f"{remaining[0]} of {len(todo)} message(s) to {self._kind} "
                    f"{self.entity_name!r} were not acknowledged in time; the broker may "
                    "still store them")
        if errors:
            raise _send_error(self._kind, self.entity_name, errors[0])

    def _announce(self, messages: list[ServiceBusMessage], placed: list[tuple[int, int]],
                  stamps: list[int]) -> None:
        """Tell the engine which sent messages are not due yet (hidden and
        counted at once) and when messages with a time to live expire (the
        engine expires them on its own timer). Plain messages cost nothing."""
        now = dt.datetime.now(dt.UTC)
        by_partition: dict[int, list[tuple[int, int, int]]] = {}
        for m, (partition, offset), stamp in zip(messages, placed, stamps, strict=True):
            due = m.scheduled_enqueue_time_utc
            due_ms = epoch_ms(due) if due is not None and as_utc(due) > now else 0
            ttl = m.time_to_live
            expires_ms = stamp + int(ttl.total_seconds() * 1000) if ttl else 0
            if due_ms or expires_ms:
                by_partition.setdefault(partition, []).append((offset, due_ms, expires_ms))
        if not by_partition:
            return
        link = self._engine()
        link.call_many([link.command(entity, p, AnnounceArgs(tuple(items)))
                        for entity in self._windows(scheduling=True)
                        for p, items in sorted(by_partition.items())])

    def _produce(self, producer: Producer, key: bytes | None, value: bytes,
                 headers: list[tuple[str, bytes]], callback: Any) -> None:
        while True:
            try:
                producer.produce(self._topic, value, key=key,
                                 # confluent-kafka's stubs take an invariant List of str,
                                 # bytes or None values; a list of bytes values is one
                                 headers=headers,  # type: ignore[arg-type]
                                 on_delivery=callback)
                return
            except BufferError:
                producer.poll(0.05)
            except KafkaException as exc:
                self._release()
                raise _send_error(self._kind, self.entity_name, exc.args[0]) from None

    def _acquire_slot(self, producer: Producer, deadline: float | None) -> None:
        while not self._slots.acquire(timeout=0.05):
            producer.poll(0)
            if deadline is not None and time.monotonic() > deadline:
                raise OperationTimeoutError(
                    f"{self.max_in_flight} earlier message(s) to {self._kind} "
                    f"{self.entity_name!r} are still unacknowledged")
        with self._count_lock:
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)

    def _release(self) -> None:
        with self._count_lock:
            self._in_flight -= 1
        self._slots.release()

    def _live_producer(self) -> Producer:
        if self._producer is None:
            self._producer = self._new_producer()
            self._closed = False
        return self._producer

    def _new_producer(self) -> Producer:
        return Producer({
            **self._settings.kafka_config(), "acks": "all", "enable.idempotence": True,
            "linger.ms": 2, "partitioner": "murmur2_random", "compression.type": "none",
            "batch.num.messages": 10_000, "message.max.bytes": 2 * 1024 * 1024,
        })

    def abandon_producer(self) -> None:
        """Give up on what the producer still holds (the broker stopped
        answering) and start a fresh one. What was on its way may still
        reach the broker; the paired namespace's syphon allows for that."""
        old, self._producer = self._live_producer(), self._new_producer()
        old.purge(in_queue=True, in_flight=True, blocking=False)
        threading.Thread(target=old.flush, args=(5,), name="abandoned-producer",
                         daemon=True).start()

    @property
    def log_topic(self) -> str:
        """The Kafka topic this sender writes."""
        return self._topic

    def __str__(self) -> str:
        return f"Sender client id: {self.client_identifier}, entity: {self.entity_name}"

    @property
    def kind(self) -> str:
        """``queue`` or ``topic``."""
        return self._kind

    def close(self) -> None:
        producer, self._producer = self._producer, None
        self._closed = True
        if producer is not None:
            producer.flush(30)

    def __enter__(self) -> ServiceBusSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _send_error(kind: str, entity: str, err: KafkaError) -> ServiceBusError:
    refused = denied(err.name(), "the Send right", f"{kind} {entity!r}")
    if refused is not None:
        return refused
    code = err.code()
    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
        return MessagingEntityNotFoundError(
            f"{kind} {entity!r} has no log topic: create the {kind} first",
            error_code=err.name())
    if code == KafkaError.MSG_SIZE_TOO_LARGE:
        return MessageSizeExceededError(
            f"the broker refused a message to {entity!r} as too large", error_code=err.name())
    return ServiceBusCommunicationError(
        f"the broker refused a message to {entity!r}: {err.str()}", error_code=err.name(),
        retryable=err.retriable() or code in _RETRYABLE)
