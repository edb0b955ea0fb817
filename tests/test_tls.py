"""TLS end to end on Apache Kafka: a cluster whose only client listener is
SASL_SSL (``KafkaCluster(tls=True, users=...)``, as ``settlement kafka --tls``
runs it), its certificate signed by a CA made for it. Clients, the
administration client, the engine worker and the Spark monitor connect with
``kafkas://`` connection strings naming that CA and SAS credentials; a
plaintext client, or one that does not trust the CA, is told so at once.
(The rights and SAS tests run on the same kind of cluster: test_rights.py.)"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from confluent_kafka.admin import AdminClient

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.exceptions import ServiceBusConnectionError
from settlement.management import ServiceBusAdministrationClient
from settlement.testing.apache_kafka import KafkaCluster
from spark.metrics_store import read_metrics, totals
from streams.process import EngineProcess
from tests.helpers import drive_workload, run_monitor
from topics import rights
from topics.connection import parse_connection_string

pytestmark = pytest.mark.needs_broker
NS = "vault"
USERS = {"admin": "admin-secret", "engine": "engine-secret", "app": "app-secret"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    with KafkaCluster(users=USERS, tls=True,
                      data_dir=tmp_path_factory.mktemp("tls-kafka")) as running:
        admin = AdminClient(parse_connection_string(running.connection_string(NS)).kafka_config())
        bindings = [*rights.engine_acl_bindings(NS, "User:engine"),
                    *rights.acl_bindings(NS, "User:app", "Manage")]
        for done in admin.create_acls(bindings).values():
            done.result(30)
        yield running


@pytest.fixture(scope="module")
def app_conn(cluster: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[str]:
    """The application's connection string, with an engine worker running
    over TLS as its own user."""
    engine = EngineProcess(cluster.connection_string(NS, "engine"),
                           tmp_path_factory.mktemp("tls-engine")).start()
    try:
        yield cluster.connection_string(NS, "app")
    finally:
        engine.stop()


def test_the_connection_string_is_kafkas_with_the_clusters_ca(cluster: KafkaCluster) -> None:
    conn = cluster.connection_string(NS, "app")
    assert conn.startswith(f"Endpoint=kafkas://{cluster.bootstrap};")
    settings = parse_connection_string(conn)
    assert settings.security["security.protocol"] == "SASL_SSL"
    assert settings.ca_file == str(cluster.ca_path)
    assert cluster.ca_path.read_text().startswith("-----BEGIN CERTIFICATE-----")
    # the broker's only client listener is TLS
    properties = (cluster.nodes[0].directory / "server.properties").read_text()
    assert f"advertised.listeners=SASL_SSL://{cluster.bootstrap}\n" in properties


def test_send_receive_settle_and_admin_over_tls(app_conn: str) -> None:
    with ServiceBusAdministrationClient.from_connection_string(app_conn) as admin:
        admin.create_queue("orders", lock_duration=30, max_delivery_count=2)
        assert "orders" in {q.name for q in admin.list_queues()}
    with ServiceBusClient.from_connection_string(app_conn) as client:
        with client.get_queue_sender("orders") as sender:
            sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                                  for i in range(4)])
        with client.get_queue_receiver("orders", max_wait_time=10) as receiver:
            got: list[Any] = []
            while len(got) < 4:
                batch = receiver.receive_messages(4 - len(got), max_wait_time=10)
                assert batch, f"only {len(got)} of 4 messages came back over TLS"
                got += batch
            receiver.complete_message(got[0])
            receiver.abandon_message(got[1])
            receiver.dead_letter_message(got[2], reason="bad", error_description="over TLS")
            receiver.defer_message(got[3])
            again = receiver.receive_messages(1, max_wait_time=10)
            assert [m.message_id for m in again] == ["m1"] and again[0].delivery_count == 1
            receiver.complete_message(again[0])
        with client.get_queue_receiver("orders", sub_queue="deadletter",
                                       max_wait_time=10) as dead:
            letters = dead.receive_messages(1, max_wait_time=10)
            assert [(m.message_id, m.dead_letter_reason) for m in letters] == [("m2", "bad")]
            dead.complete_message(letters[0])
    with ServiceBusAdministrationClient.from_connection_string(app_conn) as admin:
        props = admin.get_queue_runtime_properties("orders")
        assert (props.active_message_count, props.dead_letter_message_count) == (0, 0)


def test_the_spark_monitor_reads_over_tls(spark: Any, cluster: KafkaCluster, app_conn: str,
                                          tmp_path: Path) -> None:
    with ServiceBusAdministrationClient.from_connection_string(app_conn) as admin:
        admin.create_queue("watched", lock_duration=30)
    with ServiceBusClient.from_connection_string(app_conn) as client:
        drive_workload(client, "watched", sent=6, complete=3, abandon=1, dead_letter=1,
                       reason="r", defer=1)
    sink = tmp_path / "monitor"
    # as the operator (the cluster's admin): the engine's topics are not the app's to read
    run_monitor(spark, cluster.connection_string(NS), sink)
    counts = totals(read_metrics(sink), "count")
    assert (counts[("watched", "enqueued")], counts[("watched", "completed")],
            counts[("watched", "dead_lettered")]) == (6, 4, 1)


def test_a_plaintext_client_of_the_tls_listener_is_told_at_once(cluster: KafkaCluster) -> None:
    conn = (f"Endpoint=kafka://{cluster.bootstrap};Namespace={NS};"
            f"SharedAccessKeyName=app;SharedAccessKey={USERS['app']}")
    started = time.monotonic()
    with ServiceBusClient.from_connection_string(conn) as client, \
            pytest.raises(ServiceBusConnectionError, match="speaks TLS.*kafkas://"):
        client.get_queue_sender("orders")
    assert time.monotonic() - started < 5


def test_a_client_that_does_not_trust_the_ca_is_told_at_once(
        cluster: KafkaCluster, tmp_path: Path) -> None:
    stranger = tmp_path / "another-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(stranger))
    conn = cluster.connection_string(NS, "app").replace(str(cluster.ca_path), str(stranger))
    started = time.monotonic()
    with ServiceBusAdministrationClient.from_connection_string(conn) as admin, \
            pytest.raises(ServiceBusConnectionError, match="not signed by the CA in CaFile"):
        admin.list_queues()
    # the system's CAs do not know the cluster's private CA either
    system = conn.split(";CaFile=")[0] + f";SharedAccessKeyName=app;SharedAccessKey={USERS['app']}"
    with ServiceBusClient.from_connection_string(system) as client, \
            pytest.raises(ServiceBusConnectionError, match="system's certificate authorities"):
        client.get_queue_receiver("orders")
    assert time.monotonic() - started < 10


def test_settlement_kafka_tls_prints_its_ca_and_serves_tls_alone(tmp_path: Path) -> None:
    """``settlement kafka --tls`` prints ``ca: PATH`` beside ``bootstrap:``;
    over its TLS listener alone (``SSL``, no credentials) the engine and a
    client trusting that CA serve a queue."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "settlement.cli", "kafka", "--port", "0", "--tls",
         "--data-dir", str(tmp_path / "kafka")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    engine: EngineProcess | None = None
    try:
        assert proc.stdout is not None
        lines: dict[str, str] = {}
        while "ca" not in lines:
            line = proc.stdout.readline()
            assert line, f"settlement kafka --tls ended: {proc.stderr and proc.stderr.read()}"
            key, _, value = line.strip().partition(": ")
            lines[key] = value
        assert Path(lines["ca"]) == tmp_path / "kafka" / "tls" / "ca.pem"
        conn = f"Endpoint=kafkas://{lines['bootstrap']};Namespace=plain;CaFile={lines['ca']}"
        assert parse_connection_string(conn).security["security.protocol"] == "SSL"
        engine = EngineProcess(conn, tmp_path / "engine").start()
        with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
            admin.create_queue("q", lock_duration=30)
        with ServiceBusClient.from_connection_string(conn) as client:
            client.get_queue_sender("q").send_messages(ServiceBusMessage("tls", message_id="t"))
            with client.get_queue_receiver("q") as receiver:
                got = receiver.receive_messages(1, max_wait_time=30)
                assert [m.message_id for m in got] == ["t"]
                receiver.complete_message(got[0])
    finally:
        if engine is not None:
            engine.stop()
        proc.terminate()
        proc.wait(60)
