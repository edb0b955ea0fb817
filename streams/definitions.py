"""The entities' policies as the engine knows them: read from their definitions.

Lock duration, max delivery count, time to live, duplicate detection and
forwarding live with each queue's definition on the namespace's compacted
entities topic; a subscription's policy combines its own definition, its
topic's and its rules' (each a record of its own), and changes whenever one
of them does. Every worker follows that topic from its start in a thread of
its own (it is small, one record per queue), so ``update_queue`` takes effect
without a restart and no client can reset a policy with what it cached. A
policy's version is the offset of its definition record: a window adopts a
policy only if it is newer than the one it has. The namespace's own record
(``$namespace``: its limit of commands per second) is followed the same way.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from topics import names
from topics.commands import Policy
from topics.connection import ConnectionSettings
from topics.entities import (
    NAMESPACE_KEY,
    Definition,
    NamespaceProperties,
    QueueProperties,
    RuleProperties,
    SubscriptionProperties,
    TopicProperties,
    load_definition,
)
from topics.offsets import GapGuard, offset_of, take
from topics.rule_set import RuleSet

log = logging.getLogger(__name__)
#: How long a command for a queue the engine has not heard of waits for its
#: definition (the queue was created a moment ago).
WAIT_FOR_NEW_QUEUE_S = 2.0


class Definitions:
    """Follows the entities topic; ``policy(name)`` is the newest policy read."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self._topic = names.entities(settings.namespace)
        # The broker's own fetch wait: Apache Kafka answers a waiting fetch
        # as soon as a definition is appended, so an empty read of 0.1 s
        # still means caught up; at 20 ms the follower asked 50 times a
        # second, the broker's busiest client of an idle engine.
        self._consumer = Consumer(settings.consumer_config(f"definitions-{uuid.uuid4().hex}"))
        start = [TopicPartition(self._topic, 0, 0)]
        self._consumer.assign(start)
        #: a definition read past is read again, not missed (Tansu)
        self._in_order = GapGuard(self._topic, start=start,
                                  enabled=settings.profile.skips_unfinished_appends)
        self._policies: dict[str, tuple[int, Policy]] = {}
        #: every definition read, by key (queues, topics, subscriptions, rules)
        self._definitions: dict[str, Definition] = {}
        #: subscription path -> (policy version, its rules compiled)
        self._compiled: dict[str, tuple[int, RuleSet]] = {}
        #: name -> offset of the last deletion read: windows of an older
        #: definition belong to a deleted queue
        self._deleted: dict[str, int] = {}
        #: the namespace's limit of client commands per second (None: none)
        self.max_commands_per_second: int | None = None
        #: the next offset to read
        self._position = 0
        #: wall-clock ms when a read last found nothing more to read
        self._caught_up_ms = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="definitions", daemon=True)
        self._thread.start()

    def policy(self, name: str) -> tuple[int, Policy] | None:
        """``(version, policy)`` of a queue, None if no definition was read."""
        return self._policies.get(name)

    def entities(self) -> dict[str, Definition]:
        """Every definition read, by key (queues, topics, subscriptions, rules)."""
        return dict(self._definitions)

    def rules(self, name: str) -> RuleSet | None:
        """A subscription's rules, compiled once per policy version (None: a
        queue, or a subscription whose rules cannot be compiled)."""
        found = self._policies.get(name)
        if found is None or found[1].rules is None:
            return None
        version, policy = found
        cached = self._compiled.get(name)
        if cached is None or cached[0] != version:
            try:
                cached = (version, RuleSet(policy.rules or ()))
            except ValueError as exc:  # written around the administration client
                log.error("the rules of %r cannot be compiled: %s", name, exc)
                return None
            self._compiled[name] = cached
        return cached[1]

    def deleted_at(self, name: str) -> int:
        """The offset of the queue's last deletion read, -1 if none."""
        return self._deleted.get(name, -1)

    async def read_up_to(self, offset: int) -> None:
        """Wait (briefly) until the record at ``offset`` has been read: the
        administration client names the definition it just wrote."""
        deadline = time.monotonic() + WAIT_FOR_NEW_QUEUE_S
        while self._position <= offset and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    async def policy_as_of(self, name: str, sent_ms: int) -> tuple[int, Policy] | None:
        """The queue's policy, waiting (briefly) for a definition written
        before ``sent_ms`` that this worker has not read yet."""
        deadline = time.monotonic() + WAIT_FOR_NEW_QUEUE_S
        while (found := self._policies.get(name)) is None and (
                self._caught_up_ms < sent_ms and time.monotonic() < deadline):
            await asyncio.sleep(0.005)
        return found

    def _follow(self) -> None:
        while not self._closed.is_set():
            started = int(time.time() * 1000)
            records = take(self._consumer, 500, 0.1)
            for record in self._in_order.admit(self._consumer, records):
                if record.error():
                    continue
                offset = offset_of(record)
                self._apply(record.key(), record.value(), offset)
                self._position = offset + 1
            if not records:  # (records held back for a gap: not caught up)
                self._caught_up_ms = started

    def _apply(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        name = (key or b"").decode(errors="replace")
        if name == NAMESPACE_KEY:
            self._apply_namespace(value, offset)
            return
        if value is None:
            gone = self._definitions.pop(name, None)
            if isinstance(gone, RuleProperties):
                self._follow_subscription(name.rpartition(names.RULES)[0], offset)
                return
            self._policies.pop(name, None)
            self._deleted[name] = offset
            return
        try:
            definition = load_definition(value)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable definition of %r at offset %d: %s",
                        name, offset, exc)
            return
        self._definitions[name] = definition
        if isinstance(definition, QueueProperties):
            self._policies[name] = (offset, definition.policy())
        elif isinstance(definition, TopicProperties):
            for path in [k for k, d in self._definitions.items()
                         if isinstance(d, SubscriptionProperties) and d.topic_name == name]:
                self._follow_subscription(path, offset)
        elif isinstance(definition, SubscriptionProperties):
            self._follow_subscription(name, offset)
        elif isinstance(definition, RuleProperties):
            self._follow_subscription(name.rpartition(names.RULES)[0], offset)

    def _apply_namespace(self, value: bytes | None, offset: int) -> None:
        """The namespace's settings; their deletion lifts the limit."""
        limit = None
        if value is not None:
            try:
                found = load_definition(value)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable namespace settings at offset %d: %s",
                            offset, exc)
                return
            if not isinstance(found, NamespaceProperties):
                log.warning("ignoring a %s under %r at offset %d", type(found).__name__,
                            NAMESPACE_KEY, offset)
                return
            limit = found.max_commands_per_second
        self.max_commands_per_second = limit
        log.info("the namespace's limit of commands per second is now %s", limit or "none")

    def _follow_subscription(self, path: str, offset: int) -> None:
        """A subscription's policy after its definition, its topic's or one
        of its rules changed at ``offset`` (the policy's new version)."""
        sub = self._definitions.get(path)
        if not isinstance(sub, SubscriptionProperties):
            return
        topic = self._definitions.get(sub.topic_name)
        if not isinstance(topic, TopicProperties):
            return
        prefix = path + names.RULES
        rules = [d for k, d in self._definitions.items()
                 if k.startswith(prefix) and isinstance(d, RuleProperties)]
        self._policies[path] = (offset, sub.policy(topic, rules))
        # Compiled here, in the definitions' thread, rather than by the scan
        # of the first message (the first compile builds the SQL parser: 40 ms).
        self.rules(path)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        self._consumer.close()
