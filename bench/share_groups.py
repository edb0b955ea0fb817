"""The peer: Kafka's own queues (KIP-932 share groups) doing the same work as
the settlement layer, on the same Apache Kafka, with confluent-kafka's
``ShareConsumer`` in explicit acknowledgement mode.

Two phases, each on a fresh single-partition topic of 1 KB records (the
settlement queues of the bench have one partition too):

* throughput: ``poll()`` a batch, ``acknowledge()`` every record (ACCEPT),
  ``commit_sync()`` once per batch, like ``receive_messages`` +
  ``complete_messages``;
* acknowledge latency: one ``acknowledge()`` + ``commit_sync()`` per record,
  like one ``complete_message`` call each.

Both check that every record was acknowledged exactly once.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from bench.measure import CpuMeter, Phase, Timed, percentile

IDLE_S = 10.0


def _topic_with_records(bootstrap: str, n: int, size: int) -> str:
    topic = f"bench-share-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1)])[topic].result(15)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    payload = os.urandom(size)
    for i in range(n):
        while True:
            try:
                producer.produce(topic, payload, key=str(i).encode())
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    return topic


def _consumer(bootstrap: str, topic: str) -> ShareConsumer:
    """A share consumer of a new group that starts at the earliest record (a
    share group starts at the latest by default; it is a group config)."""
    group = f"bench-share-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest",
                    incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(15)
    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                              "share.acknowledgement.mode": "explicit"})
    consumer.subscribe([topic])
    return consumer


def _check(n: int, acknowledged: dict[int, int]) -> dict[str, Any]:
    twice = sum(1 for c in acknowledged.values() if c > 1)
    missing = n - len(acknowledged)
    return {"expected": n, "settled": sum(acknowledged.values()), "missing": missing,
            "settled_more_than_once": twice, "ok": missing == 0 and twice == 0}


def share_group_throughput(bootstrap: str, n: int, size: int, meter: CpuMeter) -> Phase:
    topic = _topic_with_records(bootstrap, n, size)
    consumer = _consumer(bootstrap, topic)
    acknowledged: dict[int, int] = {}
    polls = 0
    with Timed(meter) as t:
        idle_since = time.monotonic()
        while len(acknowledged) < n and time.monotonic() - idle_since < IDLE_S:
            records = [r for r in consumer.poll(0.5) if r.error() is None]
            if not records:
                continue
            idle_since = time.monotonic()
            polls += 1
            for record in records:
                consumer.acknowledge(record, AcknowledgeType.ACCEPT)
                acknowledged[record.offset()] = acknowledged.get(record.offset(), 0) + 1
            consumer.commit_sync()
    consumer.close()
    return Phase("share_group_batch", "Kafka share group: poll + acknowledge each + commit "
                 "per poll", len(acknowledged), t.seconds, cpu=t.cpu,
                 check=_check(n, acknowledged),
                 extra={"polls": polls, "mean_batch": round(len(acknowledged) / max(polls, 1))})


def share_group_ack_latency(bootstrap: str, samples: int, size: int,
                            meter: CpuMeter) -> Phase:
    topic = _topic_with_records(bootstrap, samples, size)
    consumer = _consumer(bootstrap, topic)
    acknowledged: dict[int, int] = {}
    latencies: list[float] = []
    with Timed(meter) as t:
        idle_since = time.monotonic()
        while len(acknowledged) < samples and time.monotonic() - idle_since < IDLE_S:
            records = [r for r in consumer.poll(0.5) if r.error() is None]
            if records:
                idle_since = time.monotonic()
            for record in records:
                started = time.perf_counter()
                consumer.acknowledge(record, AcknowledgeType.ACCEPT)
                consumer.commit_sync()
                latencies.append((time.perf_counter() - started) * 1000)
                acknowledged[record.offset()] = acknowledged.get(record.offset(), 0) + 1
    consumer.close()
    return Phase("share_group_ack_latency", "Kafka share group: acknowledge + commit_sync "
                 "per record", len(acknowledged), t.seconds, cpu=t.cpu,
                 check=_check(samples, acknowledged),
                 extra={"p50_ms": round(percentile(latencies, 50), 2),
                        "p99_ms": round(percentile(latencies, 99), 2)})
