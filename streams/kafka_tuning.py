"""The places where the engine overrides Faust's Kafka client behaviour:
two only on the broker that needs it (:mod:`topics.broker_profile`), and
aiokafka's reconnections on every broker.

1. Fetch wait. Faust hard-codes aiokafka's ``fetch_max_wait_ms=1500`` and
   offers no setting. Apache Kafka answers a waiting fetch as soon as data
   arrives, so the wait costs nothing there, but Tansu (the embedded broker)
   does not: every command would wait 1.5 s. The profile's fetch wait is
   applied here instead.

2. Changelog high watermarks. Faust recovers a table by reading its changelog
   up to the high watermarks it gets from ListOffsets, which Tansu answers with
   the last batch's base offset + 1. Recovery would then stop early and forget
   the newest window states. :func:`topics.offsets.log_end_offsets` reads them
   from a fetch response instead. Apache Kafka's answer is exact: Faust's own
   code stays.

3. Reconnections. aiokafka tries a broker that does not answer again after
   100 ms, for ever, from the fetcher, the producer, the group coordinator
   and the metadata updates alike: with every broker away, a worker spent
   6-8% of a core, and more the longer it lasted, on connection attempts.
   Here a broker that refused a connection is tried again after a delay that
   doubles with each failure, up to :data:`RECONNECT_MAX_S` (librdkafka's
   clients do the same), and at once again after a success.

4. The commands partitions. Faust assigns them (its agent on the commands
   topic makes the group's assignment, and the tables follow it), but the
   engine reads them itself (:mod:`streams.command_intake`):
   :func:`leave_to_intake` keeps them out of the partitions Faust's consumer
   hands to its streams, which it would otherwise resume after every
   rebalance.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import client as aiokafka_client
from confluent_kafka import Consumer
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from topics.connection import ConnectionSettings
from topics.offsets import log_end_offsets

#: the longest wait before a broker that refused connections is tried again:
#: how late, at most, a worker notices that the brokers are back
RECONNECT_MAX_S = 2.0
_RECONNECT_FIRST_S = 0.1


def apply(settings: ConnectionSettings) -> None:
    """Install the overrides this broker needs, for the engine process."""
    _back_off_reconnections()
    profile = settings.profile
    thread_cls = faust_aiokafka.AIOKafkaConsumerThread
    create_worker_consumer = thread_cls._create_worker_consumer

    def _create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = create_worker_consumer(self, transport)
        consumer._fetch_max_wait_ms = profile.fetch_max_wait_ms
        return consumer

    async def _highwaters(self: Any, partitions: list[TP]) -> Mapping[TP, int]:
        if self.consumer.in_transaction or not partitions:
            return {tp: self._ensure_consumer().last_stable_offset(tp) for tp in partitions}
        return await asyncio.to_thread(_true_highwaters, settings, partitions)

    # Faust creates its consumer thread itself, so the overrides replace methods of
    # its class (with setattr: a plain assignment to a method is a slip mypy stops).
    overrides: dict[str, Callable[..., Any]] = {
        "_create_worker_consumer": _create_worker_consumer}
    if not profile.exact_list_offsets:
        overrides["_highwaters"] = _highwaters
    for name, override in overrides.items():
        setattr(thread_cls, name, override)


def leave_to_intake(topic: str) -> None:
    """Faust's consumer never takes records of ``topic`` for its streams.
    (aiokafka fetches each of its partitions once after an assignment, and
    keeps what it got unread: it fetches a partition again only once its
    records were taken.)"""
    cls = faust_consumer.Consumer
    set_active = cls._set_active_tps
    resume = cls.resume_partitions

    def _set_active_tps(self: Any, tps: Any) -> Any:
        active = set_active(self, tps)
        active.difference_update([tp for tp in active if tp.topic == topic])
        return active

    def resume_partitions(self: Any, tps: Any) -> None:
        resume(self, [tp for tp in tps if tp.topic != topic])

    # with setattr: a plain assignment to a method is a slip mypy stops
    setattr(cls, "_set_active_tps", _set_active_tps)  # noqa: B010
    setattr(cls, "resume_partitions", resume_partitions)  # noqa: B010


def _true_highwaters(settings: ConnectionSettings, partitions: list[TP]) -> dict[TP, int]:
    consumer = Consumer(settings.consumer_config(f"highwaters-{uuid.uuid4().hex[:8]}"))
    try:
        ends = log_end_offsets(consumer, [(tp.topic, tp.partition) for tp in partitions],
                               exact=False)
    finally:
        consumer.close()
    return {tp: ends[(tp.topic, tp.partition)] for tp in partitions}


def _back_off_reconnections() -> None:
    """Wrap aiokafka's ``AIOKafkaClient._get_conn`` so that a node that
    refused its last connections is tried again only after a growing delay."""
    get_conn = aiokafka_client.AIOKafkaClient._get_conn

    async def _get_conn(self: Any, node_id: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        # node -> (failures in a row, when the next attempt may be made)
        refused: dict[Any, tuple[int, float]] = self.__dict__.setdefault(
            "_settlement_refused", {})
        failures, next_try = refused.get(node_id, (0, 0.0))
        if (delay := next_try - loop.time()) > 0:
            await asyncio.sleep(delay)
        conn = await get_conn(self, node_id, **kwargs)
        if conn is None:  # aiokafka logged why; the next callers wait
            wait = min(_RECONNECT_FIRST_S * 2 ** failures, RECONNECT_MAX_S)
            refused[node_id] = (failures + 1, loop.time() + wait)
        else:
            refused.pop(node_id, None)
        return conn

    # with setattr: a plain assignment to a method is a slip mypy stops
    aiokafka_client.AIOKafkaClient._get_conn = _get_conn
