"""Create, inspect and delete queues of a namespace."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from settlement._engine_link import EngineLink
from settlement._entities import EntityRegistry
from settlement._retry import RetryPolicy
from settlement._session_listing import SessionRuntimeProperties, list_sessions
from settlement._settled_stats import add_counts, log_ends, settled_stats
from settlement._sign_in import check_connection
from settlement.exceptions import (
    MessagingEntityAlreadyExistsError,
    OperationTimeoutError,
    ServiceBusConnectionError,
    denied,
    for_code,
)
from settlement.management._queue_size import queue_size_in_bytes
from settlement.management._runtime import QueueRuntimeProperties, SubscriptionRuntimeProperties
from settlement.management._topics import TopicAdministration, name_of, updated
from settlement.management._validation import (
    overridden,
    positive_or_none,
    refuse_admin,
    sdk_options,
    validated,
    validated_log,
)
from topics import names, specs
from topics.commands import StatsArgs
from topics.connection import (
    ConnectionSettings,
    parse_connection_string,
    settings_from_credential,
)
from topics.entities import (
    DEFAULT_ENGINE_PARTITIONS,
    NAMESPACE_KEY,
    NamespaceProperties,
    QueueProperties,
    SubscriptionProperties,
    validate_engine_partitions,
)

log = logging.getLogger(__name__)
#: how long runtime counts wait for the log scanner to reach the log end


class ServiceBusAdministrationClient(TopicAdministration):
    """Administration of queues (here) and of topics, subscriptions and
    rules (:class:`TopicAdministration`), over Kafka topics and the engine.

    As the SDK's: ``ServiceBusAdministrationClient(fully_qualified_namespace,
    credential)`` with an ``AzureNamedKeyCredential`` or ``AzureSasCredential``
    (:func:`topics.connection.settings_from_credential`), or
    :meth:`from_connection_string`. Its errors are the SDK's azure-core ones
    (:mod:`settlement.exceptions`). Every keyword of the SDK's methods is
    honoured or refused with a ``TypeError`` saying why."""

    def __init__(self, fully_qualified_namespace: str, credential: Any, *,
                 connection_verify: str | None = None, **kwargs: Any) -> None:
        # api_version, and azure-core's other HTTP pipeline options, have no
        # meaning over Kafka: refused, with the others. connection_verify
        # (the CA file of a TLS endpoint) is honoured, as the client's.
        refuse_admin("ServiceBusAdministrationClient", kwargs)
        self._open(settings_from_credential(fully_qualified_namespace, credential)
                   .trusting(connection_verify))

    @classmethod
    def from_connection_string(cls, conn_str: str, *, connection_verify: str | None = None,
                               **kwargs: Any) -> ServiceBusAdministrationClient:
        refuse_admin("from_connection_string", kwargs)
        return cls._from_settings(parse_connection_string(conn_str).trusting(connection_verify))

    @classmethod
    def _from_settings(cls, settings: ConnectionSettings) -> ServiceBusAdministrationClient:
        """For the package's own callers, which hold parsed settings."""
        client = cls.__new__(cls)
        client._open(settings)
        return client

    def _open(self, settings: ConnectionSettings) -> None:
        self._settings = settings
        self._admin = AdminClient(settings.kafka_config())
        self._entities = EntityRegistry(settings)
        self._link: EngineLink | None = None
        self._making = threading.Lock()
        self._signed_in = False

    @property
    def _registry(self) -> EntityRegistry:
        """The entities' definitions, once signed in (every call starts here
        or at :meth:`_provision`)."""
        self._sign_in()
        return self._entities

    def _sign_in(self) -> None:
        """Credentials the broker refuses raise ``ClientAuthenticationError``
        (:class:`ServiceBusAuthenticationError`) at the first call, as the
        SDK's do, instead of the call timing out while librdkafka retries."""
        if not self._signed_in:
            check_connection(self._settings)
            self._signed_in = True

    def create_queue(self, queue_name: str, **kwargs: Any) -> QueueProperties:
        """Create the queue's log and definition; raise ``ResourceExistsError``
        (:class:`MessagingEntityAlreadyExistsError`) if a queue or topic of
        that name exists. Takes the SDK's options; ``partition_count`` too."""
        names.validate_entity(queue_name)
        options = sdk_options("create_queue", QueueProperties, kwargs)
        props = validated_log(validated(QueueProperties(queue_name, **options)))
        props.updated_at_utc = props.created_at_utc
        self._provision_namespace()
        if self._registry.exists(queue_name):
            raise MessagingEntityAlreadyExistsError(
                f"queue or topic {queue_name!r} already exists in namespace "
                f"{self._settings.namespace!r}: use get_queue, or delete_queue first")
        self._provision(specs.entity_topics(self._settings.namespace, queue_name,
                                            props.partition_count))
        self._engine_follows(queue_name, props.partition_count,
                             self._registry.put(props, queue_name))
        return props

    def update_queue(self, queue: QueueProperties | Mapping[str, Any], **kwargs: Any) -> None:
        """Change a queue's settings: lock duration, max delivery count, time
        to live, duplicate detection window, forwarding, auto delete on idle;
        ``kwargs`` (the SDK's ``<property>=<value>``) over ``queue``'s. New
        locks follow the new lock duration at once, for every client; the
        partition count and whether the queue needs sessions cannot change."""
        current = self._registry.get(name_of(queue), fresh=True)
        wanted = overridden("update_queue", current, queue, kwargs)
        props = validated_log(validated(updated(current, wanted, "queue")))
        self._engine_follows(props.name, props.partition_count,
                             self._registry.put(props, props.name))

    def create_namespace(self, *, engine_partitions: int = DEFAULT_ENGINE_PARTITIONS
                         ) -> NamespaceProperties:
        """Make the namespace of the connection string: its topics, with
        ``engine_partitions`` engine partitions (1 to 256), the most engine
        workers it can use. Not an SDK call (Azure makes namespaces elsewhere);
        without it the first engine worker or administration call makes the
        namespace with 8. Nothing changes for a namespace that exists with
        that count; one that exists with another raises
        ``ResourceExistsError`` (:class:`MessagingEntityAlreadyExistsError`):
        the count cannot change, each window's partition follows from it."""
        wanted = validate_engine_partitions(engine_partitions)
        count = self._provision_namespace(wanted)
        if count != wanted:
            raise MessagingEntityAlreadyExistsError(
                f"namespace {self._settings.namespace!r} exists with {count} engine "
                f"partitions, not {wanted}: the count is fixed when a namespace is made, "
                "because it places every window of the namespace. Make a new namespace "
                "with the count you need and move the entities to it")
        return self.get_namespace_properties()

    def get_namespace_properties(self, **kwargs: Any) -> NamespaceProperties:
        """The namespace's settings: its limit of engine commands per second,
        and its engine partitions (0 if the namespace was never made)."""
        refuse_admin("get_namespace_properties", kwargs)
        props = self._registry.namespace_properties()
        props.engine_partitions = specs.partition_count(
            self._admin, names.commands(self._settings.namespace))
        return props

    def update_namespace_properties(self, *, max_commands_per_second: int | None
                                    ) -> NamespaceProperties:
        """Limit the engine commands (receives, settlements, peeks...) that
        every client of the namespace together may send per second; None
        lifts the limit. Commands over it are answered ``ServerBusy`` and
        clients try that entity again 10 s later. In effect when this
        returns (the engine has read it)."""
        props = NamespaceProperties(self._settings.namespace, positive_or_none(
            max_commands_per_second, "max_commands_per_second"))
        props.engine_partitions = self._provision_namespace()
        self._engine_follows(NAMESPACE_KEY, 1, self._registry.put(props, NAMESPACE_KEY))
        return props

    def _provision_namespace(self, engine_partitions: int = DEFAULT_ENGINE_PARTITIONS) -> int:
        """Make the namespace if it was not made (:func:`specs.provision_namespace`);
        its engine partitions."""
        with self._provisioning():
            return specs.provision_namespace(self._admin, self._settings.namespace,
                                             self._settings.profile.replication_factor,
                                             engine_partitions)

    def _provision(self, topics: list[specs.TopicSpec]) -> None:
        with self._provisioning():
            specs.provision(self._admin, topics, self._settings.profile.replication_factor)

    @contextmanager
    def _provisioning(self) -> Iterator[None]:
        """Signed in, and a topic creation the broker refuses for want of
        the Manage right raised as the SDK's authorization error."""
        self._sign_in()
        try:
            yield
        except specs.ProvisioningError as exc:
            cause = exc.__cause__
            refused = isinstance(cause, KafkaException) and denied(
                cause.args[0].name(), "the Manage right",
                f"namespace {self._settings.namespace!r}")
            if refused:
                raise refused from None
            raise

    def _engine_follows(self, name: str, partitions: int, version: int) -> None:
        """Wait until the engine has read record ``version`` of the entities
        topic (the definition or deletion just written) and every window of
        the queue follows it: a new policy is in effect when this returns, a
        queue that scans its messages starts at once, a deleted queue's state
        is gone. The engine takes definitions only from that topic, never
        from a command; if it does not answer now, it reads them on its own.
        ``name`` may be :data:`NAMESPACE_KEY`: the namespace's settings."""
        link = self._engine()
        try:
            replies = link.call_many([link.command(name, p, StatsArgs(0, version))
                                      for p in range(partitions)])
        except (OperationTimeoutError, ServiceBusConnectionError) as exc:
            log.warning("definition of %r written, but the engine did not answer (%s); it "
                        "reads the entities topic on its own", name, exc.message)
            return
        for reply in replies:
            if not reply.ok:
                raise for_code(reply.error_code)(
                    f"the engine refused to read the definition of {name!r}: "
                    f"{reply.error_message}", error_code=reply.error_code)

    def get_queue(self, queue_name: str, **kwargs: Any) -> QueueProperties:
        refuse_admin("get_queue", kwargs)
        return self._registry.get(queue_name, fresh=True)

    def list_queues(self, **kwargs: Any) -> list[QueueProperties]:
        refuse_admin("list_queues", kwargs)
        return sorted(self._registry.load().values(), key=lambda q: q.name)

    def list_queues_runtime_properties(self, **kwargs: Any) -> list[QueueRuntimeProperties]:
        refuse_admin("list_queues_runtime_properties", kwargs)
        return [self.get_queue_runtime_properties(q.name) for q in self.list_queues()]

    def delete_queue(self, queue_name: str, **kwargs: Any) -> None:
        """Delete the queue's definition and its log. The engine forgets the
        queue's windows once it reads the deletion (a client cannot make it
        forget them); this waits until it has."""
        refuse_admin("delete_queue", kwargs)
        props = self._registry.get(queue_name, fresh=True)
        self._engine_follows(queue_name, props.partition_count,
                             self._registry.put(None, queue_name))
        futures = self._admin.delete_topics([names.entity_log(self._settings.namespace,
                                                              queue_name)])
        for fut in futures.values():
            fut.result()

    def list_queue_sessions_runtime_properties(self, queue_name: str, **kwargs: Any
                                               ) -> list[SessionRuntimeProperties]:
        """Each session of a session-enabled queue: its active message count,
        whether it is locked and until when, and its state's size (what the
        SDK's ``list_queue_sessions`` ids leave out)."""
        refuse_admin("list_queue_sessions_runtime_properties", kwargs)
        props = self._registry.get(queue_name, fresh=True)
        return list(list_sessions(self._engine(), props))

    def get_queue_runtime_properties(self, queue_name: str, **kwargs: Any
                                     ) -> QueueRuntimeProperties:
        """Counts from the engine, against the log ends."""
        refuse_admin("get_queue_runtime_properties", kwargs)
        props = self._registry.get(queue_name, fresh=True)
        runtime = QueueRuntimeProperties(queue_name, created_at_utc=props.created_at_utc,
                                         updated_at_utc=props.updated_at_utc)
        self._count_into(runtime, props)
        return runtime

    def _count_into(self, runtime: QueueRuntimeProperties | SubscriptionRuntimeProperties,
                    props: QueueProperties | SubscriptionProperties) -> None:
        """Add the counts of every window of a queue or subscription, and its
        size in bytes where ``runtime`` has one."""
        link = self._engine()
        ends = log_ends(link, props)
        add_counts(runtime, settled_stats(link, props, ends))
        if isinstance(runtime, QueueRuntimeProperties):
            runtime.size_in_bytes = queue_size_in_bytes(self._settings, link, props, ends,
                                                        runtime.total_message_count)

    def _engine(self) -> EngineLink:
        with self._making:  # threads sharing the client share one link
            if self._link is None:
                # one producer: its calls are few, and seldom at once
                self._link = EngineLink(self._settings, attempt_timeout=5.0,
                                        retry=RetryPolicy(total=2, backoff_factor=0.2), lanes=1)
            return self._link

    def close(self) -> None:
        self._entities.close()
        with self._making:
            link, self._link = self._link, None
        if link is not None:
            link.close()

    def __enter__(self) -> ServiceBusAdministrationClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
