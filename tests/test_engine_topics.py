"""What the engine emits for Spark: settlement events and compacted window state.

Lock expiry is driven by the engine's own timer: a lapse shows up in the event
stream with no client command involved.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from settlement import ServiceBusClient, ServiceBusMessage
from topics import names, specs


def read_all(client: ServiceBusClient, topic: str, key: bytes, wait_for: Callable[[list], bool],
             timeout: float = 15.0) -> list[dict[str, Any]]:
    consumer = Consumer(client.settings.consumer_config(f"read-{topic}"))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(specs.ENGINE_PARTITIONS)])
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


def test_timer_lapses_locks_and_the_event_stream_says_so(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=1)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    receiver = client.get_queue_receiver(queue)
    held = receiver.receive_messages(2, max_wait_time=10)
    while len(held) < 2:
        held += receiver.receive_messages(1, max_wait_time=10)
    receiver.complete_message(held[0])
    key = f"{queue}#0".encode()

    def lapsed(events: list[dict[str, Any]]) -> bool:
        return any(e["type"] == "lock_expired" for e in events)

    events = read_all(client, names.events(client.settings.namespace), key, lapsed)
    kinds = [e["type"] for e in events]
    assert kinds.index("enqueued") < kinds.index("locked") < kinds.index("completed")
    assert lapsed(events)
    expired = next(e for e in events if e["type"] == "lock_expired")
    assert expired["offsets"] == [held[1].offset] and expired["entity"] == queue

    def settled(states: list[dict[str, Any]]) -> bool:
        return bool(states) and states[-1]["locked"] == 0 and states[-1]["active"] == 1

    states = read_all(client, names.state(client.settings.namespace), key, settled)
    assert settled(states)
    assert states[-1]["totals"]["completed"] == 1 and states[-1]["start"] == 1
