"""Dead-letter tooling: resubmit (filtered, once) and purge, by API and CLI."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from settlement.cli import main
from settlement.dead_letters import purge_dead_letters, resubmit_dead_letters

#: Core settlement: in the compatibility subset that also runs on Tansu.
pytestmark = pytest.mark.tansu


def dead_letter(client: ServiceBusClient, queue: str, reasons: dict[str, str]) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"body-{m}", message_id=m,
                                                application_properties={"k": m})
                              for m in reasons])
    receiver = client.get_queue_receiver(queue)
    pending = dict(reasons)
    while pending:
        for message in receiver.receive_messages(10, max_wait_time=10):
            receiver.dead_letter_message(message, reason=pending.pop(message.message_id),
                                         error_description="test")


def dead_ids(client: ServiceBusClient, queue: str) -> list[str]:
    dlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    return sorted(m.message_id for m in dlq.peek_messages(100))


def test_resubmit_by_reason_sends_each_dead_letter_back_once(
        client: ServiceBusClient, make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    dead_letter(client, queue, {"a1": "A", "a2": "A", "b1": "B"})
    ticks: list[int] = []
    assert resubmit_dead_letters(client, queue, reason="A", on_progress=ticks.append) == 2
    assert sum(ticks) == 2
    assert resubmit_dead_letters(client, queue, reason="A") == 0  # run twice: nothing more
    assert dead_ids(client, queue) == ["b1"]
    receiver = client.get_queue_receiver(queue)
    back = receiver.receive_messages(10, max_wait_time=10)
    while len(back) < 2:
        back += receiver.receive_messages(10, max_wait_time=10)
    assert sorted(m.message_id for m in back) == ["a1", "a2"]
    for message in back:
        assert message.application_properties == {"k": message.message_id}
        assert b"".join(message.body) == f"body-{message.message_id}".encode()
        assert message.dead_letter_reason is None and message.delivery_count == 0


def test_resubmit_since_and_limit(client: ServiceBusClient,
                                  make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    dead_letter(client, queue, {"x1": "X", "x2": "X", "x3": "X"})
    future = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    assert resubmit_dead_letters(client, queue, since=future) == 0
    assert resubmit_dead_letters(client, queue, limit=2) == 2
    assert len(dead_ids(client, queue)) == 1


def test_purge_removes_every_dead_letter(client: ServiceBusClient,
                                         make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    dead_letter(client, queue, {"p1": "P", "p2": "Q"})
    assert purge_dead_letters(client, queue) == 2
    assert dead_ids(client, queue) == []


def test_cli_dlq_list_resubmit_and_purge(conn: str, client: ServiceBusClient,
                                         make_queue: Callable[..., str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    queue = make_queue()
    dead_letter(client, queue, {"c1": "R1", "c2": "R2"})
    assert main(["--connection-string", conn, "dlq", queue]) == 0
    listing = capsys.readouterr().out
    assert "reason=R1" in listing and "reason=R2" in listing
    assert main(["--connection-string", conn, "dlq", "resubmit", queue, "--reason", "R1"]) == 0
    assert "resubmitted 1" in capsys.readouterr().out
    assert main(["--connection-string", conn, "dlq", "purge", queue, "--yes"]) == 0
    assert "purged 1" in capsys.readouterr().out
    assert dead_ids(client, queue) == []
