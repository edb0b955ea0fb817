"""Seeded fuzzing of every topic the engine reads: thousands of malformed,
mistyped, oversized and well-formed but forged records. The engine stays up,
and a queue under fire ends in exactly the state of a twin queue that got the
same legitimate traffic and no fuzz; the Spark audit agrees."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import Producer

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage
from settlement.management import ServiceBusAdministrationClient
from topics import names, specs
from topics.entities import DEFAULT_ENGINE_PARTITIONS
from topics.partitions import command_partition

SEED = 20261122
RECORDS = 3000
FORGED_OPS = ("expire", "accept", "dead_forwarded", "drop", "define")
#: client operations whose every well-formed variant here changes nothing: the
#: fuzz must not be a legitimate receiver (an acquire would lock messages)
HARMLESS_OPS = ("settle", "stats", "peek")
WRONG = ["", "x", -1, 1 << 70, 3.5, True, None, [], {}, [[]], [["a"]], "\x00" * 300]


def legitimate_first_half(client: ServiceBusClient, queue: str) -> None:
    """200 sent; of the first 100: 60 completed, 20 abandoned, 10 dead-lettered, 10 deferred."""
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                              for i in range(200)])
    receiver = client.get_queue_receiver(queue)
    got = receive(receiver, 100)
    got.sort(key=lambda m: int(m.message_id[1:]))
    assert all(r.succeeded for r in receiver.complete_messages(got[:60]))
    for message in got[60:80]:
        receiver.abandon_message(message)
    for message in got[80:90]:
        receiver.dead_letter_message(message, reason="legit")
    for message in got[90:]:
        receiver.defer_message(message)


def legitimate_second_half(client: ServiceBusClient, queue: str) -> dict[str, int]:
    """Everything still active is received and completed: message id -> delivery count."""
    receiver = client.get_queue_receiver(queue)
    got = receive(receiver, 120)
    assert all(r.succeeded for r in receiver.complete_messages(got))
    assert receiver.receive_messages(10, max_wait_time=1) == []
    return {m.message_id: m.delivery_count for m in got}


def receive(receiver: Any, count: int) -> list[ServiceBusReceivedMessage]:
    got: list[ServiceBusReceivedMessage] = []
    while len(got) < count:
        batch = receiver.receive_messages(count - len(got), max_wait_time=10)
        assert batch, f"only {len(got)} of {count} messages came"
        got += batch
    return got


def command_body(rng: random.Random, queue: str, op: str) -> dict[str, Any]:
    """A well-formed command of ``op`` for the queue's window."""
    offsets = [rng.randrange(0, 400) for _ in range(rng.randint(1, 20))]
    # settlements one by one, or as one group of an acquire (with a token nobody was given)
    items: list[Any] = [[o, str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                         rng.choice(["complete", "dead_letter", "defer", "abandon"]),
                         None, None] for o in offsets]
    if rng.random() < 0.3:
        items = [{"offsets": offsets, "token": items[0][1],
                  "action": rng.choice(["complete", "defer", "abandon"])}]
    args: dict[str, Any] = {
        "settle": {"items": items},
        "stats": {"hw": 0},
        "peek": {"sub": "active", "from": 0, "max": 5, "hw": 0},
        "expire": {},
        "accept": {"from": 0, "to": 400, "items": [[o, 1, 0, 1] for o in offsets]},
        "dead_forwarded": {"offsets": offsets},
        "drop": {},
        "define": {"version": 1 << 40},
    }[op]
    reply = rng.choice([None, {"partition": rng.randrange(specs.REPLY_PARTITIONS),
                               "client": f"fuzz-{rng.getrandbits(32):x}"},
                        {"partition": 1 << 19, "client": "nowhere"}])
    return {"v": 1, "id": f"fuzz-{rng.getrandbits(64):x}", "op": op, "entity": queue,
            "partition": 0, "reply": reply, **args}


def mistyped(rng: random.Random, body: dict[str, Any]) -> dict[str, Any]:
    """The command with one field (or one item's field) of the wrong type."""
    body = json.loads(json.dumps(body))
    field = rng.choice(sorted(body))
    if isinstance(body[field], list) and body[field] and isinstance(body[field][0], list):
        item = rng.choice(body[field])
        item[rng.randrange(len(item))] = rng.choice(WRONG)
    else:
        body[field] = rng.choice(WRONG)
    return body


def fuzz(rng: random.Random, ns: str, queue: str) -> Iterator[tuple[str, bytes | None,
                                                                  bytes | None, int]]:
    """``RECORDS`` records: (topic, key, value, partition)."""
    commands, key = names.commands(ns), f"{queue}#0".encode()
    right = command_partition(key.decode(), DEFAULT_ENGINE_PARTITIONS)
    for i in range(RECORDS):
        kind = rng.choice(["garbage", "garbage_json", "mistyped", "forged", "forged",
                           "stolen_token", "misrouted", "entities", "replies"])
        if i % 1000 == 999:
            kind = "oversized"
        if kind == "garbage":
            yield commands, rng.choice([key, None, rng.randbytes(8)]), rng.choice(
                [rng.randbytes(rng.randint(0, 300)), None]), right
        elif kind == "garbage_json":
            text = json.dumps(command_body(rng, queue, rng.choice(HARMLESS_OPS)))
            yield commands, key, text[:rng.randint(0, len(text) - 1)].encode(), right
        elif kind == "mistyped":
            body = mistyped(rng, command_body(rng, queue, rng.choice(HARMLESS_OPS + FORGED_OPS)))
            yield commands, key, json.dumps(body).encode(), right
        elif kind == "forged":
            body = command_body(rng, queue, rng.choice(FORGED_OPS))
            if rng.random() < 0.3:
                body["policy"] = {"lock_ms": 1000, "max_delivery": 1}
                body["op"] = rng.choice(["stats", "peek"])
            yield commands, key, json.dumps(body).encode(), right
        elif kind == "stolen_token":  # settlements with tokens nobody was given
            yield commands, key, json.dumps(command_body(rng, queue, "settle")).encode(), right
        elif kind == "misrouted":
            body = command_body(rng, queue, rng.choice(("settle", "stats", "expire")))
            yield commands, key, json.dumps(body).encode(), (right + 1) % DEFAULT_ENGINE_PARTITIONS
        elif kind == "entities":  # definitions of queues that are not there, and garbage
            yield names.entities(ns), f"fuzz-{rng.getrandbits(16):x}".encode(), rng.choice(
                [rng.randbytes(50), b'{"lock_duration": "soon"}', b"[]"]), 0
        elif kind == "replies":
            yield names.replies(ns), rng.randbytes(8), rng.randbytes(40), rng.randrange(
                specs.REPLY_PARTITIONS)
        else:  # oversized: most of a megabyte, where the engine reads commands
            body = command_body(rng, queue, "settle")
            body["items"] = body["items"] * (600_000 // len(json.dumps(body["items"])) + 1)
            yield commands, key, json.dumps(body).encode()[:900_000], right


def test_fuzzed_topics_leave_the_engine_up_and_the_state_as_legitimate_traffic_made_it(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str], spark: Any, conn: str) -> None:
    from spark.audit import run_audit

    control = make_queue(lock_duration=60, partition_count=1)
    target = f"{control}-fuzzed"
    admin.create_queue(target, lock_duration=60, partition_count=1)
    for queue in (control, target):
        legitimate_first_half(client, queue)
    producer = Producer({**client.settings.kafka_config(), "message.max.bytes": 1_000_000})
    sent = 0
    for topic, key, value, partition in fuzz(random.Random(SEED), client.settings.namespace,
                                             target):
        while True:
            try:
                producer.produce(topic, value, key=key, partition=partition)
                break
            except BufferError:
                producer.poll(0.1)
        sent += 1
    assert producer.flush(60) == 0 and sent == RECORDS
    delivered = {queue: legitimate_second_half(client, queue) for queue in (control, target)}
    assert delivered[target] == delivered[control]
    props = {q: admin.get_queue_runtime_properties(q) for q in (control, target)}
    shape = {q: (p.active_message_count, p.dead_letter_message_count,
                 p.locked_message_count, p.total_message_count) for q, p in props.items()}
    assert shape[target] == shape[control]
    assert props[target].dead_letter_message_count == 10
    report = run_audit(spark, conn, [control, target])
    assert report.ok and report.messages == 400, report.summary()
