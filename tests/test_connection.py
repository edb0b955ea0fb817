"""Connection strings, and clear errors for namespaces and brokers that are not there."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from settlement import ServiceBusClient, ServiceBusMessage, aio
from settlement.exceptions import MessagingEntityNotFoundError, ServiceBusConnectionError
from settlement.management import ServiceBusAdministrationClient
from tests.helpers import Broker
from topics.connection import (
    CLIENT_ID,
    ENGINE_CLIENT_ID,
    ConnectionStringError,
    parse_connection_string,
)
from topics.names import InvalidNameError


def test_connection_string_parses_hosts_namespace_and_options() -> None:
    settings = parse_connection_string(
        "Endpoint=kafka://a:9092,b:9093;Namespace=shop;FetchMaxWaitMs=10;SecurityProtocol=SSL")
    assert settings.bootstrap_servers == "a:9092,b:9093" and settings.namespace == "shop"
    # TLS named the librdkafka way: the system's CAs, as with kafkas://
    assert settings.security == {"security.protocol": "SSL", "ssl.ca.location": "probe"}
    assert parse_connection_string(settings.to_string()) == settings
    assert "FetchMaxWaitMs" not in settings.to_string()  # detected, never tuned by users


def test_every_kafka_client_is_named_for_the_broker_by_who_runs_it() -> None:
    """A broker's request log and client quotas tell the library's clients
    from the engine's by ``client.id`` (librdkafka's default named every
    client "rdkafka")."""
    settings = parse_connection_string("Endpoint=kafka://a:9092;Namespace=shop")
    assert settings.kafka_config()["client.id"] == CLIENT_ID
    assert settings.consumer_config("readers")["client.id"] == CLIENT_ID
    engine = dataclasses.replace(settings, client_id=ENGINE_CLIENT_ID)
    assert engine.kafka_config()["client.id"] == ENGINE_CLIENT_ID != CLIENT_ID
    assert parse_connection_string(engine.to_string()).client_id == CLIENT_ID


@pytest.mark.parametrize("conn, protocol, ca_file", [
    ("Endpoint=kafkas://a:9093;Namespace=shop", "SSL", None),
    ("Endpoint=kafkas://a:9093;Namespace=shop;CaFile={ca}", "SSL", "{ca}"),
    ("Endpoint=kafkas://a:9093;Namespace=shop;CaFile={ca};SharedAccessKeyName=app;"
     "SharedAccessKey=k", "SASL_SSL", "{ca}"),
    ("Endpoint=kafka://a:9092;Namespace=shop;SharedAccessKeyName=app;SharedAccessKey=k",
     "SASL_PLAINTEXT", None),
])
def test_kafkas_endpoints_connect_with_tls_trusting_the_ca_file_or_the_system(
        conn: str, protocol: str, ca_file: str | None, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca))
    settings = parse_connection_string(conn.format(ca=ca))
    assert settings.security["security.protocol"] == protocol
    assert settings.tls == protocol.endswith("SSL")
    assert settings.ca_file == (ca_file.format(ca=ca) if ca_file else None)
    assert parse_connection_string(settings.to_string()) == settings
    context = settings.ssl_context()
    if settings.tls:  # Python's clients (the engine's) check certificates and host names
        assert context is not None and context.check_hostname
    else:
        assert context is None


def test_an_entity_level_connection_string_is_for_its_entity_only() -> None:
    """``EntityPath=`` as in a connection string copied from a Service Bus
    queue's or topic's shared access policy: the client opens that entity
    only, refusing another with the SDK's ValueError (before connecting)."""
    conn = "Endpoint=kafka://127.0.0.1:9;Namespace=shop;EntityPath=orders"
    settings = parse_connection_string(conn)
    assert settings.entity_path == "orders"
    assert parse_connection_string(settings.to_string()) == settings
    client = ServiceBusClient.from_connection_string(conn)
    for opens in (lambda: client.get_queue_sender("payments"),
                  lambda: client.get_queue_receiver("payments"),
                  lambda: client.get_topic_sender("payments"),
                  lambda: client.get_subscription_receiver("payments", "all"),
                  lambda: client.get_queue_receiver("payments/subscriptions/all")):
        with pytest.raises(ValueError, match="does not match the EntityPath .*: orders"):
            opens()
    client.close()
    aio_client = aio.ServiceBusClient.from_connection_string(conn)
    for aio_opens in (lambda: aio_client.get_queue_sender("payments"),
                      lambda: aio_client.get_queue_receiver("payments"),
                      lambda: aio_client.get_subscription_receiver("payments", "all")):
        with pytest.raises(ValueError, match="does not match the EntityPath"):
            aio_opens()
    aio_client.get_queue_sender("orders")  # its own entity: made (it connects on first use)
    asyncio.run(aio_client.close())


def test_a_missing_namespace_is_named() -> None:
    with pytest.raises(ConnectionStringError, match="no Namespace: add ';Namespace=NAME'"):
        parse_connection_string("Endpoint=kafka://127.0.0.1:9092;SharedAccessKeyName=a;"
                                "SharedAccessKey=k")


def test_a_ca_file_that_is_not_there_is_named() -> None:
    settings = parse_connection_string("Endpoint=kafkas://a:9093;Namespace=shop;CaFile=/no/ca.pem")
    with pytest.raises(ConnectionStringError, match="CaFile '/no/ca.pem'"):
        settings.ssl_context()


@pytest.mark.parametrize("conn, error, fragment", [
    ("", ConnectionStringError, "empty"),
    ("Endpoint=sb://x.servicebus.windows.net/;Namespace=a", ConnectionStringError, "kafka://"),
    ("Endpoint=kafka://nohost;Namespace=a", ConnectionStringError, "HOST:PORT"),
    ("Endpoint=kafka://h:1;Namespace=bad name", InvalidNameError, "namespace"),
    ("Endpoint=kafka://h:1;Namespace=a;Colour=blue", ConnectionStringError, "colour"),
    ("Endpoint=kafka://h:1;Namespace=a;CaFile=/ca.pem", ConnectionStringError, "kafkas://"),
    ("Endpoint=kafkas://h:1;Namespace=a;SecurityProtocol=SASL_PLAINTEXT", ConnectionStringError,
     "TLS"),
])
def test_bad_connection_strings_say_what_is_wrong(conn: str, error: type, fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        parse_connection_string(conn)


def test_never_provisioned_namespace_has_no_queues(broker: Broker) -> None:
    conn = broker.connection_string("neverused")
    with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
        assert admin.list_queues() == []
        with pytest.raises(MessagingEntityNotFoundError, match="'ghost'"):
            admin.get_queue("ghost")
    with ServiceBusClient.from_connection_string(conn) as client:
        with pytest.raises(MessagingEntityNotFoundError):
            client.get_queue_receiver("ghost")


def test_unreachable_broker_is_a_connection_error() -> None:
    conn = "Endpoint=kafka://127.0.0.1:1;Namespace=nowhere"
    with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
        with pytest.raises(ServiceBusConnectionError, match="Kafka is running") as info:
            admin.list_queues()
        assert info.value.retryable


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A port of this machine where nothing takes connections (bound, not listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_broker_that_refuses_connections_is_one_clear_error_at_once(
        refusing_port: int, caplog: pytest.LogCaptureFixture) -> None:
    """Each client, sync, asyncio and administration, raises one retryable
    ServiceBusConnectionError naming the address within a second or two (not
    after librdkafka's timeouts), and logs at most one line."""
    conn = f"Endpoint=kafka://127.0.0.1:{refusing_port};Namespace=nowhere"
    where = f"127.0.0.1:{refusing_port}"

    async def aio_send() -> None:
        async with aio.ServiceBusClient.from_connection_string(conn) as client:
            async with client.get_queue_sender("orders") as sender:
                await sender.send_messages(ServiceBusMessage("x"), timeout=5)

    def sync_send() -> None:
        with ServiceBusClient.from_connection_string(conn) as client:
            client.get_queue_sender("orders").send_messages(ServiceBusMessage("x"), timeout=5)

    def admin_list() -> None:
        with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
            admin.list_queues()

    for call in (sync_send, lambda: asyncio.run(aio_send()), admin_list):
        caplog.clear()
        started = time.monotonic()
        with pytest.raises(ServiceBusConnectionError, match="Kafka is running") as info:
            call()
        assert time.monotonic() - started < 3
        assert where in str(info.value) and info.value.retryable
        assert len(_warnings(caplog)) <= 1, _warnings(caplog)


def test_the_cli_prints_one_line_when_no_broker_answers(refusing_port: int) -> None:
    conn = f"Endpoint=kafka://127.0.0.1:{refusing_port};Namespace=nowhere"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "settlement.cli", "queue", "list",
                           "--connection-string", conn], capture_output=True, text=True,
                          timeout=60)
    assert time.monotonic() - started < 10
    assert done.returncode != 0
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) == 1 and "cannot reach Kafka" in lines[0], lines


def test_a_broker_that_takes_connections_and_never_answers_is_one_clear_error(
        caplog: pytest.LogCaptureFixture) -> None:
    """A listener that accepts and stays silent (a hung broker): the first
    call raises once the connection check's 10 s pass, logging at most a line."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes handshakes; nothing ever answers
        conn = f"Endpoint=kafka://127.0.0.1:{silent.getsockname()[1]};Namespace=nowhere"
        started = time.monotonic()
        with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
            with pytest.raises(ServiceBusConnectionError, match="no broker answered"):
                admin.list_queues()
        assert time.monotonic() - started < 15
    assert len(_warnings(caplog)) <= 1, _warnings(caplog)
