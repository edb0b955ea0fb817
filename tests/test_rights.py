"""Service Bus rights on Kafka ACLs: Apache Kafka with SASL/PLAIN and the
StandardAuthorizer, started here, ACLs from ``settlement acl``'s bindings.
Each refusal is a ServiceBusAuthorizationError naming the entity and the
missing right. (The embedded broker has no authorizer: its engine-side
refusals are tested in test_engine_rights.py.)"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.core.exceptions import ClientAuthenticationError
from confluent_kafka.admin import AdminClient

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.exceptions import ServiceBusAuthenticationError, ServiceBusAuthorizationError
from settlement.management import ServiceBusAdministrationClient
from settlement.testing.apache_kafka import KafkaCluster
from streams.process import EngineProcess
from tests.wire_commands import call_raw
from topics import rights
from topics.connection import parse_connection_string
from topics.errors import ErrorCode

pytestmark = pytest.mark.needs_broker
NS, OTHER_NS = "shop", "bank"
USERS = {name: uuid.uuid4().hex for name in
         ("admin", "engine", "manager", "sender", "listener", "banker")}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    # TLS and SAS credentials, as an operator deploys (SASL_SSL)
    cluster = KafkaCluster(users=USERS, tls=True,
                           data_dir=tmp_path_factory.mktemp("secured-kafka"))
    cluster.start()
    engine: EngineProcess | None = None
    try:
        admin = AdminClient(parse_connection_string(cluster.connection_string(NS)).kafka_config())
        bindings = [*rights.engine_acl_bindings(NS, "User:engine"),
                    *rights.acl_bindings(NS, "User:manager", "Manage"),
                    *rights.acl_bindings(NS, "User:sender", "Send", "orders"),
                    *rights.acl_bindings(NS, "User:listener", "Listen", "orders"),
                    *rights.acl_bindings(OTHER_NS, "User:banker", "Manage")]
        for done in admin.create_acls(bindings).values():
            done.result(30)
        engine = EngineProcess(cluster.connection_string(NS, "engine"),
                               Path(tmp_path_factory.mktemp("secured-engine"))).start()
        manager = ServiceBusAdministrationClient.from_connection_string(
            cluster.connection_string(NS, "manager"))
        manager.create_queue("orders", lock_duration=30)
        manager.create_queue("payments", lock_duration=30)
        manager.close()
        yield cluster
    finally:
        if engine is not None:
            engine.stop()
        cluster.stop()


def as_user(cluster: KafkaCluster, user: str, namespace: str = NS) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(cluster.connection_string(namespace, user))


def admin_as(cluster: KafkaCluster, user: str) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient.from_connection_string(
        cluster.connection_string(NS, user))


def test_send_and_listen_rights_each_allow_their_half(secured: KafkaCluster) -> None:
    with as_user(secured, "sender") as client:
        client.get_queue_sender("orders").send_messages(
            [ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(5)])
        with pytest.raises(ServiceBusAuthorizationError, match="Listen right on queue .orders."):
            client.get_queue_receiver("orders").receive_messages(5, max_wait_time=5)
        with pytest.raises(ServiceBusAuthorizationError, match="Send right on queue .payments."):
            client.get_queue_sender("payments").send_messages(ServiceBusMessage("x"))
    with as_user(secured, "listener") as client:
        receiver = client.get_queue_receiver("orders")
        got = []
        while len(got) < 5:
            batch = receiver.receive_messages(5 - len(got), max_wait_time=10)
            assert batch, f"only {len(got)} of 5 received"
            got += batch
        assert sorted(m.message_id for m in got) == [f"m{i}" for i in range(5)]
        assert all(r.succeeded for r in receiver.complete_messages(got))
        with pytest.raises(ServiceBusAuthorizationError, match="Send right on queue .orders."):
            client.get_queue_sender("orders").send_messages(ServiceBusMessage("x"))
        with pytest.raises(ServiceBusAuthorizationError, match="Listen right on queue .payments."):
            client.get_queue_receiver("payments").receive_messages(1, max_wait_time=5)
        link = receiver._link  # a Listen principal writes commands, but not the engine's
        for op in ("drop", "expire"):
            reply = call_raw(link, op, "orders", 0)
            assert not reply.ok and reply.error_code == ErrorCode.UNAUTHORIZED, reply


def test_only_manage_creates_and_deletes(secured: KafkaCluster) -> None:
    for user in ("listener", "sender"):
        admin = admin_as(secured, user)
        with pytest.raises(ServiceBusAuthorizationError, match="Manage right on namespace .shop."):
            admin.create_queue(f"made-by-{user}")
        with pytest.raises(ServiceBusAuthorizationError, match="Manage right on namespace .shop."):
            admin.delete_queue("orders")
        admin.close()
    manager = admin_as(secured, "manager")
    assert {"orders", "payments"} <= {q.name for q in manager.list_queues()}
    manager.close()


def test_the_sdks_admin_constructor_signs_in_with_a_named_key(secured: KafkaCluster) -> None:
    """``ServiceBusAdministrationClient(namespace, credential)``; a refusal is
    azure-core's ClientAuthenticationError, as the SDK's client raises."""
    namespace = f"kafkas://{secured.bootstrap}/{NS}"
    trust = str(secured.ca_path)  # the SDK's connection_verify: the CA of a private TLS CA
    manager = ServiceBusAdministrationClient(
        namespace, AzureNamedKeyCredential("manager", USERS["manager"]), connection_verify=trust)
    assert "orders" in {q.name for q in manager.list_queues()}
    manager.close()
    for key_name, key, reason in (("listener", USERS["listener"], "Manage right"),
                                  ("manager", "wrong key", "did not accept")):
        admin = ServiceBusAdministrationClient(namespace, AzureNamedKeyCredential(key_name, key),
                                               connection_verify=trust)
        with pytest.raises(ClientAuthenticationError, match=reason) as refused:
            admin.create_queue("made-with-a-credential")
        assert refused.value.status_code == 401
        admin.close()


def test_the_sdks_client_constructor_signs_in_with_a_named_key(secured: KafkaCluster) -> None:
    """``ServiceBusClient(namespace, AzureNamedKeyCredential(...))`` sends and
    receives; a wrong key is ServiceBusAuthenticationError at once (it is not
    retried), naming the namespace and the broker's reason."""
    namespace = f"kafkas://{secured.bootstrap}/{NS}"
    trust = str(secured.ca_path)
    message_id = uuid.uuid4().hex
    with ServiceBusClient(namespace, AzureNamedKeyCredential("sender", USERS["sender"]),
                          connection_verify=trust) as client:
        assert client.fully_qualified_namespace == namespace
        client.get_queue_sender("orders").send_messages(
            ServiceBusMessage("named key", message_id=message_id))
    with ServiceBusClient(namespace, AzureNamedKeyCredential("listener", USERS["listener"]),
                          connection_verify=trust) as client:
        receiver = client.get_queue_receiver("orders")
        received: list[str] = []
        while message_id not in received:  # other tests' messages may come first
            batch = receiver.receive_messages(10, max_wait_time=10)
            assert batch, f"message {message_id} was sent but not received"
            receiver.complete_messages(batch)
            received += [m.message_id for m in batch]
    started = time.monotonic()
    with ServiceBusClient(namespace, AzureNamedKeyCredential("sender", "wrong key"),
                          retry_total=5, connection_verify=trust) as client, \
            pytest.raises(ServiceBusAuthenticationError,
                          match=f"namespace '{NS}'.*Invalid username or password"):
        client.get_queue_sender("orders").send_messages(ServiceBusMessage("x"))
    assert time.monotonic() - started < 5


def test_a_principal_of_another_namespace_sees_nothing(secured: KafkaCluster) -> None:
    admin = admin_as(secured, "banker")
    with pytest.raises(ServiceBusAuthorizationError, match="shop"):
        admin.list_queues()
    admin.close()
    with as_user(secured, "banker") as client, pytest.raises(ServiceBusAuthorizationError):
        client.get_queue_receiver("orders").receive_messages(1, max_wait_time=5)


def test_the_spark_audit_reads_a_secured_cluster_as_the_engine(secured: KafkaCluster,
                                                                spark: Any) -> None:
    from spark.audit import run_audit

    with as_user(secured, "manager") as client:
        client.get_queue_sender("payments").send_messages(ServiceBusMessage("p"))
        receiver = client.get_queue_receiver("payments")
        [message] = receiver.receive_messages(1, max_wait_time=10)
        receiver.complete_message(message)
    report = run_audit(spark, secured.connection_string(NS, "engine"), ["payments"])
    assert report.ok and report.messages == 1, report.summary()
