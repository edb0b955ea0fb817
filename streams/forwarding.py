"""Auto-forwarding: copies a queue's or a subscription's messages (or its
dead letters) to the queue or topic named by ``forward_to`` (or
``forward_dead_lettered_messages_to``).

A copy keeps the record's key, body and headers and counts its hops in
``transfer-hop-count``; a subscription's copy carries the application
properties its matching rules' actions made (as Service Bus applies a rule's
action when it evaluates the rule, the copy's receivers see them). A
message that has already made ``MAX_HOPS`` hops, or whose target does not
exist, is not copied: the caller moves it to the
transfer dead-letter sub-queue. Copies are acknowledged by Kafka before the
source is marked forwarded; a crash between the two can forward a message
twice, so a target that must not see duplicates turns duplicate detection on.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from streams.acceptance import FORWARDED, MAX_HOPS, TARGET_MISSING, TOO_MANY_HOPS, Item
from topics import names
from topics.connection import ConnectionSettings
from topics.message_record import RecordTooLarge, forwarded_headers, hop_count
from topics.offsets import offset_of, take

log = logging.getLogger(__name__)
_TARGETS_TTL = 5.0


class Forwarder:
    """Used from the scanner's thread only."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self._settings = settings
        # Kafka's murmur2 partitioner, as senders use: a copy keyed by its
        # session id lands in the partition that holds its session.
        self._producer = Producer({**settings.kafka_config(), "acks": "all",
                                   "enable.idempotence": True, "linger.ms": 2,
                                   "partitioner": "murmur2_random"})
        self._admin = AdminClient(settings.kafka_config())
        self._reader: Consumer | None = None
        self._topics: set[str] = set()
        self._topics_at = 0.0

    def forward(self, records: list[Message], target: str,
                actioned: dict[int, dict[str, Any]] | None = None) -> list[Item]:
        """Copy ``records`` to ``target``; an accept item per record.
        ``actioned``: offset -> the application properties its copy carries
        instead of the record's (what rule actions made of them)."""
        actioned = actioned or {}
        topic = self._target_log(target)
        if topic is None:
            return [Item(offset_of(r), mark=TARGET_MISSING) for r in records]
        items = []
        for record in records:
            hops = hop_count(record.headers())
            if hops >= MAX_HOPS:
                items.append(Item(offset_of(record), mark=TOO_MANY_HOPS))
                continue
            self._copy(record, topic, hops + 1, properties=actioned.get(offset_of(record)))
            items.append(Item(offset_of(record), mark=FORWARDED))
        self._flush(topic)
        return items

    def forward_dead_letters(self, log_topic: str, partition: int, offsets: list[int],
                             dead_letters: dict[int, tuple[str | None, str | None]],
                             target: str) -> list[int]:
        """Copy dead letters (read by offset) to ``target`` with their reason and
        description as application properties, as Service Bus does; return
        the offsets copied."""
        topic = self._target_log(target)
        if not offsets or topic is None:
            return []
        copied = []
        for record in self._read(log_topic, partition, offsets):
            reason, description = dead_letters[offset_of(record)]
            self._copy(record, topic, hop_count(record.headers()) + 1, extra_properties={
                "DeadLetterReason": reason, "DeadLetterErrorDescription": description})
            copied.append(offset_of(record))
        self._flush(topic)
        return copied

    def _copy(self, record: Message, topic: str, hops: int,
              extra_properties: dict[str, str | None] | None = None,
              properties: dict[str, Any] | None = None) -> None:
        try:
            headers = forwarded_headers(record.headers(), hops, extra_properties, properties)
        except (RecordTooLarge, TypeError) as exc:
            # an action made a property a record cannot carry: the copy
            # keeps the message's own properties
            log.warning("forwarding offset %d to %s without its rule actions: %s",
                        offset_of(record), topic, exc)
            headers = forwarded_headers(record.headers(), hops, extra_properties)
        self._producer.produce(topic, record.value(), key=record.key(), headers=headers)
        self._producer.poll(0)

    def _flush(self, topic: str) -> None:
        if self._producer.flush(30) != 0:
            raise RuntimeError(f"forwarded copies to {topic} were not acknowledged in 30 s")

    def _target_log(self, target: str) -> str | None:
        """The log of the queue or topic ``target`` (they share one namespace
        of names), None when neither exists. Known logs are cached for a
        while; an unknown one is always looked up."""
        logs = [names.entity_log(self._settings.namespace, target),
                names.topic_log(self._settings.namespace, target)]
        if not self._topics.intersection(logs) or (
                time.monotonic() - self._topics_at > _TARGETS_TTL):
            self._topics = set(self._admin.list_topics(timeout=10).topics)
            self._topics_at = time.monotonic()
        return next((log for log in logs if log in self._topics), None)

    def _read(self, topic: str, partition: int, offsets: list[int]) -> list[Message]:
        if self._reader is None:
            self._reader = Consumer(
                self._settings.consumer_config(f"forwarder-{uuid.uuid4().hex[:8]}"))
        found: list[Message] = []
        for offset in sorted(offsets):
            self._reader.assign([TopicPartition(topic, partition, offset)])
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                got = [r for r in take(self._reader, 1, 0.1) if r.error() is None]
                if got:
                    if offset_of(got[0]) == offset:
                        found.append(got[0])
                    break
        return found

    def close(self) -> None:
        self._producer.flush(10)
        if self._reader is not None:
            self._reader.close()

