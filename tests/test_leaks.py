"""Clients leave nothing behind: opening and closing a thousand senders,
receivers and session receivers on one client (sync and asyncio) keeps the
process's threads, sockets and file descriptors where they were and its
memory within 5 MB; closing the client stops every librdkafka handle it made.
Read from /proc: this process's own threads (librdkafka names its threads
``rdk:...``), descriptors and resident memory."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.aio import ServiceBusClient as AsyncClient

#: opened and closed of each kind
TIMES = 1000
#: of those, how many also send and peek (a fresh sender's first send and a
#: fresh receiver's first peek take about half a second each)
USED = 10
#: the memory a thousand of them may leave (the issue's bound)
MEMORY_SLACK_MB = 5.0


#: an asyncio client's worker threads (settlement/aio/_offload.py): a
#: bounded pool that grows with concurrent calls and ends with the client
POOL_THREAD = "settlement-aio"


@dataclass(frozen=True)
class Usage:
    #: threads besides an asyncio client's worker pool
    threads: int
    librdkafka_threads: int
    descriptors: int
    sockets: int
    rss_mb: float
    #: every thread's name, for the failure message
    names: tuple[str, ...] = ()

    @classmethod
    def now(cls) -> Usage:
        gc.collect()
        names = []
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm") as comm:
                    names.append(comm.read().strip())
            except FileNotFoundError:  # ended meanwhile
                continue
        sockets = descriptors = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except FileNotFoundError:  # the listing's own descriptor
                continue
            descriptors += 1
            sockets += target.startswith("socket:")
        with open("/proc/self/status") as status:
            rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
        pool = sum(t.name.startswith(POOL_THREAD) for t in threading.enumerate())
        return cls(len(names) - pool, sum(n.startswith("rdk:") for n in names), descriptors,
                   sockets, rss_kb / 1024,
                   tuple(sorted(t.name for t in threading.enumerate())) + tuple(sorted(names)))

    @classmethod
    def once_handles_end(cls, outside: Usage) -> Usage:
        """The usage once librdkafka's threads are back to ``outside``'s
        count, or after 5 s: a closed handle's threads end a moment after
        its close returns."""
        deadline = time.monotonic() + 5
        usage = cls.now()
        while usage.librdkafka_threads != outside.librdkafka_threads \
                and time.monotonic() < deadline:
            time.sleep(0.1)
            usage = cls.now()
        return usage

    def check_same(self, before: Usage, what: str) -> None:
        assert (self.threads, self.descriptors, self.sockets) == (
            before.threads, before.descriptors, before.sockets), (
            f"{what} left threads/descriptors/sockets: before {before}, after {self}, new "
            f"threads {sorted((Counter(self.names) - Counter(before.names)).elements())}")
        assert self.rss_mb - before.rss_mb <= MEMORY_SLACK_MB, (
            f"{what} grew the process's memory by {self.rss_mb - before.rss_mb:.1f} MB")


@pytest.fixture
def queues(admin: Any, queue_name: str) -> Iterator[tuple[str, str]]:
    """A plain queue and a session queue."""
    plain, sessions = queue_name, f"{queue_name}-s"
    admin.create_queue(plain)
    admin.create_queue(sessions, requires_session=True)
    yield plain, sessions


def _sync_cycles(client: ServiceBusClient, plain: str, sessions: str) -> Callable[[bool], None]:
    def one(used: bool) -> None:
        with client.get_queue_sender(plain) as sender:
            if used:
                sender.send_messages(ServiceBusMessage(b"x"))
        with client.get_queue_receiver(plain, max_wait_time=0.1) as receiver:
            if used:
                receiver.peek_messages(1)
        with client.get_queue_receiver(sessions, session_id="s", max_wait_time=0.1) as receiver:
            receiver.session.get_state()  # the session is locked on opening
    return one


@pytest.mark.tansu
def test_a_thousand_sync_senders_and_receivers_leave_nothing(
        conn: str, queues: tuple[str, str]) -> None:
    plain, sessions = queues
    outside = Usage.now()
    client = ServiceBusClient.from_connection_string(conn)
    one = _sync_cycles(client, plain, sessions)
    one(True)  # the client's own connections (engine link, readers) are made once
    before = Usage.now()
    for i in range(TIMES):
        one(i < USED)
    Usage.now().check_same(before, f"{TIMES} senders, receivers and session receivers")
    client.close()
    del client, one
    after = Usage.once_handles_end(outside)
    assert after.librdkafka_threads == outside.librdkafka_threads, (
        f"closing the client left librdkafka handles running: {after} vs {outside}")
    after.check_same(outside, "a closed client")


@pytest.mark.tansu
def test_a_thousand_asyncio_senders_and_receivers_leave_nothing(
        conn: str, queues: tuple[str, str]) -> None:
    plain, sessions = queues

    async def cycles(client: AsyncClient, times: int) -> None:
        for i in range(times):
            async with client.get_queue_sender(plain) as sender:
                if i < USED:
                    await sender.send_messages(ServiceBusMessage(b"x"))
            async with client.get_queue_receiver(plain, max_wait_time=0.1) as receiver:
                if i < USED:
                    await receiver.peek_messages(1)
            async with client.get_queue_receiver(sessions, session_id="s",
                                                 max_wait_time=0.1) as receiver:
                await receiver.session.get_state()

    async def main() -> tuple[Usage, Usage]:
        client = AsyncClient.from_connection_string(conn)
        await cycles(client, USED)  # the worker threads the client keeps, made at first use
        before = Usage.now()
        await cycles(client, TIMES)
        during = Usage.now()
        await client.close()
        del client
        return before, during

    outside = Usage.now()
    before, during = asyncio.run(main())
    during.check_same(before, f"{TIMES} asyncio senders, receivers and session receivers")
    after = Usage.once_handles_end(outside)
    assert after.librdkafka_threads == outside.librdkafka_threads, (
        f"closing the asyncio client left librdkafka handles running: {after} vs {outside}")
