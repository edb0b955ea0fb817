"""Throttling: entity quotas (``max_size_in_megabytes``) and the namespace's
limit of engine commands per second (``ServerBusy``), on the session's broker
and engine worker; and the token bucket the engine applies the limit with.

The limit is the namespace's, and the session's one engine serves every
test, so the test that sets it lifts it again in a ``finally``.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Consumer, TopicPartition

from settlement import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusReceiver,
)
from settlement.exceptions import QuotaExceededError, ServerBusyError
from settlement.management import ServiceBusAdministrationClient
from streams.throttle import REPORT_EVERY_S, CommandThrottle, TokenBucket
from topics import names
from topics.commands import Command, decode_command
from topics.connection import parse_connection_string
from topics.entities import DEFAULT_ENGINE_PARTITIONS
from topics.offsets import log_end_offsets, take
from topics.partitions import command_partition

KB = 1000
#: a send of this much passes a 1 MB quota once 900 KB are in
OVER = 200 * KB


# ----------------------------------------------------------------- token bucket
def test_bucket_holds_one_seconds_worth_and_refills_at_its_rate() -> None:
    bucket = TokenBucket(2, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [True, True, False]
    assert bucket.take(0.5) and not bucket.take(0.6)
    assert [bucket.take(100.0) for _ in range(3)] == [True, True, False]  # saves 2 at most


def test_bucket_below_one_per_second_still_admits_one() -> None:
    bucket = TokenBucket(0.25, now=0.0)
    assert bucket.take(0.0) and not bucket.take(3.9)
    assert bucket.take(4.0)


def test_throttle_admits_this_workers_share_of_the_limit() -> None:
    throttle = CommandThrottle()
    assert all(throttle.admit(None, 1.0, 0.0) for _ in range(1000))
    admitted = sum(throttle.admit(8, 0.25, t / 100) for t in range(1001))  # 10 s at 100/s
    assert 2 + 19 <= admitted <= 2 + 20  # a full bucket (2), then 2 per second


def test_throttle_follows_a_changed_limit_at_once() -> None:
    throttle = CommandThrottle()
    assert [throttle.admit(1, 1.0, 0.0) for _ in range(2)] == [True, False]
    assert [throttle.admit(3, 1.0, 0.0) for _ in range(4)] == [True, True, True, False]
    assert throttle.admit(None, 1.0, 0.0)


def test_throttle_reports_refusals_at_most_every_few_seconds() -> None:
    throttle = CommandThrottle()
    refused = [t for t in range(100) if not throttle.admit(1, 1.0, 0.0)]
    assert throttle.refused_to_report(REPORT_EVERY_S) == len(refused) == 99
    assert [throttle.admit(1, 1.0, REPORT_EVERY_S) for _ in range(2)] == [True, False]
    assert throttle.refused_to_report(REPORT_EVERY_S + 1) == 0  # too soon
    assert throttle.refused_to_report(2 * REPORT_EVERY_S) == 1
    assert throttle.refused_to_report(10 * REPORT_EVERY_S) == 0  # nothing new


# ---------------------------------------------------------------------- quotas
def _held(error: QuotaExceededError) -> int:
    """The entity's size an error names."""
    found = re.search(r"holds (\d+) bytes", error.message)
    assert found, error.message
    return int(found[1])


def _fill_then_overflow(send: Callable[[list[ServiceBusMessage]], None], entity: str) -> None:
    """~900 KB go in; 200 KB more would pass 1 MB and are refused, saying why."""
    send([ServiceBusMessage(b"x" * (100 * KB), message_id=f"m{i}") for i in range(9)])
    with pytest.raises(QuotaExceededError) as raised:
        send([ServiceBusMessage(b"y" * OVER)])
    error = raised.value
    assert error.retryable is False and error.error_code == "QuotaExceeded"
    assert repr(entity) in error.message and "max_size_in_megabytes=1" in error.message
    assert 900 * KB <= _held(error) < 1024 * 1024


def _drain(receiver_of: Callable[[], ServiceBusReceiver], count: int) -> None:
    with receiver_of() as receiver:
        got: list[ServiceBusReceivedMessage] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            batch = receiver.receive_messages(max_message_count=count, max_wait_time=2)
            receiver.complete_messages(batch)
            got += batch
    assert len(got) == count


def test_queue_quota_refuses_what_would_pass_it_until_messages_leave(
        admin: ServiceBusAdministrationClient, client: ServiceBusClient,
        make_queue: Callable[..., str]) -> None:
    queue = make_queue(max_size_in_megabytes=1)
    assert admin.get_queue(queue).max_size_in_megabytes == 1
    with client.get_queue_sender(queue) as sender:
        _fill_then_overflow(sender.send_messages, queue)
        _drain(lambda: client.get_queue_receiver(queue), 9)
        sender.send_messages(ServiceBusMessage(b"y" * OVER))  # room again


def test_raising_a_queues_quota_takes_effect_for_its_senders(
        admin: ServiceBusAdministrationClient, client: ServiceBusClient,
        make_queue: Callable[..., str]) -> None:
    queue = make_queue(max_size_in_megabytes=1)
    with client.get_queue_sender(queue) as sender:
        _fill_then_overflow(sender.send_messages, queue)
        props = admin.get_queue(queue)
        props.max_size_in_megabytes = 2
        admin.update_queue(props)
        sender.send_messages(ServiceBusMessage(b"y" * OVER))


def test_topic_quota_counts_its_fullest_subscription(
        admin: ServiceBusAdministrationClient, client: ServiceBusClient, queue_name: str) -> None:
    admin.create_topic(queue_name, max_size_in_megabytes=1)
    admin.create_subscription(queue_name, "s", lock_duration=5)
    with client.get_topic_sender(queue_name) as sender:
        _fill_then_overflow(sender.send_messages, queue_name)
        _drain(lambda: client.get_subscription_receiver(queue_name, "s"), 9)
        sender.send_messages(ServiceBusMessage(b"y" * OVER))


def test_quota_and_limit_must_be_positive_whole_numbers(
        admin: ServiceBusAdministrationClient, queue_name: str) -> None:
    with pytest.raises(ValueError, match="max_size_in_megabytes"):
        admin.create_queue(queue_name, max_size_in_megabytes=0)
    with pytest.raises(ValueError, match="max_size_in_megabytes"):
        admin.create_topic(queue_name, max_size_in_megabytes=-1)
    for wrong in (0, -5, 2.5, "10", True):
        with pytest.raises(ValueError, match="max_commands_per_second"):
            admin.update_namespace_properties(max_commands_per_second=wrong)  # type: ignore[arg-type]  # wrong on purpose


# ------------------------------------------------------------ namespace limit
@contextmanager
def limited(admin: ServiceBusAdministrationClient, per_second: int) -> Iterator[None]:
    """The namespace limited to ``per_second`` engine commands, then unlimited
    again (the session's one engine serves every test)."""
    admin.update_namespace_properties(max_commands_per_second=per_second)
    try:
        yield
    finally:
        admin.update_namespace_properties(max_commands_per_second=None)


class _CommandLog:
    """The commands of one window as the engine reads them, from the
    commands topic (from where it ended when this was made)."""

    def __init__(self, conn: str, window_key: str) -> None:
        settings = parse_connection_string(conn)
        self._key = window_key.encode()
        tp = (names.commands(settings.namespace),
              command_partition(window_key, DEFAULT_ENGINE_PARTITIONS))
        self._consumer = Consumer(settings.consumer_config(f"cmdlog-{uuid.uuid4().hex[:8]}"))
        start = log_end_offsets(self._consumer, [tp],
                                exact=settings.profile.exact_list_offsets)[tp]
        self._consumer.assign([TopicPartition(*tp, start)])
        self.sent: list[tuple[int, Command]] = []  # (timestamp ms, command)

    def read_until(self, done: Callable[[list[tuple[int, Command]]], bool]) -> None:
        deadline = time.monotonic() + 15
        while not done(self.sent) and time.monotonic() < deadline:
            for record in take(self._consumer, 500, 0.2):
                if not record.error() and record.key() == self._key:
                    self.sent.append((record.timestamp()[1], decode_command(record.value())))

    def close(self) -> None:
        self._consumer.close()


def _peek_until_busy(receiver: ServiceBusReceiver, calls: list[float]) -> None:
    """Peek again and again (each call one engine command) until a call
    takes the 10 s of a busy answer's wait; the duration of each call."""
    for _ in range(50):
        started = time.monotonic()
        receiver.peek_messages(1, sequence_number=0)
        calls.append(time.monotonic() - started)
        if calls[-1] >= 5:
            return


def _wait_until_calls_stop(calls: list[float]) -> None:
    """Until the bucket's 2 calls came back and no other has for 0.5 s (a
    call takes milliseconds)."""
    seen, quiet_since = -1, time.monotonic()
    deadline = quiet_since + 8
    while (len(calls) < 2 or time.monotonic() - quiet_since < 0.5) \
            and time.monotonic() < deadline:
        if len(calls) != seen:
            seen, quiet_since = len(calls), time.monotonic()
        time.sleep(0.05)


def test_over_the_namespace_limit_an_entity_waits_10_s_and_others_go_on(
        admin: ServiceBusAdministrationClient, conn: str, make_queue: Callable[..., str],
        queue_name: str) -> None:
    busy_queue = make_queue()
    other_queue = admin.create_queue(f"{queue_name}-other").name
    commands = _CommandLog(conn, f"{busy_queue}#0")
    with ServiceBusClient.from_connection_string(conn) as client, \
            client.get_queue_receiver(busy_queue) as busy, \
            client.get_queue_receiver(other_queue) as other:
        busy.peek_messages(1)  # readers open: from here on, one call is one command
        other.peek_messages(1)
        with limited(admin, 2):
            calls: list[float] = []
            waiter = threading.Thread(target=_peek_until_busy, args=(busy, calls))
            waiter.start()
            _wait_until_calls_stop(calls)  # the burst is spent: the busy queue waits
            time.sleep(1.0)  # the namespace's tokens refill meanwhile (2 per second)
            assert waiter.is_alive(), calls
            started = time.monotonic()
            other.peek_messages(1, sequence_number=0)
            other_took = time.monotonic() - started
            assert waiter.is_alive()  # the busy queue was still waiting meanwhile
            waiter.join(30)
    assert other_took < 3, f"a call on another entity took {other_took:.1f} s"
    assert calls and calls[-1] >= 10, calls  # the busy call came back, after its wait

    def retried(sent: list[tuple[int, Command]]) -> bool:
        ids = [cmd.id for _, cmd in sent]
        return len(ids) > len(set(ids))

    commands.read_until(retried)
    commands.close()
    by_id: dict[str, list[int]] = {}
    for stamp, cmd in commands.sent:
        by_id.setdefault(cmd.id, []).append(stamp)
    again = {cid: stamps for cid, stamps in by_id.items() if len(stamps) > 1}
    assert len(again) == 1, again  # one command was answered busy, once
    first, retry = next(iter(again.values()))
    assert retry - first >= 10_000, f"retried {retry - first} ms after the busy answer"


def test_without_retries_a_busy_answer_raises_server_busy(
        admin: ServiceBusAdministrationClient, conn: str, make_queue: Callable[..., str]
) -> None:
    queue = make_queue()
    with ServiceBusClient.from_connection_string(conn, retry_total=0) as client, \
            client.get_queue_receiver(queue) as receiver, limited(admin, 2):
        with pytest.raises(ServerBusyError) as raised:
            for _ in range(20):
                receiver.peek_messages(1, sequence_number=0)
    assert raised.value.retryable is True and raised.value.error_code == "ServerBusy"
    assert "limit of 2 engine commands per second" in raised.value.message


def test_namespace_properties_round_trip_and_are_no_entity(
        admin: ServiceBusAdministrationClient, conn: str) -> None:
    with limited(admin, 2):
        props = admin.get_namespace_properties()
        assert (props.name, props.max_commands_per_second) == (
            parse_connection_string(conn).namespace, 2)
        assert not [q.name for q in admin.list_queues() if q.name.startswith("$")]
        assert not [t.name for t in admin.list_topics() if t.name.startswith("$")]
    assert admin.get_namespace_properties().max_commands_per_second is None
