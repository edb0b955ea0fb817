"""ServiceBusClient: the entry point, as in ``azure.servicebus``."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from settlement._engine_link import EngineLink
from settlement._entities import EntityRegistry
from settlement._properties import QueueProperties
from settlement._quota import QuotaGuard
from settlement._retry import RetryPolicy, policy_from
from settlement._session import ServiceBusSessionFilter
from settlement._session_listing import session_ids
from settlement._settle_batcher import SettleBatcher
from settlement._subscription_rules import SubscriptionRules
from settlement._topic_properties import SubscriptionProperties
from settlement.receiver import ServiceBusReceiveMode, ServiceBusReceiver, ServiceBusSubQueue
from settlement.sender import ServiceBusSender
from topics import names
from topics.connection import ConnectionSettings, parse_connection_string
from topics.names import parse_entity_path

if TYPE_CHECKING:
    from settlement.pairing import Pairing, SendAvailabilityPairedNamespaceOptions


class ServiceBusClient:
    """Creates senders and receivers for the queues, topics and
    subscriptions of one namespace.

    ``ServiceBusClient.from_connection_string("Endpoint=kafka://HOST:PORT;Namespace=NAME")``
    """

    def __init__(self, settings: ConnectionSettings, *, retry: RetryPolicy | None = None,
                 paired_namespace: SendAvailabilityPairedNamespaceOptions | None = None
                 ) -> None:
        self.settings = settings
        self.fully_qualified_namespace = settings.namespace
        self.retry = retry or RetryPolicy()
        self._registry = EntityRegistry(settings)
        self._link: EngineLink | None = None
        self._batcher: SettleBatcher | None = None
        self._handlers: list[ServiceBusSender | ServiceBusReceiver] = []
        self._pairing: Pairing | None = None
        #: one quota guard per entity, so a new sender does not measure again
        self._quotas: dict[tuple[str, bool], QuotaGuard] = {}
        if paired_namespace is not None:
            from settlement.pairing import Pairing  # only paired clients need it

            self._pairing = Pairing(settings, paired_namespace, self.retry)

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusClient:
        """A client of the namespace the connection string names.

        ``retry_total`` (3), ``retry_backoff_factor`` (0.8 s),
        ``retry_backoff_max`` (120 s) and ``retry_mode`` (``"exponential"``
        or ``"fixed"``) set how transient failures are retried, as in the
        SDK. ``paired_namespace=SendAvailabilityPairedNamespaceOptions(...)``
        keeps sends going to a secondary namespace while this one is away."""
        retry = policy_from(kwargs)
        return cls(parse_connection_string(conn_str), retry=retry,
                   paired_namespace=kwargs.pop("paired_namespace", None))

    def get_queue_sender(self, queue_name: str, *, max_in_flight: int = 10_000,
                         **_: Any) -> ServiceBusSender:
        return self._sender(queue_name, max_in_flight, topic=False)

    def get_topic_sender(self, topic_name: str, *, max_in_flight: int = 10_000,
                         **_: Any) -> ServiceBusSender:
        """A sender to ``topic_name``: each message is stored once, in the
        topic's log, and delivered to every subscription whose rules match."""
        return self._sender(topic_name, max_in_flight, topic=True)

    def _sender(self, name: str, max_in_flight: int, *, topic: bool) -> ServiceBusSender:
        quota = self._quotas.setdefault((name, topic), QuotaGuard(
            self.settings, self._registry, self._engine, name, topic=topic))
        sender = ServiceBusSender(self.settings, self._registry, name, self._engine,
                                  max_in_flight=max_in_flight, topic=topic, retry=self.retry,
                                  pairing=self._pairing, quota=quota)
        self._handlers.append(sender)
        return sender

    def get_queue_receiver(self, queue_name: str, *,
                           sub_queue: ServiceBusSubQueue | str | None = None,
                           receive_mode: ServiceBusReceiveMode | str =
                           ServiceBusReceiveMode.PEEK_LOCK,
                           max_wait_time: float | None = None, prefetch_count: int = 0,
                           session_id: str | ServiceBusSessionFilter | None = None,
                           **_: Any) -> ServiceBusReceiver:
        """A receiver of ``queue_name`` (or ``queue/$deadletterqueue``; a
        subscription path ``topic/subscriptions/sub`` works too). On a
        session-enabled queue, ``session_id`` names the session to lock, or
        is ``NEXT_AVAILABLE_SESSION``."""
        name, is_dead_letter = parse_entity_path(queue_name)
        if names.SUBSCRIPTIONS in name:
            topic, subscription = names.split_subscription_path(name)
            return self.get_subscription_receiver(
                topic, subscription, receive_mode=receive_mode, max_wait_time=max_wait_time,
                prefetch_count=prefetch_count, session_id=session_id,
                sub_queue=ServiceBusSubQueue.DEAD_LETTER if is_dead_letter else sub_queue)
        props = self._registry.get(name, fresh=True)
        return self._receiver(props, None, sub_queue=ServiceBusSubQueue.DEAD_LETTER
                              if is_dead_letter else sub_queue, receive_mode=receive_mode,
                              max_wait_time=max_wait_time, prefetch_count=prefetch_count,
                              session_id=session_id)

    def get_subscription_receiver(self, topic_name: str, subscription_name: str, *,
                                  sub_queue: ServiceBusSubQueue | str | None = None,
                                  receive_mode: ServiceBusReceiveMode | str =
                                  ServiceBusReceiveMode.PEEK_LOCK,
                                  max_wait_time: float | None = None, prefetch_count: int = 0,
                                  session_id: str | ServiceBusSessionFilter | None = None,
                                  **_: Any) -> ServiceBusReceiver:
        """A receiver of one subscription of ``topic_name`` (or of its
        dead-letter sub-queue), with every feature of a queue receiver."""
        props = self._registry.get_subscription(topic_name, subscription_name, fresh=True)
        rules = SubscriptionRules(self._registry, topic_name, subscription_name)
        return self._receiver(props, rules, sub_queue=sub_queue, receive_mode=receive_mode,
                              max_wait_time=max_wait_time, prefetch_count=prefetch_count,
                              session_id=session_id)

    def list_queue_sessions(self, queue_name: str, state_updated_after: dt.datetime | None = None,
                            **_: Any) -> list[str]:
        """Ids of the queue's sessions that have active messages or stored
        state; with ``state_updated_after``, those whose state was set since."""
        props = self._registry.get(queue_name, fresh=True)
        return session_ids(self._engine(), props, state_updated_after)

    def list_subscription_sessions(self, topic_name: str, subscription_name: str,
                                   state_updated_after: dt.datetime | None = None,
                                   **_: Any) -> list[str]:
        """:meth:`list_queue_sessions` for a subscription."""
        props = self._registry.get_subscription(topic_name, subscription_name, fresh=True)
        return session_ids(self._engine(), props, state_updated_after)

    def _receiver(self, props: QueueProperties | SubscriptionProperties,
                  rules: SubscriptionRules | None, *,
                  sub_queue: ServiceBusSubQueue | str | None,
                  receive_mode: ServiceBusReceiveMode | str, max_wait_time: float | None,
                  prefetch_count: int, session_id: str | ServiceBusSessionFilter | None
                  ) -> ServiceBusReceiver:
        receiver = ServiceBusReceiver(
            self.settings, self._engine(), self._settle_batcher(), props,
            sub_queue=ServiceBusSubQueue(sub_queue) if sub_queue else None,
            receive_mode=ServiceBusReceiveMode(receive_mode), max_wait_time=max_wait_time,
            prefetch_count=prefetch_count, rules=rules, session_id=session_id)
        self._handlers.append(receiver)
        return receiver

    def _engine(self) -> EngineLink:
        if self._link is None:
            self._link = EngineLink(self.settings, retry=self.retry)
        return self._link

    def _settle_batcher(self) -> SettleBatcher:
        if self._batcher is None:
            self._batcher = SettleBatcher(self._engine())
        return self._batcher

    def close(self) -> None:
        if self._pairing is not None:
            self._pairing.close()
        for handler in self._handlers:
            handler.close()
        self._handlers.clear()
        if self._link is not None:
            self._link.close()
            self._link = None
            self._batcher = None

    def __enter__(self) -> ServiceBusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
