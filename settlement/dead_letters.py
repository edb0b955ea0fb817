"""Dead-letter tooling: resubmit dead letters to their queue, or purge them.

Both read the dead-letter sub-queue in peek-lock mode and complete each
dead letter only after it has been handled (sent back and acknowledged, for a
resubmit), so an interrupted run loses nothing and a second run picks up
exactly what the first left. A dead letter that does not match the filters
is left in the sub-queue.

A subscription's dead letters can be listed and purged, but not resubmitted
to the subscription: it has no log of its own (it is a window over its
topic's log), and sending them to the topic would deliver them again to
every subscription of the topic. Resubmitting to a subscription is refused.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from settlement.client import ServiceBusClient
from settlement.message import ServiceBusReceivedMessage, copy_message
from settlement.receiver import ServiceBusSubQueue
from topics import names
from topics.times import as_utc

Progress = Callable[[int], None]
#: Application property of a copy made by a replay job: ``entity/partition/offset``
#: of the original, so that a replay can tell what it already sent.
REPLAYED_FROM = "replayed_from"
_BATCH = 100
_WAIT = 1.0


def replay_id(entity: str, message: ServiceBusReceivedMessage) -> str:
    """The :data:`REPLAYED_FROM` value of a copy of ``message`` of ``entity``."""
    return f"{entity}/{message.partition}/{message.offset}"


def resubmit_dead_letters(client: ServiceBusClient, queue_name: str, *,
                          reason: str | None = None, since: dt.datetime | None = None,
                          limit: int | None = None, on_progress: Progress | None = None
                          ) -> int:
    """Send dead letters of ``queue_name`` back to it; return how many.

    The resubmitted message keeps its body, id and properties; the dead-letter
    fields are cleared and its delivery count starts over. ``reason`` keeps
    only dead letters with that reason, ``since`` only those enqueued at or
    after that time.
    """
    refuse_subscription_target(queue_name, queue_name)

    def matches(message: ServiceBusReceivedMessage) -> bool:
        if reason is not None and message.dead_letter_reason != reason:
            return False
        enqueued = message.enqueued_time_utc
        return since is None or (enqueued is not None and enqueued >= as_utc(since))

    with client.get_queue_sender(queue_name) as sender:
        return _drain(client, queue_name, matches, limit, on_progress,
                      lambda batch: sender.send_messages([copy_message(m) for m in batch]))


def replay_dead_letters(client: ServiceBusClient, queue_name: str,
                        chosen: set[tuple[int, int]], *, to: str | None = None,
                        already_sent: frozenset[str] = frozenset(),
                        on_progress: Progress | None = None) -> int:
    """Resubmit the dead letters at ``chosen`` ``(partition, offset)``s to ``to``
    (default: their queue); return how many left the sub-queue.

    Each copy carries :data:`REPLAYED_FROM`; a dead letter whose copy is in
    ``already_sent`` (a run that stopped between sending and completing) is
    completed without sending it again, so replaying is idempotent.
    """
    refuse_subscription_target(queue_name, to or queue_name)

    def send(batch: list[ServiceBusReceivedMessage]) -> None:
        copies = [copy_message(m, {REPLAYED_FROM: replay_id(queue_name, m)}) for m in batch
                  if replay_id(queue_name, m) not in already_sent]
        if copies:
            sender.send_messages(copies)

    with client.get_queue_sender(to or queue_name) as sender:
        return _drain(client, queue_name, lambda m: (m.partition, m.offset) in chosen,
                      len(chosen), on_progress, send)


def refuse_subscription_target(source: str, target: str) -> None:
    """Raise ValueError, before anything is received, when dead letters of
    ``source`` would be sent to a subscription: see the module's docstring."""
    if names.SUBSCRIPTIONS not in target:
        return
    topic = names.split_subscription_path(names.parse_entity_path(target)[0])[0]
    raise ValueError(
        f"cannot resubmit dead letters of {source!r} to subscription {target!r}: a "
        f"subscription has no log of its own, and sending them to its topic {topic!r} "
        f"would deliver them again to every subscription of {topic!r}. Inspect them with "
        f"'settlement dlq list {source}', take them with 'settlement receive {source} "
        f"--dead-letter', or remove them with 'settlement dlq purge {source}'")


def purge_dead_letters(client: ServiceBusClient, queue_name: str, *,
                       on_progress: Progress | None = None) -> int:
    """Remove every dead letter of ``queue_name``; return how many."""
    return _drain(client, queue_name, lambda _m: True, None, on_progress, lambda _b: None)


def _drain(client: ServiceBusClient, queue_name: str,
           matches: Callable[[ServiceBusReceivedMessage], bool], limit: int | None,
           on_progress: Progress | None,
           handle: Callable[[list[ServiceBusReceivedMessage]], None]) -> int:
    """Receive dead letters, ``handle`` the matching ones, then complete them.
    The others stay locked until the end, so they are not received again, and
    are then abandoned back into the sub-queue."""
    done = 0
    skipped: list[ServiceBusReceivedMessage] = []
    with client.get_queue_receiver(queue_name, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        try:
            while limit is None or done < limit:
                want = _BATCH if limit is None else min(_BATCH, limit - done)
                batch = dlq.receive_messages(want, max_wait_time=_WAIT)
                if not batch:
                    break
                chosen = [m for m in batch if matches(m)]
                skipped += [m for m in batch if not matches(m)]
                if chosen:
                    handle(chosen)
                    settled = [r for r in dlq.complete_messages(chosen) if r.succeeded]
                    done += len(settled)
                    if on_progress is not None:
                        on_progress(len(settled))
        finally:
            if skipped:
                dlq.abandon_messages(skipped)
    return done
