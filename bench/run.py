"""Throughput and latency of the settlement layer against raw Kafka.

``python -m bench.run [--broker kafka|tansu] [--messages N] [--size 1024]``
starts a broker (Apache Kafka from Maven Central, one node, by default; or
Tansu, the embedded broker) and one engine worker subprocess, then measures
on that one broker:

1. raw Kafka: confluent-kafka produce (acks=all, idempotent) and a plain
   assigned consumer (no commits), on a fresh topic; the produce -> ack p50
   of single records is the floor F of any settlement;
2. durable sends through ``ServiceBusSender.send_messages`` in lists;
3. peek-lock: ``receive_messages(batch)`` + ``complete_messages(batch)``,
   with the engine commands per second it costs;
4. peek-lock: ``receive_messages`` + one ``complete_message`` per message,
   from one thread and from several threads, each thread with its own
   receiver of one client;
5. asyncio (``settlement.aio``): ``receive_messages(100)`` + ``asyncio.gather``
   of one ``complete_message`` per message, one receiver, one event loop;
6. ``for m in receiver: complete_message(m)`` and ``receiver.process`` with a
   handler that completes its message;
7. receive-and-delete;
8. latency of ``complete_message`` after ``receive_messages(1)`` (p50/p99);
9. Spark (``bench.spark_phases``): records/s the Kafka source reads, and the
   delay from a settlement to its row in the monitor's sink (2 s trigger);
10. on Apache Kafka, the peer: Kafka's own queues (KIP-932 share groups,
    ``bench.share_groups``) doing the same work, batch and one at a time.

On Apache Kafka the run ends with the targets of issue 24, goals that depend
on F computed from the same run. Each phase with a rate target (3-6) runs
``TRIALS`` (3) times, each trial on a queue and messages of its own, one
after the other; the median trial is the phase's figure, and every trial's
is printed beside it.

Every settled phase checks by message id that each message was settled
exactly once. The table goes to stdout and the same figures as JSON to
``bench/results/latest-kafka.json`` (``latest-tansu.json`` on Tansu). CPU
seconds of the client, engine and broker processes are recorded per phase
to show which one is the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.brokers import add_broker_argument, broker_label, broker_pid, new_broker, results_path
from bench.measure import (
    BROKER_JIT,
    CLIENT_GC,
    CpuMeter,
    EngineDurations,
    Phase,
    Timed,
    median_trial,
    percentile,
    python_speed,
    warm_line,
    warm_up,
)
from settlement import ServiceBusClient, ServiceBusMessage
from settlement.exceptions import OperationTimeoutError, ServiceBusError
from settlement.management import ServiceBusAdministrationClient
from settlement.receiver import ServiceBusReceiveMode
from settlement.sender import ServiceBusSender
from settlement.testing._local_broker import free_port
from streams.placement import measure_wakes
from streams.process import EngineProcess
from topics import names
from topics.connection import parse_connection_string

NAMESPACE = "bench"
#: how many times each phase with a rate target runs, each trial on a queue
#: and messages of its own; the median is kept, every trial printed beside it.
#: One run of a phase is 0.4-8 s, and the speed of these machines moves
#: within a minute: the batched phase, four times in a row on one broker (a
#: harness, 2026-12-03, AMD EPYC, idle), 37,939, 46,656, 53,422, 52,794 /s.
TRIALS = 3
#: the queues of the phases run TRIALS times (queue ``base`` + trial number)
TRIAL_QUEUES = ("peek", "onethread", "threads", "aio", "loop", "process")
LOCK_SECONDS = 300  # the longest lock a queue allows: no lapse can blur the counts
IDLE_S = 10.0       # a phase gives up after this long without a message

log = logging.getLogger("bench")


def floor_ms(phases: dict[str, Phase]) -> float:
    """F: this run's raw produce -> ack p50 in ms, the durable floor of any settlement."""
    return float(phases["raw_ack_latency"].extra["p50_ms"])


@dataclass(frozen=True)
class Target:
    """A figure the project promises (issue 24), checked on every run on Apache Kafka."""
    label: str         # "{goal}" in it is the goal computed for this run
    phase: str
    figure: str        # "rate", or a key of the phase's extra figures
    goal_of_floor: Callable[[float], float]  # the goal, from this run's floor F (ms)
    at_most: bool      # latencies: at most the goal; rates: at least
    beside: str = ""   # printed after the figure, formatted with the phase's extra figures

    def goal(self, phases: dict[str, Phase]) -> float:
        return self.goal_of_floor(floor_ms(phases))

    def title(self, phases: dict[str, Phase]) -> str:
        return self.label.format(goal=self.goal(phases))

    def measured(self, phases: dict[str, Phase]) -> float:
        p = phases[self.phase]
        return p.rate if self.figure == "rate" else float(p.extra[self.figure])

    def met(self, phases: dict[str, Phase]) -> bool:
        value, goal = self.measured(phases), self.goal(phases)
        return value <= goal if self.at_most else value >= goal


def _one_thread_goal(floor: float) -> float:
    """min(2,500, 500 / F) msg/s; a floor that rounds to 0 ms leaves 2,500."""
    return min(2_500.0, 500 / floor) if floor > 0 else 2_500.0


TARGETS = (
    Target("complete_message p50 <= max(1, 3F) = {goal:.2f} ms", "settle_latency", "p50_ms",
           lambda f: max(1.0, 3 * f), True),
    Target("complete_message p99 <= 10 ms", "settle_latency", "p99_ms", lambda f: 10, True),
    Target("receive_messages(100) + complete_message each, one thread >= "
           "min(2,500, 500/F) = {goal:,.0f} msg/s", "one_thread_each", "rate",
           _one_thread_goal, False),
    Target("8 threads x receive_messages(20) + complete_message each >= 5,000 msg/s",
           "peek_lock_threads", "rate", lambda f: 5_000, False),
    Target("asyncio receive_messages(100) + gather(complete_message each) >= 15,000 msg/s",
           "aio_concurrent_complete", "receive_and_complete_rate", lambda f: 15_000, False),
    Target("for m in receiver: complete_message(m) >= 400 msg/s", "sdk_loop", "rate",
           lambda f: 400, False),
    Target("process(max_concurrent_calls=32), handler settles each >= 10,000 msg/s",
           "process_settling_each", "rate", lambda f: 10_000, False),
    Target("receive 1,000 + complete_messages(list) >= 40,000 msg/s", "peek_lock_batch",
           "rate", lambda f: 40_000, False,
           beside="engine commands at that load: {engine_commands_per_s:,.0f} /s "
                  "({engine_commands:,} records appended to the commands topic, engine side)"),
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
        "python_loop_s": python_speed(),
        "thread_wake_us": thread_wakes(),
    }


def thread_wakes() -> dict[str, float] | None:
    """How long a thread takes to wake another and be woken back, on one CPU
    and across two (us; None with one CPU): where across costs many times
    more (a nested virtual machine), every hand-over between the threads and
    processes of a round trip does (streams.placement)."""
    measured = measure_wakes()
    if measured is None:
        return None
    _, same, across = measured
    return {"same_cpu": round(same, 1), "across_cpus": round(across, 1)}


def machine_label(machine: dict[str, Any]) -> str:
    """The machine as the benches' reports name it: cores, CPU, Python, and
    how fast it ran Python when the bench started (:func:`python_speed`)."""
    speed = machine.get("python_loop_s")
    speed_text = f"; 10M Python additions in {speed:.2f} s" if speed is not None else ""
    wakes = machine.get("thread_wake_us")
    wake_text = (f"; a thread woken and answered across CPUs in {wakes['across_cpus']:.0f} us, "
                 f"on one in {wakes['same_cpu']:.0f} us" if wakes else "")
    return (f"{machine['cores']} cores ({machine['usable_cores']} usable), "
            f"{machine['cpu_model']}; {machine['implementation']} {machine['python']}"
            f"{speed_text}{wake_text}")


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


def warm_round(client: ServiceBusClient, conn: str, queue: str, size: int,
               meter: CpuMeter, number: int) -> None:
    """One round of the warm-up (:func:`bench.measure.warm_up`): the requests
    of the phases with targets, large and small, each on messages of its own.
    Each has request paths of its own in the broker: warmed on the others
    alone, the broker's compilers still took 0.13-0.24 of a core through the
    first 10 s of the one-thread phase, and 0.30-0.33 through the asyncio one
    (``conn``'s asyncio client; a harness of 2026-12-03); make bench's batched
    phase (receive 1,000 with ``prefetch_count``) and ``process`` 0.16 and 0.13
    with the warm-up of lists of a hundred and one-by-one completes alone."""
    from bench.aio import concurrent_completes  # bench.aio imports this module

    steps: list[tuple[str, int, Callable[[list[str]], object]]] = [
        ("l", 1000, lambda ids: settle_in_batches(client, queue, ids, 100, meter)),
        ("b", 2000, lambda ids: settle_in_batches(client, queue, ids, 1000, meter)),
        ("e8", 2000, lambda ids: settle_per_message_threads(
            "warm-up", client, queue, ids, 8, 20, 30.0, meter)),
        ("e1", 1000, lambda ids: settle_per_message_threads(
            "warm-up", client, queue, ids, 1, 100, 30.0, meter)),
        ("a", 1000, lambda ids: asyncio.run(concurrent_completes(conn, queue, ids, 100, meter))),
        ("p", 1000, lambda ids: process_settling_each(client, queue, ids, 32, meter)),
    ]
    for tag, count, settle in steps:
        messages = make_messages(f"w{number}{tag}", count, size)
        send(client, queue, messages, 1000)
        settle([m.message_id for m in messages])


def settle_in_batches(client: ServiceBusClient, queue: str, ids: list[str], batch: int,
                      meter: CpuMeter, commands: CommandLog | None = None) -> Phase:
    """``receive_messages(batch)`` + ``complete_messages`` until every id is
    settled; with ``commands``, also the engine commands this cost per second."""
    # prefetch_count: the next batch is locked while this one is settled
    receiver = client.get_queue_receiver(queue, prefetch_count=batch)
    # ids listed under the clock, counted after it: a Counter's += of a new
    # key calls its __missing__ in Python, and summing it every round walked
    # every id settled so far (3 % of the client's time in this phase)
    received_ids: list[str] = []
    settled_ids: list[str] = []
    failures = rounds = 0
    # read outside the clock: each read asks the broker for every partition's end
    commands_before = commands.end() if commands else 0
    with Timed(meter) as t:
        while len(settled_ids) + failures < len(ids):
            msgs = receiver.receive_messages(batch, max_wait_time=IDLE_S)
            if not msgs:
                log.warning("peek-lock: nothing received for %.0fs; giving up", IDLE_S)
                break
            rounds += 1
            received_ids += [m.message_id for m in msgs]
            for result in receiver.complete_messages(msgs):
                if result.succeeded:
                    settled_ids.append(result.message.message_id)
                else:
                    failures += 1
    received, settled = Counter(received_ids), Counter(settled_ids)
    extra: dict[str, Any] = {"receive_rounds": rounds,
                             "mean_batch": round(sum(received.values()) / max(rounds, 1), 1)}
    if commands:
        sent = commands.end() - commands_before
        extra |= {"engine_commands": sent,
                  "engine_commands_per_s": round(sent / t.seconds, 1) if t.seconds else 0.0}
    check = final_check([receiver], ids, received, settled, failures, batch)
    return Phase("peek_lock_batch", f"peek-lock receive({batch}) + complete_messages(batch), "
                 f"prefetch_count={batch}",
                 len(ids), t.seconds, cpu=t.cpu, check=check, extra=extra)


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


def settle_per_message_threads(key: str, client: ServiceBusClient, queue: str,
                               ids: list[str], threads: int, batch: int, budget: float,
                               meter: CpuMeter) -> Phase:
    """Each thread: its own receiver (a PartitionReader is not thread-safe),
    ``receive_messages(batch)``, then one ``complete_message`` per message.
    The result is phase ``key``.

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
    # counted as they come: a sum over the counter for each message cost the
    # callers 45 us each at 10,000 ids, under the lock (6-11 % of a phase)
    done = {"settled": 0}

    def stop_clock(timer: Timed) -> None:
        if not stop.is_set():
            timer.stop()
            at_stop["settled"] = done["settled"]
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
                        done["settled"] += 1
                        if done["settled"] + len(failures) >= len(ids):
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
    who = "one thread" if threads == 1 else f"{threads} threads"
    return Phase(key, f"peek-lock, {who}: receive({batch}) + complete_message each",
                 timed, t.seconds, cpu=t.cpu, check=check,
                 extra={"callers": threads, "budget_s": budget,
                        "stopped_by_budget": timed < len(ids),
                        "settled_after_clock": len(ids) - timed - drained,
                        "drained_untimed": drained})


def sdk_loop(client: ServiceBusClient, queue: str, ids: list[str], meter: CpuMeter) -> Phase:
    """The loop people porting from azure-servicebus write first:
    ``for message in receiver: receiver.complete_message(message)``."""
    receiver = client.get_queue_receiver(queue, max_wait_time=IDLE_S)
    received: Counter[str] = Counter()
    settled: Counter[str] = Counter()
    failures = completed = 0
    with Timed(meter) as t:
        for message in receiver:
            received[message.message_id] += 1
            try:
                receiver.complete_message(message)
                settled[message.message_id] += 1
                completed += 1
            except ServiceBusError:
                failures += 1
            if completed + failures >= len(ids):
                break
    check = final_check([receiver], ids, received, settled, failures, 100)
    return Phase("sdk_loop", "for m in receiver: complete_message(m), one thread",
                 sum(settled.values()), t.seconds, cpu=t.cpu, check=check,
                 extra={"callers": 1})


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
                 extra={"callers": concurrency})


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
    """The answer time of ``complete_message`` after ``receive_messages(1)``,
    one message at a time: only the complete is timed."""
    receiver = client.get_queue_receiver(queue)
    received: Counter[str] = Counter()
    settled: Counter[str] = Counter()
    lat: list[float] = []
    failures = 0
    with Timed(meter) as t:
        while sum(received.values()) < len(ids):
            msgs = receiver.receive_messages(1, max_wait_time=IDLE_S)
            if not msgs:
                log.warning("latency: nothing received for %.0fs; giving up", IDLE_S)
                break
            received[msgs[0].message_id] += 1
            t0 = time.perf_counter()
            try:
                receiver.complete_message(msgs[0])
            except ServiceBusError:
                failures += 1
                continue
            lat.append((time.perf_counter() - t0) * 1000)
            settled[msgs[0].message_id] += 1
    check = final_check([receiver], ids, received, settled, failures, 100)
    return Phase("settle_latency", "complete_message after receive_messages(1)", len(lat),
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


class CommandLog:
    """How many commands the engine was sent: the summed end offsets of the
    namespace's commands topic. Every client command is one record there
    (retries included); the engine's own timer operations never are."""

    def __init__(self, conn: str) -> None:
        settings = parse_connection_string(conn)
        topic = names.commands(settings.namespace)
        self._consumer = Consumer(settings.consumer_config(f"bench-cmds-{uuid.uuid4().hex[:8]}"))
        partitions = self._consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self._partitions = [TopicPartition(topic, p) for p in partitions]

    def end(self) -> int:
        return sum(self._consumer.get_watermark_offsets(tp, timeout=10)[1]
                   for tp in self._partitions)

    def close(self) -> None:
        self._consumer.close()


# ------------------------------------------------------------------- report
def fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def render(machine: dict[str, Any], args: argparse.Namespace, phases: dict[str, Phase],
           derived: dict[str, Any]) -> str:
    raw_p, raw_c = phases["raw_produce"].rate, phases["raw_consume"].rate
    lines = [
        "",
        f"Settlement layer benchmark ({broker_label(args.broker)}, 1 engine worker)",
        f"machine: {machine_label(machine)}; "
        f"confluent-kafka {machine['confluent_kafka']} / librdkafka {machine['librdkafka']}",
        f"messages per phase: {args.messages:,} x {args.size} B bodies",
        warm_line(machine["broker_warm_up"]),
        "",
    ]
    head = (f"{'figure':<52} {'result':>12}  {'raw Kafka baseline':>24}  {'vs raw':>7}"
            f"  {'cores busy client/engine/broker':>31}")
    lines += [head, "-" * len(head)]

    def row(label: str, value: str, base: str, ratio: str, cpu: dict[str, float]) -> None:
        busy = "/".join(f"{cpu.get(k, 0):.2f}" for k in ("client", "engine", "broker")) \
            if cpu else ""
        lines.append(f"{label:<52} {value:>12}  {base:>24}  {ratio:>7}  {busy:>31}")

    def thr(key: str, base_rate: float, base_label: str, figure: str = "rate",
            note: str = "") -> None:
        """A phase's rate, or its extra figure ``figure`` (a rate) with ``note``."""
        p = phases[key]
        rate = p.rate if figure == "rate" else float(p.extra[figure])
        row(p.label + note + (" [!]" if p.check and not p.check.get("ok") else ""),
            fmt_rate(rate) + " /s", f"{fmt_rate(base_rate)} /s {base_label}",
            f"{rate / base_rate:.0%}" if base_rate else "", p.cpu)
        if "trials" in p.extra:
            lines.append(f"  the median of {len(p.extra['trials'])} trials: "
                         + ", ".join(fmt_rate(r) for r in p.extra["trials"]) + " /s")

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
    for key in ("one_thread_each", "peek_lock_threads"):
        thr(key, raw_c, "consume")
        if phases[key].extra["stopped_by_budget"]:
            lines.append(f"  (clock stopped by the {phases[key].extra['budget_s']:.0f}s budget "
                         f"after {phases[key].messages:,} settled; the rest was drained "
                         "untimed and checked)")
    thr("aio_concurrent_complete", raw_c, "consume", "receive_and_complete_rate",
        ", receive included")
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
    if args.broker == "kafka":
        lines += ["", f"targets (issue 24) on Apache Kafka, F = this run's raw produce -> ack "
                  f"p50 = {floor_ms(phases):.2f} ms:"]
        lines += render_targets(phases)
    else:
        lines += ["", "targets (issue 24) are set on Apache Kafka: not judged on this broker"]
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
        value, goal = target.measured(phases), target.goal(phases)
        unit = "ms" if target.at_most else "msg/s"
        if target.met(phases):
            verdict = "met"
        elif target.at_most:
            verdict = f"MISSED by {value - goal:.2f} ms ({value / goal:.1f}x)"
        else:
            verdict = f"MISSED: {value / goal:.0%} of it"
        trials = phases[target.phase].extra.get("trials")
        of = "" if not trials else f" (the median of {', '.join(map(fmt_rate, trials))})"
        lines.append(f"  {target.title(phases)}: {value:,.2f} {unit}{of} -> {verdict}")
        if target.beside:
            lines.append("    " + target.beside.format(**phases[target.phase].extra))
        if not target.met(phases):
            lines.append(f"    why: {why_missed(target, phases)}")
    return lines


def shared_cpu_note(cpu: dict[str, float]) -> str:
    """What the client's garbage collections took of a phase, where measured
    and 1 % or more; what the broker's JIT compilers took, where 0.05 of a
    core or more."""
    share, jit = cpu.get(CLIENT_GC), cpu.get(BROKER_JIT)
    collections = ("" if share is None or share < 0.01 else
                   f"; the client's garbage collections took {share:.0%} of the phase, every "
                   "thread of it waiting")
    compilers = ("" if jit is None or jit < 0.05 else
                 f"; the broker's JIT compilers used {jit:.2f} of a core of the broker's, "
                 "compiling paths the warm-up had not")
    return collections + compilers


def why_missed(target: Target, phases: dict[str, Phase]) -> str:
    """The figures of this run that bound the missed one."""
    latency, trip = phases["settle_latency"].extra, phases["raw_round_trip"].extra
    ack = phases["raw_ack_latency"].extra
    engine_ms = latency["p50_ms"] - trip["p50_ms"] - ack["p50_ms"]
    if target.figure == "p50_ms":
        return (f"a settlement is a request and a reply through the broker, whose floor with "
                f"nothing in between is {trip['p50_ms']:.2f} ms p50 here (raw round trip), "
                f"plus the engine's durable commit record ({ack['p50_ms']:.2f} ms ack), plus "
                f"{engine_ms:.2f} ms in the engine (its intake, state machine and producers)")
    if target.figure == "p99_ms":
        return (f"a settlement chains that round trip and a durable write, whose own p99 "
                f"here are {trip['p99_ms']:.2f} ms and {ack['p99_ms']:.2f} ms")
    p = phases[target.phase]
    cores = {k: p.cpu.get(k, 0.0) for k in ("client", "engine", "broker")}
    busy = ", ".join(f"{k} {v:.2f}" for k, v in cores.items())
    python = max(("client", "engine"), key=cores.__getitem__)
    machine = os.cpu_count() or 1
    total = sum(cores.values())
    per_message = ", ".join(f"{k} {v / p.rate * 1e6:,.0f}" for k, v in cores.items())
    # 0.9 of a core: a Python process runs its Python on one core at a time (the GIL)
    load = (f"the {python} is saturated (cores busy: {busy})" if cores[python] >= 0.9
            else f"neither the client nor the engine fills a core (cores busy: {busy} "
                 f"of {machine})")
    if total >= 0.85 * machine:
        # The three share this machine's cores: below a core each, they can
        # still be bound by CPU together.
        load += (f"; together they keep {total:.2f} of the {machine} cores busy: the "
                 f"machine's CPU bounds it, {total / p.rate * 1e6:,.0f} µs of CPU a "
                 f"message ({per_message})")
    load += shared_cpu_note(p.cpu)
    if "callers" in p.extra:
        callers = p.extra["callers"]
        who = ("one caller waits for each answer" if callers == 1 else
               f"{callers} callers each wait for their own answer (concurrent ones share "
               "engine commands)")
        return (f"{who}: a message cost its caller {callers * 1000 / p.rate:.1f} ms here, "
                f"receive included, against a complete_message p50 of "
                f"{latency['p50_ms']:.2f} ms alone; {load}")
    if target.phase == "aio_concurrent_complete":
        rounds = max(p.extra["rounds"], 1)
        round_ms = p.messages / p.extra["receive_and_complete_rate"] / rounds * 1000
        acquire_ms = p.extra.get("acquire_in_engine_ms")
        in_engine = ("" if acquire_ms is None else
                     f"; a receive's acquire spent {acquire_ms:.1f} ms in the engine, from its "
                     "append to its answer (the rest of the receive: the round trip, reading "
                     "and building the messages)")
        return (f"a round is a receive, then its completes: {round_ms:.1f} ms a round, of "
                f"which the completes take {p.seconds / rounds * 1000:.1f} ms "
                f"({p.extra['settles_per_command']} settles per engine command){in_engine}; "
                f"{load}")
    rounds = max(p.extra["receive_rounds"], 1)
    return (f"a round of {p.extra['mean_batch']:,.0f} messages takes "
            f"{p.seconds * 1000 / rounds:.1f} ms and {p.extra['engine_commands'] / rounds:.1f} "
            f"engine commands, each waiting for its answer through the broker (raw round "
            f"trip p50 {trip['p50_ms']:.2f} ms); {load}")


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
    p.add_argument("--thread-batch", type=int, default=20,
                   help="max_message_count of each thread's receives (default 20)")
    p.add_argument("--each-batch", type=int, default=100,
                   help="max_message_count of the receives of the one-thread and asyncio "
                        "phases that complete each message (default 100)")
    p.add_argument("--loop-messages", type=int, default=2000,
                   help="messages of the one-thread SDK loop phase (default 2000)")
    p.add_argument("--concurrent-calls", type=int, default=32,
                   help="max_concurrent_calls of the process phase (default 32)")
    p.add_argument("--budget", type=float, default=30.0,
                   help="seconds each per-message thread phase may run before its clock "
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
        metrics_port = free_port("127.0.0.1")
        worker = EngineProcess(conn, work / "engine", timer_interval=0.5,
                               env={"SETTLEMENT_METRICS_PORT": str(metrics_port)}).start()
        durations = EngineDurations(metrics_port)
        pids = {"client": os.getpid(), "engine": worker.pid, "broker": broker_pid(broker)}
        meter = CpuMeter(pids)

        def step(msg: str) -> None:
            print(f"[{time.monotonic() - started:6.1f}s] {msg}", flush=True)

        admin = ServiceBusAdministrationClient.from_connection_string(conn)
        queues = ["warmup", "batchthreads", "rad", "latency", "probe"]
        queues += [f"{base}{i}" for base in TRIAL_QUEUES for i in range(TRIALS)]
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

            # Warm-up: connections, readers, the engine's first windows and
            # the broker's JIT.
            warmed = warm_up(pids["broker"],
                             lambda i: warm_round(client, conn, "warmup", size, meter, i), step)

            step("raw Kafka baseline")
            for p in raw_kafka(broker.bootstrap, conn, n, size, meter, args.latency_samples):
                phases[p.key] = p

            def trials(base: str, what: str, measure: Callable[[str, list[str]], Phase],
                       count: int = n, figure: str = "rate",
                       sent: list[ServiceBusMessage] | None = None) -> Phase:
                """``measure(queue, ids)`` on the TRIALS queues of ``base``, each
                sent ``count`` messages of its own (the first: ``sent``, if the
                messages are there already); the median trial."""
                runs = []
                for i in range(TRIALS):
                    step(f"{what}, trial {i + 1} of {TRIALS}")
                    queue = f"{base}{i}"
                    msgs = sent if i == 0 and sent is not None else make_messages(
                        queue, count, size)
                    if msgs is not sent:
                        send(client, queue, msgs, args.send_chunk)
                    runs.append(measure(queue, [m.message_id for m in msgs]))
                return median_trial(runs, figure)

            step(f"send_messages in lists of {args.send_chunk}")
            msgs = make_messages("p", n + 1, size)
            sender, first_send = warm_sender(client, "peek0", msgs[0])
            with Timed(meter) as t:
                for start in range(1, len(msgs), args.send_chunk):
                    sender.send_messages(msgs[start:start + args.send_chunk])
            sender.close()
            phases["send"] = Phase("send", f"durable send_messages(list of {args.send_chunk})",
                                   n, t.seconds, cpu=t.cpu,
                                   extra={"first_send_of_new_sender_s": round(first_send, 3)})

            commands = CommandLog(conn)
            # its first trial drains what the send phase sent
            phases["peek_lock_batch"] = trials(
                "peek", f"peek-lock receive({args.batch}) + complete_messages",
                lambda q, ids: settle_in_batches(client, q, ids, args.batch, meter, commands),
                sent=msgs)
            commands.close()

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

            phases["one_thread_each"] = trials(
                "onethread", f"peek-lock, one thread, receive({args.each_batch}) + "
                "complete_message each",
                lambda q, ids: settle_per_message_threads(
                    "one_thread_each", client, q, ids, 1, args.each_batch, args.budget, meter))

            phases["peek_lock_threads"] = trials(
                "threads", f"peek-lock, {args.threads} threads, receive({args.thread_batch}) + "
                "complete_message each",
                lambda q, ids: settle_per_message_threads(
                    "peek_lock_threads", client, q, ids, args.threads, args.thread_batch,
                    args.budget, meter))

            # Imported here: bench.aio imports this module.
            from bench.aio import concurrent_completes

            def aio_trial(queue: str, ids: list[str]) -> Phase:
                before = durations.totals()
                p = asyncio.run(concurrent_completes(conn, queue, ids, args.each_batch, meter))
                p.extra["acquire_in_engine_ms"] = durations.mean_ms_since(before, "acquire")
                return p

            phases["aio_concurrent_complete"] = trials(
                "aio", f"asyncio: receive({args.each_batch}) + gather(complete_message each)",
                aio_trial, figure="receive_and_complete_rate")

            phases["sdk_loop"] = trials(
                "loop", f"the SDK loop, {args.loop_messages:,} messages",
                lambda q, ids: sdk_loop(client, q, ids, meter), count=args.loop_messages)

            phases["process_settling_each"] = trials(
                "process", f"process(max_concurrent_calls={args.concurrent_calls}), "
                "handler settles each",
                lambda q, ids: process_settling_each(client, q, ids, args.concurrent_calls,
                                                     meter))

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
        }
        if args.broker == "kafka":  # issue 24 sets its targets on Apache Kafka only
            derived["floor_ms"] = floor_ms(phases)
            derived["targets"] = {
                t.title(phases): {"goal": round(t.goal(phases), 2),
                                  "measured": round(t.measured(phases), 2),
                                  "met": t.met(phases)} for t in TARGETS}
        leftovers = {q: {"active": r.active_message_count, "locked": r.locked_message_count,
                         "dead_letter": r.dead_letter_message_count}
                     for q, r in runtime.items()}
        if any(v["active"] or v["locked"] or v["dead_letter"] for v in leftovers.values()):
            log.warning("queues are not empty after the bench: %s", leftovers)
        machine["broker_warm_up"] = warmed.as_dict()
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
