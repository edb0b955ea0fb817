"""Every broker gone for 30 s: an engine worker and a client with an open
receiver wait calmly (under 5% of a core each, at most about a log line a
second saying what they wait for), serve again by themselves once the
brokers are back, and stop within 10 s (SIGTERM, ``close()``) while the
brokers are away.

The test starts its own Apache Kafka and engine; the session's broker is not
used."""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.management import ServiceBusAdministrationClient
from settlement.testing.apache_kafka import KafkaCluster
from streams.process import EngineProcess

pytestmark = pytest.mark.needs_broker
DOWN_S = 30.0
log = logging.getLogger(__name__)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    return _ticks(Path(f"/proc/{pid}/stat")) / os.sysconf("SC_CLK_TCK")


def threads_cpu_seconds(threads: set[str]) -> float:
    """User + system CPU time of ``threads`` (ids of this process's tasks,
    native ones included: librdkafka's) that are still running: one may end
    while they are read. Its stat file is then gone (FileNotFoundError) or,
    ended between the open and the read, fails with ESRCH
    (ProcessLookupError): CI saw both."""
    ticks = 0
    for tid in threads:
        try:
            ticks += _ticks(Path(f"/proc/self/task/{tid}/stat"))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def _ticks(stat: Path) -> int:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class Lines(logging.Handler):
    """The records a logger lets through (after its filters)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def round_trip(client: ServiceBusClient, queue: str, body: str, wait: float = 10) -> None:
    """Send one message and complete it: the namespace serves."""
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(body, message_id=body))
    with client.get_queue_receiver(queue) as receiver:
        got = receiver.receive_messages(1, max_wait_time=wait)
        assert [m.message_id for m in got] == [body]
        receiver.complete_message(got[0])


def stop_every_broker(cluster: KafkaCluster) -> None:
    for node in cluster.nodes:
        cluster.kill_node(node.node_id)


def test_a_worker_and_a_client_wait_calmly_for_their_brokers(tmp_path: Path) -> None:
    cluster = KafkaCluster(data_dir=tmp_path / "kafka").start()
    conn = cluster.connection_string(f"lost{uuid.uuid4().hex[:6]}")
    engine = EngineProcess(conn, tmp_path / "engine").start()
    # The client's CPU is that of the threads it starts: the session's other
    # clients (fixtures of other tests) share this process.
    before_client = set(os.listdir("/proc/self/task"))
    client = ServiceBusClient.from_connection_string(conn)
    librdkafka = logging.getLogger("librdkafka")
    lines = Lines()
    librdkafka.addHandler(lines)
    try:
        with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
            admin.create_queue("q", lock_duration=30)
        round_trip(client, "q", "before")
        receiver = client.get_queue_receiver("q")  # its threads stay through the loss
        receiver.peek_messages(1)

        stop_every_broker(cluster)
        log_at = engine.log_path.stat().st_size
        clients_threads = set(os.listdir("/proc/self/task")) - before_client
        engine_cpu, client_cpu = cpu_seconds(engine.pid), threads_cpu_seconds(clients_threads)
        lines.records.clear()
        started = time.monotonic()
        time.sleep(DOWN_S)
        elapsed = time.monotonic() - started
        engine_share = (cpu_seconds(engine.pid) - engine_cpu) / elapsed
        client_share = (threads_cpu_seconds(clients_threads) - client_cpu) / elapsed
        with open(engine.log_path, "rb") as out:
            out.seek(log_at)
            engine_lines = out.read().decode(errors="replace").splitlines()
        log.info("brokers away %.0f s: engine %.1f%% of a core, %d log lines; client %.1f%%, "
                 "%d lines", elapsed, 100 * engine_share, len(engine_lines),
                 100 * client_share, len(lines.records))
        assert engine.proc is not None and engine.proc.poll() is None
        assert engine_share < 0.05, f"the engine spent {engine_share:.1%} of a core waiting"
        assert len(engine_lines) <= elapsed + 5, engine_lines[:20]
        assert any("waiting for Kafka" in line for line in engine_lines), engine_lines[:5]
        assert client_share < 0.05, f"the client spent {client_share:.1%} of a core waiting"
        assert len(lines.records) <= elapsed + 5, [r.getMessage() for r in lines.records[:20]]

        # Back: the same worker and client serve again, nothing restarted.
        for node in cluster.nodes:
            cluster.start_node(node.node_id)
        round_trip(client, "q", "after", wait=60)
        receiver.close()

        # Away again: SIGTERM ends the worker, close() the client, in 10 s each.
        stop_every_broker(cluster)
        time.sleep(3)
        asked = time.monotonic()
        engine.proc.send_signal(signal.SIGTERM)
        engine.proc.wait(15)
        assert time.monotonic() - asked < 10, "the worker took too long to stop"
        asked = time.monotonic()
        client.close()
        assert time.monotonic() - asked < 10, "the client took too long to close"
    finally:
        librdkafka.removeHandler(lines)
        client.close()
        engine.stop()
        cluster.stop()
