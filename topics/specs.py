"""Partitions, cleanup policy and retention of every topic, and provisioning.

Entity logs keep everything (``retention.ms=-1``): a time-based retention could
delete a message nobody has settled, which would break "a message whose send
returned is never lost". The engine may later advance a log's start with
DeleteRecords up to the oldest unsettled offset where the broker supports it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic, TopicMetadata

from topics import names
from topics.entities.namespace import DEFAULT_ENGINE_PARTITIONS

log = logging.getLogger(__name__)

REPLY_PARTITIONS = 8
#: the engine's Faust tables: window headers, and everything else of the windows
ENGINE_TABLES = ("headers", "entries")
_DAY_MS = 24 * 3600 * 1000


class ProvisioningError(RuntimeError):
    """A topic could not be created or exists with an incompatible shape."""


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


def namespace_topics(namespace: str, engine_partitions: int) -> list[TopicSpec]:
    """Topics the engine and every client of a namespace share. The commands,
    events and state topics are keyed by window and co-partitioned: each has
    the namespace's ``engine_partitions``."""
    compact = {"cleanup.policy": "compact"}
    return [
        # Stamped by the broker: a settlement is judged by when it reached the
        # log (docs/settlement-by-log.md).
        TopicSpec(names.commands(namespace), engine_partitions,
                  {"cleanup.policy": "delete", "retention.ms": str(7 * _DAY_MS),
                   "message.timestamp.type": "LogAppendTime"}),
        TopicSpec(names.replies(namespace), REPLY_PARTITIONS,
                  {"cleanup.policy": "delete", "retention.ms": str(_DAY_MS)}),
        TopicSpec(names.events(namespace), engine_partitions,
                  {"cleanup.policy": "delete", "retention.ms": str(30 * _DAY_MS)}),
        TopicSpec(names.state(namespace), engine_partitions, compact),
        TopicSpec(names.entities(namespace), 1, compact),
        # a monitor subscribes to it on every namespace: paired clients of
        # other namespaces report to it when this one is their secondary
        TopicSpec(names.pairing(namespace), 1, compact),
    ]


def engine_tables(namespace: str, engine_partitions: int) -> list[TopicSpec]:
    """The changelogs of the engine's tables, co-partitioned with the commands
    topic, created before Faust starts. Faust would create them itself, but
    on a cluster it reads the new topic's partition count before its metadata
    has spread, finds 0 partitions and refuses every table write
    (``PartitionsMismatch``)."""
    return [TopicSpec(names.table_changelog(namespace, table), engine_partitions,
                      {"cleanup.policy": "compact"}) for table in ENGINE_TABLES]


def provision_namespace(admin: AdminClient, namespace: str, replication_factor: int,
                        engine_partitions: int = DEFAULT_ENGINE_PARTITIONS, *,
                        tables: bool = False) -> int:
    """Create what is missing of the namespace's topics (and, for the engine,
    ``tables=True``, of its tables' changelogs: their names are the engine's,
    outside what a client's Manage right covers); return its engine partitions.

    A namespace's engine partitions are its commands topic's partition count:
    ``engine_partitions`` for a namespace made now, its own for one that
    exists (the caller compares when it asked for a count). They never change
    afterwards: each window's commands partition, hence the worker and the
    table partition holding its state, follows from the count."""
    existing = partition_count(admin, names.commands(namespace))
    count = existing or engine_partitions
    provision(admin, namespace_topics(namespace, count)
              + (engine_tables(namespace, count) if tables else []), replication_factor)
    return count


def entity_topics(namespace: str, entity: str, partitions: int, *, topic: bool = False
                  ) -> list[TopicSpec]:
    """The message log of a queue (its dead-letter sub-queue lives in it), or
    of a topic (``topic=True``; its subscriptions read it)."""
    log = (names.topic_log if topic else names.entity_log)(namespace, entity)
    return [TopicSpec(log, partitions, {"cleanup.policy": "delete", "retention.ms": "-1"})]


def provision(admin: AdminClient, specs: list[TopicSpec], replication_factor: int,
              timeout: float = 15.0) -> None:
    """Create the topics that are missing; check the partition count of the rest.

    ``replication_factor`` comes from the broker profile (up to three replicas,
    one per broker). Idempotent: running it twice, or from two processes at
    once, is harmless.
    """
    futures = admin.create_topics(
        [NewTopic(s.name, s.partitions, replication_factor, config=s.config) for s in specs],
        operation_timeout=timeout, request_timeout=timeout,
    )
    existing: list[TopicSpec] = []
    for spec in specs:
        try:
            futures[spec.name].result()
            log.info("created topic %s (%d partitions)", spec.name, spec.partitions)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise ProvisioningError(
                    f"cannot create topic {spec.name}: {exc.args[0].str()}") from exc
            existing.append(spec)
    metadata = _wait_for_leaders(admin, specs, timeout)
    for spec in existing:
        count = len(metadata[spec.name].partitions)
        if spec.partitions and count != spec.partitions:
            raise ProvisioningError(
                f"topic {spec.name} exists with {count} partitions, expected "
                f"{spec.partitions}: delete it or use its partition count"
            )


def _wait_for_leaders(admin: AdminClient, specs: list[TopicSpec], timeout: float
                      ) -> dict[str, TopicMetadata]:
    """Metadata of ``specs`` once every partition of each has a leader: on a
    cluster a new topic reaches the other brokers' metadata a moment after
    CreateTopics returns, and clients that ask too early see no partitions."""
    deadline = time.monotonic() + timeout
    while True:
        metadata = admin.list_topics(timeout=timeout).topics
        waiting = [s.name for s in specs if s.name not in metadata
                   or metadata[s.name].error is not None or not metadata[s.name].partitions
                   or any(p.leader < 0 for p in metadata[s.name].partitions.values())]
        if not waiting:
            return metadata
        if time.monotonic() > deadline:
            raise ProvisioningError(f"topics {waiting} have no leader {timeout:.0f} s after "
                                    "they were created: is every broker up?")
        time.sleep(0.1)


def partition_count(admin: AdminClient, topic: str, timeout: float = 10.0) -> int:
    """Partitions of an existing topic, 0 when it does not exist. Looked up
    in the list of every topic: Tansu creates a topic asked for by name."""
    found = admin.list_topics(timeout=timeout).topics.get(topic)
    if found is None or found.error is not None:
        return 0
    return len(found.partitions)
