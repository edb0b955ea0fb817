"""ServiceBusClient: the entry point, as in ``azure.servicebus``."""

from __future__ import annotations

import datetime as dt
import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any

from settlement._engine_link import EngineLink
from settlement._entities import EntityRegistry
from settlement._keywords import refuse
from settlement._log_reader import ReaderPool
from settlement._quota import QuotaGuard
from settlement._retry import RetryPolicy
from settlement._session import ServiceBusSessionFilter
from settlement._session_listing import session_ids
from settlement._settle_batcher import SettleBatcher
from settlement._sign_in import check_connection
from settlement._subscription_rules import SubscriptionRules
from settlement.lock_renewer import AutoLockRenewer
from settlement.pairing import Pairing, SendAvailabilityPairedNamespaceOptions
from settlement.receiver import ServiceBusReceiveMode, ServiceBusReceiver, ServiceBusSubQueue
from settlement.sender import ServiceBusSender
from topics import names
from topics.connection import (
    ConnectionSettings,
    parse_connection_string,
    settings_from_credential,
)
from topics.entities import QueueProperties, SubscriptionProperties
from topics.names import parse_entity_path


@dataclass
class ReceiverOptions:
    """The SDK's receiver keywords of one ``get_*_receiver`` call."""

    session_id: str | ServiceBusSessionFilter | None
    sub_queue: ServiceBusSubQueue | str | None
    receive_mode: ServiceBusReceiveMode | str
    max_wait_time: float | None
    auto_lock_renewer: AutoLockRenewer | None
    prefetch_count: int
    client_identifier: str | None


class ServiceBusClient:
    """Creates senders and receivers for the queues, topics and
    subscriptions of one namespace.

    As the SDK's: ``ServiceBusClient(fully_qualified_namespace, credential)``
    with ``fully_qualified_namespace`` as ``HOST:PORT[,HOST:PORT]/NAMESPACE``
    (Kafka's bootstrap servers, then the namespace) and an
    ``AzureNamedKeyCredential`` or ``AzureSasCredential``
    (:func:`topics.connection.settings_from_credential`), or
    ``ServiceBusClient.from_connection_string("Endpoint=kafka://HOST:PORT;Namespace=NAME")``.

    ``retry_total`` (3), ``retry_backoff_factor`` (0.8 s),
    ``retry_backoff_max`` (120 s) and ``retry_mode`` (``"exponential"`` or
    ``"fixed"``) set how transient failures are retried, as in the SDK.
    ``logging_enable=True`` sets the ``settlement`` loggers to DEBUG (the
    SDK's network trace; as there, handlers are the application's).
    ``paired_namespace=SendAvailabilityPairedNamespaceOptions(...)`` keeps
    sends going to a secondary namespace while this one is away.
    ``connection_verify=PATH`` checks a ``kafkas://`` (TLS) endpoint's
    certificates against the CA in that PEM file, as the SDK's does (as
    ``CaFile=PATH`` in a connection string). The SDK's AMQP transport
    keywords are refused (:mod:`settlement._keywords`).
    """

    def __init__(self, fully_qualified_namespace: str, credential: Any, *,
                 retry_total: int = 3, retry_backoff_factor: float = 0.8,
                 retry_backoff_max: float = 120, retry_mode: str = "exponential",
                 logging_enable: bool = False,
                 paired_namespace: SendAvailabilityPairedNamespaceOptions | None = None,
                 connection_verify: str | None = None, **kwargs: Any) -> None:
        refuse("ServiceBusClient", kwargs)
        self._open(settings_from_credential(fully_qualified_namespace, credential)
                   .trusting(connection_verify),
                   RetryPolicy.from_options(
                       retry_total=retry_total, retry_backoff_factor=retry_backoff_factor,
                       retry_backoff_max=retry_backoff_max, retry_mode=retry_mode),
                   paired_namespace, logging_enable)

    @classmethod
    def from_connection_string(cls, conn_str: str, *, retry_total: int = 3,
                               retry_backoff_factor: float = 0.8,
                               retry_backoff_max: float = 120,
                               retry_mode: str = "exponential", logging_enable: bool = False,
                               paired_namespace: SendAvailabilityPairedNamespaceOptions
                               | None = None, connection_verify: str | None = None,
                               **kwargs: Any) -> ServiceBusClient:
        """A client of the namespace the connection string names; the
        keywords are the constructor's."""
        refuse("from_connection_string", kwargs)
        return cls._from_settings(
            parse_connection_string(conn_str).trusting(connection_verify),
            retry=RetryPolicy.from_options(
                retry_total=retry_total, retry_backoff_factor=retry_backoff_factor,
                retry_backoff_max=retry_backoff_max, retry_mode=retry_mode),
            paired_namespace=paired_namespace, logging_enable=logging_enable)

    @classmethod
    def _from_settings(cls, settings: ConnectionSettings, *, retry: RetryPolicy | None = None,
                       paired_namespace: SendAvailabilityPairedNamespaceOptions | None = None,
                       logging_enable: bool = False) -> ServiceBusClient:
        """For the package's own callers, which hold parsed settings."""
        client = cls.__new__(cls)
        client._open(settings, retry or RetryPolicy(), paired_namespace, logging_enable)
        return client

    def _open(self, settings: ConnectionSettings, retry: RetryPolicy,
              paired_namespace: SendAvailabilityPairedNamespaceOptions | None,
              logging_enable: bool) -> None:
        if logging_enable:
            logging.getLogger("settlement").setLevel(logging.DEBUG)
        self.settings = settings
        self.retry = retry
        self._registry = EntityRegistry(settings)
        #: log readers shared by the client's receivers (see settlement._log_reader)
        self._readers = ReaderPool(settings)
        self._link: EngineLink | None = None
        self._batcher: SettleBatcher | None = None
        #: makes the link and the batcher once when threads share the client
        #: (each of them made a link of its own, and only the last was closed)
        self._making = threading.Lock()
        self._handlers: list[ServiceBusSender | ServiceBusReceiver] = []
        self._pairing: Pairing | None = None
        self._signed_in = False
        #: one quota guard per entity, so a new sender does not measure again
        self._quotas: dict[tuple[str, bool], QuotaGuard] = {}
        if paired_namespace is not None:
            self._pairing = Pairing(settings, paired_namespace, functools.partial(
                ServiceBusClient._from_settings, retry=retry))

    @property
    def fully_qualified_namespace(self) -> str:
        """``HOST:PORT[,HOST:PORT]/NAMESPACE``: where the SDK has the
        namespace's host name, the brokers and the namespace on them
        (after ``kafkas://`` for TLS, so that it builds a client like this one)."""
        scheme = "kafkas://" if self.settings.tls else ""
        return f"{scheme}{self.settings.bootstrap_servers}/{self.settings.namespace}"

    def get_queue_sender(self, queue_name: str, *, client_identifier: str | None = None,
                         max_in_flight: int = 10_000, **kwargs: Any) -> ServiceBusSender:
        """A sender to ``queue_name``; ``client_identifier`` names it in its
        errors (as the SDK's); ``max_in_flight`` bounds its unacknowledged
        records."""
        refuse("get_queue_sender", kwargs)
        self._check_entity_path(queue_name, "queue")
        return self._sender(queue_name, max_in_flight, client_identifier, topic=False)

    def get_topic_sender(self, topic_name: str, *, client_identifier: str | None = None,
                         max_in_flight: int = 10_000, **kwargs: Any) -> ServiceBusSender:
        """A sender to ``topic_name``: each message is stored once, in the
        topic's log, and delivered to every subscription whose rules match."""
        refuse("get_topic_sender", kwargs)
        self._check_entity_path(topic_name, "topic")
        return self._sender(topic_name, max_in_flight, client_identifier, topic=True)

    def _check_entity_path(self, name: str, kind: str) -> None:
        """An entity-level connection string (``EntityPath=``) is for its
        entity only, as in the SDK."""
        entity = self.settings.entity_path
        if entity is not None and name != entity:
            raise ValueError(  # the SDK's words
                f"The {kind} name provided does not match the EntityPath in the connection "
                f"string passed to the ServiceBusClient constructor: {entity}.")

    def _check_receiver_path(self, path: str) -> None:
        """:meth:`_check_entity_path` of ``get_queue_receiver``'s path (a
        queue, its dead letters, or a subscription: its topic's)."""
        name = parse_entity_path(path)[0]
        if names.SUBSCRIPTIONS in name:
            self._check_entity_path(names.split_subscription_path(name)[0], "topic")
        else:
            self._check_entity_path(name, "queue")

    def _sender(self, name: str, max_in_flight: int, client_identifier: str | None, *,
                topic: bool) -> ServiceBusSender:
        self._sign_in()
        quota = self._quotas.setdefault((name, topic), QuotaGuard(
            self.settings, self._registry, self._engine, name, topic=topic))
        sender = ServiceBusSender(self.settings, self._registry, name, self._engine,
                                  max_in_flight=max_in_flight, topic=topic, retry=self.retry,
                                  pairing=self._pairing, quota=quota,
                                  client_identifier=client_identifier)
        self._keep(sender)
        return sender

    def get_queue_receiver(self, queue_name: str, *,
                           session_id: str | ServiceBusSessionFilter | None = None,
                           sub_queue: ServiceBusSubQueue | str | None = None,
                           receive_mode: ServiceBusReceiveMode | str =
                           ServiceBusReceiveMode.PEEK_LOCK,
                           max_wait_time: float | None = None,
                           auto_lock_renewer: AutoLockRenewer | None = None,
                           prefetch_count: int = 0, client_identifier: str | None = None,
                           **kwargs: Any) -> ServiceBusReceiver:
        """A receiver of ``queue_name`` (or ``queue/$deadletterqueue``; a
        subscription path ``topic/subscriptions/sub`` works too). On a
        session-enabled queue, ``session_id`` names the session to lock, or
        is ``NEXT_AVAILABLE_SESSION``; on another queue it is an error. With
        ``auto_lock_renewer``, each received message (or the session) is
        registered with it, as in the SDK."""
        refuse("get_queue_receiver", kwargs)
        options = ReceiverOptions(session_id, sub_queue, receive_mode, max_wait_time,
                                  auto_lock_renewer, prefetch_count, client_identifier)
        self._check_receiver_path(queue_name)
        name, is_dead_letter = parse_entity_path(queue_name)
        self._sign_in()
        if is_dead_letter:
            options.sub_queue = ServiceBusSubQueue.DEAD_LETTER
        if names.SUBSCRIPTIONS in name:
            topic, subscription = names.split_subscription_path(name)
            return self._receiver(self._registry.get_subscription(topic, subscription,
                                                                  fresh=True, recent=True),
                                  SubscriptionRules(self._registry, topic, subscription), options)
        return self._receiver(self._registry.get(name, fresh=True, recent=True), None, options)

    def get_subscription_receiver(self, topic_name: str, subscription_name: str, *,
                                  session_id: str | ServiceBusSessionFilter | None = None,
                                  sub_queue: ServiceBusSubQueue | str | None = None,
                                  receive_mode: ServiceBusReceiveMode | str =
                                  ServiceBusReceiveMode.PEEK_LOCK,
                                  max_wait_time: float | None = None,
                                  auto_lock_renewer: AutoLockRenewer | None = None,
                                  prefetch_count: int = 0, client_identifier: str | None = None,
                                  **kwargs: Any) -> ServiceBusReceiver:
        """A receiver of one subscription of ``topic_name`` (or of its
        dead-letter sub-queue), with every feature of a queue receiver."""
        refuse("get_subscription_receiver", kwargs)
        self._check_entity_path(topic_name, "topic")
        options = ReceiverOptions(session_id, sub_queue, receive_mode, max_wait_time,
                                  auto_lock_renewer, prefetch_count, client_identifier)
        self._sign_in()
        props = self._registry.get_subscription(topic_name, subscription_name, fresh=True,
                                                recent=True)
        rules = SubscriptionRules(self._registry, topic_name, subscription_name)
        return self._receiver(props, rules, options)

    def list_queue_sessions(self, queue_name: str, state_updated_after: dt.datetime | None = None
                            ) -> list[str]:
        """Ids of the queue's sessions that have active messages or stored
        state; with ``state_updated_after``, those whose state was set since."""
        self._sign_in()
        props = self._registry.get(queue_name, fresh=True)
        return session_ids(self._engine(), props, state_updated_after)

    def list_subscription_sessions(self, topic_name: str, subscription_name: str,
                                   state_updated_after: dt.datetime | None = None
                                   ) -> list[str]:
        """:meth:`list_queue_sessions` for a subscription."""
        self._sign_in()
        props = self._registry.get_subscription(topic_name, subscription_name, fresh=True)
        return session_ids(self._engine(), props, state_updated_after)

    def _receiver(self, props: QueueProperties | SubscriptionProperties,
                  rules: SubscriptionRules | None, options: ReceiverOptions
                  ) -> ServiceBusReceiver:
        if options.session_id is not None and options.sub_queue:
            raise ValueError(  # the SDK's words
                "session_id and sub_queue can not be specified simultaneously. To connect to "
                "the sub queue of a sessionful entity, set sub_queue only: sub queues do not "
                "support sessions")
        receiver = ServiceBusReceiver(
            self.settings, self._engine(), self._settle_batcher(), self._readers, props,
            sub_queue=ServiceBusSubQueue(options.sub_queue) if options.sub_queue else None,
            receive_mode=ServiceBusReceiveMode(options.receive_mode),
            max_wait_time=options.max_wait_time, prefetch_count=options.prefetch_count,
            rules=rules, session_id=options.session_id,
            auto_lock_renewer=options.auto_lock_renewer,
            client_identifier=options.client_identifier)
        self._keep(receiver)
        return receiver

    def _keep(self, handler: ServiceBusSender | ServiceBusReceiver) -> None:
        """Remember ``handler`` to close it with the client. Closed ones go:
        a client opening a sender or a session receiver per message would
        otherwise keep every one it ever opened."""
        self._handlers = [h for h in self._handlers if not h._closed]
        self._handlers.append(handler)

    def _sign_in(self) -> None:
        """Before the first sender or receiver: credentials the broker
        refuses raise ServiceBusAuthenticationError now, not after timeouts."""
        if not self._signed_in:
            check_connection(self.settings)
            self._signed_in = True

    def _engine(self) -> EngineLink:
        with self._making:
            if self._link is None:
                self._link = EngineLink(self.settings, retry=self.retry)
            return self._link

    def _settle_batcher(self) -> SettleBatcher:
        link = self._engine()
        with self._making:
            if self._batcher is None:
                self._batcher = SettleBatcher(link)
            return self._batcher

    def close(self) -> None:
        if self._pairing is not None:
            self._pairing.close()
        for handler in self._handlers:
            handler.close()
        self._handlers.clear()
        self._registry.close()
        self._readers.close()
        with self._making:
            link, self._link, self._batcher = self._link, None, None
        if link is not None:
            link.close()

    def __enter__(self) -> ServiceBusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
