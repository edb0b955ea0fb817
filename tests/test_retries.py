"""Client retries: the policy's waits, and its count and spacing measured on
a real broker, from the commands a client sent to a namespace whose engine
does not answer (each retry re-sends the command under its id)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from settlement import ServiceBusClient
from settlement._engine_link import EngineLink
from settlement._retry import SERVER_BUSY_WAIT_S, RetryMode, RetryPolicy
from settlement.exceptions import (
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusServerBusyError,
)
from tests.helpers import Broker
from topics import names, specs
from topics.commands import Action, SettleArgs, SettleItem, StatsArgs, decode_command
from topics.connection import parse_connection_string
from topics.entities import DEFAULT_ENGINE_PARTITIONS

ATTEMPT_S = 1.0


def test_fixed_and_exponential_waits_with_jitter_and_a_cap() -> None:
    fixed = RetryPolicy.from_options(retry_backoff_factor=0.5, retry_mode="fixed")
    exponential = RetryPolicy.from_options(retry_backoff_factor=0.5, retry_backoff_max=3)
    for retried in range(5):
        assert 0.4 <= fixed.backoff(retried) <= 0.6
        assert exponential.backoff(retried) <= 3
    assert 0.8 <= exponential.backoff(1) <= 1.2
    assert exponential.mode is RetryMode.EXPONENTIAL
    assert len({round(fixed.backoff(0), 6) for _ in range(20)}) > 1, "no jitter"
    busy = ServiceBusServerBusyError("busy")
    assert fixed.backoff(0, busy) >= SERVER_BUSY_WAIT_S


@pytest.mark.parametrize("option", [{"retry_total": -1}, {"retry_backoff_factor": "1"},
                                    {"retry_mode": "linear"}])
def test_bad_retry_options_are_refused_by_name(conn: str, option: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(option))):
        ServiceBusClient.from_connection_string(conn, **option)


def test_errors_that_are_not_transient_raise_at_once(conn: str) -> None:
    started = time.monotonic()
    with ServiceBusClient.from_connection_string(conn, retry_total=5) as client, \
            pytest.raises(MessagingEntityNotFoundError) as raised:
        client.get_queue_receiver(f"missing-{uuid.uuid4().hex[:6]}")
    assert raised.value.retryable is False
    assert time.monotonic() - started < 5


def _commands_of(broker: Broker, namespace: str, command_id: str, expected: int
                 ) -> list[float]:
    """When each copy of command ``command_id`` reached the commands topic
    (s): read until ``expected`` were found and one more read finds no other."""
    conn = parse_connection_string(broker.connection_string(namespace))
    consumer = Consumer(conn.consumer_config("retries-test"))
    topic = names.commands(namespace)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(DEFAULT_ENGINE_PARTITIONS)])
    found: list[float] = []
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            records = consumer.consume(500, timeout=0.5)
            for record in records:
                if not record.error() and decode_command(record.value()).id == command_id:
                    found.append(record.timestamp()[1] / 1000)
            if not records and len(found) >= expected:
                break
    finally:
        consumer.close()
    return sorted(found)


@pytest.mark.parametrize(("mode", "factor", "expected_waits"), [
    ("fixed", 0.5, [0.5, 0.5, 0.5]), ("exponential", 0.3, [0.3, 0.6, 1.2])])
def test_an_engine_that_does_not_answer_is_retried_as_the_policy_says(
        broker: Broker, mode: str, factor: float, expected_waits: list[float]) -> None:
    namespace = f"r{uuid.uuid4().hex[:8]}"  # provisioned, but no engine runs for it
    settings = parse_connection_string(broker.connection_string(namespace))
    specs.provision_namespace(AdminClient(settings.kafka_config()), namespace,
                              settings.profile.replication_factor)
    policy = RetryPolicy.from_options(retry_total=len(expected_waits),
                                      retry_backoff_factor=factor, retry_mode=mode)
    link = EngineLink(settings, attempt_timeout=ATTEMPT_S, retry=policy)
    command = link.command("nowhere", 0, StatsArgs(0))
    try:
        with pytest.raises(OperationTimeoutError) as raised:
            link.call(command)
    finally:
        link.close()
    assert raised.value.retryable is True
    sent = _commands_of(broker, namespace, command.id, len(expected_waits) + 1)
    assert len(sent) == len(expected_waits) + 1, sent  # the first attempt and each retry
    for gap, wait in zip((b - a for a, b in zip(sent, sent[1:], strict=False)),
                         expected_waits, strict=True):
        # each attempt waits ATTEMPT_S for an answer, then the policy's wait (+-20 %)
        assert ATTEMPT_S + 0.8 * wait - 0.15 <= gap <= ATTEMPT_S + 1.2 * wait + 0.5, sent


def test_a_quiet_settlement_still_on_its_way_is_waited_for_not_sent_again(
        broker: Broker) -> None:
    """The engine keeps no answer of a settlement final at its append, so a
    second copy would be applied again and answered lock_lost: an attempt
    that gave up waiting for the append (here at once) leaves the copy to
    the producer, and the next attempt waits for that same copy."""
    namespace = f"r{uuid.uuid4().hex[:8]}"  # no engine: final at its append or never
    settings = parse_connection_string(broker.connection_string(namespace))
    specs.provision_namespace(AdminClient(settings.kafka_config()), namespace,
                              settings.profile.replication_factor)
    # Retries enough for the copy to get in: a new idempotent producer's
    # first append to topics just made took over the 0.6 s of three retries
    # on a loaded machine (CI, 2026-11-29); each retry waits, none sends again.
    policy = RetryPolicy.from_options(retry_total=20, retry_backoff_factor=0.2,
                                      retry_mode="fixed")
    link = EngineLink(settings, attempt_timeout=0.0, retry=policy)
    command = link.command("nowhere", 0, SettleArgs((SettleItem(0, "t", Action.COMPLETE),)))
    try:
        reply = link.call(command, final_before_ms=int(time.time() * 1000) + 60_000)
    finally:
        link.close()
    assert reply.ok and list(reply.statuses) == [("ok", 0)]
    assert len(_commands_of(broker, namespace, command.id, 1)) == 1


@pytest.mark.tansu(only=True)
def test_where_kafka_stamps_no_append_time_a_settlement_is_sent_once(
        broker: Broker, conn: str, make_queue: Callable[..., str]) -> None:
    """Tansu stamps no append time, so no settlement is final at its append:
    once a delivery report shows it, settlements are sent waited for, once,
    instead of quiet and then again under the same id."""
    queue = make_queue()
    link = EngineLink(parse_connection_string(conn))
    until = int(time.time() * 1000) + 60_000
    try:
        first, second = (link.command(queue, 0, SettleArgs((SettleItem(0, "t",
                                                                       Action.COMPLETE),)))
                         for _ in range(2))
        for command in (first, second):  # a lock never granted: lock_lost, answered
            assert list(link.call(command, final_before_ms=until).statuses) == [("lock_lost", 0)]
    finally:
        link.close()
    namespace = parse_connection_string(conn).namespace
    assert len(_commands_of(broker, namespace, first.id, 2)) == 2  # quiet, then waited for
    assert len(_commands_of(broker, namespace, second.id, 1)) == 1
