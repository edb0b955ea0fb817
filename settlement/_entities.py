"""Entity definitions: read and written on the namespace's compacted
``NS.__entities`` topic, keyed by entity name (a tombstone deletes)."""

from __future__ import annotations

import logging
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from settlement._properties import QueueProperties
from settlement.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusConnectionError,
    denied,
)
from topics import names
from topics.connection import ConnectionSettings
from topics.offsets import log_end_offsets, take

log = logging.getLogger(__name__)
_CACHE_SECONDS = 2.0


class EntityRegistry:
    """Reads the whole (small) entities topic; writes one record per change."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self._settings = settings
        self._topic = names.entities(settings.namespace)
        self._cache: dict[str, QueueProperties] = {}
        self._loaded_at = 0.0

    def load(self) -> dict[str, QueueProperties]:
        """Every definition; none in a namespace that was never provisioned."""
        consumer = Consumer(self._settings.consumer_config(f"entities-{uuid.uuid4().hex[:12]}"))
        try:
            end = self._log_end(consumer)
            queues = self._read(consumer, end) if end else {}
        finally:
            consumer.close()
        self._cache, self._loaded_at = queues, time.monotonic()
        return dict(queues)

    def _log_end(self, consumer: Consumer) -> int:
        try:
            metadata = consumer.list_topics(self._topic, timeout=10)
            error = metadata.topics[self._topic].error
            if error is not None:
                refused = denied(error.name(), "a right (Send, Listen or Manage)",
                                 f"namespace {self._settings.namespace!r}")
                if refused is not None:
                    raise refused
                return 0  # not provisioned yet: no queues
            exact = self._settings.profile.exact_list_offsets
            return log_end_offsets(consumer, [(self._topic, 0)], exact=exact)[(self._topic, 0)]
        except (KafkaException, TimeoutError) as exc:
            reason = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
            raise ServiceBusConnectionError(
                f"cannot read the queues of namespace {self._settings.namespace!r} from "
                f"{self._settings.bootstrap_servers}: {reason}; check the Endpoint of the "
                "connection string and that Kafka is running") from None

    def _read(self, consumer: Consumer, end: int) -> dict[str, QueueProperties]:
        queues: dict[str, QueueProperties] = {}
        consumer.assign([TopicPartition(self._topic, 0, 0)])
        position = 0
        deadline = time.monotonic() + 30
        while position < end:
            if time.monotonic() > deadline:
                raise ServiceBusConnectionError(
                    f"reading {self._topic} stalled at offset {position} of {end}")
            for record in take(consumer, 1000, 0.1):
                if record.error():
                    continue
                position = record.offset() + 1
                name = (record.key() or b"").decode(errors="replace")
                if record.value() is None:
                    queues.pop(name, None)
                    continue
                try:
                    queues[name] = QueueProperties.from_json(record.value())
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("ignoring unreadable definition of %r: %s", name, exc)
        return queues

    def get(self, name: str, *, fresh: bool = False) -> QueueProperties:
        if fresh or name not in self._cache or time.monotonic() - self._loaded_at > _CACHE_SECONDS:
            self.load()
        try:
            return self._cache[name]
        except KeyError:
            raise MessagingEntityNotFoundError(
                f"queue {name!r} does not exist in namespace {self._settings.namespace!r}: "
                "create it with ServiceBusAdministrationClient.create_queue or "
                f"'settlement queue create {name}'"
            ) from None

    def put(self, props: QueueProperties | None, name: str) -> int:
        """Write (or with None, delete) a definition; returns its offset, which
        is the version of the queue's policy."""
        producer = Producer({**self._settings.kafka_config(), "acks": "all",
                             "enable.idempotence": True})
        written: list[int] = []
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                written.append(msg.offset())
            else:
                errors.append(err)

        producer.produce(self._topic, None if props is None else props.to_json(),
                         key=name.encode(), partition=0, on_delivery=delivered)
        if producer.flush(15) != 0 or not written:
            refused = errors and denied(errors[0].name(), "the Manage right",
                                        f"namespace {self._settings.namespace!r}")
            if refused:
                raise refused
            raise TimeoutError(f"could not write the definition of {name!r} to {self._topic}"
                               + (f": {errors[0].str()}" if errors else ""))
        self._loaded_at = 0.0
        return written[0]
