"""Faults of a 3-node Apache Kafka cluster (replication factor 3, two in sync):
``kill -9`` of the node leading a queue's partition under load, then the whole
cluster stopped and started again on its data; ``kill -9`` of one of three
engine workers sharing a namespace under load.

The cluster is the one a developer runs, ``settlement kafka --brokers 3``,
started once for this module (three Kafka nodes take a while to start and to
stop): the command says where each node runs, makes topics of three replicas
with two in sync, keeps the two other nodes running when one dies, says so,
starts the dead one again on its data, stops every node on SIGTERM and starts
the same cluster again on its data. Each test starts its own engine workers
in a namespace of its own; the session's broker is not used.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from settlement.exceptions import ServiceBusError
from settlement.management import ServiceBusAdministrationClient
from spark.audit import run_audit
from streams.process import EngineProcess
from tests.helpers import receive_exactly, shared_partitions, wait_for_log_start
from topics import names
from topics.partitions import command_partition

pytestmark = pytest.mark.needs_broker
TOTAL = 600
RECOVERY_S = 15.0
log = logging.getLogger(__name__)


class Load:
    """A sender and three competing receivers on one queue, recording what
    each saw: sends acknowledged, completions that succeeded, and every lock
    each receiver held (so overlapping locks can be found)."""

    def __init__(self, client: ServiceBusClient, queue: str, total: int = TOTAL) -> None:
        self.client, self.queue, self.total = client, queue, total
        self.sent: list[tuple[str, float]] = []
        self.completed: list[tuple[str, int, float]] = []  # message id, sequence number, when
        self.locks: list[tuple[int, int, float, float]] = []  # seq, receiver, from, until
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send)] + [
            threading.Thread(target=self._receive, args=(i,)) for i in range(3)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _send(self) -> None:
        with self.client.get_queue_sender(self.queue) as sender:
            for first in range(0, self.total, 10):
                batch = [ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                         for i in range(first, first + 10)]
                sender.send_messages(batch)  # librdkafka retries across a leader move
                with self._lock:
                    self.sent += [(m.message_id, time.monotonic()) for m in batch]
                time.sleep(0.3)  # ~20 s of sends: the kill comes in the middle of them

    def _receive(self, index: int) -> None:
        receiver = self.client.get_queue_receiver(self.queue)
        while not self._stop.is_set():
            try:
                batch = receiver.receive_messages(20, max_wait_time=1)
                got = time.monotonic()
                for m in batch:
                    until = m.locked_until_utc.timestamp() - time.time() + got
                    with self._lock:
                        self.locks.append((m.sequence_number, index, got, until))
                for result in receiver.complete_messages(batch):
                    if result.succeeded:
                        with self._lock:
                            self.completed.append((result.message.message_id,
                                                   result.message.sequence_number,
                                                   time.monotonic()))
            except ServiceBusError as exc:  # the cluster is moving leaders
                with self._lock:
                    self.errors.append(repr(exc))
                time.sleep(0.2)
        receiver.close()

    def wait_until_completed(self, count: int, timeout: float, *engines: EngineProcess) -> None:
        """Wait until ``count`` messages were completed; past ``timeout``
        seconds, stop the load and fail with what it and ``engines`` logged
        (within the test's own time limit, so that the cause is shown)."""
        deadline = time.monotonic() + timeout
        while (done := len({c[0] for c in self.completed})) < count:
            if time.monotonic() >= deadline:
                self._stop.set()
                tails = "\n".join(e.log_path.read_text(errors="replace")[-3000:]
                                  for e in engines)
                raise AssertionError(f"{self.queue}: {done} of {count} completed in {timeout} s;"
                                     f" receivers' errors: {self.errors[-5:]}\n{tails}")
            time.sleep(0.1)

    def check_each_completed_once(self) -> None:
        """Every message sent was completed, none twice."""
        sent_ids = {mid for mid, _ in self.sent}
        assert len(sent_ids) == self.total, f"{self.queue}: {len(sent_ids)} sent"
        completed_ids = [mid for mid, _, _ in self.completed]
        assert set(completed_ids) == sent_ids, (
            f"{self.queue} lost: {sorted(sent_ids - set(completed_ids))}; "
            f"errors: {self.errors[-5:]}")
        assert len(completed_ids) == len(set(completed_ids)), (
            f"{self.queue}: a message completed twice")

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)


class KafkaCommand:
    """``settlement kafka --brokers 3`` in a child process, its output read
    line by line: the nodes' pids, the bootstrap servers, what it reports."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> KafkaCommand:
        self.lines = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "settlement.cli", "kafka", "--brokers", "3", "--port", "0",
             "--data-dir", str(self.data_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for(r"^bootstrap: ", 180)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if found := re.search(pattern, line):
                    return found
            assert self.running, "settlement kafka ended:\n" + "\n".join(self.lines[-30:])
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r} in {timeout} s: {self.lines[-10:]}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def bootstrap(self) -> str:
        return self.wait_for(r"^bootstrap: (\S+)", 1).group(1)

    def pid(self, node_id: int) -> int:
        """The node's pid, as last reported (at start, or started again)."""
        pids = [int(m.group(1)) for line in self.lines if (m := re.search(
            rf"^node {node_id}(?::| started again:) pid (\d+)", line))]
        return pids[-1]

    def stop(self) -> None:
        """SIGTERM: the command stops every node and ends well."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(90) == 0, "\n".join(self.lines[-30:])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCommand]:
    """One ``settlement kafka --brokers 3`` for the module's tests."""
    command = KafkaCommand(tmp_path_factory.mktemp("kafka")).start()
    try:
        yield command
    finally:
        command.stop()


def _leader(bootstrap: str, topic: str) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return int(metadata.topics[topic].partitions[0].leader)


def _overlapping_locks(locks: list[tuple[int, int, float, float]],
                       completed: list[tuple[str, int, float]]) -> list[Any]:
    """Two receivers holding a live lock on one message at once: a later
    lock of the same message that began before the earlier one ended,
    unless the earlier holder's lock had been released (completed)."""
    settled = {seq: at for _, seq, at in completed}
    found = []
    by_seq: dict[int, list[tuple[int, int, float, float]]] = {}
    for lock in locks:
        by_seq.setdefault(lock[0], []).append(lock)
    for seq, held in by_seq.items():
        held.sort(key=lambda lock: lock[2])
        for earlier, later in zip(held, held[1:], strict=False):
            ended = min(earlier[3], settled.get(seq, earlier[3]))
            if later[2] < ended - 0.5 and later[1] != earlier[1]:  # 0.5 s: clock rounding
                found.append((seq, earlier, later))
    return found


#: Queues of three partitions each whose six windows fall on the six engine
#: partitions of the namespace below, one each: every worker serves some.
SPREAD_QUEUES = ("emails", "alerts")
SCALE_PARTITIONS = 6


def test_one_of_three_engine_workers_killed_under_load_loses_nothing(
        cluster: KafkaCommand, tmp_path: Path) -> None:
    """A namespace made with six engine partitions, three workers sharing
    them; ``kill -9`` of one while messages are sent and settled: the two
    others take its partitions over and every message is completed once."""
    windows = {command_partition(names.window_key(q, p), SCALE_PARTITIONS)
               for q in SPREAD_QUEUES for p in range(3)}
    assert windows == set(range(SCALE_PARTITIONS))
    conn = f"Endpoint=kafka://{cluster.bootstrap};Namespace=scale{uuid.uuid4().hex[:6]}"
    admin = ServiceBusAdministrationClient.from_connection_string(conn)
    client = ServiceBusClient.from_connection_string(conn)
    workers = [EngineProcess(conn, tmp_path / f"engine-{i}") for i in range(3)]
    try:
        assert admin.create_namespace(engine_partitions=SCALE_PARTITIONS).engine_partitions \
            == SCALE_PARTITIONS
        with ThreadPoolExecutor(len(workers)) as pool:
            list(pool.map(EngineProcess.start, workers))
        held = shared_partitions(workers, SCALE_PARTITIONS, 60)
        assert all(held) and set().union(*held) == windows, held
        for queue in SPREAD_QUEUES:
            admin.create_queue(queue, lock_duration=5, max_delivery_count=50, partition_count=3)
        loads = [Load(client, queue, total=300) for queue in SPREAD_QUEUES]
        for load in loads:
            load.start()
        for load in loads:
            load.wait_until_completed(load.total // 4, 90, *workers)
        victim, *survivors = workers
        victim.kill()
        for load in loads:
            load.wait_until_completed(load.total, 150, *survivors)
        for load in loads:
            load.stop()
        for load in loads:
            load.check_each_completed_once()
        held = shared_partitions(survivors, SCALE_PARTITIONS, 30)
        assert all(held) and set().union(*held) == windows, held
    finally:
        client.close()
        admin.close()
        for worker in workers:
            worker.stop()


def _nodes_as_started(cluster: KafkaCommand) -> dict[int, tuple[int, int]]:
    """The command's first lines: ``node N: pid P port Q`` for nodes 1 to 3."""
    nodes = {int(m.group(1)): (int(m.group(2)), int(m.group(3))) for line in cluster.lines
             if (m := re.fullmatch(r"node (\d+): pid (\d+) port (\d+)", line))}
    assert sorted(nodes) == [1, 2, 3], cluster.lines[:10]
    return nodes


def _check_replicas_and_write(bootstrap: str) -> None:
    """A topic made with the cluster's defaults has a replica on each node
    and needs two in sync; 100 records written to it with acks=all."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("kept", 1)])["kept"].result(30)
    # The new topic reaches the other brokers' metadata a moment later.
    deadline = time.monotonic() + 30
    while not (partitions := admin.list_topics("kept", timeout=10).topics["kept"].partitions):
        assert time.monotonic() < deadline, "topic 'kept' has no partitions after 30 s"
        time.sleep(0.1)
    assert sorted(partitions[0].replicas) == [1, 2, 3]
    resource = ConfigResource(ConfigResource.Type.TOPIC, "kept")
    # The broker asked may answer UNKNOWN_TOPIC_OR_PART a moment longer still.
    while True:
        try:
            config = admin.describe_configs([resource])[resource].result(10)
            break
        except KafkaException as e:
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            assert time.monotonic() < deadline, "describe_configs does not know 'kept' after 30 s"
            time.sleep(0.1)
    assert config["min.insync.replicas"].value == "2"
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(100):
        producer.produce("kept", f"m{i}".encode())
    assert producer.flush(30) == 0


def _check_written(bootstrap: str) -> None:
    """The 100 records of :func:`_check_replicas_and_write`, read back."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check"})
    consumer.assign([TopicPartition("kept", 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < 100 and time.monotonic() < deadline:
        values += [m.value() for m in consumer.consume(100, timeout=1) if not m.error()]
    consumer.close()
    assert values == [f"m{i}".encode() for i in range(100)]


def test_leader_killed_under_load_then_whole_cluster_restarted(
        cluster: KafkaCommand, tmp_path: Path, spark: Any) -> None:
    """Last of the module: it restarts the whole cluster."""
    bootstrap = cluster.bootstrap
    nodes = _nodes_as_started(cluster)
    assert bootstrap == ",".join(f"127.0.0.1:{port}" for _, port in nodes.values())
    _check_replicas_and_write(bootstrap)
    conn = f"Endpoint=kafka://{bootstrap};Namespace=faults{uuid.uuid4().hex[:6]}"
    engine = EngineProcess(conn, tmp_path / "engine").start()
    admin = ServiceBusAdministrationClient.from_connection_string(conn)
    client = ServiceBusClient.from_connection_string(conn)
    try:
        admin.create_queue("work", lock_duration=5, max_delivery_count=50)
        topic = names.entity_log(client.settings.namespace, "work")
        load = Load(client, "work")
        load.start()
        load.wait_until_completed(TOTAL // 4, 90, engine)
        victim = _leader(cluster.bootstrap, topic)
        os.kill(cluster.pid(victim), signal.SIGKILL)
        killed_at = time.monotonic()
        load.wait_until_completed(TOTAL, 150, engine)
        load.stop()

        sends_after = [at for _, at in load.sent if at > killed_at]
        completions_after = [at for _, _, at in load.completed if at > killed_at]
        log.info("after the kill of node %d: first send acknowledged in %.2f s, first "
                 "completion in %.2f s; %d receiver errors", victim,
                 min(sends_after, default=-1) - killed_at,
                 min(completions_after, default=-1) - killed_at, len(load.errors))
        assert sends_after and min(sends_after) - killed_at < RECOVERY_S, "sends stalled"
        assert completions_after and min(completions_after) - killed_at < RECOVERY_S, (
            f"settlements stalled; errors: {load.errors[-5:]}")
        assert _leader(cluster.bootstrap, topic) != victim
        # the command said so, kept running, and started the node again on its data
        cluster.wait_for(rf"^node {victim} exited", 10)
        cluster.wait_for(rf"^node {victim} started again: pid \d+", 30)
        assert cluster.running
        load.check_each_completed_once()
        assert not _overlapping_locks(load.locks, load.completed)
        report = run_audit(spark, conn, ["work"])
        assert report.ok and report.messages >= TOTAL - 1, report.summary()
        wait_for_log_start(client, topic, TOTAL)  # trimmed on the new leader too

        # Leave work behind: active, deferred and dead-lettered messages.
        with client.get_queue_sender("work") as sender:
            sender.send_messages([ServiceBusMessage(f"r{i}", message_id=f"r{i}")
                                  for i in range(9)])
        with client.get_queue_receiver("work") as receiver:
            got = receive_exactly(receiver, 6)
            deferred = got[:3]
            for message in deferred:
                receiver.defer_message(message)
            for message in got[3:]:
                receiver.dead_letter_message(message, reason="Kept", error_description="x")
        before = admin.get_queue_runtime_properties("work")
        assert (before.active_message_count, before.deferred_message_count,
                before.dead_letter_message_count) == (3, 3, 3)

        engine.stop()
        client.close()
        admin.close()
        cluster.stop()
        for node_id in nodes:  # every node stopped with the command
            with pytest.raises(ProcessLookupError):
                os.kill(cluster.pid(node_id), 0)
        cluster.start()  # the same cluster, on its data, at the same addresses
        assert cluster.bootstrap == bootstrap
        _check_written(bootstrap)
        engine.start()
        admin = ServiceBusAdministrationClient.from_connection_string(conn)
        client = ServiceBusClient.from_connection_string(conn)
        after = admin.get_queue_runtime_properties("work")
        assert (after.active_message_count, after.deferred_message_count,
                after.dead_letter_message_count) == (3, 3, 3)
        with client.get_queue_receiver("work") as receiver:
            active = receive_exactly(receiver, 3)
            again = receiver.receive_deferred_messages([m.sequence_number for m in deferred])
            assert sorted(m.message_id for m in again) == sorted(m.message_id for m in deferred)
            receiver.complete_messages(active + again)
        with client.get_queue_receiver("work", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
            dead = receive_exactly(dlq, 3)
            assert {m.dead_letter_reason for m in dead} == {"Kept"}
            dlq.complete_messages(dead)
        left = admin.get_queue_runtime_properties("work")
        assert (left.active_message_count, left.deferred_message_count,
                left.dead_letter_message_count) == (0, 0, 0)
    finally:
        client.close()
        admin.close()
        engine.stop()
