"""Test helpers: draining a queue, reading what the engine emits, running the
Spark monitor over it."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from settlement import ServiceBusClient, ServiceBusReceivedMessage
from settlement.testing.apache_kafka import KafkaCluster
from settlement.testing.embedded import EmbeddedBroker
from streams.process import EngineProcess
from topics import names
from topics.connection import ConnectionSettings, parse_connection_string
from topics.entities import DEFAULT_ENGINE_PARTITIONS

#: The broker of this test session: ``kafka`` (Apache Kafka, the default) or ``tansu``.
TEST_BROKER = os.environ.get("SETTLEMENT_TEST_BROKER", "kafka")
#: What the session's ``broker`` fixture is: both start, stop and make connection strings.
Broker = EmbeddedBroker | KafkaCluster


def assigned_partitions(engine: EngineProcess) -> set[int]:
    """Commands-topic partitions the worker's log says it was given last
    (Faust prints them as ``{0-3}`` or ``{0, 2, 5}``)."""
    text = engine.log_path.read_text(errors="replace")
    found = re.findall(r"__commands\s*\|\s*\{([0-9, \-]+)\}", text)
    partitions: set[int] = set()
    for part in (found[-1].split(",") if found else []):
        low, _, high = part.strip().partition("-")
        partitions |= set(range(int(low), int(high or low) + 1))
    return partitions


def shared_partitions(workers: list[EngineProcess], partitions: int, timeout: float
                      ) -> list[set[int]]:
    """The commands partitions each worker's log says it holds, once they
    hold all ``partitions`` between them, each its own (or at the timeout):
    a group settles a while after its last join or leave."""
    deadline = time.monotonic() + timeout
    while True:
        held = [assigned_partitions(w) for w in workers]
        if (sum(map(len, held)) == partitions and set().union(*held) == set(range(partitions))
                or time.monotonic() > deadline):
            return held
        time.sleep(0.2)


def read_all(client: ServiceBusClient, topic: str, key: bytes, wait_for: Callable[[list], bool],
             timeout: float = 15.0) -> list[dict[str, Any]]:
    consumer = Consumer(client.settings.consumer_config(f"read-{topic}"))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(DEFAULT_ENGINE_PARTITIONS)])
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not wait_for(records):
            for record in consumer.consume(500, timeout=0.2):
                if not record.error() and record.key() == key:
                    records.append(json.loads(record.value()))
    finally:
        consumer.close()
    return records


def last_state(client: ServiceBusClient, queue: str, until: Callable[[dict[str, Any]], bool],
               timeout: float = 15.0) -> dict[str, Any]:
    """The latest state record of ``queue#0`` once ``until`` holds for it (or at the timeout)."""
    states = read_all(client, names.state(client.settings.namespace), f"{queue}#0".encode(),
                      lambda found: bool(found) and until(found[-1]), timeout)
    return states[-1] if states else {}


def wait_for_events(client: ServiceBusClient, entity: str, kind: str, count: int,
                    timeout: float = 15.0) -> None:
    """Until the events topic holds events ``kind`` of ``count`` distinct
    offsets of ``entity``'s partition 0. A settlement final at its append
    returns before the engine has applied it and published its event (and
    an answered command is answered before its events go out): a job that
    reads the topic to its end right after may not find them yet."""
    def enough(events: list[dict[str, Any]]) -> bool:
        return len({o for e in events if e["type"] == kind for o in e["offsets"]}) >= count

    events = read_all(client, names.events(client.settings.namespace), f"{entity}#0".encode(),
                      enough, timeout)
    assert enough(events), f"{entity}: fewer than {count} {kind} offsets in {timeout:.0f} s"


def drain_ids(client: ServiceBusClient, queue: str, wait: float = 2.0) -> list[str]:
    """Receive and complete until nothing comes for ``wait`` s; the ids, in order."""
    receiver = client.get_queue_receiver(queue)
    ids: list[str] = []
    while batch := receiver.receive_messages(50, max_wait_time=wait):
        ids += [m.message_id for m in batch]
        receiver.complete_messages(batch)
    receiver.close()
    return ids


def receive_exactly(receiver: Any, count: int) -> list[ServiceBusReceivedMessage]:
    got: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        got += receiver.receive_messages(max_message_count=count - len(got), max_wait_time=2)
    assert len(got) == count
    return got


def run_monitor(spark: Any, conn: str, sink: Path, **options: Any) -> None:
    """The monitor over what the topics hold now, to the end (``available_now``)."""
    from spark.monitor import start_monitor

    query = start_monitor(spark, conn, sink, available_now=True, **options)
    query.awaitTermination(300)
    query.stop()  # releases the checkpoint for the next run
    assert query.exception() is None


def drive_workload(client: ServiceBusClient, queue: str, *, sent: int, complete: int,
                   abandon: int, dead_letter: int, reason: str, defer: int = 0,
                   renew_first: bool = False) -> list[ServiceBusReceivedMessage]:
    """A known workload for the Spark jobs to count: send ``sent`` messages,
    receive them all, then (renew the first lock,) complete ``complete``,
    abandon ``abandon``, dead-letter ``dead_letter`` with ``reason`` and defer
    ``defer``, in that order; the abandoned ones come back with delivery
    count 2 and are completed. Returns the first deliveries, in order."""
    from settlement import ServiceBusMessage

    assert complete + abandon + dead_letter + defer == sent
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(sent)])
    with client.get_queue_receiver(queue) as receiver:
        first = receive_exactly(receiver, sent)
        if renew_first:
            receiver.renew_message_lock(first[0])
        done = complete
        receiver.complete_messages(first[:done])
        receiver.abandon_messages(first[done:done + abandon])
        done += abandon
        for message in first[done:done + dead_letter]:
            receiver.dead_letter_message(message, reason=reason, error_description="test")
        for message in first[done + dead_letter:]:
            receiver.defer_message(message)
        again = receive_exactly(receiver, abandon)
        assert all(m.delivery_count == 1 for m in again)
        receiver.complete_messages(again)
    return first


def drive_topic_workload(client: ServiceBusClient, admin: Any, topic: str) -> tuple[str, str]:
    """A known workload on a topic for the Spark jobs: subscription ``all``
    (every message) and ``eu`` (``region = 'eu'``, created after 2 messages
    were published, so they are not its). 10 more are published, 6 of them
    eu: ``eu`` completes 5 and dead-letters 1 (reason ``bad-region``), ``all``
    completes all 12. Returns the paths of ``eu`` and ``all``."""
    from settlement import ServiceBusMessage
    from settlement.management import SqlRuleFilter

    admin.create_topic(topic)
    admin.create_subscription(topic, "all")
    with client.get_topic_sender(topic) as sender:
        sender.send_messages([ServiceBusMessage(f"early {i}") for i in range(2)])
        admin.create_subscription(topic, "eu")
        admin.delete_rule(topic, "eu", "$Default")
        admin.create_rule(topic, "eu", "eu", filter=SqlRuleFilter("region = 'eu'"))
        sender.send_messages([ServiceBusMessage(f"m{i}", application_properties={
            "region": "eu" if i < 6 else "us"}) for i in range(10)])
    with client.get_subscription_receiver(topic, "eu") as receiver:
        got = receive_exactly(receiver, 6)
        receiver.complete_messages(got[:5])
        receiver.dead_letter_message(got[5], reason="bad-region", error_description="test")
    with client.get_subscription_receiver(topic, "all") as receiver:
        receiver.complete_messages(receive_exactly(receiver, 12))
    return names.subscription_path(topic, "eu"), names.subscription_path(topic, "all")


def one_partition_log(broker: Broker) -> tuple[ConnectionSettings, str, Callable[[int], None]]:
    """A new namespace's settings, a new one-partition log in it, and what
    appends ``count`` records to it (record N's value: ``b"record N"``)."""
    settings = parse_connection_string(broker.connection_string(f"t{uuid.uuid4().hex[:8]}"))
    topic = f"{settings.namespace}.log-{uuid.uuid4().hex[:6]}"
    config: dict[str, str | int | float | bool] = {"bootstrap.servers": settings.bootstrap_servers}
    admin = AdminClient(config)  # kept until the topic is made: its futures need it
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer(config)
    appended = 0

    def append(count: int) -> None:
        nonlocal appended
        for i in range(appended, appended + count):
            producer.produce(topic, f"record {i}".encode())
            producer.poll(0)
        assert producer.flush(30) == 0
        appended += count

    return settings, topic, append


def log_start(client: ServiceBusClient, log: str, partition: int = 0) -> int:
    """The start of ``partition`` of the Kafka topic ``log``."""
    return log_bounds(client, log, partition)[0]


def log_bounds(client: ServiceBusClient, log: str, partition: int) -> tuple[int, int]:
    """The start and end of ``partition`` of the Kafka topic ``log``."""
    consumer = Consumer(client.settings.consumer_config("trim-check"))
    try:
        return consumer.get_watermark_offsets(TopicPartition(log, partition), timeout=10)
    finally:
        consumer.close()


def wait_for_log_start(client: ServiceBusClient, log: str, expected: int) -> None:
    """Wait until the engine trimmed partition 0 of ``log`` to ``expected``."""
    deadline = time.monotonic() + 45  # every 5 s, to where it could 10 s before
    while (start := log_start(client, log)) != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    assert start == expected, f"the log start of {log} is {start}, not {expected}"
