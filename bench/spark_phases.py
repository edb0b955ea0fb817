"""The bench's Spark figures: how fast the Kafka source reads, and how soon a
settlement shows in the monitor's Parquet sink (2-second trigger).

Both run on one SparkSession, started before any clock.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.measure import CpuMeter, Phase, Timed, percentile
from settlement import ServiceBusClient, ServiceBusMessage
from spark.metrics_store import read_metrics, totals

TRIGGER_S = 2.0
SINK_POLL_S = 0.05
CATCH_UP_S = 300.0


def spark_source_read(spark: Any, bootstrap: str, n: int, size: int,
                      meter: CpuMeter) -> Phase:
    """Records/s the Spark Kafka source (spark.source.read_kafka_stream) reads
    with Trigger.AvailableNow from a fresh 2-partition topic, query start
    included. Spark's Python workers are started by an untimed batch read
    first: their start (seconds, once per session) is not the source's speed."""
    from spark.source import read_kafka, read_kafka_stream

    topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep it alive for the result
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(15)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    payload = b"x" * size
    for i in range(n):
        producer.produce(topic, payload, key=str(i).encode())
        producer.poll(0)
    producer.flush(60)
    read_kafka(spark, bootstrap, [topic]).count()  # warm-up: Python workers, imports
    counted: list[int] = []
    with tempfile.TemporaryDirectory() as checkpoint, Timed(meter) as t:
        frame = read_kafka_stream(spark, bootstrap, [topic])
        query = (frame.writeStream
                 .foreachBatch(lambda batch, _id: counted.append(batch.count()))
                 .option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination(600)
    return Phase("spark_source", "Spark read, Spark's kafka connector (AvailableNow)", sum(counted),
                 t.seconds, cpu=t.cpu, check={"ok": sum(counted) == n, "expected": n,
                                             "read": sum(counted)})


def monitor_delay(spark: Any, client: ServiceBusClient, conn: str, queue: str, samples: int,
                  meter: CpuMeter) -> Phase:
    """Seconds from ``complete_message`` returning to the completion being in
    the monitor's sink, with the monitor running on a 2-second trigger.

    The monitor first catches up with everything the bench did before (not
    timed); then each sample completes one message and polls the sink."""
    from spark.monitor import start_monitor

    sink = Path(tempfile.mkdtemp(prefix="bench-monitor-"))
    query = start_monitor(spark, conn, sink, trigger_seconds=TRIGGER_S)
    delays: list[float] = []
    try:
        _wait_until_caught_up(query)
        with client.get_queue_sender(queue) as sender, \
                client.get_queue_receiver(queue) as receiver, Timed(meter) as t:
            for i in range(samples):
                sender.send_messages(ServiceBusMessage(f"probe-{i}"))
                (message,) = receiver.receive_messages(1, max_wait_time=10)
                receiver.complete_message(message)
                settled = time.perf_counter()
                _wait_for_completions(sink, queue, i + 1)
                delays.append(time.perf_counter() - settled)
    finally:
        query.stop()
    extra = {"trigger_s": TRIGGER_S, "p50_s": round(percentile(delays, 50), 3),
             "max_s": round(max(delays), 3), "samples_s": [round(d, 3) for d in delays]}
    return Phase("monitor_delay", "settlement -> monitor sink (2 s trigger)", samples,
                 t.seconds, unit="s", cpu=t.cpu, extra=extra)


def _wait_until_caught_up(query: Any) -> None:
    """Until a micro-batch finds nothing new to read."""
    deadline = time.monotonic() + CATCH_UP_S
    while time.monotonic() < deadline:
        progress = query.lastProgress
        if progress is not None and progress["numInputRows"] == 0:
            return
        if query.exception() is not None:
            raise RuntimeError(f"the monitor failed: {query.exception()}")
        time.sleep(0.5)
    raise TimeoutError(f"the monitor did not catch up within {CATCH_UP_S:.0f}s")


def _wait_for_completions(sink: Path, queue: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if totals(read_metrics(sink), "count").get((queue, "completed"), 0) >= count:
            return
        time.sleep(SINK_POLL_S)
    raise TimeoutError(f"completion {count} of {queue} did not reach the monitor's sink in 60s")
