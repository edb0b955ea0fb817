"""Advances the start of entity logs past what is settled (DeleteRecords), so
a queue's or a topic's disk use follows its backlog, not its history.

Entity logs keep everything (``retention.ms=-1``): no time-based retention may
delete an unsettled message. Instead, every few seconds, this timer moves the
log start of each entity partition this worker owns (a topic's partition:
where it holds the windows of all the topic's subscriptions) up to the
oldest offset still needed (by any of them): not yet settled, locked,
parked (deferred, dead-lettered, scheduled), or inside the
duplicate-detection window, whose history is read back from the log after
a restart. Nothing below that offset can be delivered, peeked or fetched by
sequence number again.

It trims to where that offset stood :data:`GRACE_S` ago, not to where it is
now: a message received in receive-and-delete mode is settled the moment the
engine hands its offset out, before the receiver has read it from the log.
(Without the grace, the bench's receive-and-delete phase lost the records of
its first batch: they were deleted between the answer and the read.)

The commands partitions this worker reads are trimmed the same way, up to
where the engine's group holds them applied (the offsets it committed): a
command before that was applied and no worker reads it again, a new owner
starting there. So the commands log keeps the engine's lag, not its seven
days' history (every command somebody waits for carries
:data:`topics.commands.WAKE_BYTES` of padding: a thousand receives a second
kept 2 MB a second there, 170 GB a day).

Only brokers that implement DeleteRecords do this (Apache Kafka; the
embedded broker does not: :mod:`topics.broker_profile`). Deleting is
idempotent and only ever moves forward, so a second worker that still sees a
window it no longer owns does no harm (a window's oldest needed offset only
grows: an old copy of it trims less, never more).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from streams.app import app, commands_topic, settings, stored_headers
from streams.command_agent import definitions, intake
from streams.window import InflightWindow
from topics import names
from topics.entities import NAMESPACE_KEY, SubscriptionProperties

log = logging.getLogger(__name__)
TRIM_INTERVAL_S = 5.0
#: How long a receiver has to read what it was handed before it may be deleted.
GRACE_S = 10.0


class LogTrimmer:
    """Remembers how far each log was trimmed, so it asks only when that moves."""

    def __init__(self) -> None:
        self._admin = AdminClient(settings.kafka_config())
        self._times = Consumer(settings.consumer_config(f"trimmer-{uuid.uuid4().hex[:8]}"))
        self._trimmed: dict[tuple[str, int], int] = {}
        #: per log: (when, oldest offset needed then), oldest first
        self._needed: dict[tuple[str, int], deque[tuple[float, int]]] = {}

    def trim(self, stored: list[bytes], subscriptions: dict[str, list[str]],
             applied: dict[tuple[str, int], int]) -> None:
        """Trim the logs of these stored windows, and the commands partitions
        up to ``applied`` (where the engine's group holds them applied), as
        far as each allowed :data:`GRACE_S` ago; ``subscriptions``: each
        topic's subscriptions (their entity paths), as defined now."""
        wanted: dict[tuple[str, int], int] = {}
        now = time.monotonic()
        current = self._needed_now(list(map(InflightWindow.from_header, stored)),
                                   subscriptions) | applied
        for gone in set(self._needed) - set(current):  # deleted queues, windows moved away
            del self._needed[gone]
            self._trimmed.pop(gone, None)
        for tp, keep_now in current.items():
            needed = self._needed.setdefault(tp, deque())
            needed.append((now, keep_now))
            keep = None
            while needed and needed[0][0] <= now - GRACE_S:
                keep = needed.popleft()[1]
            if keep is None:
                continue
            needed.appendleft((now - GRACE_S, keep))  # still the newest one that old
            if keep > self._trimmed.get(tp, 0):
                wanted[tp] = keep
        if not wanted:
            return
        requests = [TopicPartition(topic, partition, offset)
                    for (topic, partition), offset in wanted.items()]
        for request, future in zip(requests, self._admin.delete_records(requests).values(),
                                   strict=True):
            tp = (request.topic, request.partition)
            try:
                future.result(timeout=30)
            except KafkaException as exc:  # a deleted queue, a moving leader: next time
                log.info("could not trim %s[%d] to %d: %s", *tp, request.offset, exc)
                # librdkafka's admin client does not look a partition's leader
                # up again after "not leader": without this, it asked the old
                # one (a node killed, say) until its next periodic refresh.
                with contextlib.suppress(KafkaException):  # brokers away: next time
                    self._admin.list_topics(request.topic, timeout=10)
                continue
            self._trimmed[tp] = request.offset
            log.debug("log start of %s[%d] is now %d", *tp, request.offset)

    def _needed_now(self, windows: list[InflightWindow], subscriptions: dict[str, list[str]]
                    ) -> dict[tuple[str, int], int]:
        """Per log partition of these windows, the oldest offset needed now.
        A queue's window says it alone. A topic's log is shared by its
        subscriptions, whose windows may live on other workers: its partition
        is trimmed only where this worker holds the window of every
        subscription the topic has, to the oldest offset any of them needs
        (one not among them, or a subscription with no window yet, keeps
        the whole partition). The namespace's own window has no log."""
        queues = [w for w in windows
                  if names.SUBSCRIPTIONS not in w.entity and w.entity != NAMESPACE_KEY]
        needed = {(names.entity_log(settings.namespace, w.entity), w.partition): w
                  for w in queues}
        keep = {tp: self._keep_from(w, tp) for tp, w in needed.items()}
        #: subscription -> partition -> its window held here
        held: dict[str, dict[int, InflightWindow]] = {}
        for w in windows:
            if names.SUBSCRIPTIONS in w.entity:
                held.setdefault(w.entity, {})[w.partition] = w
        for topic, paths in subscriptions.items():
            each = [held.get(path, {}) for path in paths]
            for partition in set().union(*each):
                here = [by_partition.get(partition) for by_partition in each]
                if all(w is not None for w in here):
                    tp = (names.topic_log(settings.namespace, topic), partition)
                    keep[tp] = min(self._keep_from(w, tp) for w in here if w is not None)
        return keep

    def _keep_from(self, window: InflightWindow, tp: tuple[str, int]) -> int:
        keep = window.retained
        if window.duplicate_window_ms:
            since = int(time.time() * 1000) - window.duplicate_window_ms
            found = self._times.offsets_for_times([TopicPartition(*tp, since)], timeout=10)[0]
            if found.offset >= 0:  # else: no record is that recent, none is needed
                keep = min(keep, found.offset)
        return keep


if settings.profile.deletes_records:
    _trimmer = LogTrimmer()

    @app.timer(interval=TRIM_INTERVAL_S)
    async def trim_entity_logs() -> None:
        stored = [raw for _, raw in stored_headers() if raw]
        topic = commands_topic.get_topic_name()
        applied = {(topic, p): offset for p, offset in intake.committed().items()}
        try:
            await asyncio.to_thread(_trimmer.trim, stored, _subscriptions(), applied)
        except Exception:  # never let trimming stop the engine; the next pass retries
            log.exception("trimming entity logs failed")


def _subscriptions() -> dict[str, list[str]]:
    """Each topic's subscriptions (entity paths), as defined now."""
    found: dict[str, list[str]] = {}
    for path, definition in definitions().entities().items():
        if isinstance(definition, SubscriptionProperties):
            found.setdefault(definition.topic_name, []).append(path)
    return found
