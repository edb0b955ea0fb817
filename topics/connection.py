"""Connection strings: ``Endpoint=kafka://HOST:PORT[,HOST:PORT];Namespace=NAME``.

The shape follows Service Bus connection strings so that ported code only
changes the string. ``Endpoint=kafkas://...`` connects with TLS (Kafka's
``SSL`` protocol, ``SASL_SSL`` with credentials), trusting the system's
certificate authorities or the one in ``CaFile=PATH`` (a PEM file: a private
CA, such as the one ``settlement kafka --tls`` makes). Optional keys:

* ``CaFile``: the PEM file of the CA that signed the brokers' certificates
  (``kafkas://`` only).
* ``EntityPath``: the one queue or topic the string is for, as in a Service
  Bus entity-level connection string: a client made from it opens senders
  and receivers of that entity only.
* ``SharedAccessKeyName`` and ``SharedAccessKey`` (the Service Bus names) are
  the SASL user name and password; the mechanism is then PLAIN and the
  protocol SASL_PLAINTEXT (SASL_SSL with ``kafkas://``) unless the string
  names others.
* ``SecurityProtocol``, ``SaslMechanism``, ``SaslUsername``, ``SaslPassword``,
  ``SslCaLocation``: passed to Kafka clients as their librdkafka names.
* ``SharedAccessSignature=SharedAccessSignature sr=..&sig=..&se=..&skn=..``
  signs in as the token's key name with the token as password, as
  ``AzureSasCredential`` does (see :func:`settings_from_credential`).

A client built the SDK's other way, ``ServiceBusClient(fully_qualified_namespace,
credential)``, names the namespace as ``HOST:PORT[,HOST:PORT]/NAMESPACE``
(optionally after ``kafka://``, ``kafkas://`` for TLS, or ``sb://``) and passes an ``azure-core``
credential: :func:`settings_from_credential` maps it to the same settings.

Nothing in the string tunes for a broker: what differs between Apache Kafka
and the embedded broker is detected (:mod:`topics.broker_profile`). The
``FetchMaxWaitMs`` key of earlier versions is accepted and ignored.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import ssl
import threading
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

from topics import broker_profile
from topics.names import validate_entity, validate_namespace

_SECURITY_KEYS = {
    "securityprotocol": "security.protocol",
    "saslmechanism": "sasl.mechanism",
    "saslusername": "sasl.username",
    "saslpassword": "sasl.password",
    "sslcalocation": "ssl.ca.location",
    "cafile": "ssl.ca.location",
    "sharedaccesskeyname": "sasl.username",
    "sharedaccesskey": "sasl.password",
}
#: the connection string's name of each setting, as :meth:`ConnectionSettings.to_string` writes it
_KEY_NAMES = {"security.protocol": "SecurityProtocol", "sasl.mechanism": "SaslMechanism",
              "sasl.username": "SaslUsername", "sasl.password": "SaslPassword",
              "ssl.ca.location": "CaFile"}
#: the protocols of a TLS connection (librdkafka's ``security.protocol``)
TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
#: librdkafka's ``ssl.ca.location`` for "the system's CAs": it looks in the
#: usual places, since its bundled OpenSSL may not know this system's
SYSTEM_CAS = "probe"
#: the Kafka ``client.id`` of the client library's clients (the engine's:
#: ENGINE_CLIENT_ID), so that a broker operator can tell them apart
CLIENT_ID = "settlement"
ENGINE_CLIENT_ID = "settlement-engine"
#: what Kafka clients' log lines say when no broker answers
_UNREACHABLE = re.compile(
    r"Unable (to )?connect|Unable to update metadata|Connect call failed|Connection refused|"
    r"NodeNotReady|brokers are down|Broker transport failure|Failed fetch messages|"
    r"KafkaConnectionError|Disconnected|Connection reset|Timed out|RequestTimedOut|"
    r"NotLeader|LeaderNotAvailable|Coordinator|Heartbeat", re.IGNORECASE)


class WaitingForKafka(logging.Filter):
    """At most one line a second about unreachable brokers.

    While no broker answers, every Kafka client logs each failed connection
    and metadata request: tens of lines a second from one client, a hundred
    from an engine worker. This lets one through a second, saying what it
    waits for and how many lines like it were left out (an informational
    one, such as a closed connection, goes through as it is); other lines pass.
    ``loggers``: the names (prefixes) of the loggers whose lines it looks at."""

    def __init__(self, loggers: tuple[str, ...], every_s: float = 1.0) -> None:
        super().__init__()
        self._loggers = loggers
        self._every_s = every_s
        self._last = 0.0
        self._left_out = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self._loggers) or record.levelno < logging.INFO:
            return True
        message = record.getMessage()
        if not _UNREACHABLE.search(message):
            return True
        with self._lock:
            now = time.monotonic()
            if now - self._last < self._every_s:
                self._left_out += 1
                return False
            self._last = now
            if record.levelno < logging.WARNING:
                # An informational line (a connection closed: one per connection
                # of every client when the brokers go) shares the budget as it is.
                return True
            left_out, self._left_out = self._left_out, 0
        if getattr(record, "waiting_for_kafka", False):  # said so by another filter
            return True
        record.waiting_for_kafka = True
        record.msg = "waiting for Kafka: %s (%d more lines like it left out)"
        record.args = (message.strip()[:300], left_out)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True


_LIBRDKAFKA_LOG = logging.getLogger("librdkafka")
_LIBRDKAFKA_LOG.addFilter(WaitingForKafka(("librdkafka",)))
#: How long librdkafka waits before it fetches again for a partition whose
#: fetch queue was full (``queued.max.messages.kbytes``). At its default,
#: 1,000 ms, a reader that takes records faster than that (a receiver of
#: 1,000 at a time, its fetch queue of 16 MB emptied in about 0.3 s) found
#: nothing fetched for the rest of the second: make bench's receive 1,000 +
#: complete_messages waited 460-600 ms for one batch of its twenty, about
#: half of the phase (a harness of that loop: 17,361-18,485 msg/s with the
#: default, 33,754-39,732 with 10 ms). A consumer whose queue stays full (an
#: idle receiver that fetched ahead) costs 0.06 % of a core more, measured.
_FETCH_QUEUE_BACKOFF_MS = 10
_HOSTPORT = re.compile(r"^[A-Za-z0-9._\-\[\]:]+:\d{1,5}$")


class ConnectionStringError(ValueError):
    """The connection string cannot be parsed; the message says which part."""


@dataclass(frozen=True)
class ConnectionSettings:
    """What a connection string says: where Kafka is and which namespace to use."""

    bootstrap_servers: str
    namespace: str
    security: dict[str, str] = field(default_factory=dict)
    #: the entity an entity-level connection string names (``EntityPath``)
    entity_path: str | None = None
    #: how long a Kafka client waits before trying a broker again; None:
    #: librdkafka's 100 ms (see :meth:`kafka_config`)
    reconnect_backoff_ms: int | None = None
    #: the ``client.id`` of its Kafka clients: what a broker's request log,
    #: client quotas and their per-client metrics know them by (librdkafka's
    #: default, "rdkafka", named every client of every process alike)
    client_id: str = CLIENT_ID

    @property
    def tls(self) -> bool:
        """Whether clients connect with TLS (``kafkas://``)."""
        return self.security.get("security.protocol", "PLAINTEXT") in TLS_PROTOCOLS

    @property
    def ca_file(self) -> str | None:
        """The PEM file of the CA the brokers' certificates are checked
        against; None: the system's CAs (or no TLS)."""
        location = self.security.get("ssl.ca.location")
        return None if location in (None, SYSTEM_CAS) else location

    def trusting(self, ca_file: str | None) -> ConnectionSettings:
        """These settings, checking the brokers' certificates against the
        CA in ``ca_file`` (the SDK's ``connection_verify``); None changes
        nothing."""
        if ca_file is None:
            return self
        if not self.tls:
            raise ConnectionStringError(
                f"connection_verify={ca_file!r} names the CA of a TLS listener: use an "
                "Endpoint=kafkas://HOST:PORT (or a kafkas:// fully qualified namespace)")
        return dataclasses.replace(self, security={**self.security,
                                                   "ssl.ca.location": str(ca_file)})

    def ssl_context(self) -> ssl.SSLContext | None:
        """A TLS context for Python's own Kafka clients (aiokafka, under
        Faust): certificates and host names checked against :attr:`ca_file`,
        or the system's CAs; None without TLS."""
        if not self.tls:
            return None
        try:
            return ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConnectionStringError(
                f"CaFile {self.ca_file!r} is not a readable PEM file of certificates ({exc}): "
                "name the CA certificate that signed the brokers' ('settlement kafka --tls' "
                "prints it as 'ca:')") from None

    @cached_property
    def profile(self) -> broker_profile.BrokerProfile:
        """What the broker can do, asked once (per process and bootstrap list)."""
        # asked once, by a client that connects at once (see kafka_config)
        return broker_profile.detect({**replace(self, reconnect_backoff_ms=None).kafka_config(),
                                      "log_level": 0})

    def kafka_config(self) -> dict[str, Any]:
        """librdkafka settings every client of this namespace starts from. Its
        own log lines go through :mod:`logging` (logger ``librdkafka``), not
        straight to stderr."""
        config = {"bootstrap.servers": self.bootstrap_servers, "logger": _LIBRDKAFKA_LOG,
                  "client.id": self.client_id, **self.security}
        if self.reconnect_backoff_ms is not None:
            # With every broker away, librdkafka tries the bootstrap broker
            # again after this delay each time, without growing it (at the
            # 100 ms default one client spent 1.1 % of a core on it, 0.27 %
            # at 500 ms). But a new client's first connection to a broker
            # named by the metadata also waits half of it (librdkafka 2.16):
            # only long-lived processes can afford more than the default.
            config["reconnect.backoff.ms"] = self.reconnect_backoff_ms
        return config

    def consumer_config(self, group_id: str, *, to_known_end: bool = False
                        ) -> dict[str, object]:
        """A consumer that is only ever assigned partitions and never commits.
        Its group is named under the namespace, where the namespace's ACLs
        allow it (:mod:`topics.rights`).

        ``to_known_end``: it only reads up to an end it asked for, never
        waiting for new records. Its fetches then wait briefly at the
        broker: a fetch parked there at the end delays every later request
        of the consumer (a broker answers one connection's requests in
        order), and the next read waited up to half a second for it."""
        wait_ms = broker_profile.SHORT_FETCH_WAIT_MS if to_known_end \
            else self.profile.fetch_max_wait_ms
        return {
            **self.kafka_config(),
            "group.id": f"{self.namespace}.{group_id}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.wait.max.ms": wait_ms,
            "fetch.error.backoff.ms": min(wait_ms, 100),
            "fetch.queue.backoff.ms": _FETCH_QUEUE_BACKOFF_MS,
            "auto.offset.reset": "earliest",
        }

    def faust_credentials(self) -> Any:
        """The credentials of this connection for Faust (aiokafka): SASL,
        TLS or both; None for a plaintext connection."""
        if "sasl.username" not in self.security and not self.tls:
            return None
        # deferred: Faust is the engine's, slow to import, and clients never get here
        import faust

        if "sasl.username" not in self.security:
            return faust.SSLCredentials(self.ssl_context())
        return faust.SASLCredentials(
            username=self.security["sasl.username"], password=self.security["sasl.password"],
            mechanism=self.security.get("sasl.mechanism", "PLAIN"),
            ssl_context=self.ssl_context())

    def to_string(self) -> str:
        """The connection string that parses back to these settings."""
        scheme = "kafkas" if self.tls else "kafka"
        parts = [f"Endpoint={scheme}://{self.bootstrap_servers}", f"Namespace={self.namespace}"]
        parts += [f"{_KEY_NAMES[k]}={v}" for k, v in self.security.items()
                  if (k, v) != ("ssl.ca.location", SYSTEM_CAS)]
        if self.entity_path is not None:
            parts.append(f"EntityPath={self.entity_path}")
        return ";".join(parts)


def parse_connection_string(conn_str: str) -> ConnectionSettings:
    """Parse ``Endpoint=kafka://...;Namespace=...``; raise ConnectionStringError."""
    if not conn_str or not isinstance(conn_str, str):
        raise ConnectionStringError(
            "connection string is empty: use 'Endpoint=kafka://HOST:PORT;Namespace=NAME'"
        )
    values: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in conn_str.split(";"))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ConnectionStringError(f"connection string part {part!r} has no '='")
        values[key.strip().lower()] = value.strip()
    endpoint = values.pop("endpoint", "")
    scheme, sep, servers = endpoint.partition("://")
    if not sep or scheme.lower() not in ("kafka", "kafkas"):
        raise ConnectionStringError(
            f"Endpoint must start with kafka:// (or kafkas:// for TLS), got {endpoint!r}: "
            "use 'Endpoint=kafka://HOST:PORT[,HOST:PORT];Namespace=NAME'"
        )
    hosts = [h.strip() for h in servers.rstrip("/").split(",") if h.strip()]
    bad = [h for h in hosts if not _HOSTPORT.match(h)]
    if not hosts or bad:
        raise ConnectionStringError(f"Endpoint needs HOST:PORT pairs, got {bad or endpoint!r}")
    namespace = values.pop("namespace", "")
    if not namespace:
        raise ConnectionStringError(
            "the connection string has no Namespace: add ';Namespace=NAME' (the namespace's "
            "topics on the brokers are named after it)")
    validate_namespace(namespace)
    entity_path = values.pop("entitypath", None)
    if entity_path is not None:
        validate_entity(entity_path)
    if values.pop("fetchmaxwaitms", None) is not None:
        logging.getLogger(__name__).info(
            "FetchMaxWaitMs in the connection string is ignored: the broker's fetch "
            "behaviour is detected")
    security = {_SECURITY_KEYS[k]: values.pop(k) for k in list(values) if k in _SECURITY_KEYS}
    token = values.pop("sharedaccesssignature", None)
    if token is not None:
        if "sasl.username" in security:
            raise ConnectionStringError(
                "a connection string has either SharedAccessSignature or "
                "SharedAccessKeyName/SharedAccessKey (SaslUsername/SaslPassword), not both")
        security.update({"sasl.username": sas_key_name(token), "sasl.password": token})
    if values:
        raise ConnectionStringError(f"unknown connection string keys: {sorted(values)}")
    return ConnectionSettings(",".join(hosts), namespace,
                              _with_protocol(security, tls=scheme.lower() == "kafkas"),
                              entity_path)


def _with_protocol(security: dict[str, str], *, tls: bool) -> dict[str, str]:
    """``security`` with its protocol: TLS as the endpoint's scheme says,
    SASL when there are credentials; a protocol named outright must agree."""
    sasl = "sasl.username" in security
    if sasl:
        security.setdefault("sasl.mechanism", "PLAIN")
    implied = {(False, False): "PLAINTEXT", (False, True): "SASL_PLAINTEXT",
               (True, False): "SSL", (True, True): "SASL_SSL"}[(tls, sasl)]
    named = security.get("security.protocol")
    if tls and named is not None and named.upper() not in TLS_PROTOCOLS:
        raise ConnectionStringError(
            f"Endpoint kafkas:// connects with TLS, but SecurityProtocol says {named}: "
            "drop SecurityProtocol, or use kafka://")
    if not tls and "ssl.ca.location" in security and (named or "").upper() not in TLS_PROTOCOLS:
        raise ConnectionStringError(
            "CaFile is the CA of a TLS listener: use Endpoint=kafkas://HOST:PORT with it")
    if implied != "PLAINTEXT":
        security.setdefault("security.protocol", implied)
    if security.get("security.protocol", "").upper() in TLS_PROTOCOLS:
        security.setdefault("ssl.ca.location", SYSTEM_CAS)
    return security


#: ``token_type`` of a ``get_token`` credential whose tokens are SAS tokens (as in the SDK)
SAS_TOKEN_TYPE = b"servicebus.windows.net:sastoken"
#: how a SAS token starts (``AzureSasCredential``, ``SharedAccessSignature=``)
SAS_PREFIX = "SharedAccessSignature "


def parse_fully_qualified_namespace(fully_qualified_namespace: str) -> tuple[str, str]:
    """``(bootstrap servers, namespace)`` of ``HOST:PORT[,HOST:PORT]/NAMESPACE``."""
    text = str(fully_qualified_namespace or "").strip()
    for scheme in ("kafkas://", "kafka://", "sb://"):
        text = text.removeprefix(scheme)
    hosts, _, namespace = text.rstrip("/").rpartition("/")
    servers = [h.strip() for h in hosts.split(",") if h.strip()]
    if not servers or not all(_HOSTPORT.match(h) for h in servers) or not namespace:
        raise ConnectionStringError(
            f"fully_qualified_namespace {fully_qualified_namespace!r} is not "
            "'HOST:PORT[,HOST:PORT]/NAMESPACE' (Kafka's bootstrap servers, then the "
            "namespace): Service Bus host names do not apply here")
    return ",".join(servers), validate_namespace(namespace)


def sas_key_name(token: str) -> str:
    """The ``skn`` (key name) of a SAS token ``SharedAccessSignature sr=..&sig=..&se=..&skn=..``."""
    fields = dict(part.partition("=")[::2] for part in token.removeprefix(SAS_PREFIX).split("&"))
    if not token.startswith(SAS_PREFIX) or not all(fields.get(k) for k in ("sr", "sig", "se",
                                                                         "skn")):
        raise ConnectionStringError(
            "a shared access signature must read 'SharedAccessSignature sr=URI&sig=SIGNATURE"
            "&se=EXPIRY&skn=KEYNAME'")
    return fields["skn"]


def settings_from_credential(fully_qualified_namespace: str, credential: Any
                             ) -> ConnectionSettings:
    """The settings of ``ServiceBusClient(fully_qualified_namespace, credential)``.

    ``AzureNamedKeyCredential(name, key)`` is the SASL user and password, as
    ``SharedAccessKeyName``/``SharedAccessKey`` in a connection string;
    ``AzureSasCredential(token)`` signs in as the token's key name with the
    token as password (a broker configured by :mod:`settlement.testing.apache_kafka`
    checks its signature and expiry), and so does a ``get_token`` credential
    whose ``token_type`` is :data:`SAS_TOKEN_TYPE`; its token is taken once,
    so it must outlive the client. Azure AD credentials (other ``get_token``
    credentials) have nothing to sign in to here."""
    servers, namespace = parse_fully_qualified_namespace(fully_qualified_namespace)
    tls = str(fully_qualified_namespace).strip().startswith("kafkas://")
    if isinstance(credential, AzureNamedKeyCredential):
        user, password = credential.named_key
    elif isinstance(credential, AzureSasCredential):
        password = credential.signature
        user = sas_key_name(password)
    elif getattr(credential, "token_type", None) == SAS_TOKEN_TYPE:
        # the SDK's other way to pass a SAS token: a get_token credential of this type
        password = credential.get_token(f"sb://{fully_qualified_namespace}/.default").token
        user = sas_key_name(password)
    elif hasattr(credential, "get_token"):
        raise TypeError(
            f"{type(credential).__name__} is an Azure AD credential, which Kafka cannot check: "
            "use AzureNamedKeyCredential(KEY_NAME, KEY) or AzureSasCredential(TOKEN), or a "
            "connection string")
    else:
        raise TypeError(
            f"credential must be an azure.core.credentials.AzureNamedKeyCredential or "
            f"AzureSasCredential, not {type(credential).__name__}")
    return ConnectionSettings(servers, namespace, _with_protocol(
        {"sasl.username": user, "sasl.password": password}, tls=tls))
