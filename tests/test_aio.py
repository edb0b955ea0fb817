"""settlement.aio, the asyncio twin, against the real broker and a real engine."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from settlement import NEXT_AVAILABLE_SESSION, ServiceBusSubQueue
from settlement.aio import AutoLockRenewer, ServiceBusClient
from settlement.aio.management import ServiceBusAdministrationClient
from settlement.exceptions import MessageAlreadySettled
from settlement.management import ServiceBusAdministrationClient as SyncAdmin
from tests.aio_helpers import receive_all, run, send


def test_send_receive_complete_abandon_dead_letter_defer(
        conn: str, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30)

    async def main() -> None:
        async with ServiceBusClient.from_connection_string(conn) as client:
            await send(client, queue, "done", "again", "bad", "later")
            async with client.get_queue_receiver(queue) as receiver:
                got = {str(m): m for m in await receive_all(receiver, 4)}
                await receiver.complete_message(got["done"])
                await receiver.abandon_message(got["again"])
                await receiver.dead_letter_message(got["bad"], reason="broken",
                                                   error_description="cannot parse")
                await receiver.defer_message(got["later"])
                with pytest.raises(MessageAlreadySettled):
                    await receiver.complete_message(got["done"])
                [again] = await receiver.receive_messages(5, max_wait_time=10)
                assert str(again) == "again" and again.delivery_count > \
                    got["again"].delivery_count
                await receiver.complete_message(again)
                [later] = await receiver.receive_deferred_messages(
                    [got["later"].sequence_number])
                assert str(later) == "later"
                await receiver.complete_message(later)
                assert await receiver.peek_messages(5) == []
            async with client.get_queue_receiver(
                    queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead:
                [bad] = await dead.receive_messages(1, max_wait_time=10)
                assert bad.dead_letter_reason == "broken"
                await dead.complete_message(bad)

    run(main())


def test_async_for_yields_every_message_and_stops_after_max_wait_time(
        conn: str, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30)
    bodies = [f"m{i}" for i in range(20)]

    async def main() -> None:
        async with ServiceBusClient.from_connection_string(conn) as client:
            await send(client, queue, *bodies)
            seen = []
            async with client.get_queue_receiver(queue, max_wait_time=2) as receiver:
                started = time.monotonic()
                async for message in receiver:
                    seen.append(str(message))
                    await receiver.complete_message(message)
                assert time.monotonic() - started < 15
            assert sorted(seen) == sorted(bodies)

    run(main())


def test_one_thousand_concurrent_completes_are_grouped_and_settle_each_message_once(
        conn: str, admin: SyncAdmin, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=60, partition_count=1)
    bodies = [f"c{i}" for i in range(1000)]

    async def main() -> None:
        async with ServiceBusClient.from_connection_string(conn) as client:
            await send(client, queue, *bodies)
            async with client.get_queue_receiver(queue) as receiver:
                messages = await receive_all(receiver, len(bodies))
                assert sorted(str(m) for m in messages) == sorted(bodies)
                results = await asyncio.gather(
                    *(receiver.complete_message(m) for m in messages), return_exceptions=True)
                assert results == [None] * len(bodies)
                # one command per window while another is in flight: a handful, not 1,000
                assert client._settles.commands_sent <= 10
                assert await receiver.receive_messages(10, max_wait_time=1) == []

    run(main())
    props = admin.get_queue_runtime_properties(queue)
    assert (props.active_message_count, props.locked_message_count,
            props.dead_letter_message_count, props.deferred_message_count) == (0, 0, 0, 0)


def test_completed_messages_are_freed_without_the_garbage_collector(
        conn: str, make_queue: Callable[..., str]) -> None:
    """A settled message is freed when the application drops it: nothing of
    a ``complete_message`` (its queued settle, answer, callbacks) holds it in
    a reference cycle, which only the cyclic collector frees, walking every
    object of the process to do so."""
    queue = make_queue(lock_duration=60, partition_count=1)
    bodies = [f"g{i}" for i in range(100)]

    async def main() -> None:
        async with ServiceBusClient.from_connection_string(conn) as client:
            await send(client, queue, *bodies)
            async with client.get_queue_receiver(queue) as receiver:
                messages = await receive_all(receiver, len(bodies))
                gc.collect()
                gc.disable()
                try:
                    freed = [weakref.ref(m) for m in messages]
                    results = await asyncio.gather(
                        *(receiver.complete_message(m) for m in messages))
                    assert results == [None] * len(bodies)
                    del messages, results
                    # the worker thread that sent the settle lets go of it
                    # soon after its answer: a cycle never does (gc is off)
                    deadline = time.monotonic() + 2.0
                    while any(ref() is not None for ref in freed) \
                            and time.monotonic() < deadline:
                        await asyncio.sleep(0.01)
                    alive = sum(ref() is not None for ref in freed)
                    assert alive == 0, f"{alive} of {len(bodies)} completed messages are " \
                        "still alive: something of the settle path holds them in a cycle"
                finally:
                    gc.enable()

    run(main())


def test_session_receiver_holds_its_session_and_keeps_state(
        conn: str, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=30, requires_session=True)

    async def main() -> None:
        async with ServiceBusClient.from_connection_string(conn) as client:
            await send(client, queue, "s1", "s2", session_id="cart-7")
            async with client.get_queue_receiver(
                    queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=10) as receiver:
                session = receiver.session
                assert session is not None and session.session_id == "cart-7"
                assert await session.get_state() is None
                await session.set_state("step 1")
                assert await session.get_state() == b"step 1"
                before = session.locked_until_utc
                assert before is not None and await session.renew_lock() >= before
                got = await receive_all(receiver, 2)
                assert [str(m) for m in got] == ["s1", "s2"]
                for message in got:
                    await receiver.complete_message(message)

    run(main())


def test_auto_lock_renewer_keeps_a_message_past_its_lock_duration(
        conn: str, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=2)
    failures: list[Exception | None] = []

    async def failed(_renewable: Any, error: Exception | None) -> None:
        failures.append(error)

    async def main() -> None:
        async with ServiceBusClient.from_connection_string(conn) as client:
            await send(client, queue, "slow")
            async with client.get_queue_receiver(queue) as receiver, \
                    AutoLockRenewer(on_lock_renew_failure=failed) as renewer:
                [message] = await receiver.receive_messages(1, max_wait_time=10)
                renewer.register(receiver, message)
                await asyncio.sleep(3.5)  # past the 2 s lock
                await receiver.complete_message(message)
        assert failures == []

    run(main())


def test_admin_client_is_awaitable_and_lists_asynchronously(conn: str, queue_name: str) -> None:
    async def main() -> None:
        async with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
            created = await admin.create_queue(queue_name, max_delivery_count=4)
            assert created.max_delivery_count == 4
            assert (await admin.get_queue(queue_name)).name == queue_name
            assert queue_name in [q.name async for q in admin.list_queues()]
            runtime = await admin.get_queue_runtime_properties(queue_name)
            assert runtime.active_message_count == 0
            assert queue_name in [r.name async for r in admin.list_queues_runtime_properties()]
            await admin.delete_queue(queue_name)
            assert queue_name not in [q.name async for q in admin.list_queues()]

    run(main())


def test_receiver_with_an_auto_lock_renewer_renews_what_it_receives(
        conn: str, make_queue: Callable[..., str]) -> None:
    queue = make_queue(lock_duration=2)

    async def main() -> None:
        async with ServiceBusClient.from_connection_string(conn) as client, \
                AutoLockRenewer() as renewer:
            await send(client, queue, "slow")
            async with client.get_queue_receiver(queue, auto_lock_renewer=renewer) as receiver:
                [message] = await receiver.receive_messages(1, max_wait_time=10)
                await asyncio.sleep(3.5)  # past the 2 s lock
                await receiver.complete_message(message)

    run(main())
