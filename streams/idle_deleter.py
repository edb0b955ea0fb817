"""Deletes queues, topics and subscriptions idle for their ``auto_delete_on_idle``.

As in Service Bus, an entity is idle while nothing uses it; it is deleted
(definition and log, as ``delete_queue``/``delete_topic``/``delete_subscription``
do, through the administration client) once idle for its
``auto_delete_on_idle`` (5 minutes at least; "never" by default). What counts
as use here:

* a client's command on one of its windows (receive, settle, renew, peek,
  count...), seen at the engine's ``on_client_command`` point;
* a send: its log grew (its end offsets, read at each check);
* a change of its definition (``updated_at_utc``);
* for a topic, also the use of any of its subscriptions.

A subscription is not kept by sends to its topic alone: only its receivers
and changes keep it (Service Bus deletes a subscription nobody reads).

Each entity is watched by the worker that owns its first window
(``ENTITY#0``). It sees the commands of the windows it owns; receivers ask
every partition in turn, so it sees every active receiver, and sends to any
partition through the log ends. Activity is kept in memory: a worker that
starts (or gets the entity's window) counts the entity as used then, so a
restart only ever delays a deletion.

Private test hook: ``SETTLEMENT_TEST_IDLE_CLOCK_SCALE`` (engine environment,
for the tests only, not a setting) makes the idle clock and the check run
that many times faster, so a test sees the 5-minute minimum pass in seconds.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import time
import uuid

from confluent_kafka import Consumer, KafkaException
from faust.types import TP

from settlement.exceptions import MessagingEntityNotFoundError
from settlement.management import ServiceBusAdministrationClient
from streams.app import app, commands_topic, settings, window_partition
from streams.command_agent import definitions, on_client_command
from topics import names
from topics.commands import Command
from topics.entities import Definition, QueueProperties, SubscriptionProperties, TopicProperties
from topics.entities.queue import DEFAULT_TTL
from topics.offsets import log_end_offsets

log = logging.getLogger(__name__)
#: the definitions that have an ``auto_delete_on_idle``
Deletable = QueueProperties | TopicProperties | SubscriptionProperties
#: how often idle entities are looked for
CHECK_INTERVAL_S = 30.0
#: the private test hook (see the module's docstring)
_CLOCK_SCALE = float(os.environ.get("SETTLEMENT_TEST_IDLE_CLOCK_SCALE", "1"))


class IdleTracker:
    """When each entity was last used, as this worker saw it."""

    def __init__(self) -> None:
        self._started = time.time()
        #: entity (queue, topic or subscription path) -> last use, epoch seconds
        self._used: dict[str, float] = {}
        #: entity log -> its end offsets at the last check
        self._ends: dict[str, dict[int, int]] = {}

    def saw(self, cmd: Command, _appended_ms: int) -> None:
        """A client's command: its entity is in use (now: a command read again
        after a restart is use too), and a subscription's topic."""
        now = time.time()
        self._used[cmd.entity] = now
        if names.SUBSCRIPTIONS in cmd.entity:
            self._used[names.split_subscription_path(cmd.entity)[0]] = now

    def saw_log(self, entity: str, ends: dict[int, int]) -> None:
        """The log ends of a queue or topic now: grown since last time is a
        send (``{}``: unknown, counted as one)."""
        if not ends or self._ends.get(entity, ends) != ends:
            self._used[entity] = time.time()
        self._ends[entity] = ends

    def idle_for(self, name: str, definition: Deletable) -> float:
        """Seconds since ``name`` was last used, on the (scaled) idle clock."""
        changed = definition.updated_at_utc.timestamp()
        last = max(self._started, changed, self._used.get(name, 0.0))
        return (time.time() - last) * _CLOCK_SCALE

    def restart(self) -> None:
        self._started = time.time()

    def forget(self, name: str) -> None:
        self._used.pop(name, None)
        self._ends.pop(name, None)


_tracker = IdleTracker()
on_client_command.append(_tracker.saw)


@app.on_rebalance_complete.connect
async def _count_from_now(sender: object, /, *_: object, **__: object) -> None:
    """Windows may have moved here: what this worker did not see (their use
    on another worker) counts as use until now."""
    _tracker.restart()


def _watched(known: dict[str, Definition]) -> list[tuple[str, Deletable]]:
    """The entities with an ``auto_delete_on_idle`` whose first window this
    worker owns."""
    assigned = app.consumer.assignment()
    topic = commands_topic.get_topic_name()
    return [(name, d) for name, d in known.items()
             if isinstance(d, Deletable)
             and d.auto_delete_on_idle < DEFAULT_TTL
             and TP(topic, window_partition(names.window_key(name, 0))) in assigned]


def _read_log_ends(known: list[tuple[str, Deletable]]) -> None:
    """Note the sends to the watched queues and topics (their logs' ends).
    A log that cannot be read counts as in use: nothing is deleted unseen."""
    logs = [(name, d) for name, d in known if not isinstance(d, SubscriptionProperties)]
    if not logs:
        return
    consumer = Consumer(settings.consumer_config(f"idle-{uuid.uuid4().hex[:8]}"))
    try:
        for name, definition in logs:
            topic = (names.topic_log(settings.namespace, name)
                     if isinstance(definition, TopicProperties)
                     else names.entity_log(settings.namespace, name))
            partitions = [(topic, p) for p in range(definition.partition_count)]
            try:
                ends = log_end_offsets(consumer, partitions,
                                       exact=settings.profile.exact_list_offsets)
            except (KafkaException, TimeoutError) as exc:
                log.warning("cannot read the log ends of %r (%s): counting it as in use",
                            name, exc)
                _tracker.saw_log(name, {})
                continue
            _tracker.saw_log(name, {p: ends[(topic, p)] for _, p in partitions})
    finally:
        consumer.close()


def _delete(name: str, definition: Deletable) -> None:
    """Delete as the administration client does; gone already is fine."""
    admin = _admin()
    try:
        if isinstance(definition, QueueProperties):
            admin.delete_queue(name)
        elif isinstance(definition, TopicProperties):
            admin.delete_topic(name)
        else:
            admin.delete_subscription(definition.topic_name, definition.name)
    except MessagingEntityNotFoundError:  # e.g. a subscription of a topic deleted before
        pass
    _tracker.forget(name)


def check_once() -> None:
    """Delete every watched entity idle for its ``auto_delete_on_idle``."""
    watched = _watched(definitions().entities())
    _read_log_ends(watched)
    for name, definition in watched:
        idle = _tracker.idle_for(name, definition)
        limit = definition.auto_delete_on_idle
        if idle >= limit.total_seconds():
            log.info("deleting %s %r: idle for %s, its auto_delete_on_idle is %s",
                     type(definition).__name__.removesuffix("Properties").lower(), name,
                     dt.timedelta(seconds=round(idle)), limit)
            _delete(name, definition)


@app.timer(interval=CHECK_INTERVAL_S / _CLOCK_SCALE)
async def delete_idle_entities() -> None:
    try:
        await asyncio.to_thread(check_once)
    except Exception:  # never let one check stop the timer
        log.exception("looking for idle entities failed; trying again at the next check")


_admins: list[ServiceBusAdministrationClient] = []


def _admin() -> ServiceBusAdministrationClient:
    """One administration client, made at the first deletion."""
    if not _admins:
        _admins.append(ServiceBusAdministrationClient._from_settings(settings))
    return _admins[0]
