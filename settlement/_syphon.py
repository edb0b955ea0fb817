"""The syphon of a paired namespace: moves backlog messages of the secondary
to their destinations on the primary once the primary is back.

Each backlog message is received in peek-lock mode, sent to its destination
(with its replay id) and only then completed on the secondary, so a crash
in between leaves it in the backlog. Before sending, the syphon reads the
destination's log from where a late arrival could be (the offsets its sender
had seen acknowledged, else the time of its first attempt) and skips every
message whose replay id is already there: the send that timed out against the
paused primary and reached it after all, or a copy moved by a syphon that
died before completing it. So each message reaches the primary once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition

from settlement import _backlog as backlog
from settlement.exceptions import ServiceBusError
from settlement.message import ServiceBusReceivedMessage, copy_message
from settlement.receiver import ServiceBusReceiver
from settlement.sender import ServiceBusSender
from topics import names
from topics.connection import ConnectionSettings
from topics.message_record import replay_ids
from topics.offsets import offset_of, take

log = logging.getLogger(__name__)
#: the primary must answer this long before messages move: requests it held
#: while paused are stored first, so their replay ids are seen
SETTLE_S = 3.0
_BATCH = 200
#: how far before a message's first attempt a late arrival is looked for
#: when its sender had no acknowledged offset (clock skew between hosts)
_SKEW_MS = 60_000


class NamespaceClient(Protocol):
    """What the pairing and the syphon need of a client (a
    :class:`settlement.ServiceBusClient`): a protocol, as the client module
    builds on them."""

    settings: ConnectionSettings

    def get_queue_sender(self, queue_name: str) -> ServiceBusSender: ...

    def get_topic_sender(self, topic_name: str) -> ServiceBusSender: ...

    def get_queue_receiver(self, queue_name: str) -> ServiceBusReceiver: ...

    def close(self) -> None: ...


class Syphon:
    """A thread of a paired client with ``enable_syphon=True``: it moves the
    messages of the backlog ``queues`` to the primary while ``primary_answers()``."""

    def __init__(self, queues: list[str], primary_answers: Callable[[], bool],
                 primary: NamespaceClient, secondary: NamespaceClient) -> None:
        self._queues = queues
        self._primary_answers = primary_answers
        self._primary = primary
        self._secondary = secondary
        self._receivers: dict[str, ServiceBusReceiver] = {}
        self._senders: dict[str, ServiceBusSender] = {}
        self._seen = LandedIds(primary)
        self.moved = 0
        self.skipped = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pairing-syphon", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        answering_since: float | None = None
        while not self._closed.is_set():
            if not self._primary_answers():
                answering_since = None
                self._closed.wait(1.0)
                continue
            answering_since = answering_since or time.monotonic()
            if time.monotonic() - answering_since < SETTLE_S:
                self._closed.wait(0.5)
                continue
            try:
                moved = self.move_once()
            except (ServiceBusError, KafkaException) as exc:
                # the primary may go away again mid-pass: what was not
                # completed stays in the backlog for the next pass
                log.warning("the syphon could not move backlog messages (%s); trying again",
                            exc)
                answering_since = None
                moved = 0
            if not moved:
                self._seen.clear()
                self._closed.wait(1.0)

    def move_once(self) -> int:
        """One pass over every backlog queue; how many messages left the backlog."""
        done = 0
        for queue in self._queues:
            if self._closed.is_set():
                break
            receiver = self._receiver(queue)
            batch = receiver.receive_messages(_BATCH, max_wait_time=0.2)
            if not batch:
                continue
            by_destination: dict[str, list[ServiceBusReceivedMessage]] = defaultdict(list)
            for message in batch:
                by_destination[str(message.application_properties.get(
                    backlog.DESTINATION, ""))].append(message)
            for where, messages in by_destination.items():
                self._move(where, messages)
            receiver.complete_messages(batch)
            done += len(batch)
        return done

    def _move(self, where: str, messages: list[ServiceBusReceivedMessage]) -> None:
        kind, _, entity = where.partition(":")
        if kind not in ("queue", "topic") or not entity:
            log.error("%d backlog message(s) name no destination (%r); dropping them",
                      len(messages), where)
            return
        landed = self._seen.landed(kind, entity, messages)
        fresh = [m for m in messages if _replay_id(m) not in landed]
        self.skipped += len(messages) - len(fresh)
        if not fresh:
            return
        copies = [copy_message(m) for m in fresh]
        for copy in copies:
            for name in backlog.BACKLOG_PROPERTIES:
                copy.application_properties.pop(name, None)
        sender = self._sender(kind, entity)
        sender.send_with_replay_ids(copies, [_replay_id(m) for m in fresh])
        self._seen.add(kind, entity, [_replay_id(m) for m in fresh])
        self.moved += len(fresh)
        log.info("moved %d backlog message(s) to %s on the primary (%d were there already)",
                 len(fresh), where, len(messages) - len(fresh))

    def _receiver(self, queue: str) -> ServiceBusReceiver:
        if queue not in self._receivers:
            self._receivers[queue] = self._secondary.get_queue_receiver(queue)
        return self._receivers[queue]

    def _sender(self, kind: str, entity: str) -> ServiceBusSender:
        key = backlog.destination(kind, entity)
        if key not in self._senders:
            self._senders[key] = (self._primary.get_topic_sender if kind == "topic"
                                  else self._primary.get_queue_sender)(entity)
        return self._senders[key]

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=15)
        self._primary.close()


def _replay_id(message: ServiceBusReceivedMessage) -> str:
    return str(message.application_properties.get(backlog.REPLAY, ""))


class LandedIds:
    """Replay ids found in the destinations' logs, read from where late
    arrivals could be; kept while the backlog has messages (what a failover
    left behind), forgotten once it is empty."""

    def __init__(self, primary: NamespaceClient) -> None:
        self._settings = primary.settings
        #: log topic -> partition -> (first offset read, next offset to read)
        self._read: dict[str, dict[int, tuple[int, int]]] = {}
        self._ids: dict[str, set[str]] = defaultdict(set)

    def clear(self) -> None:
        self._read.clear()
        self._ids.clear()

    def add(self, kind: str, entity: str, ids: list[str]) -> None:
        self._ids[self._topic(kind, entity)].update(ids)

    def landed(self, kind: str, entity: str, messages: list[ServiceBusReceivedMessage]
               ) -> set[str]:
        """The replay ids in the destination's log since the earliest point
        any of ``messages`` could have reached it."""
        topic = self._topic(kind, entity)
        consumer = Consumer(self._settings.consumer_config("syphon"))
        try:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            starts = self._starts(consumer, topic, sorted(partitions), messages)
            read = self._read.setdefault(topic, {})
            for partition, start in starts.items():
                first, upto = read.get(partition, (start, start))
                if start < first:  # an earlier point than read so far: read again
                    first, upto = start, start
                read[partition] = (first, self._scan(consumer, topic, partition, upto))
        finally:
            consumer.close()
        return self._ids[topic]

    def _topic(self, kind: str, entity: str) -> str:
        return (names.topic_log if kind == "topic" else names.entity_log)(
            self._settings.namespace, entity)

    def _starts(self, consumer: Consumer, topic: str, partitions: list[int],
                messages: list[ServiceBusReceivedMessage]) -> dict[int, int]:
        """Per partition, the lowest offset any message could have landed at."""
        starts: dict[int, int] = {}
        by_time: set[int] = set()
        since_ms: int | None = None
        for message in messages:
            props = message.application_properties
            scan_from = json.loads(str(props.get(backlog.SCAN_FROM) or "{}"))
            for partition in partitions:
                if str(partition) in scan_from:
                    offset = int(scan_from[str(partition)])
                    starts[partition] = min(starts.get(partition, offset), offset)
                    continue
                by_time.add(partition)
                first_try = int(props.get(backlog.FIRST_TRY_MS) or 0)
                since_ms = first_try if since_ms is None else min(since_ms, first_try)
        missing = sorted(by_time)
        if missing and since_ms is not None:
            asked = [TopicPartition(topic, p, max(0, since_ms - _SKEW_MS)) for p in missing]
            try:
                found = consumer.offsets_for_times(asked, timeout=10)
            except KafkaException:
                found = [TopicPartition(topic, p, 0) for p in missing]
            for tp in found:
                # -1: nothing at or after that time; read from the end
                offset = tp.offset if tp.offset >= 0 else consumer.get_watermark_offsets(
                    TopicPartition(topic, tp.partition), timeout=10)[1]
                starts[tp.partition] = min(starts.get(tp.partition, offset), offset)
        return starts

    def _scan(self, consumer: Consumer, topic: str, partition: int, start: int) -> int:
        """Read ``partition`` from ``start`` to its end, keeping replay ids;
        the next offset to read."""
        end = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
        if start >= end:
            return start
        consumer.assign([TopicPartition(topic, partition, start)])
        position = start
        deadline = time.monotonic() + 60
        ids = self._ids[topic]
        while position < end and time.monotonic() < deadline:
            for record in take(consumer, 1000, 0.5):
                if record.error():
                    continue
                position = offset_of(record) + 1
                ids.update(replay_ids(record.headers()))
        if position < end:
            raise ServiceBusError(f"could not read {topic}[{partition}] up to {end} to find "
                                  "messages that reached it already; the syphon tries again")
        return position
