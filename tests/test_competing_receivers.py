"""Competing receivers: every message delivered, never locked by two at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from settlement import ServiceBusClient, ServiceBusMessage


def test_three_receivers_share_a_queue_without_overlapping_locks(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=5, partition_count=2)
    total = 600
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}")
                              for i in range(total)])
    lock = threading.Lock()
    # message id -> [(receiver, received_at, released_at or None, delivery_count)]
    deliveries: dict[str, list[tuple[int, float, float | None, int]]] = {}
    completed: dict[str, int] = {}
    # Every receiver holds its first batch before any settles, so all three
    # take part however the threads are scheduled (in CI two of them once
    # drained the 600 before the third's first receive came back).
    first_batches = threading.Barrier(3)

    def work(index: int) -> None:
        receiver = client.get_queue_receiver(queue)
        abandon_turn = 0
        first = True
        while True:
            batch = receiver.receive_messages(25, max_wait_time=3)
            got_at = time.monotonic()
            if first:
                first_batches.wait(timeout=60)
                first = False
            if not batch:
                return
            keep = []
            for message in batch:
                abandon_turn += 1
                if abandon_turn % 7 == 0:
                    released = time.monotonic()
                    receiver.abandon_message(message)
                    with lock:
                        deliveries.setdefault(message.message_id, []).append(
                            (index, got_at, released, message.delivery_count))
                else:
                    keep.append(message)
            released = time.monotonic()
            for result in receiver.complete_messages(keep):
                with lock:
                    deliveries.setdefault(result.message.message_id, []).append(
                        (index, got_at, released, result.message.delivery_count))
                    if result.succeeded:
                        completed[result.message.message_id] = (
                            completed.get(result.message.message_id, 0) + 1)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert set(completed) == {f"m{i}" for i in range(total)}
    assert all(count == 1 for count in completed.values())
    assert len({d[0] for ds in deliveries.values() for d in ds}) == 3  # all three worked
    for message_id, ds in deliveries.items():
        ds.sort(key=lambda d: d[3])
        assert [d[3] for d in ds] == list(range(len(ds))), message_id
        for earlier, later in zip(ds, ds[1:], strict=False):
            # the next holder got it only after the previous one let it go
            assert earlier[2] is not None and earlier[2] <= later[1], (message_id, ds)


def _engine_link_threads() -> int:
    return sum(t.name == "engine-replies" for t in threading.enumerate())


def test_threads_that_share_a_new_client_share_its_engine_link(
        client: ServiceBusClient, conn: str, make_queue: Callable[..., str]) -> None:
    """Eight threads start receiving and completing at once through one new
    client: it links to the engine once, and closing it stops the link (each
    thread made a link of its own, and only the last was closed)."""
    queue = make_queue(partition_count=2)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(16)])
    before = _engine_link_threads()
    start = threading.Barrier(8)
    done: list[int] = []
    with ServiceBusClient.from_connection_string(conn) as shared:

        def work() -> None:
            start.wait(timeout=30)
            with shared.get_queue_receiver(queue) as receiver:
                while batch := receiver.receive_messages(2, max_wait_time=2):
                    for message in batch:
                        receiver.complete_message(message)
                        done.append(1)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert _engine_link_threads() == before + 1
    assert _engine_link_threads() == before
    assert len(done) == 16
