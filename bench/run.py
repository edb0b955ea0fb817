"""Throughput and latency of the settlement layer against raw Kafka.

``python -m bench.run [--broker kafka|tansu] [--messages N] [--size 1024]``
starts a broker (Apache Kafka from Maven Central, one node, by default; or
Tansu, the embedded broker) and one engine worker subprocess, then measures
on that one broker:

1. raw Kafka: confluent-kafka produce (acks=all, idempotent) and a plain
   assigned consumer (no commits), on a fresh topic;
2. durable sends through ``ServiceBusSender.send_messages`` in lists;
3. peek-lock: ``receive_messages(batch)`` + ``complete_messages(batch)``;
4. peek-lock: one ``complete_message`` per message from several threads,
   each thread with its own receiver of one client;
5. receive-and-delete;
6. latency of single ``complete_message`` calls (p50/p99);
7. Spark (``bench.spark_phases``): records/s the Kafka source reads, and the
   delay from a settlement to its row in the monitor's sink (2 s trigger);
8. on Apache Kafka, the peer: Kafka's own queues (KIP-932 share groups,
   ``bench.share_groups``) doing the same work, batch and one at a time.

Every settled phase checks by message id that each message was settled
exactly once. The table goes to stdout and the same figures as JSON to
``bench/results/latest-kafka.json`` (``latest-tansu.json`` on Tansu). CPU
seconds of the client, engine and broker processes are recorded per phase
to show which one is the bottleneck.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.brokers import add_broker_argument, broker_label, broker_pid, new_broker, results_path
from bench.measure import CpuMeter, Phase, Timed, percentile
from settlement import ServiceBusClient, ServiceBusMessage
from settlement.exceptions import OperationTimeoutError, ServiceBusError
from settlement.management import ServiceBusAdministrationClient
from settlement.receiver import ServiceBusReceiveMode
from settlement.sender import ServiceBusSender
from streams.process import EngineProcess
from topics.connection import parse_connection_string

NAMESPACE = "bench"
LOCK_SECONDS = 300  # the longest lock a queue allows: no lapse can blur the counts
IDLE_S = 10.0       # a phase gives up after this long without a message

log = logging.getLogger("bench")


@dataclass(frozen=True)
class Target:
    """A figure the project promises (issue 9), checked on every run."""
    label: str
    phase: str
    figure: str        # "rate", or a key of the phase's extra figures
    goal: float
    at_most: bool      # latencies: at most the goal; rates: at least

    def measured(self, phases: dict[str, Phase]) -> float:
        p = phases[self.phase]
        return p.rate if self.figure == "rate" else float(p.extra[self.figure])

    def met(self, phases: dict[str, Phase]) -> bool:
        value = self.measured(phases)
        return value <= self.goal if self.at_most else value >= self.goal


TARGETS = (
    Target("single complete_message p50 <= 5 ms", "settle_latency", "p50_ms", 5, True),
    Target("single complete_message p99 <= 20 ms", "settle_latency", "p99_ms", 20, True),
    Target("SDK loop, one thread >= 150 msg/s", "sdk_loop", "rate", 150, False),
    Target("process(max_concurrent_calls=32), handler settles each >= 10,000 msg/s",
           "process_settling_each", "rate", 10_000, False),
    Target("batched peek-lock (receive 1,000 + complete_messages) >= 40,000 msg/s",
           "peek_lock_batch", "rate", 40_000, False),
)


# --------------------------------------------------------------------- machine
def machine_info() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "cores": os.cpu_count(), "usable_cores": usable, "cpu_model": model,
        "python": platform.python_version(), "implementation": platform.python_implementation(),
        "platform": platform.platform(), "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
    }


# ------------------------------------------------------------- exactly once
def check_exactly_once(expected: list[str], received: Counter[str], settled: Counter[str],
                       failures: int = 0) -> dict[str, Any]:
    """Each expected id received and settled once; nothing else."""
    want = set(expected)
    missing = [i for i in expected if settled[i] == 0]
    check = {
        "expected": len(expected),
        "settled": sum(settled.values()),
        "missing": len(missing),
        "received_more_than_once": sum(1 for c in received.values() if c > 1),
        "settled_more_than_once": sum(1 for c in settled.values() if c > 1),
        "unexpected": sum(1 for i in received if i not in want),
        "settle_failures": failures,
    }
    check["ok"] = (check["missing"] == 0 and check["received_more_than_once"] == 0
                   and check["settled_more_than_once"] == 0 and check["unexpected"] == 0
                   and failures == 0)
    if missing:
        check["missing_sample"] = missing[:5]
    return check


def final_check(receivers: list[Any], ids: list[str], received: Counter[str],
                settled: Counter[str], failures: int | list[str], batch: int) -> dict[str, Any]:
    """After a phase: nothing may be left in the queue, and every message must
    have been settled exactly once. Closes the receivers (an open receiver
    keeps fetching and loads the broker)."""
    leftover = receivers[0].receive_messages(batch, max_wait_time=0.5)
    for receiver in receivers:
        receiver.close()
    received.update(m.message_id for m in leftover)
    failed = failures if isinstance(failures, int) else len(failures)
    check = check_exactly_once(ids, received, settled, failed)
    check["left_in_queue"] = len(leftover)
    check["ok"] = check["ok"] and not leftover
    if isinstance(failures, list) and failures:
        check["failure_sample"] = failures[:3]
    return check


# ------------------------------------------------------------ raw baseline
def raw_kafka(bootstrap: str, conn: str, n: int, size: int, meter: CpuMeter,
              latency_samples: int) -> list[Phase]:
    settings = parse_connection_string(conn)
    topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    payload = os.urandom(size)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 2,
                         "batch.num.messages": 10_000, "compression.type": "none"})
    errors: list[Any] = []
    # An idempotent producer's first ack waits for InitProducerId (~0.5-1 s on
    # Tansu): pay that before the clock starts, as the settlement sender does.
    producer.produce(topic, payload, key=b"warm-up")
    producer.flush(15)

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    def produce(key: bytes) -> None:
        while True:
            try:
                producer.produce(topic, payload, key=key, on_delivery=delivered)
                return
            except BufferError:
                producer.poll(0.05)

    phases = []
    with Timed(meter) as t:
        for i in range(n):
            produce(b"r-%d" % i)
            if i % 1000 == 999:
                producer.poll(0)
        producer.flush(60)
    if errors:
        raise RuntimeError(f"raw produce failed: {errors[0]}")
    phases.append(Phase("raw_produce", "raw produce (acks=all, idempotent, streaming)", n,
                        t.seconds, cpu=t.cpu))

    # The same, but waiting for the acks of every 1000 like send_messages(list) does.
    with Timed(meter) as t:
        for start in range(0, n, 1000):
            for i in range(start, min(n, start + 1000)):
                produce(b"s-%d" % i)
            producer.flush(60)
    phases.append(Phase("raw_produce_lists", "raw produce, flush every 1000", n, t.seconds,
                        cpu=t.cpu))

    # Consume n records (after the warm-up one) with a plain assigned consumer,
    # no commits. consume() returns once it has num_messages or at the timeout.
    consumer = Consumer(settings.consumer_config(f"bench-raw-{uuid.uuid4().hex[:8]}"))
    got, seen_bytes = 0, 0
    with Timed(meter) as t:
        consumer.assign([TopicPartition(topic, 0, 1)])
        deadline = time.monotonic() + 120
        while got < n and time.monotonic() < deadline:
            for record in consumer.consume(num_messages=1000, timeout=0.1):
                if record.error() is None and record.offset() <= n:
                    got += 1
                    seen_bytes += len(record.value())
    consumer.close()
    if got < n:
        log.warning("raw consumer read only %d of %d records", got, n)
    phases.append(Phase("raw_consume", "raw consume (assign, no commits)", got, t.seconds,
                        cpu=t.cpu))

    # Produce-to-ack latency of single records: the floor of any round trip
    # through the broker that needs one durable write.
    lat = []
    for i in range(latency_samples):
        t0 = time.perf_counter()
        produce(b"l-%d" % i)
        producer.flush(10)
        lat.append((time.perf_counter() - t0) * 1000)
    producer.flush(10)
    phases.append(Phase("raw_ack_latency", "raw single produce -> ack latency",
                        latency_samples, sum(lat) / 1000, unit="ms",
                        extra=latency_figures(lat)))
    phases.append(raw_round_trip(admin, settings, latency_samples))
    return phases


def raw_round_trip(admin: AdminClient, settings: Any, samples: int) -> Phase:
    """Request and reply through the broker with nothing in between: the floor
    of any engine round trip. An echo thread consumes each request and produces
    it, durably, to a reply topic that the caller consumes; both consumers use
    the connection's own fetch settings."""
    request, reply = (f"bench-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("req", "rep"))
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in (request, reply)]).values():
        f.result(15)
    stop = threading.Event()

    def durable_producer() -> Producer:
        return Producer({"bootstrap.servers": settings.bootstrap_servers, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 0})

    def echo() -> None:
        producer = durable_producer()
        consumer = Consumer(settings.consumer_config(f"bench-echo-{uuid.uuid4().hex[:8]}"))
        consumer.assign([TopicPartition(request, 0, 0)])
        while not stop.is_set():
            record = consumer.poll(0.1)  # consume(n) would wait for n records
            if record is not None and record.error() is None:
                producer.produce(reply, record.value())
                producer.flush(10)
        consumer.close()

    echoer = threading.Thread(target=echo, name="bench-echo", daemon=True)
    echoer.start()
    caller = durable_producer()
    caller.produce(request, b"warm-up")
    caller.flush(15)
    consumer = Consumer(settings.consumer_config(f"bench-caller-{uuid.uuid4().hex[:8]}"))
    consumer.assign([TopicPartition(reply, 0, 0)])
    lat: list[float] = []
    for i in range(samples + 1):
        t0 = time.perf_counter()
        caller.produce(request, b"%d" % i)
        caller.flush(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            record = consumer.poll(0.5)
            if record is not None and record.error() is None:
                break
        if i:  # the first answers the warm-up request too
            lat.append((time.perf_counter() - t0) * 1000)
    stop.set()
    echoer.join(5)
    consumer.close()
    return Phase("raw_round_trip", "raw request -> echo -> reply round trip", len(lat),
                 sum(lat) / 1000, unit="ms", extra=latency_figures(lat))


def latency_figures(lat: list[float]) -> dict[str, Any]:
    return {"p50_ms": round(percentile(lat, 50), 2), "p90_ms": round(percentile(lat, 90), 2),
            "p99_ms": round(percentile(lat, 99), 2),
            "max_ms": round(max(lat), 2) if lat else None,
            "mean_ms": round(statistics.fmean(lat), 2) if lat else None}


# ----------------------------------------------------------- settlement layer
def make_messages(prefix: str, n: int, size: int) -> list[ServiceBusMessage]:
    body = os.urandom(size)
    return [ServiceBusMessage(body, message_id=f"{prefix}-{i}") for i in range(n)]


def warm_sender(client: ServiceBusClient, queue: str, first: ServiceBusMessage
                ) -> tuple[ServiceBusSender, float]:
    """A sender whose producer is connected and has its producer id: sends
    ``first`` (one of the phase's messages) and returns how long that took."""
    sender = client.get_queue_sender(queue)
    t0 = time.perf_counter()
    sender.send_messages(first)
    return sender, time.perf_counter() - t0


def send(client: ServiceBusClient, queue: str, messages: list[ServiceBusMessage],
         chunk: int) -> None:
    sender, _ = warm_sender(client, queue, messages[0])
    for start in range(1, len(messages), chunk):
        sender.send_messages(messages[start:start + chunk])
    sender.close()


def settle_in_batches(client: ServiceBusClient, queue: str, ids: list[str], batch: int,
                      meter: CpuMeter) -> Phase:
    # prefetch_count: the next batch is locked while this one is settled
    receiver = client.get_queue_receiver(queue, prefetch_count=batch)
    received: Counter[str] = Counter()
    settled: Counter[str] = Counter()
    failures = rounds = 0
    with Timed(meter) as t:
        while sum(settled.values()) + failures < len(ids):
            msgs = receiver.receive_messages(batch, max_wait_time=IDLE_S)
            if not msgs:
                log.warning("peek-lock: nothing received for %.0fs; giving up", IDLE_S)
                break
            rounds += 1
            received.update(m.message_id for m in msgs)
            for result in receiver.complete_messages(msgs):
                if result.succeeded:
                    settled[result.message.message_id] += 1
                else:
                    failures += 1
    check = final_check([receiver], ids, received, settled, failures, batch)
    return Phase("peek_lock_batch", f"peek-lock receive({batch}) + complete_messages(batch), "
                 f"prefetch_count={batch}",
                 len(ids), t.seconds, cpu=t.cpu, check=check,
                 extra={"receive_rounds": rounds,
                        "mean_batch": round(sum(received.values()) / max(rounds, 1), 1)})


def batches(receiver: Any, batch: int, stop: threading.Event) -> Iterator[list[Any]]:
    """Received batches until ``stop`` is set or nothing came for IDLE_S seconds."""
    idle_since = time.monotonic()
    while not stop.is_set():
        msgs = receiver.receive_messages(batch, max_wait_time=0.5)
        if msgs:
            idle_since = time.monotonic()
            yield msgs
        elif time.monotonic() - idle_since > IDLE_S:
            return


def settle_batches_threads(client: ServiceBusClient, queue: str, ids: list[str],
                           threads: int, batch: int, meter: CpuMeter) -> Phase:
    """Several threads, each with its own receiver, each doing
    ``receive_messages(batch)`` + ``complete_messages``: round trips overlap."""
    receivers = [client.get_queue_receiver(queue) for _ in range(threads)]
    received: Counter[str] = Counter()
    settled: Counter[str] = Counter()
    lock = threading.Lock()
    failures: list[str] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def work(receiver: Any, timer: Timed) -> None:
        try:
            for msgs in batches(receiver, batch, done):
                results = receiver.complete_messages(msgs)
                with lock:
                    received.update(m.message_id for m in msgs)
                    for result in results:
                        if result.succeeded:
                            settled[result.message.message_id] += 1
                        else:
                            failures.append(f"{result.message.message_id}: {result.error}")
                    if sum(settled.values()) + len(failures) >= len(ids):
                        timer.stop()
                        done.set()
        except BaseException as exc:  # report, do not hang the bench
            errors.append(exc)

    with Timed(meter) as t:
        workers = [threading.Thread(target=work, args=(r, t), name=f"bench-b{i}", daemon=True)
                   for i, r in enumerate(receivers)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    if errors:
        raise errors[0]
    check = final_check(receivers, ids, received, settled, failures, batch)
    return Phase("peek_lock_batch_threads",
                 f"peek-lock, {threads} threads x receive({batch}) + complete_messages",
                 sum(settled.values()), t.seconds, cpu=t.cpu, check=check)


def settle_per_message_threads(client: ServiceBusClient, queue: str, ids: list[str],
                               threads: int, batch: int, budget: float,
                               meter: CpuMeter) -> Phase:
    """Each thread: its own receiver (a PartitionReader is not thread-safe),
    ``receive_messages(batch)``, then one ``complete_message`` per message.

    The clock stops when the last expected message is settled or after
    ``budget`` seconds; the rate counts what was settled by then. Threads then
    finish the messages they hold and whatever is left is drained with batch
    settlements (untimed), so the exactly-once check still covers every id."""
    receivers = [client.get_queue_receiver(queue) for _ in range(threads)]
    received: Counter[str] = Counter()
    settled: Counter[str] = Counter()
    lock = threading.Lock()
    failures: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []
    at_stop = {"settled": 0}

    def stop_clock(timer: Timed) -> None:
        if not stop.is_set():
            timer.stop()
            at_stop["settled"] = sum(settled.values())
            stop.set()

    def work(receiver: Any, timer: Timed) -> None:
        try:
            for msgs in batches(receiver, batch, stop):
                with lock:
                    received.update(m.message_id for m in msgs)
                for m in msgs:  # finish what this thread holds, even after the clock
                    try:
                        receiver.complete_message(m)
                    except ServiceBusError as exc:
                        with lock:
                            failures.append(f"{m.message_id}: {exc}")
                        continue
                    with lock:
                        settled[m.message_id] += 1
                        if sum(settled.values()) + len(failures) >= len(ids):
                            stop_clock(timer)
        except BaseException as exc:  # report, do not hang the bench
            errors.append(exc)

    with Timed(meter) as t:
        workers = [threading.Thread(target=work, args=(r, t), name=f"bench-{i}", daemon=True)
                   for i, r in enumerate(receivers)]
        for w in workers:
            w.start()
        deadline = time.monotonic() + budget
        while not stop.is_set() and any(w.is_alive() for w in workers):
            stop.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                with lock:
                    stop_clock(t)
        for w in workers:
            w.join()
    if errors:
        raise errors[0]
    timed = at_stop["settled"] if stop.is_set() else sum(settled.values())
    # Drain what the budget left behind (not timed), then check every id.
    drained = 0
    if sum(settled.values()) + len(failures) < len(ids):
        drain = client.get_queue_receiver(queue)
        while sum(settled.values()) + len(failures) < len(ids):
            msgs = drain.receive_messages(500, max_wait_time=IDLE_S)
            if not msgs:
                break
            received.update(m.message_id for m in msgs)
            for result in drain.complete_messages(msgs):
                if result.succeeded:
                    settled[result.message.message_id] += 1
                    drained += 1
                else:
                    failures.append(f"{result.message.message_id}: {result.error}")
        drain.close()
    check = final_check(receivers, ids, received, settled, failures, 500)
    return Phase("peek_lock_threads",
                 f"peek-lock, {threads} threads x complete_message (receive({batch}))",
                 timed, t.seconds, cpu=t.cpu, check=check,
                 extra={"budget_s": budget, "stopped_by_budget": timed < len(ids),
                        "settled_after_clock": len(ids) - timed - drained,
                        "drained_untimed": drained})


def sdk_loop(client: ServiceBusClient, queue: str, ids: list[str], meter: CpuMeter) -> Phase:
    """The loop people porting from azure-servicebus write first:
    ``for message in receiver: receiver.complete_message(message)``."""
    receiver = client.get_queue_receiver(queue, max_wait_time=IDLE_S)
    received: Counter[str] = Counter()
    settled: Counter[str] = Counter()
    failures = 0
    with Timed(meter) as t:
        for message in receiver:
            received[message.message_id] += 1
            try:
                receiver.complete_message(message)
                settled[message.message_id] += 1
            except ServiceBusError:
                failures += 1
            if sum(settled.values()) + failures >= len(ids):
                break
    check = final_check([receiver], ids, received, settled, failures, 100)
    return Phase("sdk_loop", "for m in receiver: complete_message(m), one thread",
                 sum(settled.values()), t.seconds, cpu=t.cpu, check=check)


def process_settling_each(client: ServiceBusClient, queue: str, ids: list[str],
                          concurrency: int, meter: CpuMeter) -> Phase:
    """``receiver.process`` with a handler that completes its own message."""
    receiver = client.get_queue_receiver(queue)
    received: Counter[str] = Counter()
    settled: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(message: Any) -> None:
        with lock:
            received[message.message_id] += 1
        receiver.complete_message(message)
        with lock:
            settled[message.message_id] += 1

    with Timed(meter) as t:
        stats = receiver.process(handler, max_concurrent_calls=concurrency,
                                 max_wait_time=IDLE_S, max_message_count=len(ids))
    check = final_check([receiver], ids, received, settled, stats["lock_lost"], 100)
    return Phase("process_settling_each",
                 f"process(max_concurrent_calls={concurrency}), handler completes each",
                 sum(settled.values()), t.seconds, cpu=t.cpu, check=check,
                 extra={"max_concurrent_calls": concurrency})


def receive_and_delete(client: ServiceBusClient, queue: str, ids: list[str], batch: int,
                       meter: CpuMeter) -> Phase:
    receiver = client.get_queue_receiver(queue,
                                         receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE)
    received: Counter[str] = Counter()
    with Timed(meter) as t:
        while sum(received.values()) < len(ids):
            msgs = receiver.receive_messages(batch, max_wait_time=IDLE_S)
            if not msgs:
                log.warning("receive-and-delete: nothing received for %.0fs; giving up", IDLE_S)
                break
            received.update(m.message_id for m in msgs)
    leftover = receiver.receive_messages(batch, max_wait_time=0.5)
    receiver.close()
    received.update(m.message_id for m in leftover)
    # In this mode a message is settled by being received.
    check = check_exactly_once(ids, received, received)
    return Phase("receive_and_delete", f"receive-and-delete receive({batch})", len(ids),
                 t.seconds, cpu=t.cpu, check=check)


def settle_latency(client: ServiceBusClient, queue: str, ids: list[str],
                   meter: CpuMeter) -> Phase:
    receiver = client.get_queue_receiver(queue)
    msgs: list[Any] = []
    deadline = time.monotonic() + 60
    while len(msgs) < len(ids) and time.monotonic() < deadline:
        msgs += receiver.receive_messages(len(ids) - len(msgs), max_wait_time=IDLE_S)
    received = Counter(m.message_id for m in msgs)
    settled: Counter[str] = Counter()
    lat: list[float] = []
    failures = 0
    with Timed(meter) as t:
        for m in msgs:
            t0 = time.perf_counter()
            try:
                receiver.complete_message(m)
            except ServiceBusError:
                failures += 1
                continue
            lat.append((time.perf_counter() - t0) * 1000)
            settled[m.message_id] += 1
    receiver.close()
    check = check_exactly_once(ids, received, settled, failures)
    return Phase("settle_latency", "single complete_message latency", len(lat),
                 sum(lat) / 1000, unit="ms", cpu=t.cpu, check=check,
                 extra=latency_figures(lat))


# ------------------------------------------------------------------- engine
def wait_for_engine(client: ServiceBusClient, queue: str, worker: subprocess.Popen[bytes],
                    timeout: float = 120.0) -> float:
    """Block until the engine answers an acquire on ``queue`` (an empty queue)."""
    t0 = time.monotonic()
    receiver = client.get_queue_receiver(queue)
    while True:
        if worker.poll() is not None:
            raise RuntimeError(f"the engine worker exited with code {worker.returncode}")
        try:
            receiver.receive_messages(1, max_wait_time=0)
            receiver.close()
            return time.monotonic() - t0
        except OperationTimeoutError:
            if time.monotonic() - t0 > timeout:
                raise


# ------------------------------------------------------------------- report
def fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def render(machine: dict[str, Any], args: argparse.Namespace, phases: dict[str, Phase],
           derived: dict[str, Any]) -> str:
    raw_p, raw_c = phases["raw_produce"].rate, phases["raw_consume"].rate
    lines = [
        "",
        f"Settlement layer benchmark ({broker_label(args.broker)}, 1 engine worker)",
        f"machine: {machine['cores']} cores ({machine['usable_cores']} usable), "
        f"{machine['cpu_model']}; {machine['implementation']} {machine['python']}; "
        f"confluent-kafka {machine['confluent_kafka']} / librdkafka {machine['librdkafka']}",
        f"messages per phase: {args.messages:,} x {args.size} B bodies",
        "",
    ]
    head = (f"{'figure':<52} {'result':>12}  {'raw Kafka baseline':>24}  {'vs raw':>7}"
            f"  {'cores busy client/engine/broker':>31}")
    lines += [head, "-" * len(head)]

    def row(label: str, value: str, base: str, ratio: str, cpu: dict[str, float]) -> None:
        busy = "/".join(f"{cpu.get(k, 0):.2f}" for k in ("client", "engine", "broker")) \
            if cpu else ""
        lines.append(f"{label:<52} {value:>12}  {base:>24}  {ratio:>7}  {busy:>31}")

    def thr(key: str, base_rate: float, base_label: str) -> None:
        p = phases[key]
        row(p.label + (" [!]" if p.check and not p.check.get("ok") else ""),
            fmt_rate(p.rate) + " /s", f"{fmt_rate(base_rate)} /s {base_label}",
            f"{p.rate / base_rate:.0%}" if base_rate else "", p.cpu)

    thr("raw_produce", raw_p, "(itself)")
    thr("raw_produce_lists", raw_p, "produce")
    thr("raw_consume", raw_c, "(itself)")
    thr("send", phases["raw_produce_lists"].rate, "flush/1000")
    thr("peek_lock_batch", raw_c, "consume")
    e2e = derived["end_to_end_rate"]
    raw_e2e = derived["raw_end_to_end_rate"]
    row("  end to end: send + receive + complete_messages", fmt_rate(e2e) + " /s",
        f"{fmt_rate(raw_e2e)} /s prod+cons", f"{e2e / raw_e2e:.0%}" if raw_e2e else "", {})
    plain = phases["peek_lock_batch"]
    thr("peek_lock_lifecycle", plain.rate, "plain peek-lock")
    thr("peek_lock_batch_threads", raw_c, "consume")
    thr("peek_lock_threads", raw_c, "consume")
    pt = phases["peek_lock_threads"]
    if pt.extra.get("stopped_by_budget"):
        lines.append(f"  (clock stopped by the {pt.extra['budget_s']:.0f}s budget after "
                     f"{pt.messages:,} settled; the rest was drained untimed and checked)")
    thr("sdk_loop", raw_c, "consume")
    thr("process_settling_each", raw_c, "consume")
    thr("receive_and_delete", raw_c, "consume")
    if "spark_source" in phases:
        thr("spark_source", raw_c, "consume")
    if "monitor_delay" in phases:
        delay = phases["monitor_delay"]
        row(f"{delay.label} p50 (n={delay.messages})", f"{delay.extra['p50_s']:.2f} s",
            "", "", delay.cpu)
        row(f"{delay.label} max", f"{delay.extra['max_s']:.2f} s", "", "", {})
    lat, raw_lat = phases["settle_latency"], phases["raw_ack_latency"]
    row(f"{lat.label} p50 (n={lat.messages})", f"{lat.extra['p50_ms']:.2f} ms",
        f"{raw_lat.extra['p50_ms']:.2f} ms produce->ack", "", lat.cpu)
    row(f"{lat.label} p99", f"{lat.extra['p99_ms']:.2f} ms",
        f"{raw_lat.extra['p99_ms']:.2f} ms produce->ack", "", {})
    trip = phases["raw_round_trip"]
    row(f"{trip.label} p50", f"{trip.extra['p50_ms']:.2f} ms", "", "", {})
    if "share_group_batch" in phases:
        lines += ["", "the peer, on the same broker: Kafka share groups (KIP-932), "
                  "confluent-kafka ShareConsumer, explicit acknowledge"]
        peer, ack = phases["share_group_batch"], phases["share_group_ack_latency"]
        thr("share_group_batch", raw_c, "consume")
        row("  this project, receive + complete_messages (above)", fmt_rate(plain.rate) + " /s",
            f"{fmt_rate(peer.rate)} /s share group", f"{plain.rate / peer.rate:.0%}"
            if peer.rate else "", {})
        row(f"{ack.label} p50 (n={ack.messages})", f"{ack.extra['p50_ms']:.2f} ms",
            f"{lat.extra['p50_ms']:.2f} ms complete_message", "", ack.cpu)
        row(f"{ack.label} p99", f"{ack.extra['p99_ms']:.2f} ms",
            f"{lat.extra['p99_ms']:.2f} ms complete_message", "", {})
    lines += ["", "targets (issue 9), measured in this run:"]
    lines += render_targets(phases)
    for p in phases.values():
        if p.check and not p.check.get("ok"):
            lines.append(f"WARNING: {p.label}: not every message settled exactly once: "
                         f"{json.dumps(p.check)}")
    if all(p.check.get("ok", True) for p in phases.values()):
        lines.append("exactly-once check: every message of every settled phase was received "
                     "and settled exactly once, none left in the queue")
    lines.append("cores busy = CPU seconds / wall seconds of each process during the phase")
    return "\n".join(lines)


def render_targets(phases: dict[str, Phase]) -> list[str]:
    """Each target with its figure, by how much it is missed, and why, from
    the other figures of the same run."""
    lines = []
    for target in TARGETS:
        value = target.measured(phases)
        unit = "ms" if target.at_most else "msg/s"
        if target.met(phases):
            verdict = "met"
        elif target.at_most:
            verdict = f"MISSED by {value - target.goal:.2f} ms ({value / target.goal:.1f}x)"
        else:
            verdict = f"MISSED: {value / target.goal:.0%} of it"
        lines.append(f"  {target.label}: {value:,.2f} {unit} -> {verdict}")
        if not target.met(phases):
            lines.append(f"    why: {why_missed(target, phases)}")
    return lines


def why_missed(target: Target, phases: dict[str, Phase]) -> str:
    """The figures of this run that bound the missed one."""
    latency, trip = phases["settle_latency"].extra, phases["raw_round_trip"].extra
    ack = phases["raw_ack_latency"].extra
    engine_ms = latency["p50_ms"] - trip["p50_ms"] - ack["p50_ms"]
    if target.phase == "settle_latency":
        return (f"a settlement is a request and a reply through the broker, whose floor with "
                f"nothing in between is {trip['p50_ms']:.2f} ms p50 here (raw round trip), "
                f"plus the engine's durable commit record ({ack['p50_ms']:.2f} ms ack), plus "
                f"{engine_ms:.2f} ms in the engine's Faust consumer, agent and producer")
    if target.phase == "sdk_loop":
        return (f"one thread waits for each answer: at this run's p50 of "
                f"{latency['p50_ms']:.2f} ms per settlement the ceiling is "
                f"{1000 / latency['p50_ms']:,.0f} msg/s")
    cpu = phases[target.phase].cpu
    busy = (", ".join(f"{k} {cpu.get(k, 0):.2f}" for k in ("client", "engine", "broker"))
            + f" of {os.cpu_count()} cores")
    if target.phase == "process_settling_each":
        calls = phases[target.phase].extra["max_concurrent_calls"]
        return (f"each handler waits for its own answer (concurrent answers share commands): "
                f"{calls} handlers at this run's p50 of {latency['p50_ms']:.2f} ms give at "
                f"most {calls * 1000 / latency['p50_ms']:,.0f} msg/s; busy: {busy}")
    p = phases[target.phase]
    per_round = p.seconds * 1000 / max(p.extra["receive_rounds"], 1)
    return (f"a round of {p.extra['mean_batch']:,.0f} messages takes {per_round:.1f} ms: "
            f"receive and complete_messages are one engine command each, one after the "
            f"other, and no process is saturated (busy: {busy}): rounds wait on each other")


# --------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    add_broker_argument(p)
    p.add_argument("--messages", "-n", type=int, default=20_000,
                   help="messages per throughput phase (default 20000)")
    p.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    p.add_argument("--send-chunk", type=int, default=1000,
                   help="messages per send_messages call (default 1000)")
    p.add_argument("--batch", type=int, default=1000,
                   help="max_message_count of batch receives (default 1000)")
    p.add_argument("--batch-threads", type=int, default=4,
                   help="threads of the concurrent batch phase (default 4)")
    p.add_argument("--threads", type=int, default=8, help="threads of the per-message phase")
    p.add_argument("--thread-batch", type=int, default=50,
                   help="max_message_count of each thread's receives (default 50)")
    p.add_argument("--loop-messages", type=int, default=2000,
                   help="messages of the one-thread SDK loop phase (default 2000)")
    p.add_argument("--concurrent-calls", type=int, default=32,
                   help="max_concurrent_calls of the process phase (default 32)")
    p.add_argument("--budget", type=float, default=30.0,
                   help="seconds the per-message thread phase may run before its clock "
                        "stops; the rest is drained untimed (default 30)")
    p.add_argument("--latency-samples", type=int, default=300,
                   help="single complete_message calls timed (default 300)")
    p.add_argument("--output", type=Path, default=None,
                   help="where to write the JSON results (default "
                        "bench/results/latest-kafka.json, latest-tansu.json on Tansu)")
    p.add_argument("--no-spark", action="store_true",
                   help="skip the Spark phases (they start a SparkSession, ~15 s)")
    p.add_argument("--monitor-samples", type=int, default=5,
                   help="settlements timed into the Spark monitor's sink")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the broker and worker logs and the engine's data dir")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    if args.output is None:
        args.output = results_path("latest", args.broker)
    machine = machine_info()
    work = Path(tempfile.mkdtemp(prefix="settlement-bench-"))
    n, size = args.messages, args.size
    phases: dict[str, Phase] = {}
    started = time.monotonic()
    ok = False
    print(f"bench: {n:,} messages x {size} B per phase; scratch dir {work}", flush=True)
    broker = new_broker(args.broker, work).start()
    worker = None
    try:
        conn = broker.connection_string(NAMESPACE)
        worker = EngineProcess(conn, work / "engine", timer_interval=0.5).start()
        pids = {"client": os.getpid(), "engine": worker.pid, "broker": broker_pid(broker)}
        meter = CpuMeter(pids)

        def step(msg: str) -> None:
            print(f"[{time.monotonic() - started:6.1f}s] {msg}", flush=True)

        admin = ServiceBusAdministrationClient.from_connection_string(conn)
        queues = ["warmup", "peek", "batchthreads", "threads", "loop", "process", "rad",
                  "latency", "probe"]
        for q in queues:
            admin.create_queue(q, lock_duration=LOCK_SECONDS, max_delivery_count=10)
        # The same workload with duplicate detection and a time to live: the
        # engine reads these headers before it hands messages out.
        admin.create_queue("lifecycle", lock_duration=LOCK_SECONDS, max_delivery_count=10,
                           requires_duplicate_detection=True,
                           default_message_time_to_live=3600)
        with ServiceBusClient.from_connection_string(conn) as client:
            ready = wait_for_engine(client, "warmup", worker.proc)
            step(f"engine ready after {ready:.1f}s")

            # Warm-up: connections, readers and the engine's first windows.
            warm = make_messages("w", min(2000, n), size)
            send(client, "warmup", warm, args.send_chunk)
            settle_in_batches(client, "warmup", [m.message_id for m in warm], args.batch, meter)
            step("warm-up done")

            step("raw Kafka baseline")
            for p in raw_kafka(broker.bootstrap, conn, n, size, meter, args.latency_samples):
                phases[p.key] = p

            step(f"send_messages in lists of {args.send_chunk}")
            msgs = make_messages("p", n + 1, size)
            sender, first_send = warm_sender(client, "peek", msgs[0])
            with Timed(meter) as t:
                for start in range(1, len(msgs), args.send_chunk):
                    sender.send_messages(msgs[start:start + args.send_chunk])
            sender.close()
            phases["send"] = Phase("send", f"durable send_messages(list of {args.send_chunk})",
                                   n, t.seconds, cpu=t.cpu,
                                   extra={"first_send_of_new_sender_s": round(first_send, 3)})

            step(f"peek-lock receive({args.batch}) + complete_messages")
            phases["peek_lock_batch"] = settle_in_batches(
                client, "peek", [m.message_id for m in msgs], args.batch, meter)

            step(f"peek-lock receive({args.batch}) + complete_messages, duplicate detection "
                 "and TTL on")
            msgs = make_messages("l", n, size)
            send(client, "lifecycle", msgs, args.send_chunk)
            phases["peek_lock_lifecycle"] = settle_in_batches(
                client, "lifecycle", [m.message_id for m in msgs], args.batch, meter)
            phases["peek_lock_lifecycle"].key = "peek_lock_lifecycle"
            phases["peek_lock_lifecycle"].label = "  the same, duplicate detection + TTL on"

            step(f"peek-lock, {args.batch_threads} threads x receive({args.batch}) "
                 "+ complete_messages")
            msgs = make_messages("bt", n, size)
            send(client, "batchthreads", msgs, args.send_chunk)
            phases["peek_lock_batch_threads"] = settle_batches_threads(
                client, "batchthreads", [m.message_id for m in msgs], args.batch_threads,
                args.batch, meter)

            step(f"peek-lock, {args.threads} threads, complete_message each")
            msgs = make_messages("t", n, size)
            send(client, "threads", msgs, args.send_chunk)
            phases["peek_lock_threads"] = settle_per_message_threads(
                client, "threads", [m.message_id for m in msgs], args.threads,
                args.thread_batch, args.budget, meter)

            step(f"the SDK loop, {args.loop_messages:,} messages")
            msgs = make_messages("o", args.loop_messages, size)
            send(client, "loop", msgs, args.send_chunk)
            phases["sdk_loop"] = sdk_loop(client, "loop", [m.message_id for m in msgs], meter)

            step(f"process(max_concurrent_calls={args.concurrent_calls}), handler settles each")
            msgs = make_messages("c", n, size)
            send(client, "process", msgs, args.send_chunk)
            phases["process_settling_each"] = process_settling_each(
                client, "process", [m.message_id for m in msgs], args.concurrent_calls, meter)

            step(f"receive-and-delete receive({args.batch})")
            msgs = make_messages("d", n, size)
            send(client, "rad", msgs, args.send_chunk)
            phases["receive_and_delete"] = receive_and_delete(
                client, "rad", [m.message_id for m in msgs], args.batch, meter)

            if not args.no_spark:
                from bench.spark_phases import monitor_delay, spark_source_read
                from spark.session import spark_session

                step("Spark source read (starting a SparkSession)")
                spark = spark_session("settlement-bench")
                phases["spark_source"] = spark_source_read(spark, broker.bootstrap, n, size,
                                                           meter)
                step(f"settlement -> monitor sink delay, {args.monitor_samples} samples")
                phases["monitor_delay"] = monitor_delay(spark, client, conn, "probe",
                                                        args.monitor_samples, meter)
                spark.stop()

            step(f"latency of {args.latency_samples} single complete_message calls")
            msgs = make_messages("l", args.latency_samples, size)
            send(client, "latency", msgs, args.send_chunk)
            phases["settle_latency"] = settle_latency(
                client, "latency", [m.message_id for m in msgs], meter)

            if args.broker == "kafka":
                from bench.share_groups import share_group_ack_latency, share_group_throughput

                step("the peer: Kafka share groups, batch and one acknowledge at a time")
                phases["share_group_batch"] = share_group_throughput(
                    broker.bootstrap, n, size, meter)
                phases["share_group_ack_latency"] = share_group_ack_latency(
                    broker.bootstrap, args.latency_samples, size, meter)

            runtime = {q: admin.get_queue_runtime_properties(q) for q in queues}
        admin.close()

        send_s = phases["send"].seconds
        settle_s = phases["peek_lock_batch"].seconds
        raw_s = phases["raw_produce"].seconds + phases["raw_consume"].seconds
        derived = {
            "end_to_end_seconds": round(send_s + settle_s, 3),
            "end_to_end_rate": round(n / (send_s + settle_s), 1),
            "raw_end_to_end_rate": round(n / raw_s, 1),
            "best_settled_peek_lock_rate": round(max(
                phases[k].rate for k in ("peek_lock_batch", "peek_lock_batch_threads",
                                         "peek_lock_threads")), 1),
            "targets": {t.label: {"goal": t.goal, "measured": round(t.measured(phases), 2),
                                  "met": t.met(phases)} for t in TARGETS},
        }
        leftovers = {q: {"active": r.active_message_count, "locked": r.locked_message_count,
                         "dead_letter": r.dead_letter_message_count}
                     for q, r in runtime.items()}
        if any(v["active"] or v["locked"] or v["dead_letter"] for v in leftovers.values()):
            log.warning("queues are not empty after the bench: %s", leftovers)
        print(render(machine, args, phases, derived), flush=True)
        result = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine,
            "parameters": {k: (str(v) if isinstance(v, Path) else v)
                           for k, v in vars(args).items()},
            "phases": {k: p.as_dict() for k, p in phases.items()},
            "derived": derived,
            "queues_after": leftovers,
            "exactly_once_ok": all(p.check.get("ok", True) for p in phases.values()),
            "total_seconds": round(time.monotonic() - started, 1),
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {args.output} (whole bench {result['total_seconds']}s)")
        ok = result["exactly_once_ok"]
    finally:
        if worker is not None:
            worker.stop()
        broker.stop()
        if args.keep_logs or not ok:
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KafkaException as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(2)
