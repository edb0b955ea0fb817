"""The SDK's types: application property values of type bytes, UUID and
datetime, and AmqpAnnotatedMessage's DATA, VALUE and SEQUENCE bodies, go
through a record and come back with their types (docs/wire-format.md)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage
from settlement.aio import ServiceBusClient as AsyncServiceBusClient
from settlement.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from settlement.management import RuleProperties, ServiceBusAdministrationClient, SqlRuleFilter
from settlement.message import sendable
from settlement.message_records import decode, encode
from topics import names
from topics.message_record import MalformedRecord
from topics.rules import FilterEvaluationError, MessageView, compile_filter

ID = uuid.UUID("3f2a8c1e-5b7d-4e0f-9a61-2c4d8e6f0b13")
AT = dt.datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=dt.UTC)
TYPED = {"blob": b"\x00\xffraw", "id": ID, "at": AT, "text": "t", "n": 7, "x": 1.5,
         "ok": True, "none": None}
#: what comes back: the datetime to the millisecond (AMQP's precision)
RECEIVED = {**TYPED, "at": AT.replace(microsecond=123000)}


def _through_a_record(message: ServiceBusMessage | AmqpAnnotatedMessage
                      ) -> ServiceBusReceivedMessage:
    key, value, headers = encode(sendable(message))
    return decode(value, headers, 0, 0, 1)


def _types(properties: dict[str, Any]) -> dict[str, type]:
    return {name: type(value) for name, value in properties.items()}


def test_typed_property_values_come_back_with_their_types() -> None:
    got = _through_a_record(ServiceBusMessage("x", application_properties=TYPED))
    assert got.application_properties == RECEIVED
    assert _types(got.application_properties) == _types(RECEIVED)
    assert got.application_properties[b"id"] == ID  # the SDK's bytes keys work too
    naive = _through_a_record(ServiceBusMessage("x", application_properties={
        "at": dt.datetime(2026, 3, 1, 12, 30)}))  # taken as UTC, as the SDK does
    assert naive.application_properties["at"] == dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.UTC)


def test_the_header_is_plain_json_with_tagged_values_any_client_can_write() -> None:
    _, _, headers = encode(ServiceBusMessage("x", application_properties=TYPED))
    assert json.loads(dict(headers)["application-properties"]) == {
        "blob": {"$binary": "AP9yYXc="}, "id": {"$uuid": str(ID)},
        "at": {"$timestamp": 1772368215123}, "text": "t", "n": 7, "x": 1.5, "ok": True,
        "none": None}
    written_elsewhere = [("application-properties", json.dumps(
        {"plain": "as before", "n": 3, "id": {"$uuid": str(ID).upper()},
         "other": {"kept": "as is"}}).encode())]
    got = decode(b"x", written_elsewhere, 0, 0, 1)
    assert got.application_properties == {"plain": "as before", "n": 3, "id": ID,
                                          "other": {"kept": "as is"}}


def test_numbers_come_back_as_sent_however_large() -> None:
    """Integers past 64 bits stay integers (exactly), floats keep every bit,
    NaN and infinities come back: what ``json`` wrote is what is read."""
    for sent in ({"big": 2**70, "low": -(2**64) - 1, "edge": 2**63, "n": 7},
                 {"third": 1 / 3, "tiny": 5e-324, "long_text": "1" * 25, "max": 2**63 - 1},
                 {"inf": float("inf"), "minus": -float("inf")}):
        got = _through_a_record(ServiceBusMessage("x", application_properties=sent))
        assert got.application_properties == sent
        assert _types(got.application_properties) == _types(sent)
    nan = _through_a_record(ServiceBusMessage("x", application_properties={"nan": float("nan")}))
    assert math.isnan(nan.application_properties["nan"])


def test_a_tag_that_cannot_be_read_makes_the_record_malformed() -> None:
    for bad in ({"$binary": "not base64!"}, {"$uuid": "nope"}, {"$timestamp": "noon"}):
        headers = [("application-properties", json.dumps({"p": bad}).encode())]
        with pytest.raises(MalformedRecord, match="application-properties"):
            decode(b"x", headers, 0, 0, 1)
        assert decode(b"x", headers, 0, 0, 1, lenient=True).malformed_reason


def test_unsupported_property_types_are_refused_naming_the_property() -> None:
    for value in ([1, 2], {"a": 1}, object(), dt.timedelta(1)):
        with pytest.raises(TypeError, match=r"'bad' is a .*uuid\.UUID, datetime\.datetime"):
            ServiceBusMessage("x", application_properties={"ok": 1, "bad": value})


BODIES = [
    (AmqpAnnotatedMessage(data_body=[b"ab", "cd"]), AmqpMessageBodyType.DATA, [b"abcd"]),
    (AmqpAnnotatedMessage(value_body={"order": 7, "id": ID, "raw": b"\x01", "at": AT,
                                      "lines": [1.5, None, True]}),
     AmqpMessageBodyType.VALUE,
     {"order": 7, "id": ID, "raw": b"\x01", "at": RECEIVED["at"], "lines": [1.5, None, True]}),
    (AmqpAnnotatedMessage(value_body=None), AmqpMessageBodyType.VALUE, None),
    (AmqpAnnotatedMessage(sequence_body=[[1, "two"], [b"3", ID]]),
     AmqpMessageBodyType.SEQUENCE, [[1, "two"], [b"3", ID]]),
]


def _body(message: ServiceBusMessage | AmqpAnnotatedMessage) -> Any:
    """A body as a comparable value: generators of sections as lists."""
    return message.body if message.body_type == AmqpMessageBodyType.VALUE else list(
        message.body)


@pytest.mark.parametrize(("sent", "body_type", "body"), BODIES)
def test_each_amqp_body_type_comes_back_through_a_record(
        sent: AmqpAnnotatedMessage, body_type: AmqpMessageBodyType, body: Any) -> None:
    got = _through_a_record(sent)
    assert got.body_type == got.raw_amqp_message.body_type == body_type
    assert _body(got) == _body(got.raw_amqp_message) == body


def test_amqp_sections_a_record_has_headers_for_are_kept() -> None:
    got = _through_a_record(AmqpAnnotatedMessage(
        value_body=1, header={"time_to_live": 60_000},
        properties={"message_id": ID, "subject": b"created", "group_id": "s-1",
                    "content_type": "application/json"},
        application_properties={b"tenant": "a"}, annotations={"x-opt-partition-key": "s-1"}))
    assert (got.message_id, got.subject, got.session_id, got.partition_key,
            got.content_type) == (str(ID), "created", "s-1", "s-1", "application/json")
    assert got.time_to_live == dt.timedelta(minutes=1)
    assert got.application_properties == {"tenant": "a"}
    raw = got.raw_amqp_message
    assert raw.properties is not None and raw.properties.group_id == "s-1"
    assert raw.header is not None and raw.header.time_to_live == 60_000


def test_a_record_without_body_type_is_a_data_body_and_a_bad_one_is_malformed() -> None:
    plain = decode(b'{"not": "parsed"}', [], 0, 0, 1)
    assert plain.body_type == AmqpMessageBodyType.DATA
    assert list(plain.body) == [b'{"not": "parsed"}']
    for value, headers in ((b"{", [("body-type", b"value")]),
                           (b"[1, 2]", [("body-type", b"sequence")]),
                           (b"1", [("body-type", b"map")])):
        with pytest.raises(MalformedRecord, match="body"):
            decode(value, headers, 0, 0, 1)
        lenient = decode(value, headers, 0, 0, 1, lenient=True)
        assert lenient.malformed_reason and list(lenient.body) == [value]


def test_maps_whose_keys_json_cannot_carry_come_back() -> None:
    value = {b"key": [-123, b"data", False], 7: {"$uuid": "a map, not a tag"}}
    got = _through_a_record(AmqpAnnotatedMessage(value_body=value))
    assert got.body == value


def test_value_bodies_that_json_cannot_carry_are_refused() -> None:
    with pytest.raises(TypeError, match=r"value body\[0\] is a set"):
        encode(sendable(AmqpAnnotatedMessage(value_body=[{1}])))
    with pytest.raises(ValueError, match="exactly one"):
        AmqpAnnotatedMessage(data_body=b"x", value_body=1)


def test_sql_filters_compare_typed_properties_without_failing() -> None:
    view = MessageView({}, {"id": ID, "at": AT, "blob": b"\x01"})
    for expression in (f"user.id = '{str(ID).upper()}'", f"id IN ('x', '{ID}')",
                       "id <> 'not a uuid'", "at > at2 OR at = at", "blob = blob"):
        assert compile_filter(expression).matches(view), expression
    for expression in ("at > 5", "id > 'x'", "blob = 'x'"):
        with pytest.raises(FilterEvaluationError):
            compile_filter(expression).matches(view)


def _receive_all(client: ServiceBusClient, queue: str, count: int
                 ) -> list[ServiceBusReceivedMessage]:
    got: list[ServiceBusReceivedMessage] = []
    with client.get_queue_receiver(queue) as receiver:  # peek-lock
        while len(got) < count and (batch := receiver.receive_messages(
                count - len(got), max_wait_time=10)):
            got += batch
        receiver.complete_messages(got)
    return sorted(got, key=lambda m: m.sequence_number)


@pytest.mark.tansu
def test_typed_properties_go_through_a_queue(client: ServiceBusClient,
                                             make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("typed", application_properties=TYPED))
    producer = Producer(client.settings.kafka_config())  # another Kafka client, by the document
    producer.produce(names.entity_log(client.settings.namespace, queue), b"theirs", headers=[
        ("application-properties", json.dumps({"id": {"$uuid": str(ID)}}).encode())])
    assert producer.flush(10) == 0
    ours, theirs = _receive_all(client, queue, 2)
    assert ours.application_properties == RECEIVED
    assert _types(ours.application_properties) == _types(RECEIVED)
    assert theirs.application_properties == {"id": ID}


@pytest.mark.tansu
def test_each_amqp_body_type_goes_through_a_queue(client: ServiceBusClient,
                                                  make_queue: Callable[..., str]) -> None:
    queue = make_queue()
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([sent for sent, _, _ in BODIES])
    got = _receive_all(client, queue, len(BODIES))
    assert [(m.body_type, _body(m)) for m in got] == [(t, b) for _, t, b in BODIES]
    assert [_body(m.raw_amqp_message) for m in got] == [b for _, _, b in BODIES]


@pytest.mark.tansu
def test_the_asyncio_sender_sends_amqp_messages(conn: str,
                                                make_queue: Callable[..., str]) -> None:
    queue = make_queue()

    async def send_and_receive() -> ServiceBusReceivedMessage:
        async with AsyncServiceBusClient.from_connection_string(conn) as client:
            async with client.get_queue_sender(queue) as sender:
                await sender.send_messages(AmqpAnnotatedMessage(
                    sequence_body=[1, ID], application_properties={"at": AT}))
            async with client.get_queue_receiver(queue) as receiver:
                [received] = await receiver.receive_messages(1, max_wait_time=10)
                await receiver.complete_message(received)
                return received

    got = asyncio.run(send_and_receive())
    assert got.raw_amqp_message.body_type == AmqpMessageBodyType.SEQUENCE
    assert list(got.body) == [[1, ID]]
    assert got.application_properties == {"at": RECEIVED["at"]}


@pytest.mark.tansu
def test_a_subscription_filter_selects_by_a_uuid_property(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        queue_name: str) -> None:
    admin.create_topic(queue_name)
    admin.create_subscription(queue_name, "mine")
    admin.delete_rule(queue_name, "mine", "$Default")
    rule = RuleProperties("id", SqlRuleFilter(f"user.id = '{ID}' AND user.at < user.due"))
    admin.create_rule(queue_name, "mine", rule.name, filter=rule.filter)
    with client.get_topic_sender(queue_name) as sender:
        sender.send_messages([
            ServiceBusMessage("yes", application_properties={
                "id": ID, "at": AT, "due": AT + dt.timedelta(days=1)}),
            ServiceBusMessage("other", application_properties={
                "id": uuid.uuid4(), "at": AT, "due": AT}),
            ServiceBusMessage("fails", application_properties={"id": ID, "at": AT, "due": 5})])
    with client.get_subscription_receiver(queue_name, "mine") as receiver:
        got = receiver.receive_messages(3, max_wait_time=10)
        receiver.complete_messages(got)
        assert receiver.receive_messages(3, max_wait_time=2) == []
    assert [str(m) for m in got] == ["yes"]
    assert got[0].application_properties["due"] == RECEIVED["at"] + dt.timedelta(days=1)
