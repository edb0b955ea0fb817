"""A window's counts once the engine has read its log up to the log end.

On a scanned entity (duplicate detection, filters, sessions...) the engine
learns of a message only when its log scanner accepts it, a moment after the
send. Counts and session listings read right after a send would miss it, so
they first wait (up to :data:`SCAN_WAIT_S`) until each window's scanner has
reached the log end the caller read.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer

from settlement._engine_link import EngineLink
from settlement.exceptions import for_code
from topics import names
from topics.commands import Reply, StatsArgs
from topics.entities import QueueProperties, SubscriptionProperties
from topics.offsets import log_end_offsets

SCAN_WAIT_S = 3.0


def log_ends(link: EngineLink, props: QueueProperties | SubscriptionProperties
             ) -> dict[int, int]:
    """The end offset of each partition of the entity's log."""
    settings = link.settings
    topic = names.entity_log(settings.namespace, props.path)
    consumer = Consumer(settings.consumer_config(f"admin-{uuid.uuid4().hex[:12]}"))
    try:
        ends = log_end_offsets(consumer, [(topic, p) for p in range(props.partition_count)],
                               exact=settings.profile.exact_list_offsets)
    finally:
        consumer.close()
    return {p: ends[(topic, p)] for p in range(props.partition_count)}


def settled_stats(link: EngineLink, props: QueueProperties | SubscriptionProperties,
                  ends: dict[int, int], *, scan_wait: float = SCAN_WAIT_S) -> list[Reply]:
    """Each window's stats once its log scanner has read up to ``ends``
    (waiting up to ``scan_wait`` s): before that, a filtered subscription
    would count messages its rules may not select, and a session queue would
    miss sessions."""
    deadline = time.monotonic() + scan_wait
    while True:
        replies = link.call_many([link.command(props.path, p, StatsArgs(ends[p]))
                                  for p in range(props.partition_count)])
        behind = [r for r in replies if r.ok and r.result.get("scanned") is not None
                  and r.result["scanned"] < r.result["hw"]]
        if not behind or time.monotonic() > deadline:
            return replies
        time.sleep(0.05)


def add_counts(runtime: Any, replies: list[Reply]) -> None:
    """Add each window's counts (the replies of :func:`settled_stats`) into a
    queue's or a subscription's runtime properties; raise what the engine
    refused."""
    for reply in replies:
        if not reply.ok:
            raise for_code(reply.error_code)(reply.error_message, error_code=reply.error_code)
        stats = reply.result
        runtime.active_message_count += stats["active"]
        runtime.dead_letter_message_count += stats["dead_letter"]
        runtime.deferred_message_count += stats["deferred"]
        runtime.locked_message_count += stats["locked"]
        runtime.scheduled_message_count += stats.get("scheduled", 0)
        runtime.transfer_dead_letter_message_count += stats.get("transfer_dead_letter", 0)
