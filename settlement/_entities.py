"""Entity definitions: read and written on the namespace's compacted
``NS.__entities`` topic, keyed by entity name (a tombstone deletes).

Keys: a queue's or a topic's name, ``TOPIC/subscriptions/SUB`` for a
subscription, ``TOPIC/subscriptions/SUB/rules/RULE`` for a rule, and
``$namespace`` for the namespace's own settings (no entity name starts with
``$``)."""

from __future__ import annotations

import copy
import logging
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from settlement.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusConnectionError,
    denied,
)
from topics import names
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
from topics.offsets import GapGuard, log_end_offsets, offset_of, take

log = logging.getLogger(__name__)
_CACHE_SECONDS = 2.0
#: a read that began this recently serves a new receiver (``recent=True``):
#: receivers made one after the other or side by side (a receiver per
#: session) share a read instead of each waiting for its own (the SDK reads
#: nothing when it makes one). A name not read yet is always read for.
_FRESH_S = 0.1
_KIND = {QueueProperties: "queue", TopicProperties: "topic",
         SubscriptionProperties: "subscription", RuleProperties: "rule",
         NamespaceProperties: "namespace"}


class EntityRegistry:
    """Reads the entities topic; writes one record per change.

    The topic holds every change of every entity of the namespace until
    compaction, so each load reads on from where the previous one stopped
    instead of from the start: an admin call costs what changed since, not
    what the namespace ever held. It hands out copies of what it read: a
    caller changes the properties it got (``props.x = ...; update_queue(props)``)
    and the registry must still know what is written."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self._settings = settings
        self._topic = names.entities(settings.namespace)
        self._cache: dict[str, Definition] = {}
        self._loaded_at = 0.0
        #: when the latest read began (monotonic): it holds what was written before
        self._read_began = float("-inf")
        self._producer: Producer | None = None
        #: the definitions read so far, and the offset to read on from
        self._read_so_far: dict[str, Definition] = {}
        self._position = 0
        self._load_lock = threading.Lock()
        self._consumer: Consumer | None = None
        #: whether the topic was read: its metadata need not be asked again
        self._readable = False

    def load_all(self) -> dict[str, Definition]:
        """Every definition by key; none in a namespace never provisioned."""
        self._refresh()
        return copy.deepcopy(self._cache)

    def _refresh(self, fresh_within: float = 0.0) -> None:
        """Read on, unless a read began after this call, or at most
        ``fresh_within`` seconds before it (while this waited for the lock,
        another caller's read may have served it)."""
        asked = time.monotonic()
        with self._load_lock:
            if self._read_began >= asked - fresh_within:
                return
            began = time.monotonic()
            # One consumer for the registry's life: a new one per read costs
            # a connection and a metadata round trip (10-55 ms), which every
            # new receiver (a session receiver per session) would pay.
            if self._consumer is None:
                self._consumer = Consumer(self._settings.consumer_config(
                    f"entities-{uuid.uuid4().hex[:12]}", to_known_end=True))
            end = self._log_end(self._consumer)
            if end < self._position:  # the topic was made again: read it anew
                self._read_so_far, self._position = {}, 0
            if end > self._position:
                self._read(self._consumer, end)
            self._cache, self._loaded_at = dict(self._read_so_far), time.monotonic()
            self._read_began = began

    def close(self) -> None:
        """Close the registry's consumer (it opens again if used again)."""
        with self._load_lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None

    def load(self) -> dict[str, QueueProperties]:
        """Every queue's definition."""
        return {k: v for k, v in self.load_all().items() if isinstance(v, QueueProperties)}

    def topics(self) -> dict[str, TopicProperties]:
        return {k: v for k, v in self.load_all().items() if isinstance(v, TopicProperties)}

    def namespace_properties(self) -> NamespaceProperties:
        """The namespace's settings as last written (defaults if never)."""
        self._refresh()
        found = self._cache.get(NAMESPACE_KEY)
        if isinstance(found, NamespaceProperties):
            return copy.deepcopy(found)
        return NamespaceProperties(self._settings.namespace)

    def subscriptions_of(self, topic: str, *, fresh: bool = True
                         ) -> list[SubscriptionProperties]:
        """The subscriptions of ``topic``, by name."""
        self._refresh_unless_recent(fresh)
        prefix = topic + names.SUBSCRIPTIONS
        return sorted((copy.deepcopy(v) for k, v in self._cache.items() if k.startswith(prefix)
                       and isinstance(v, SubscriptionProperties)), key=lambda s: s.name)

    def rules_of(self, topic: str, subscription: str, *, fresh: bool = True
                 ) -> list[RuleProperties]:
        """The rules of a subscription, by name (``fresh`` False: as read in
        the last :data:`_CACHE_SECONDS`)."""
        self._refresh_unless_recent(fresh)
        prefix = names.subscription_path(topic, subscription) + names.RULES
        return sorted((copy.deepcopy(v) for k, v in self._cache.items() if k.startswith(prefix)
                       and isinstance(v, RuleProperties)), key=lambda r: r.name)

    def exists(self, name: str) -> bool:
        """Whether a definition has this key (queues and topics share one namespace)."""
        self._refresh()
        return name in self._cache

    def _refresh_unless_recent(self, fresh: bool) -> None:
        """Read on if ``fresh``, or if what was read is stale; then a read
        that began just before will do: the receivers of a topic's ten
        subscriptions, all looking up their rules at their first messages,
        each read the log end in turn otherwise (0.47-0.78 s of waiting
        summed over the ten threads of a 0.8 s drain)."""
        if fresh:
            self._refresh()
        elif self._stale():
            self._refresh(_FRESH_S)

    def _stale(self) -> bool:
        return time.monotonic() - self._loaded_at > _CACHE_SECONDS

    def _log_end(self, consumer: Consumer) -> int:
        try:
            # The topic's metadata says whether it exists and may be read;
            # once it was read, the log end alone is asked (a request, not
            # three, for every new receiver), and metadata again if that fails.
            if not self._readable:
                metadata = consumer.list_topics(self._topic, timeout=10)
                error = metadata.topics[self._topic].error
                if error is not None:
                    refused = denied(error.name(), "a right (Send, Listen or Manage)",
                                     f"namespace {self._settings.namespace!r}")
                    if refused is not None:
                        raise refused
                    return 0  # not provisioned yet: no queues
            exact = self._settings.profile.exact_list_offsets
            end = log_end_offsets(consumer, [(self._topic, 0)], exact=exact)[(self._topic, 0)]
            self._readable = True
            return end
        except (KafkaException, TimeoutError) as exc:
            if self._readable:  # deleted, or no longer allowed: the metadata says which
                self._readable = False
                return self._log_end(consumer)
            reason = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
            raise ServiceBusConnectionError(
                f"cannot read the queues of namespace {self._settings.namespace!r} from "
                f"{self._settings.bootstrap_servers}: {reason}; check the Endpoint of the "
                "connection string and that Kafka is running") from None

    def _read(self, consumer: Consumer, end: int) -> None:
        """Read on from ``self._position`` to ``end`` into ``self._read_so_far``."""
        found = self._read_so_far
        start = [TopicPartition(self._topic, 0, self._position)]
        consumer.assign(start)
        # a definition read past is read again, not missed (Tansu)
        in_order = GapGuard(self._topic, start=start,
                            enabled=self._settings.profile.skips_unfinished_appends)
        try:
            self._read_to(consumer, end, found, in_order)
        finally:
            # Left assigned at the log end, the consumer keeps a fetch parked
            # at the broker for new records (fetch.wait.max.ms), and the next
            # read would wait for it to come back.
            consumer.unassign()

    def _read_to(self, consumer: Consumer, end: int, found: dict[str, Definition],
                 in_order: GapGuard) -> None:
        deadline = time.monotonic() + 30
        while self._position < end:
            if time.monotonic() > deadline:
                raise ServiceBusConnectionError(
                    f"reading {self._topic} stalled at offset {self._position} of {end}")
            for record in in_order.admit(consumer, take(consumer, 1000, 0.1)):
                if record.error():
                    continue
                self._position = offset_of(record) + 1
                name = (record.key() or b"").decode(errors="replace")
                value = record.value()
                if value is None:
                    found.pop(name, None)
                    continue
                try:
                    found[name] = load_definition(value)
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("ignoring unreadable definition of %r: %s", name, exc)

    def get(self, name: str, *, fresh: bool = False, recent: bool = False) -> QueueProperties:
        """A queue's definition: read on first if ``fresh`` (a read that
        began within :data:`_FRESH_S` will do if ``recent``)."""
        return self._get(name, QueueProperties, "queue", "create_queue",
                         f"queue create {name}", fresh, recent)

    def get_topic(self, name: str, *, fresh: bool = False) -> TopicProperties:
        return self._get(name, TopicProperties, "topic", "create_topic",
                         f"topic create {name}", fresh, False)

    def get_subscription(self, topic: str, subscription: str, *, fresh: bool = False,
                         recent: bool = False) -> SubscriptionProperties:
        return self._get(names.subscription_path(topic, subscription), SubscriptionProperties,
                         "subscription", "create_subscription",
                         f"subscription create {topic} {subscription}", fresh, recent)

    def get_rule(self, topic: str, subscription: str, rule: str, *, fresh: bool = False
                 ) -> RuleProperties:
        return self._get(names.rule_key(topic, subscription, rule), RuleProperties, "rule",
                         "create_rule", f"rule create {topic} {subscription} {rule}", fresh,
                         False)

    def _get(self, key: str, kind: type, what: str, create: str, cli: str, fresh: bool,
             recent: bool) -> Any:
        if key not in self._cache or self._stale():
            self._refresh()
        elif fresh:
            self._refresh(_FRESH_S if recent else 0.0)
        found = self._cache.get(key)
        if isinstance(found, kind):
            return copy.deepcopy(found)  # the caller may change it (update_queue's input)
        if found is not None:
            raise MessagingEntityNotFoundError(
                f"{key!r} is a {_KIND[type(found)]} of namespace "
                f"{self._settings.namespace!r}, not a {what}: use the {_KIND[type(found)]}'s "
                f"methods (e.g. get_{_KIND[type(found)]}_sender), or another name")
        raise MessagingEntityNotFoundError(
            f"{what} {key!r} does not exist in namespace {self._settings.namespace!r}: "
            f"create it with ServiceBusAdministrationClient.{create} or 'settlement {cli}'")

    def put(self, props: Definition | None, name: str) -> int:
        """Write (or with None, delete) a definition; returns its offset, which
        is the version of the queue's policy."""
        if self._producer is None:  # kept: a new idempotent producer's first send is slow
            self._producer = Producer({**self._settings.kafka_config(), "acks": "all",
                                       "enable.idempotence": True, "linger.ms": 0})
        producer = self._producer
        written: list[int] = []
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                written.append(offset_of(msg))
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
        self._loaded_at, self._read_began = 0.0, float("-inf")
        return written[0]
