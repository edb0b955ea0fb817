"""Paired namespaces for send availability, as the seed on high availability
describes them (``SendAvailabilityPairedNamespaceOptions``).

A client paired with a secondary namespace sends to its primary as usual.
When sends to an entity keep timing out or failing on the way for the
failover interval, that entity's sends go to a backlog queue of the
secondary instead, chosen at random, each copy carrying its destination
and the message's replay id. A busy answer, a refusal (rights, size,
quota) or an unknown entity does not fail over: those are the caller's to
see. The client keeps probing the primary and sends there again once it
answers. A syphon (``enable_syphon=True``, on the receiving side) moves
backlog messages to their destinations on the primary once it is back
(:mod:`settlement._syphon`). Receivers only ever read the primary.

Each message a paired client sends carries a replay id (the record header
``replay-id``), so a message that reached the primary after all, though its
send timed out, is not moved there a second time.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from settlement._backlog import backlog_copy, destination
from settlement._syphon import NamespaceClient, Syphon
from settlement.exceptions import (
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthorizationError,
    ServiceBusError,
    ServiceBusServerBusyError,
)
from settlement.management import ServiceBusAdministrationClient
from settlement.message import ServiceBusMessage
from settlement.sender import Delivery, ServiceBusSender
from topics import names, specs
from topics.connection import ConnectionSettings, parse_connection_string
from topics.message_record import with_replay_id
from topics.offsets import offset_of

log = logging.getLogger(__name__)
#: how often an entity sending to the backlog probes the primary
PROBE_INTERVAL_S = 1.0
#: how often an entity sending to the backlog reports its progress (the
#: messages it sent there) to the status topic between failover and switch back
REPORT_INTERVAL_S = 5.0
#: how long a failed primary attempt waits before the next, within the interval
_PAUSE_S = 0.2
#: the shortest wait for the primary's acknowledgement (a zero interval
#: fails over at the first failure, not before the broker could answer)
_MIN_ATTEMPT_S = 1.0


@dataclass
class SendAvailabilityPairedNamespaceOptions:
    """What pairs a client with a secondary namespace.

    ``backlog_queue_count`` (at least 1; 10 recommended) backlog queues are
    found or created on the secondary; after the pairing it says how many
    are available, and ``backlog_queues_found``/``backlog_queues_created``
    say how they came to be. ``failover_interval`` is how long sends to an
    entity may fail before that entity fails over (zero: at the first
    failure). ``enable_syphon`` makes this client move backlog messages back
    to the primary: set it on receivers, not senders.
    """

    secondary_connection_string: str
    backlog_queue_count: int = 10
    failover_interval: dt.timedelta = dt.timedelta(seconds=10)
    enable_syphon: bool = False
    backlog_queues_found: int = field(default=0, init=False)
    backlog_queues_created: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        count = self.backlog_queue_count
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"backlog_queue_count must be at least 1, not {count!r}")
        interval = self.failover_interval
        if not isinstance(interval, dt.timedelta):
            self.failover_interval = dt.timedelta(seconds=float(interval))
        if self.failover_interval < dt.timedelta(0):
            raise ValueError("failover_interval must not be negative")


def backlog_queue_names(primary_namespace: str, count: int) -> list[str]:
    """The backlog queues of ``primary_namespace`` on its secondary."""
    return [names.backlog_queue(primary_namespace, i) for i in range(count)]


@dataclass
class Route:
    """Where one entity's sends go now, and what happened so far."""

    kind: str
    entity: str
    #: time.monotonic() of the first failure of the current run of failures
    failing_since: float | None = None
    #: wall-clock time the entity failed over (None: sends go to the primary)
    backlog_since: dt.datetime | None = None
    failovers: int = 0
    sent_to_backlog: int = 0

    @property
    def to_backlog(self) -> bool:
        return self.backlog_since is not None

    def status(self, client_id: str, event: str) -> dict[str, object]:
        """The record ``settlement pair status`` and the dashboard read;
        ``event`` says why it was published (see :class:`StatusTopic`)."""
        mode = "closed" if event == "closed" else "backlog" if self.to_backlog else "primary"
        return {"entity": self.entity, "kind": self.kind, "client": client_id,
                "event": event, "mode": mode,
                "since": self.backlog_since.isoformat() if self.backlog_since else None,
                "failovers": self.failovers, "sent_to_backlog": self.sent_to_backlog,
                "ts": int(time.time() * 1000)}


def fails_over(error: ServiceBusError) -> bool:
    """Whether ``error`` counts towards the failover interval: timeouts and
    failures on the way, not a busy namespace (wait 10 s instead) nor a
    refusal that says the client is misconfigured."""
    if isinstance(error, ServiceBusServerBusyError | ServiceBusAuthorizationError
                  | MessagingEntityNotFoundError):
        return False
    return error.retryable


class Pairing:
    """One client's pairing: its backlog queues, the routes of its
    entities, the probe of the primary and, if enabled, the syphon.
    ``open_client`` makes the unpaired clients it needs (of the secondary,
    and of the primary for the syphon): the client module passes it in, as
    it builds on this one."""

    def __init__(self, primary: ConnectionSettings,
                 options: SendAvailabilityPairedNamespaceOptions,
                 open_client: Callable[[ConnectionSettings], NamespaceClient]) -> None:
        self.primary = primary
        self.options = options
        self.secondary = parse_connection_string(options.secondary_connection_string)
        if (self.secondary.bootstrap_servers, self.secondary.namespace) == (
                primary.bootstrap_servers, primary.namespace):
            raise ValueError("the secondary namespace of a pairing must not be the primary")
        self.client_id = uuid.uuid4().hex[:12]
        self.queues = backlog_queue_names(primary.namespace, options.backlog_queue_count)
        self._interval = options.failover_interval.total_seconds()
        self._routes: dict[str, Route] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._ensure_backlog_queues()
        self._secondary_client = open_client(self.secondary)
        self._backlog_senders: dict[str, ServiceBusSender] = {}
        self._status = StatusTopic(self.secondary)
        self._primary_admin = AdminClient({**primary.kafka_config(), "log_level": 0})
        self._probe = threading.Thread(target=self._probe_primary, name="pairing-probe",
                                       daemon=True)
        self._probe.start()
        self._syphon: Syphon | None = None
        if options.enable_syphon:
            self._syphon = Syphon(self.queues, self.primary_answers, open_client(primary),
                                  self._secondary_client)

    # ------------------------------------------------------------ set-up
    def _ensure_backlog_queues(self) -> None:
        """Find or create the backlog queues; report how many of each."""
        with ServiceBusAdministrationClient._from_settings(self.secondary) as admin:
            existing = {q.name for q in admin.list_queues()}
            missing = [q for q in self.queues if q not in existing]
            for queue in missing:
                admin.create_queue(queue, lock_duration=dt.timedelta(seconds=60))
        found = len(self.queues) - len(missing)
        self.options.backlog_queues_found = found
        self.options.backlog_queues_created = len(missing)
        self.options.backlog_queue_count = len(self.queues)
        log.info("paired namespace %r with %r: %d backlog queue(s) found, %d created",
                 self.primary.namespace, self.secondary.namespace, found, len(missing))

    # ------------------------------------------------------------ sending
    def route(self, kind: str, entity: str) -> Route:
        key = destination(kind, entity)
        with self._lock:
            if key not in self._routes:
                self._routes[key] = Route(kind, entity)
            return self._routes[key]

    def send(self, sender: ServiceBusSender, messages: list[ServiceBusMessage],
             records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]) -> None:
        """Send to the primary, or to the backlog once the entity failed over."""
        route = self.route(sender.kind, sender.entity_name)
        replay_ids = [uuid.uuid4().hex for _ in messages]
        records = [with_replay_id(record, rid)
                   for record, rid in zip(records, replay_ids, strict=True)]
        delivery = Delivery(len(records))
        first_try_ms = int(time.time() * 1000)
        while not route.to_backlog:
            started = time.monotonic()
            deadline = (route.failing_since or started) + max(self._interval, _MIN_ATTEMPT_S)
            try:
                sender.deliver(records, delivery, deadline)
            except ServiceBusError as exc:
                if not fails_over(exc):
                    raise
                self._failing(route, sender, exc, started)
                continue
            route.failing_since = None
            sender.announce_sent(messages, delivery)
            return
        self._to_backlog(route, sender, messages, replay_ids, delivery, first_try_ms)

    def _failing(self, route: Route, sender: ServiceBusSender, error: ServiceBusError,
                 started: float) -> None:
        """Count a failed attempt; fail the entity over once its failures
        span the interval. An attempt that timed out left its records in the
        producer, so it fails over at once (its deadline was the interval's
        end): sending them again to the primary could store them twice."""
        with self._lock:
            if route.failing_since is None:
                route.failing_since = started
            timed_out = isinstance(error, OperationTimeoutError)
            if not timed_out and time.monotonic() - route.failing_since < self._interval:
                pause = True
            elif route.to_backlog:
                return
            else:
                pause = False
                route.backlog_since = dt.datetime.now(dt.UTC)
                route.failovers += 1
        if pause:
            time.sleep(_PAUSE_S)
            return
        log.warning("sends to %s %r fail over to the backlog of namespace %r: %s",
                    route.kind, route.entity, self.secondary.namespace, error.message)
        sender.abandon_producer()
        self._publish(route, "failover")

    def _to_backlog(self, route: Route, sender: ServiceBusSender,
                    messages: list[ServiceBusMessage], replay_ids: list[str],
                    delivery: Delivery, first_try_ms: int) -> None:
        """Send what the primary did not acknowledge to a random backlog
        queue; on failure, to another one, until every queue was tried."""
        scan_from = json.dumps({str(p): o + 1 for p, o in sender.acked.items()})
        copies = [backlog_copy(messages[i], destination(route.kind, route.entity),
                                replay_ids[i], first_try_ms, scan_from)
                  for i in delivery.missing()]
        queues = random.sample(self.queues, len(self.queues))
        for queue in queues:
            try:
                self._backlog_sender(queue).send_messages(copies)
            except ServiceBusError as exc:
                if queue == queues[-1] or not exc.retryable:
                    raise
                log.warning("backlog queue %r refused a send (%s); trying another", queue,
                            exc.message)
                continue
            with self._lock:
                route.sent_to_backlog += len(copies)
            return

    def _backlog_sender(self, queue: str) -> ServiceBusSender:
        with self._lock:
            if queue not in self._backlog_senders:
                self._backlog_senders[queue] = self._secondary_client.get_queue_sender(queue)
            return self._backlog_senders[queue]

    # ------------------------------------------------------------ probing
    def primary_answers(self, topic: str | None = None) -> bool:
        """Whether the primary's brokers answer for ``topic`` (default: the
        namespace's commands topic) with a leader for every partition."""
        topic = topic or names.commands(self.primary.namespace)
        try:
            metadata = self._primary_admin.list_topics(topic, timeout=2)
        except KafkaException:
            return False
        found = metadata.topics.get(topic)
        return (found is not None and found.error is None and bool(found.partitions)
                and all(p.leader >= 0 for p in found.partitions.values()))

    def _probe_primary(self) -> None:
        reported = time.monotonic()
        while not self._closed.wait(PROBE_INTERVAL_S):
            with self._lock:
                away = [r for r in self._routes.values() if r.to_backlog]
            report = time.monotonic() - reported >= REPORT_INTERVAL_S
            if report:
                reported = time.monotonic()
            for route in away:
                log_topic = (names.topic_log if route.kind == "topic" else names.entity_log)(
                    self.primary.namespace, route.entity)
                if not self.primary_answers(log_topic):
                    if report:
                        self._publish(route, "progress")
                    continue
                with self._lock:
                    route.backlog_since = None
                    route.failing_since = None
                log.warning("the primary namespace %r answers again: sends to %s %r go "
                            "there", self.primary.namespace, route.kind, route.entity)
                self._publish(route, "switch_back")

    def _publish(self, route: Route, event: str) -> None:
        self._status.publish(self.primary.namespace, route.status(self.client_id, event))

    def routes(self) -> list[Route]:
        with self._lock:
            return list(self._routes.values())

    def close(self) -> None:
        """Stop probing and syphoning; an entity still sending to the backlog
        reports that this client is gone, so nothing shows it sending there."""
        self._closed.set()
        if self._syphon is not None:
            self._syphon.close()
        self._probe.join(timeout=5)
        for route in self.routes():
            if route.to_backlog:
                self._publish(route, "closed")
        self._status.close()
        self._secondary_client.close()


class StatusTopic:
    """The compacted topic ``NS.__pairing`` of the secondary namespace: per
    primary entity and client, where its sends go and how many went to the
    backlog. ``settlement pair status`` and the monitor (for the dashboard)
    read it. A record's ``event`` is ``failover``, ``progress`` (every
    :data:`REPORT_INTERVAL_S` while in the backlog), ``switch_back`` or
    ``closed`` (the client closed while in the backlog: mode ``closed``)."""

    def __init__(self, secondary: ConnectionSettings) -> None:
        self.topic = names.pairing(secondary.namespace)
        admin = AdminClient(secondary.kafka_config())
        specs.provision_namespace(admin, secondary.namespace,
                                  secondary.profile.replication_factor)
        self._producer = Producer({**secondary.kafka_config(), "acks": "all", "linger.ms": 0})

    def publish(self, primary_namespace: str, status: dict[str, object]) -> None:
        """Queue one status record; it must not hold up the send that caused it."""
        key = f"{primary_namespace}|{status['kind']}:{status['entity']}|{status['client']}"
        self._producer.produce(self.topic, json.dumps(
            {"primary": primary_namespace, **status}).encode(), key=key.encode())
        self._producer.poll(0)

    def close(self) -> None:
        self._producer.flush(5)


def read_status(secondary: ConnectionSettings, primary_namespace: str) -> list[dict[str, object]]:
    """The latest status record of each entity and client of
    ``primary_namespace``, as its paired clients last published them."""
    topic = names.pairing(secondary.namespace)
    consumer = Consumer(secondary.consumer_config(f"pair-status-{uuid.uuid4().hex}"))
    latest: dict[bytes | None, dict[str, object]] = {}
    deadline = time.monotonic() + 30
    try:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        except KafkaException:
            return []  # no paired client has published yet
        consumer.assign([TopicPartition(topic, 0, low)])
        position = low
        while position < high and time.monotonic() < deadline:
            for record in consumer.consume(500, timeout=1.0):
                if record.error():
                    continue
                position = offset_of(record) + 1
                value = record.value()
                if value is None:
                    latest.pop(record.key(), None)
                    continue
                status = json.loads(value)
                if status.get("primary") == primary_namespace:
                    latest[record.key()] = status
    finally:
        consumer.close()
    return sorted(latest.values(), key=lambda s: (str(s["entity"]), str(s["client"])))
