"""Clients leave nothing behind: opening and closing a thousand senders,
receivers and session receivers on one client (sync and asyncio) keeps the
process's threads and file descriptors where they were (its connections to
brokers within what its librdkafka handles' broker threads may hold) and its
memory within 5 MB; closing the client stops every librdkafka handle it made.
The workload runs in a fresh process (tests/leak_probe.py), as an application
would, so that the other tests' handles in this one do not move the counts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from settlement._log_reader import IDLE_READERS
from tests.leak_probe import TIMES, Usage

#: the thousand cycles take about 40 s on Apache Kafka, 45 s on Tansu
PROBE_TIMEOUT_S = 300


@pytest.fixture
def queues(admin: Any, queue_name: str) -> Iterator[tuple[str, str]]:
    """A plain queue and a session queue."""
    plain, sessions = queue_name, f"{queue_name}-s"
    admin.create_queue(plain)
    admin.create_queue(sessions, requires_session=True)
    yield plain, sessions


def probe(mode: str, conn: str, queues: tuple[str, ...]) -> dict[str, Usage]:
    """What tests/leak_probe.py measured in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.leak_probe", mode, conn, *queues],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True,
        timeout=PROBE_TIMEOUT_S)
    assert done.returncode == 0, f"the {mode} leak probe failed:\n{done.stderr}"
    return {when: Usage(**{k: tuple(v) if isinstance(v, list) else v for k, v in usage.items()})
            for when, usage in json.loads(done.stdout).items()}


@pytest.mark.tansu
@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_a_thousand_senders_and_receivers_leave_nothing(
        mode: str, conn: str, queues: tuple[str, str]) -> None:
    usage = probe(mode, conn, queues)
    usage["during"].check_same(usage["before"],
                               f"{TIMES} {mode} senders, receivers and session receivers")
    assert usage["after"].librdkafka_threads == usage["outside"].librdkafka_threads, (
        f"closing the {mode} client left librdkafka handles running: {usage['after']} vs "
        f"{usage['outside']}")
    usage["after"].check_same(usage["outside"], f"a closed {mode} client")


def test_a_client_that_reads_many_queues_keeps_a_bounded_number_of_readers(
        conn: str, admin: Any, queue_name: str) -> None:
    """A client keeps at most IDLE_READERS idle log readers (librdkafka
    consumers): reading four more queues once that many were read leaves its
    threads and descriptors as they were, and its connections within what
    its librdkafka broker threads hold."""
    queues = tuple(f"{queue_name}-{i}" for i in range(IDLE_READERS + 4))
    for queue in queues:
        admin.create_queue(queue)
    usage = probe("entities", conn, queues)
    usage["more"].check_same(usage["full"], f"reading {len(queues)} queues on one client")
