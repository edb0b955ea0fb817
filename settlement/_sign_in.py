"""Connecting: credentials the broker refuses, and TLS on one side only, are
reported at once.

librdkafka retries a refused SASL sign-in, a failed TLS handshake and a
listener that hangs up on it forever, and every call then fails as if the
broker were away (``Broker transport failure``) once its own timeout passes,
while the log fills with one error line per attempt. The SDK raises
``ServiceBusAuthenticationError`` when the service refuses the credentials,
and does not retry it. So a client connects once before its first sender or
receiver (as the SDK connects on first use), and within about a second:

* refused credentials raise ``ServiceBusAuthenticationError``, naming the
  namespace and the broker's reason;
* a TLS handshake that fails (the broker's certificate is not signed by a
  trusted CA, or the listener does not speak TLS) raises
  ``ServiceBusConnectionError`` saying which, and what to change;
* a ``kafka://`` (plaintext) connection to a listener that speaks TLS, which
  the broker simply hangs up on, is found by trying a TLS handshake with it:
  ``ServiceBusConnectionError`` says to use ``kafkas://``;
* no broker at all (nothing takes connections at any bootstrap address, or
  none answers a metadata request within the check's time) raises
  ``ServiceBusConnectionError`` (retryable) once, instead of each call
  waiting out librdkafka's timeouts while it logs its reconnect attempts.
"""

from __future__ import annotations

import socket
import ssl
import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from settlement.exceptions import ServiceBusConnectionError, denied
from topics.connection import ConnectionSettings

#: how long one metadata request may take before errors are looked at
_ATTEMPT_S = 0.5
#: how long the TLS probe of a plaintext connection may take
_PROBE_S = 2.0


def check_connection(settings: ConnectionSettings, timeout: float = 10.0) -> None:
    """Raise ``ServiceBusAuthenticationError`` if the brokers refuse the
    SASL credentials of ``settings``, ``ServiceBusConnectionError`` if TLS
    is on one side only, the brokers' certificate is not trusted, nothing
    takes connections at any bootstrap address (within about a second), or
    no broker answers within ``timeout``. Returns when the brokers answer."""
    errors: list[KafkaError] = []
    # log_level 0: the refusal is raised below, not logged once per attempt
    # (confluent-kafka annotates AdminClient's config without the callbacks it takes)
    admin = AdminClient({**settings.kafka_config(),
                         "error_cb": errors.append,  # type: ignore[dict-item]
                         "log_level": 0})
    deadline = time.monotonic() + timeout
    probed = False
    while True:
        try:
            admin.list_topics(timeout=_ATTEMPT_S)
            return
        except KafkaException:
            admin.poll(0)  # serves error_cb
        _raise_refusal(settings, errors)
        if not probed:
            probed = True
            addresses = settings.bootstrap_servers.split(",")
            if not any(_listens(address) for address in addresses):
                raise _unreachable(settings, "nothing takes connections there")
            if not settings.tls and _speaks_tls(addresses[0]):
                raise ServiceBusConnectionError(
                    f"the broker at {settings.bootstrap_servers} speaks TLS, and this "
                    "connection string asks for a plaintext connection: use "
                    "Endpoint=kafkas://HOST:PORT (with CaFile=PATH for a private CA)")
        if time.monotonic() > deadline:
            raise _unreachable(settings, f"no broker answered within {timeout:g} s")


def _unreachable(settings: ConnectionSettings, why: str) -> ServiceBusConnectionError:
    return ServiceBusConnectionError(
        f"cannot reach Kafka at {settings.bootstrap_servers} ({why}): check the Endpoint of "
        "the connection string and that Kafka is running")


def _listens(host_port: str) -> bool:
    """Whether anything takes a TCP connection at ``host_port``."""
    raw = _connect(host_port)
    if raw is not None:
        raw.close()
    return raw is not None


def _connect(host_port: str) -> socket.socket | None:
    """A TCP connection to ``host_port``; None when it is refused or unreachable."""
    host, _, port = host_port.rpartition(":")
    try:
        return socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_S)
    except OSError:
        return None


def _raise_refusal(settings: ConnectionSettings, errors: list[KafkaError]) -> None:
    """Raise the error a definite refusal among ``errors`` stands for."""
    for error in errors:
        if error.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            refused = denied(error.name(), "", f"namespace {settings.namespace!r} on "
                             f"{settings.bootstrap_servers} ({error.str()})")
            if refused is not None:  # always, for these error names
                raise refused
        if error.code() == KafkaError._SSL:
            raise ServiceBusConnectionError(_tls_failure(settings, error.str()))


def _tls_failure(settings: ConnectionSettings, reason: str) -> str:
    where = f"the TLS handshake with the broker at {settings.bootstrap_servers} failed"
    if "verify failed" in reason:
        trusted = (f"the CA in CaFile {settings.ca_file!r}" if settings.ca_file
                   else "the system's certificate authorities")
        return (f"{where}: its certificate is not signed by {trusted} ({reason}): set "
                "CaFile=PATH to the PEM file of the CA that signed it ('settlement kafka "
                "--tls' prints it as 'ca:')")
    return (f"{where} ({reason}): if that listener is plaintext, use Endpoint=kafka://; "
            "otherwise check its certificate and TLS settings")


def _speaks_tls(host_port: str) -> bool:
    """Whether the listener at ``host_port`` completes a TLS handshake
    (its certificate unchecked: only the protocol is asked); False when
    nothing takes the connection."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    raw = _connect(host_port)
    if raw is None:
        return False
    try:
        with context.wrap_socket(raw, server_hostname=host_port.rpartition(":")[0].strip("[]")):
            return True
    except OSError:  # ssl.SSLError among them: a plaintext listener hangs up or answers junk
        return False
    finally:
        raw.close()
