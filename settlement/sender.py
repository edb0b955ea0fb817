"""Sending: a send returns only once the broker has durably accepted it."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from settlement import _wire
from settlement._entities import EntityRegistry
from settlement.batch import ServiceBusMessageBatch
from settlement.exceptions import (
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    ServiceBusCommunicationError,
    ServiceBusError,
)
from settlement.message import ServiceBusMessage
from topics import names
from topics.connection import ConnectionSettings

_RETRYABLE = {KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT,
              KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_LEADER_FOR_PARTITION,
              KafkaError._TRANSPORT}


class ServiceBusSender:
    """Sends to one queue with ``acks=all`` and an idempotent producer.

    Sends are pipelined but bounded: at most ``max_in_flight`` records are
    unacknowledged at once (callers block for a slot), never fire-and-forget.
    Thread-safe: several threads may send through one sender.
    """

    def __init__(self, settings: ConnectionSettings, registry: EntityRegistry,
                 queue_name: str, *, max_in_flight: int = 10_000) -> None:
        self.entity_name = queue_name
        self._registry = registry
        self._topic = names.entity_log(settings.namespace, queue_name)
        self._producer = Producer({
            **settings.kafka_config(), "acks": "all", "enable.idempotence": True,
            "linger.ms": 2, "partitioner": "murmur2_random", "compression.type": "none",
            "batch.num.messages": 10_000, "message.max.bytes": 2 * 1024 * 1024,
        })
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        self.peak_in_flight = 0
        self._count_lock = threading.Lock()
        self._max_bytes: int | None = None

    def _check_entity(self) -> int:
        if self._max_bytes is None:
            props = self._registry.get(self.entity_name)
            self._max_bytes = props.max_message_size_in_kilobytes * 1024
        return self._max_bytes

    def create_message_batch(self, max_size_in_bytes: int | None = None) -> ServiceBusMessageBatch:
        limit = self._check_entity()
        return ServiceBusMessageBatch(min(max_size_in_bytes or limit, limit))

    def send_messages(self, message: ServiceBusMessage | Iterable[ServiceBusMessage]
                      | ServiceBusMessageBatch, *, timeout: float | None = 60.0,
                      **_: Any) -> None:
        """Send one message, a list or a batch; return when all are acknowledged.

        Raises the first rejection as a :class:`ServiceBusError` carrying the
        broker's error code, a tracking id and whether a retry may succeed.
        """
        if isinstance(message, ServiceBusMessageBatch):
            messages = message.messages
        elif isinstance(message, ServiceBusMessage):
            messages = [message]
        else:
            messages = list(message)
        if not all(isinstance(m, ServiceBusMessage) for m in messages):
            raise TypeError("send_messages takes ServiceBusMessage objects or a batch")
        try:
            limit = self._check_entity()
        except MessagingEntityNotFoundError:
            self._max_bytes = None
            raise
        records = [_wire.encode(m) for m in messages]
        for m, (key, value, headers) in zip(messages, records, strict=True):
            size = len(key or b"") + len(value) + sum(len(k) + len(v) for k, v in headers)
            if size > limit:
                raise MessageSizeExceededError(
                    f"message {m.message_id or ''} is {size} bytes; queue "
                    f"{self.entity_name!r} accepts at most {limit}: split the payload or "
                    "raise max_message_size_in_kilobytes")
        done = threading.Event()
        errors: list[KafkaError] = []
        remaining = [len(records)]
        lock = threading.Lock()

        def delivered(err: KafkaError | None, _msg: object) -> None:
            self._release()
            with lock:
                if err is not None:
                    errors.append(err)
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        if not records:
            return
        for key, value, headers in records:
            self._acquire_slot()
            self._produce(key, value, headers, delivered)
        while not done.wait(0.001):
            self._producer.poll(0.05)
        if errors:
            raise _send_error(self.entity_name, errors[0])

    def _produce(self, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]],
                 callback: Any) -> None:
        while True:
            try:
                self._producer.produce(self._topic, value, key=key, headers=headers,
                                       on_delivery=callback)
                return
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:
                self._release()
                raise _send_error(self.entity_name, exc.args[0]) from None

    def _acquire_slot(self) -> None:
        while not self._slots.acquire(timeout=0.05):
            self._producer.poll(0)
        with self._count_lock:
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)

    def _release(self) -> None:
        with self._count_lock:
            self._in_flight -= 1
        self._slots.release()

    def close(self) -> None:
        self._producer.flush(30)

    def __enter__(self) -> ServiceBusSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _send_error(entity: str, err: KafkaError) -> ServiceBusError:
    code = err.code()
    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
        return MessagingEntityNotFoundError(
            f"queue {entity!r} has no log topic: create the queue first",
            error_code=err.name())
    if code == KafkaError.MSG_SIZE_TOO_LARGE:
        return MessageSizeExceededError(
            f"the broker refused a message to {entity!r} as too large", error_code=err.name())
    return ServiceBusCommunicationError(
        f"the broker refused a message to {entity!r}: {err.str()}", error_code=err.name(),
        retryable=err.retriable() or code in _RETRYABLE)
