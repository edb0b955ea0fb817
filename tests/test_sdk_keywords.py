"""The keywords of the SDK's client, sender and receiver calls: each is
honoured, or refused with a TypeError that says it is not supported here and
why; a keyword the SDK does not know either is Python's own TypeError. And
the SDK's constructor, ``ServiceBusClient(fully_qualified_namespace,
credential)``, as far as a broker without SASL can show it (signing in with
the credential is tested on Apache Kafka in test_rights.py)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from azure.core.credentials import AccessToken, AzureNamedKeyCredential, AzureSasCredential

from settlement import AutoLockRenewer, ServiceBusClient, ServiceBusMessage
from settlement._keywords import UNSUPPORTED
from settlement.exceptions import ServiceBusError
from topics.connection import ConnectionStringError, parse_connection_string

#: a value of the type the SDK takes, for each keyword refused here
SDK_VALUES: dict[str, Any] = {
    "http_proxy": {"proxy_hostname": "proxy.example", "proxy_port": 3128},
    "custom_endpoint_address": "sb://gateway.example:443",
    "ssl_context": None,
    "transport_type": "AmqpOverWebsocket",
    "uamqp_transport": False,
    "socket_timeout": 1.0,
    "user_agent": "my-app/1.0",
    "connection_timeout": 5.0,
}
CLIENT_KEYWORDS = ["http_proxy", "custom_endpoint_address", "ssl_context",
                   "transport_type", "uamqp_transport", "user_agent", "socket_timeout"]


def test_every_refused_keyword_has_an_sdk_value() -> None:
    assert set(SDK_VALUES) == set(UNSUPPORTED)


class AzureAdCredential:
    """What azure-identity's credentials look like to the client."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("token", int(time.time()) + 3600)


def assert_refused(call: Callable[..., Any], where: str, keyword: str) -> None:
    with pytest.raises(TypeError, match=f"{where}\\(\\) keyword '{keyword}' is not supported "
                                        "here: .{10,}"):
        call(**{keyword: SDK_VALUES[keyword]})


def assert_unknown(call: Callable[..., Any], where: str) -> None:
    with pytest.raises(TypeError, match=f"{where}\\(\\) got an unexpected keyword argument "
                                        "'no_such_option'"):
        call(no_such_option=1)


@pytest.mark.parametrize("keyword", CLIENT_KEYWORDS)
def test_the_client_refuses_the_amqp_transport_keywords(conn: str, keyword: str) -> None:
    assert_refused(lambda **kw: ServiceBusClient.from_connection_string(conn, **kw),
                   "from_connection_string", keyword)
    assert_refused(lambda **kw: ServiceBusClient(
        "127.0.0.1:9092/shop", AzureNamedKeyCredential("sender", "key"), **kw),
        "ServiceBusClient", keyword)


def test_connection_verify_names_the_ca_of_a_tls_endpoint(conn: str) -> None:
    """The SDK's ``connection_verify`` (a CA file) is ``CaFile`` of a
    ``kafkas://`` endpoint; on a plaintext one it says so."""
    with pytest.raises(ConnectionStringError, match="kafkas://"):
        ServiceBusClient.from_connection_string(conn, connection_verify="/etc/ca.pem")
    client = ServiceBusClient("kafkas://127.0.0.1:9093/shop",
                              AzureNamedKeyCredential("sender", "key"),
                              connection_verify="/etc/ca.pem")
    assert client.settings.ca_file == "/etc/ca.pem"
    assert client.fully_qualified_namespace == "kafkas://127.0.0.1:9093/shop"
    client.close()


def test_the_client_refuses_unknown_keywords(conn: str) -> None:
    assert_unknown(lambda **kw: ServiceBusClient.from_connection_string(conn, **kw),
                   "from_connection_string")
    assert_unknown(lambda **kw: ServiceBusClient(
        "127.0.0.1:9092/shop", AzureNamedKeyCredential("sender", "key"), **kw),
        "ServiceBusClient")


def test_the_sdks_constructor_takes_host_port_and_namespace() -> None:
    """The named key is the SASL user and password, as SharedAccessKeyName and
    SharedAccessKey in a connection string; ``sb://`` is stripped as the SDK
    strips it. (Tansu has no SASL: signing in is tested in test_rights.py.)"""
    for given in ("127.0.0.1:9092,127.0.0.1:9093/shop", "sb://127.0.0.1:9092,127.0.0.1:9093/shop/"):
        client = ServiceBusClient(given, AzureNamedKeyCredential("sender", "the-key"),
                                  retry_total=1)
        assert client.fully_qualified_namespace == "127.0.0.1:9092,127.0.0.1:9093/shop"
        assert client.settings == parse_connection_string(
            "Endpoint=kafka://127.0.0.1:9092,127.0.0.1:9093;Namespace=shop;"
            "SharedAccessKeyName=sender;SharedAccessKey=the-key")
        assert client.retry.total == 1
        client.close()


def test_the_sdks_constructor_refuses_what_kafka_cannot_check() -> None:
    with pytest.raises(ConnectionStringError, match="HOST:PORT.*Service Bus host names"):
        ServiceBusClient("shop.servicebus.windows.net", AzureNamedKeyCredential("a", "b"))
    with pytest.raises(TypeError, match="AzureAdCredential is an Azure AD credential"):
        ServiceBusClient("127.0.0.1:9092/shop", AzureAdCredential())
    with pytest.raises(TypeError, match="AzureNamedKeyCredential or AzureSasCredential, not str"):
        ServiceBusClient("127.0.0.1:9092/shop", "Endpoint=sb://...")
    with pytest.raises(ConnectionStringError, match="SharedAccessSignature sr="):
        ServiceBusClient("127.0.0.1:9092/shop", AzureSasCredential("not a token"))


def test_a_connection_strings_client_names_brokers_and_namespace(conn: str) -> None:
    settings = parse_connection_string(conn)
    with ServiceBusClient.from_connection_string(conn) as client:
        assert client.fully_qualified_namespace == (
            f"{settings.bootstrap_servers}/{settings.namespace}")


@pytest.fixture
def debug_logging_restored() -> Iterator[logging.Logger]:
    logger = logging.getLogger("settlement")
    level = logger.level
    yield logger
    logger.setLevel(level)


def test_logging_enable_logs_the_clients_work_at_debug(
        conn: str, debug_logging_restored: logging.Logger) -> None:
    with ServiceBusClient.from_connection_string(conn):
        assert not debug_logging_restored.isEnabledFor(logging.DEBUG)
    with ServiceBusClient.from_connection_string(conn, logging_enable=True):
        assert debug_logging_restored.isEnabledFor(logging.DEBUG)


@pytest.mark.parametrize("method", ["get_queue_sender", "get_queue_receiver"])
def test_the_handler_getters_refuse_socket_timeout_and_unknown_keywords(
        client: ServiceBusClient, make_queue: Callable[..., str], method: str) -> None:
    queue = make_queue()
    get = getattr(client, method)
    assert_refused(lambda **kw: get(queue, **kw), method, "socket_timeout")
    assert_unknown(lambda **kw: get(queue, **kw), method)
    handler = get(queue, client_identifier="orders-handler")
    assert handler.client_identifier == "orders-handler"
    assert get(queue).client_identifier.startswith(
        "SBSender-" if method == "get_queue_sender" else "SBReceiver-")


def test_the_topic_getters_refuse_socket_timeout_and_unknown_keywords(
        client: ServiceBusClient) -> None:
    """Checked before the topic is looked up: no topic is needed."""
    get_sender = client.get_topic_sender
    assert_refused(lambda **kw: get_sender("news", **kw), "get_topic_sender", "socket_timeout")
    assert_unknown(lambda **kw: get_sender("news", **kw), "get_topic_sender")
    get_receiver = client.get_subscription_receiver
    assert_refused(lambda **kw: get_receiver("news", "all", **kw), "get_subscription_receiver",
                   "socket_timeout")
    assert_unknown(lambda **kw: get_receiver("news", "all", **kw), "get_subscription_receiver")


def test_session_id_needs_a_session_queue_and_no_sub_queue(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    with pytest.raises(ServiceBusError, match=f"{queue} does not require sessions"):
        client.get_queue_receiver(queue, session_id="s1")
    with pytest.raises(ValueError, match="session_id and sub_queue can not be specified"):
        client.get_queue_receiver(queue, session_id="s1", sub_queue="deadletter")


def test_the_sender_methods_take_the_sdks_keywords_only(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    with client.get_queue_sender(queue) as sender:
        for call in (lambda **kw: sender.send_messages(ServiceBusMessage("x"), **kw),
                     lambda **kw: sender.schedule_messages(
                         ServiceBusMessage("x"), dt.datetime.now(dt.UTC), **kw),
                     lambda **kw: sender.cancel_scheduled_messages(1, **kw)):
            with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_option'"):
                call(no_such_option=1)
        sender.send_messages(ServiceBusMessage("x"), timeout=30)
        later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        [scheduled] = sender.schedule_messages(ServiceBusMessage("later"), later, timeout=30)
        sender.cancel_scheduled_messages(scheduled, timeout=30)
        limit = sender.create_message_batch().max_size_in_bytes
        assert sender.create_message_batch(1024).max_size_in_bytes == 1024
        with pytest.raises(ValueError, match=f"acceptable max batch size is: {limit} bytes"):
            sender.create_message_batch(limit + 1)


def test_auto_lock_renewer_keeps_the_received_messages_locks(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    """As the SDK: every message a receiver with ``auto_lock_renewer``
    receives is registered with it."""
    queue = make_queue(lock_duration=2)
    client.get_queue_sender(queue).send_messages(ServiceBusMessage("held"))
    with AutoLockRenewer(max_lock_renewal_duration=30) as renewer, \
            client.get_queue_receiver(queue, auto_lock_renewer=renewer) as receiver:
        [message] = receiver.receive_messages(1, max_wait_time=10)
        time.sleep(3)  # past the 2 s lock: only the renewer keeps it
        receiver.complete_message(message)
