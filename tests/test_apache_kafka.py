"""Apache Kafka from Maven Central: ``settlement broker`` and ``settlement
kafka``, the detected broker profile, and what real Kafka has that Tansu
lacks (compaction). ``settlement kafka --brokers 3`` (its nodes, its topics'
replicas, a restart on its data) is run by test_cluster_faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from settlement.management import ServiceBusAdministrationClient
from settlement.testing._local_broker import free_port
from settlement.testing.apache_kafka import KafkaCluster
from settlement.testing.maven import JarFetchError, fetch_jars
from streams.process import EngineProcess
from tests.helpers import Broker
from topics import names
from topics.connection import parse_connection_string

pytestmark = pytest.mark.needs_broker
ROOT = Path(__file__).resolve().parent.parent


def _read_line(proc: subprocess.Popen[str], deadline: float) -> str:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            return line.strip()
        if proc.poll() is not None:
            break
    raise AssertionError(f"no output from settlement kafka (exit {proc.poll()})")


def _start_cli(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], list[str]]:
    """``settlement ARGS --data-dir DATA_DIR`` and its lines of output up to
    the ``bootstrap:`` line, the last."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "settlement.cli", *args, "--data-dir", str(data_dir)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    lines = [_read_line(proc, deadline)]
    while not lines[-1].startswith("bootstrap: "):
        lines.append(_read_line(proc, deadline))
    return proc, lines


def _stop_cli(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


def test_settlement_broker_keeps_messages_locks_dead_letters_and_sessions_across_a_restart(
        tmp_path: Path) -> None:
    """What was sent and settled before ``settlement broker`` stopped is there
    after it starts again on the same --data-dir, as a new engine worker (with
    none of the old one's local state) reads it back from the broker."""
    port = free_port("127.0.0.1")
    data = tmp_path / "broker"
    proc, lines = _start_cli(data, "broker", "--port", str(port))
    conn = f"Endpoint=kafka://127.0.0.1:{port};Namespace=kept"
    try:
        assert lines[-1] == f"bootstrap: 127.0.0.1:{port}"
        engine = EngineProcess(conn, tmp_path / "engine-1").start()
        try:
            with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
                admin.create_queue("orders", lock_duration=300)
                admin.create_queue("jobs", requires_session=True)
            with ServiceBusClient.from_connection_string(conn) as client:
                with client.get_queue_sender("orders") as sender:
                    sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                                          for i in range(4)])
                with client.get_queue_sender("jobs") as sender:
                    sender.send_messages(ServiceBusMessage("step 1", session_id="job-1"))
                receiver = client.get_queue_receiver("orders")
                first, second = receiver.receive_messages(2, max_wait_time=10)
                receiver.dead_letter_message(first, reason="bad-total")
                # m0..m3 may come in any order across the queue's partitions
                dead_id, held = first.message_id, second.message_id  # held: a 300 s lock
                others = sorted({f"m{i}" for i in range(4)} - {dead_id, held})
                with client.get_queue_receiver("jobs", session_id="job-1") as session:
                    session.session.set_state(b"halfway")
                receiver.close()
        finally:
            engine.stop()
    finally:
        _stop_cli(proc)

    proc, lines = _start_cli(data, "broker", "--port", str(port))
    assert lines[-1] == f"bootstrap: 127.0.0.1:{port}"
    engine = EngineProcess(conn, tmp_path / "engine-2").start()
    try:
        with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
            props = admin.get_queue_runtime_properties("orders")
        assert (props.active_message_count, props.locked_message_count,
                props.dead_letter_message_count) == (3, 1, 1)
        with ServiceBusClient.from_connection_string(conn) as client:
            with client.get_queue_receiver("orders") as receiver:
                rest = receiver.receive_messages(4, max_wait_time=5)
                assert sorted(m.message_id for m in rest) == others  # not the held one
                receiver.complete_messages(rest)
            with client.get_queue_receiver("orders", sub_queue=ServiceBusSubQueue.DEAD_LETTER,
                                           max_wait_time=5) as dead:
                (letter,) = dead.receive_messages(2)
                assert (letter.message_id, letter.dead_letter_reason) == (dead_id, "bad-total")
                dead.complete_message(letter)
            with client.get_queue_receiver("jobs", session_id="job-1",
                                           max_wait_time=5) as session:
                assert session.session.get_state() == b"halfway"
                assert [str(m) for m in session.receive_messages(2)] == ["step 1"]
    finally:
        engine.stop()
        _stop_cli(proc)


def test_settlement_broker_tansu_keeps_no_data_dir(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "settlement.cli", "broker", "--tansu",
                           "--data-dir", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "--data-dir is for Apache Kafka: Tansu (--tansu) keeps everything in memory" \
        in done.stderr


def test_a_data_dir_keeps_its_cluster_shape(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(
        '{"cluster_id": "x", "nodes": [{"node_id": 1, "port": 1, "controller_port": 2}]}')
    done = subprocess.run([sys.executable, "-m", "settlement.cli", "kafka", "--brokers", "3",
                           "--data-dir", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "holds a cluster of 1 node(s), not 3: pass --brokers 1" in done.stderr


def test_missing_maven_or_java_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLEMENT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # neither java nor mvn on it
    with pytest.raises(JarFetchError, match="apt-get install openjdk-17-jre-headless"):
        fetch_jars("kafka", {"kafka.version": "4.4.0"})
    java = tmp_path / "java"
    java.symlink_to(subprocess.check_output(["sh", "-c", "command -v java"],
                                            env={"PATH": os.defpath + ":/usr/bin"},
                                            text=True).strip())
    with pytest.raises(JarFetchError, match="apt-get install maven"):
        fetch_jars("kafka", {"kafka.version": "4.4.0"})


def test_a_version_maven_central_lacks_is_a_clear_error(tmp_path: Path) -> None:
    cluster = KafkaCluster(version="4.99.0", data_dir=tmp_path)
    with pytest.raises(JarFetchError, match="could not fetch kafka 4.99.0 from Maven Central"):
        cluster.start()


def test_the_profile_of_apache_kafka_is_detected(broker: Broker) -> None:
    profile = parse_connection_string(broker.connection_string("any")).profile
    assert profile.kind == "apache-kafka"
    assert profile.wakes_waiting_fetches and profile.exact_list_offsets
    assert profile.compacts and profile.deletes_records and profile.transactions
    assert profile.fetch_max_wait_ms == 500 and profile.replication_factor == 1


def _fast_compaction(admin: AdminClient, topic: str) -> None:
    """Roll segments at once and clean at the cleaner's next pass (the
    production settings keep segments longer; compaction is the same)."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.001",
                            "min.compaction.lag.ms": "0"}.items()])
    admin.incremental_alter_configs([resource])[resource].result(10)


def test_state_and_definition_topics_really_compact(broker: Broker) -> None:
    conn = broker.connection_string(f"c{uuid.uuid4().hex[:8]}")
    with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
        admin.create_queue("orders")  # provisions the namespace's topics
    settings = parse_connection_string(conn)
    topics = [names.state(settings.namespace), names.entities(settings.namespace)]
    kafka_admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for topic in topics:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        config = kafka_admin.describe_configs([resource])[resource].result(10)
        assert config["cleanup.policy"].value == "compact"
        _fast_compaction(kafka_admin, topic)
    for topic in topics:  # the same key written three times, each in its own segment
        for value in (b"old-1", b"old-2", b"newest"):
            producer.produce(topic, key=b"compaction-probe", value=value, partition=0)
            producer.flush(10)
            time.sleep(0.3)
        producer.produce(topic, key=b"roll", value=b"x", partition=0)  # closes the last one
        producer.flush(10)

    def probe_values(topic: str) -> list[bytes]:
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "compaction",
                             "enable.partition.eof": True})
        consumer.assign([TopicPartition(topic, 0, 0)])
        found: list[bytes] = []
        while (message := consumer.poll(5)) is not None and not message.error():
            if message.key() == b"compaction-probe":
                found.append(message.value())
        consumer.close()
        return found

    deadline = time.monotonic() + 90  # the log cleaner runs every 15 s
    remaining = {topic: probe_values(topic) for topic in topics}
    while any(v != [b"newest"] for v in remaining.values()) and time.monotonic() < deadline:
        time.sleep(3)
        remaining = {topic: probe_values(topic) for topic in topics}
    assert remaining == {topic: [b"newest"] for topic in topics}
