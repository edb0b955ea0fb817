"""The leak tests' workload, run in a process of its own so that what it
measures is this client's doing alone: in the test session's process, other
tests' engines, brokers and clients come and go in the background (about fifty
librdkafka handles by the time the leak tests run on Apache Kafka), and their
descriptors moved the counts (CI once saw 5 more descriptors, with the same
threads and sockets, after a thousand cycles).

``python -m tests.leak_probe sync|asyncio CONNECTION_STRING PLAIN SESSIONS``
opens and closes a thousand senders, receivers and session receivers on one
client and prints, as JSON, the process's :class:`Usage` outside any client,
before and after the thousand, and once the closed client's handles ended.
``python -m tests.leak_probe entities CONNECTION_STRING QUEUE...`` receives
from each queue in turn on one client, and prints the usage once as many
queues as the client keeps idle readers for were read and after the rest.
Read from /proc: the process's own threads (librdkafka names its threads
``rdk:...``), descriptors and resident memory."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass

from settlement import ServiceBusClient, ServiceBusMessage
from settlement._log_reader import IDLE_READERS
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


def _socket_peers() -> dict[str, str]:
    """Each socket's inode -> what it is, for failure messages: TCP and UDP
    sockets by their local and remote port and state (01 established, 0A
    listening, 06 time-wait), the rest by family."""
    peers = {}
    for family in ("tcp", "tcp6", "udp", "udp6", "unix"):
        try:
            with open(f"/proc/self/net/{family}") as table:
                rows = [line.split() for line in table.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            if family == "unix":  # Num RefCount Protocol Flags Type St Inode [Path]
                peers[row[6]] = f"unix {row[7] if len(row) > 7 else ''}".strip()
            else:  # sl local rem st tx:rx tr:when retrnsmt uid timeout inode
                local, remote = (int(end.rsplit(":", 1)[1], 16) for end in row[1:3])
                peers[row[9]] = f"{family} :{local}->:{remote} {row[3]}"
    return peers


@dataclass(frozen=True)
class Usage:
    #: threads besides an asyncio client's worker pool
    threads: int
    librdkafka_threads: int
    descriptors: int
    rss_mb: float
    #: every thread's name (librdkafka's broker threads bound its
    #: connections) and every descriptor's kind (a socket's, what it connects)
    names: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()

    @classmethod
    def now(cls) -> Usage:
        gc.collect()
        names = []
        for task in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{task}/comm") as comm:
                    names.append(comm.read().strip())
            except (FileNotFoundError, ProcessLookupError):  # ended meanwhile (ESRCH: mid-read)
                continue
        peers = _socket_peers()
        kinds = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except FileNotFoundError:  # the listing's own descriptor
                continue
            inode = re.fullmatch(r"socket:\[(\d+)\]", target)
            if inode:  # socket:[1234] -> "socket tcp :41234->:9092 01"
                kinds.append(f"socket {peers.get(inode[1], '?')}")
            else:
                kinds.append(re.sub(r":\[\d+\]$", "", target))  # pipe:[1234] -> pipe
        with open("/proc/self/status") as status:
            rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
        pool = sum(t.name.startswith(POOL_THREAD) for t in threading.enumerate())
        return cls(len(names) - pool, sum(n.startswith("rdk:") for n in names), len(kinds),
                   rss_kb / 1024,
                   tuple(sorted(t.name for t in threading.enumerate())) + tuple(sorted(names)),
                   tuple(sorted(kinds)))

    @classmethod
    def once_handles_end(cls, threads: int = 1) -> Usage:
        """The usage once no librdkafka thread runs (this process has no
        other clients) and at most ``threads`` threads do (default: the main
        one), or after 5 s: a closed handle's threads, and a closed asyncio
        client's workers, end a moment after its close returns."""
        deadline = time.monotonic() + 5
        usage = cls.now()
        while (usage.librdkafka_threads or usage.threads > threads) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
            usage = cls.now()
        return usage

    @property
    def connections(self) -> int:
        """The process's TCP sockets: librdkafka's connections to brokers."""
        return sum(kind.startswith("socket tcp") for kind in self.kinds)

    @property
    def connection_slots(self) -> int:
        """How many connections the running librdkafka handles may hold: one
        per broker thread (``rdk:broker<id>``, and ``rdk:broker-1`` for each
        bootstrap address), less each handle's internal broker thread (also
        ``rdk:broker-1``, one per ``rdk:main``), which never connects. A
        handle closes and reopens its connections of its own accord (a
        bootstrap connection dropped, then dialled again for a metadata
        request): CI twice saw one socket more, with the same threads, after
        a thousand asyncio cycles that passed in every run alone. So the
        connections are bounded by the handles' broker threads rather than
        counted: a leaked handle leaves threads, and a handle cannot hold
        more connections than it has broker threads."""
        rdk = [name for name in self.names if name.startswith("rdk:")]
        return sum(n.startswith("rdk:broker") for n in rdk) - rdk.count("rdk:main")

    def _fixed(self) -> tuple[int, int]:
        """Threads, and descriptors other than connections."""
        return self.threads, self.descriptors - self.connections

    @classmethod
    def back_to(cls, before: Usage, wait: float = 5.0) -> Usage:
        """The usage once its threads and other descriptors are ``before``'s
        again, or after ``wait`` seconds: a closed handle's threads end, and
        its descriptors close, a moment after its close returns. What a
        thousand cycles leak stays."""
        deadline = time.monotonic() + wait
        usage = cls.now()
        while usage._fixed() != before._fixed() and time.monotonic() < deadline:
            time.sleep(0.1)
            usage = cls.now()
        return usage

    def check_same(self, before: Usage, what: str) -> None:
        new_threads = sorted((Counter(self.names) - Counter(before.names)).elements())
        new_kinds = sorted((Counter(self.kinds) - Counter(before.kinds)).elements())
        assert self._fixed() == before._fixed() \
                and self.connections <= self.connection_slots, (
            f"{what} left threads/descriptors/connections (of slots): before "
            f"{before.threads}/{before.descriptors}/{before.connections} "
            f"({before.connection_slots}), after {self.threads}/{self.descriptors}/"
            f"{self.connections} ({self.connection_slots}); new threads {new_threads}, "
            f"new descriptors {new_kinds}")
        assert self.rss_mb - before.rss_mb <= MEMORY_SLACK_MB, (
            f"{what} grew the process's memory by {self.rss_mb - before.rss_mb:.1f} MB")


def sync_run(conn: str, plain: str, sessions: str) -> dict[str, Usage]:
    def one(client: ServiceBusClient, used: bool) -> None:
        with client.get_queue_sender(plain) as sender:
            if used:
                sender.send_messages(ServiceBusMessage(b"x"))
        with client.get_queue_receiver(plain, max_wait_time=0.1) as receiver:
            if used:
                receiver.peek_messages(1)
        with client.get_queue_receiver(sessions, session_id="s", max_wait_time=0.1) as receiver:
            receiver.session.get_state()  # the session is locked on opening

    with ServiceBusClient.from_connection_string(conn) as first:
        one(first, True)  # what a process loads once (modules, librdkafka)
    outside = Usage.once_handles_end()
    client = ServiceBusClient.from_connection_string(conn)
    one(client, True)  # the client's own connections (engine link, readers) are made once
    before = Usage.now()
    for i in range(TIMES):
        one(client, i < USED)
    during = Usage.back_to(before)
    client.close()
    del client
    return {"outside": outside, "before": before, "during": during,
            "after": Usage.once_handles_end(outside.threads)}


def asyncio_run(conn: str, plain: str, sessions: str) -> dict[str, Usage]:
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

    async def first() -> None:
        async with AsyncClient.from_connection_string(conn) as client:
            await cycles(client, 1)

    async def main() -> tuple[Usage, Usage]:
        client = AsyncClient.from_connection_string(conn)
        await cycles(client, USED)  # the worker threads the client keeps, made at first use
        before = Usage.now()
        await cycles(client, TIMES)
        during = Usage.back_to(before)
        await client.close()
        del client
        return before, during

    asyncio.run(first())  # what a process loads once (modules, librdkafka)
    outside = Usage.once_handles_end()
    before, during = asyncio.run(main())
    return {"outside": outside, "before": before, "during": during,
            "after": Usage.once_handles_end(outside.threads)}


def entities_run(conn: str, *queues: str) -> dict[str, Usage]:
    def receive(client: ServiceBusClient, queue: str) -> None:
        with client.get_queue_receiver(queue, max_wait_time=0.1) as receiver:
            receiver.receive_messages(1, max_wait_time=0.1)

    with ServiceBusClient.from_connection_string(conn) as client:
        for queue in queues[:IDLE_READERS]:
            receive(client, queue)
        full = Usage.now()
        for queue in queues[IDLE_READERS:]:
            receive(client, queue)
        return {"full": full, "more": Usage.now()}


if __name__ == "__main__":
    mode, *entities = sys.argv[1:]
    runs = {"sync": sync_run, "asyncio": asyncio_run, "entities": entities_run}
    usages = runs[mode](*entities)
    json.dump({when: dataclasses.asdict(usage) for when, usage in usages.items()}, sys.stdout)
