"""What the engine emits for Spark: settlement events and compacted window state.

Lock expiry is driven by the engine's own timer: a lapse shows up in the event
stream with no client command involved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from settlement import ServiceBusClient, ServiceBusMessage
from tests.helpers import read_all
from topics import names


def test_timer_lapses_locks_and_the_event_stream_says_so(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=1)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    receiver = client.get_queue_receiver(queue)
    held = receiver.receive_messages(2, max_wait_time=10)
    while len(held) < 2:
        held += receiver.receive_messages(1, max_wait_time=10)
    receiver.complete_message(held[0])
    key = f"{queue}#0".encode()

    def lapsed(events: list[dict[str, Any]]) -> bool:
        return any(e["type"] == "lock_expired" for e in events)

    events = read_all(client, names.events(client.settings.namespace), key, lapsed)
    kinds = [e["type"] for e in events]
    assert kinds.index("enqueued") < kinds.index("locked") < kinds.index("completed")
    assert lapsed(events)
    expired = next(e for e in events if e["type"] == "lock_expired")
    assert expired["offsets"] == [held[1].offset] and expired["entity"] == queue

    def settled(states: list[dict[str, Any]]) -> bool:
        return bool(states) and states[-1]["locked"] == 0 and states[-1]["active"] == 1

    states = read_all(client, names.state(client.settings.namespace), key, settled)
    assert settled(states)
    assert states[-1]["totals"]["completed"] == 1 and states[-1]["start"] == 1
