"""Auto-forwarding, hop counts and the transfer dead-letter sub-queue."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from settlement.management import ServiceBusAdministrationClient


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def wait_for(check: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_forward_to_moves_every_message_to_the_target(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient) -> None:
    target, source = name("target"), name("source")
    admin.create_queue(target)
    admin.create_queue(source, forward_to=target)
    with client.get_queue_sender(source) as sender:
        sender.send_messages([ServiceBusMessage(f"m{i}", message_id=f"m{i}",
                                                application_properties={"i": i})
                              for i in range(5)])
    receiver = client.get_queue_receiver(target)
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 5 and time.monotonic() < deadline:
        got += receiver.receive_messages(5, max_wait_time=2)
    receiver.complete_messages(got)
    assert sorted(m.message_id for m in got) == [f"m{i}" for i in range(5)]
    assert all(m.application_properties == {"i": int(m.message_id[1:])} for m in got)
    assert wait_for(lambda: admin.get_queue_runtime_properties(source).active_message_count == 0)


def test_a_forwarding_loop_ends_in_the_transfer_dead_letter_sub_queue(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient) -> None:
    first, second = name("ping"), name("pong")
    admin.create_queue(first, forward_to=second)
    admin.create_queue(second, forward_to=first)
    with client.get_queue_sender(first) as sender:
        sender.send_messages(ServiceBusMessage("around", message_id="around"))

    def transfer_dead() -> int:
        return sum(admin.get_queue_runtime_properties(q).transfer_dead_letter_message_count
                   for q in (first, second))

    assert wait_for(lambda: transfer_dead() == 1)
    for queue in (first, second):
        tdlq = client.get_queue_receiver(queue,
                                         sub_queue=ServiceBusSubQueue.TRANSFER_DEAD_LETTER)
        for message in tdlq.receive_messages(5, max_wait_time=1):
            assert message.message_id == "around"
            assert message.dead_letter_reason == "MaxTransferHopCountExceeded"
            tdlq.complete_message(message)
    assert transfer_dead() == 0


def test_missing_forward_target_is_a_transfer_dead_letter(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        make_queue: Callable[..., str]) -> None:
    queue = make_queue(forward_to="nowhere-queue")
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("lost?", message_id="stray"))
    assert wait_for(lambda: admin.get_queue_runtime_properties(
        queue).transfer_dead_letter_message_count == 1)
    tdlq = client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.TRANSFER_DEAD_LETTER)
    [message] = tdlq.receive_messages(1, max_wait_time=10)
    assert message.dead_letter_reason == "ForwardTargetNotFound"
    assert "nowhere-queue" in message.dead_letter_error_description


def test_dead_letters_are_forwarded_with_their_reason(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient) -> None:
    parking, queue = name("parking"), name("work")
    admin.create_queue(parking)
    admin.create_queue(queue, forward_dead_lettered_messages_to=parking)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("bad", message_id="bad"))
    receiver = client.get_queue_receiver(queue)
    [message] = receiver.receive_messages(1, max_wait_time=10)
    receiver.dead_letter_message(message, reason="Broken", error_description="cannot parse")
    parked = client.get_queue_receiver(parking)
    [moved] = parked.receive_messages(1, max_wait_time=15)
    assert moved.message_id == "bad"
    assert moved.application_properties["DeadLetterReason"] == "Broken"
    assert moved.application_properties["DeadLetterErrorDescription"] == "cannot parse"
    assert wait_for(lambda: admin.get_queue_runtime_properties(
        queue).dead_letter_message_count == 0)
