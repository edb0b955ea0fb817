"""Cancelling settlement.aio awaits leaves nothing behind, against the real
broker and a real engine: what a cancelled receive locks goes back at once
(its delivery count untouched), a cancelled settle is applied or not, and
concurrent awaits do not queue behind a thread pool."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from settlement import NEXT_AVAILABLE_SESSION
from settlement.aio import ServiceBusClient, ServiceBusReceiver
from settlement.exceptions import MessageAlreadySettled
from settlement.management import ServiceBusAdministrationClient as SyncAdmin
from tests.aio_helpers import receive_all, run, send

#: how soon released messages must reach another receiver (generous: the
#: test machine is shared; without the release they come back after 30 s)
BACK_WITHIN_S = 3.0


async def received_back(receiver: ServiceBusReceiver, bodies: list[str]) -> None:
    """``receiver`` gets ``bodies`` soon, as first deliveries; completes them."""
    started = time.monotonic()
    got = await receive_all(receiver, len(bodies))
    assert time.monotonic() - started < BACK_WITHIN_S
    assert sorted(str(m) for m in got) == sorted(bodies)
    assert [m.delivery_count for m in got] == [0] * len(bodies)
    for message in got:
        await receiver.complete_message(message)


@pytest.mark.tansu
def test_a_receive_cancelled_by_wait_for_hands_back_what_it_locks(
        conn: str, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30, partition_count=1)

    async def main() -> None:
        async with ServiceBusClient.from_connection_string(conn) as client, \
                client.get_queue_receiver(queue) as cancelled, \
                client.get_queue_receiver(queue) as other:
            # waiting on an empty queue when cancelled: it stops waiting
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(cancelled.receive_messages(5, max_wait_time=20), 1)
            await send(client, queue, "w1", "w2", "w3")
            await received_back(other, ["w1", "w2", "w3"])
            # cancelled at any point of a receive that finds messages: what it
            # locks after its caller is gone is released as soon as it returns
            for trial, delay in enumerate([0, 0.001, 0.003, 0.006, 0.01, 0.02, 0.04]):
                bodies = [f"t{trial}-{i}" for i in range(3)]
                await send(client, queue, *bodies)
                task = asyncio.create_task(cancelled.receive_messages(3, max_wait_time=5))
                await asyncio.sleep(delay)
                task.cancel()
                [outcome] = await asyncio.gather(task, return_exceptions=True)
                if isinstance(outcome, list):  # it returned before the cancel came
                    for message in outcome:
                        await cancelled.complete_message(message)
                    bodies = [b for b in bodies if b not in {str(m) for m in outcome}]
                else:
                    assert isinstance(outcome, asyncio.CancelledError)
                if bodies:
                    await received_back(other, bodies)

    run(main())


@pytest.mark.tansu
def test_cancelling_a_task_waiting_in_async_for_locks_nothing_afterwards(
        conn: str, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30, partition_count=1)

    async def main() -> None:
        async with ServiceBusClient.from_connection_string(conn) as client, \
                client.get_queue_receiver(queue) as looping, \
                client.get_queue_receiver(queue) as other:
            seen: list[str] = []

            async def consume() -> None:
                async for message in looping:  # no max_wait_time: waits for ever
                    seen.append(str(message))
                    await looping.complete_message(message)

            await send(client, queue, "first")
            task = asyncio.create_task(consume())
            while not seen:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # the loop waits for the next message
            task.cancel()  # a shutdown
            with pytest.raises(asyncio.CancelledError):
                await task
            await send(client, queue, "a1", "a2", "a3")
            await received_back(other, ["a1", "a2", "a3"])
            assert seen == ["first"]

    run(main())


@pytest.mark.tansu
def test_cancelling_a_task_in_async_for_releases_what_it_locked_ahead(
        conn: str, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30, partition_count=1)
    bodies = [f"m{i:02}" for i in range(20)]

    async def main() -> None:
        async with ServiceBusClient.from_connection_string(conn) as client, \
                client.get_queue_receiver(queue) as looping, \
                client.get_queue_receiver(queue) as other:
            seen: list[str] = []
            stuck = asyncio.Event()

            async def consume() -> None:
                async for message in looping:
                    seen.append(str(message))
                    await looping.complete_message(message)
                    if len(seen) == 5:  # a fast loop locks 1, 2, 4... ahead: 2 unseen
                        stuck.set()
                        await asyncio.sleep(3600)

            await send(client, queue, *bodies)
            task = asyncio.create_task(consume())
            await stuck.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await received_back(other, [b for b in bodies if b not in seen])
            # a loop left by break, its receiver closed: the same
            await send(client, queue, *bodies)
            async with client.get_queue_receiver(queue, prefetch_count=10) as breaking:
                async for message in breaking:
                    await breaking.complete_message(message)
                    break
            await received_back(other, [b for b in bodies if b != str(message)])

    run(main())


@pytest.mark.tansu
def test_a_cancelled_wait_for_a_session_leaves_it_free(
        conn: str, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30, requires_session=True)

    async def take_session(client: ServiceBusClient, bodies: list[str]) -> None:
        async with client.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION,
                                             max_wait_time=10) as other:
            await received_back(other, bodies)

    async def main() -> None:
        async with ServiceBusClient.from_connection_string(conn) as client:
            # waiting for a session when cancelled: it stops waiting
            waiting = client.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION,
                                                max_wait_time=20)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(waiting.__aenter__(), 1)
            await send(client, queue, "s1", "s2", session_id="cart-0")
            await take_session(client, ["s1", "s2"])
            # cancelled at any point of locking a free session: released at once
            for trial, delay in enumerate([0, 0.002, 0.005, 0.01, 0.02, 0.04]):
                bodies = [f"t{trial}-{i}" for i in range(2)]
                await send(client, queue, *bodies, session_id=f"cart-{trial + 1}")
                opening = client.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION,
                                                    max_wait_time=5)
                task = asyncio.create_task(opening.__aenter__())
                await asyncio.sleep(delay)
                task.cancel()
                [outcome] = await asyncio.gather(task, return_exceptions=True)
                if outcome is opening:  # it opened before the cancel came
                    await opening.close()
                else:
                    assert isinstance(outcome, asyncio.CancelledError)
                await take_session(client, bodies)

    run(main())


@pytest.mark.tansu
def test_a_cancelled_complete_is_applied_or_not_never_half(
        conn: str, admin: SyncAdmin, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=5, partition_count=1)
    bodies = [f"c{i:02}" for i in range(40)]

    async def main() -> dict[str, int]:
        outcomes = {"applied": 0, "withdrawn": 0}
        async with ServiceBusClient.from_connection_string(conn) as client, \
                client.get_queue_receiver(queue) as receiver:
            await send(client, queue, *bodies)
            for i, message in enumerate(await receive_all(receiver, len(bodies))):
                task = asyncio.create_task(receiver.complete_message(message))
                for _ in range(i % 4):  # cancelled queued, being sent, or in flight
                    await asyncio.sleep(0)
                await asyncio.sleep(0.002 * (i % 5))
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                # Settled or not, the message's state says which: completing
                # it again succeeds (it was withdrawn, the lock still holds)
                # or is refused as settled; never a lost lock.
                try:
                    await receiver.complete_message(message)
                    outcomes["withdrawn"] += 1
                except MessageAlreadySettled:
                    outcomes["applied"] += 1
            # nothing comes back once the locks would have lapsed
            assert await receiver.receive_messages(len(bodies), max_wait_time=7) == []
        return outcomes

    outcomes: dict[str, Any] = run(main())
    assert sum(outcomes.values()) == len(bodies)
    props = admin.get_queue_runtime_properties(queue)
    assert (props.active_message_count, props.locked_message_count,
            props.dead_letter_message_count) == (0, 0, 0)


@pytest.mark.tansu
def test_thousands_of_concurrent_awaits_do_not_queue_behind_a_thread_pool(
        conn: str, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=60, partition_count=1)
    bodies = [f"k{i}" for i in range(2000)]
    wait_s = 2.0

    async def main() -> None:
        async with ServiceBusClient.from_connection_string(conn) as client, \
                client.get_queue_receiver(queue) as receiver:
            await send(client, queue, *bodies)
            messages = await receive_all(receiver, len(bodies))
            waiting = [client.get_queue_receiver(queue) for _ in range(4)]
            for idle in waiting:  # opened, their log readers taken
                assert await idle.receive_messages(1, max_wait_time=0.1) == []
            started = time.monotonic()
            results = await asyncio.gather(
                *(receiver.complete_message(m) for m in messages),
                *(waiting[i % 4].receive_messages(5, max_wait_time=wait_s) for i in range(200)))
            took = time.monotonic() - started
            assert results == [None] * len(bodies) + [[]] * 200
            # one round of waits, not 200 / 32 of them one after the other
            assert took < 3 * wait_s, f"{took:.1f} s"
            for idle in waiting:
                await idle.close()

    run(main())
