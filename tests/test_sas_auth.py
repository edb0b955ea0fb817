"""Shared access signatures and named keys, checked by Apache Kafka: the
secured cluster of test_rights.py (SASL/PLAIN with settlement's handler,
settlement/testing/jars/sas-auth) accepts a token signed with a user's key as that
user, and refuses a wrong signature, an expired token and a token presented
for another key name with a ServiceBusAuthenticationError."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import uuid
from urllib.parse import quote

import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.exceptions import ServiceBusAuthenticationError
from settlement.testing.apache_kafka import KafkaCluster
from tests.test_rights import NS, USERS, secured  # noqa: F401 (the secured cluster fixture)
from topics.connection import ConnectionStringError, parse_connection_string

pytestmark = pytest.mark.needs_broker  # the secured cluster of test_rights.py
QUEUE = "orders"  # test_rights.py: 'sender' may Send to it, 'listener' may Listen
REFUSED = "did not accept this connection's credentials"


def generate_sas_token(uri: str, sas_name: str, sas_value: str, token_ttl: float) -> str:
    """As the SDK's sample generate_sas_token_and_authenticate_client.py makes it."""
    expiry = str(int(time.time() + token_ttl))
    signed = hmac.HMAC(sas_value.encode(), (uri + "\n" + expiry).encode(), hashlib.sha256)
    signature = quote(base64.b64encode(signed.digest()))
    return f"SharedAccessSignature sr={uri}&sig={signature}&se={expiry}&skn={sas_name}"


def namespace(cluster: KafkaCluster) -> str:
    """``fully_qualified_namespace`` of the SDK: ``HOST:PORT/NAMESPACE``."""
    return f"{cluster.bootstrap}/{NS}"


def token_for(cluster: KafkaCluster, user: str, key: str | None = None, ttl: float = 300) -> str:
    return generate_sas_token(f"sb://{namespace(cluster)}/{QUEUE}", user, key or USERS[user], ttl)


def with_token(cluster: KafkaCluster, token: str) -> ServiceBusClient:
    return ServiceBusClient.from_connection_string(
        f"Endpoint=kafkas://{cluster.bootstrap};Namespace={NS};CaFile={cluster.ca_path};"
        f"SharedAccessSignature={token}")


def with_credential(cluster: KafkaCluster, credential: object) -> ServiceBusClient:
    """The SDK's constructor, over TLS trusting the cluster's CA (``connection_verify``)."""
    return ServiceBusClient(f"kafkas://{namespace(cluster)}", credential,
                            connection_verify=str(cluster.ca_path))


def send_and_receive(sending: ServiceBusClient, receiving: ServiceBusClient) -> None:
    message_id = uuid.uuid4().hex
    with sending, receiving:
        sending.get_queue_sender(QUEUE).send_messages(
            ServiceBusMessage("signed", message_id=message_id))
        receiver = receiving.get_queue_receiver(QUEUE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            batch = receiver.receive_messages(10, max_wait_time=5)
            receiver.complete_messages(batch)
            if any(m.message_id == message_id for m in batch):
                return
        pytest.fail(f"message {message_id} was sent but not received in 30 s")


def assert_refused(client: ServiceBusClient) -> None:
    """The send fails at once (not after retries) with the authentication error."""
    started = time.monotonic()
    with client, pytest.raises(ServiceBusAuthenticationError, match=REFUSED):
        client.get_queue_sender(QUEUE).send_messages(ServiceBusMessage("x"))
    assert time.monotonic() - started < 15


def test_a_valid_token_sends_and_receives(secured: KafkaCluster) -> None:  # noqa: F811
    send_and_receive(with_token(secured, token_for(secured, "sender")),
                     with_credential(secured, AzureSasCredential(token_for(secured, "listener"))))


def test_a_named_key_credential_signs_in_with_the_key(secured: KafkaCluster) -> None:  # noqa: F811
    send_and_receive(with_credential(secured, AzureNamedKeyCredential("sender", USERS["sender"])),
                     with_credential(secured, AzureNamedKeyCredential("listener",
                                                                      USERS["listener"])))
    assert_refused(with_credential(secured, AzureNamedKeyCredential("sender", "wrong-key")))


def test_a_wrong_signature_is_refused(secured: KafkaCluster) -> None:  # noqa: F811
    assert_refused(with_token(secured, token_for(secured, "sender", key="not-the-key")))
    # signed with another user's key
    assert_refused(with_token(secured, token_for(secured, "sender", key=USERS["listener"])))
    # the signature of another resource or expiry
    token = token_for(secured, "sender")
    assert_refused(with_token(secured, token.replace(f"/{QUEUE}&", "/payments&")))


def test_an_expired_token_is_refused(secured: KafkaCluster) -> None:  # noqa: F811
    assert_refused(with_token(secured, token_for(secured, "sender", ttl=-1)))


def test_a_token_for_another_key_name_is_refused(secured: KafkaCluster) -> None:  # noqa: F811
    assert_refused(with_token(secured, token_for(secured, "nobody", key="some-key")))
    # the sender's valid token presented as the listener's password
    conn = (f"Endpoint=kafkas://{secured.bootstrap};Namespace={NS};CaFile={secured.ca_path};"
            f"SharedAccessKeyName=listener;SharedAccessKey={token_for(secured, 'sender')}")
    assert_refused(ServiceBusClient.from_connection_string(conn))


def test_a_connection_string_signature_signs_in_as_its_key_name() -> None:
    token = "SharedAccessSignature sr=sb://k:9092/shop/q&sig=c2ln%2B&se=1&skn=app"
    settings = parse_connection_string(
        f"Endpoint=kafka://k:9092;Namespace=shop;SharedAccessSignature={token}")
    assert (settings.security["sasl.username"], settings.security["sasl.password"]) == (
        "app", token)
    with pytest.raises(ConnectionStringError, match="not both"):
        parse_connection_string(f"Endpoint=kafka://k:9092;Namespace=shop;SharedAccessSignature="
                                f"{token};SharedAccessKeyName=app;SharedAccessKey=k")
    with pytest.raises(ConnectionStringError, match="skn=KEYNAME"):
        parse_connection_string("Endpoint=kafka://k:9092;Namespace=shop;"
                                "SharedAccessSignature=SharedAccessSignature sr=sb://k/shop&se=1")
