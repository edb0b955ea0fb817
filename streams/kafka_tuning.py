"""The two places where the engine overrides Faust's Kafka client behaviour,
each only on the broker that needs it (:mod:`topics.broker_profile`).

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
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from topics.connection import ConnectionSettings
from topics.offsets import log_end_offsets


def apply(settings: ConnectionSettings) -> None:
    """Install the overrides this broker needs, for the engine process."""
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


def _true_highwaters(settings: ConnectionSettings, partitions: list[TP]) -> dict[TP, int]:
    consumer = Consumer(settings.consumer_config(f"highwaters-{uuid.uuid4().hex[:8]}"))
    try:
        ends = log_end_offsets(consumer, [(tp.topic, tp.partition) for tp in partitions],
                               exact=False)
    finally:
        consumer.close()
    return {tp: ends[(tp.topic, tp.partition)] for tp in partitions}
