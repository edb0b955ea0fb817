"""Topics and subscriptions: a message published once reaches every
subscription whose rules select it, once, and each subscription settles its
own copy (locks, delivery counts, dead letters) without holding up another."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition

from settlement import (
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusReceivedMessage,
    ServiceBusSubQueue,
)
from settlement._entities import EntityRegistry
from settlement.exceptions import MessagingEntityAlreadyExistsError, MessagingEntityNotFoundError
from settlement.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleProperties,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from tests.helpers import read_all
from topics import names
from topics.offsets import log_end_offsets
from topics.rules import SqlSyntaxError

Subscribe = Callable[..., str]


@pytest.fixture
def topic(admin: ServiceBusAdministrationClient, queue_name: str) -> str:
    admin.create_topic(queue_name)
    return queue_name


@pytest.fixture
def subscribe(admin: ServiceBusAdministrationClient, topic: str) -> Subscribe:
    """Create a subscription with the given rules instead of ``$Default``;
    returns its name."""

    def create(name: str, *rules: RuleProperties, **kwargs: object) -> str:
        kwargs.setdefault("lock_duration", 30)
        admin.create_subscription(topic, name, **kwargs)
        if rules:
            admin.delete_rule(topic, name, "$Default")
            for rule in rules:
                admin.create_rule(topic, name, rule.name, filter=rule.filter, action=rule.action)
        return name

    return create


def _publish(client: ServiceBusClient, topic: str, *messages: ServiceBusMessage) -> None:
    with client.get_topic_sender(topic) as sender:
        sender.send_messages(list(messages))


def _drain(client: ServiceBusClient, topic: str, subscription: str, *, wait: float = 5.0,
           sub_queue: ServiceBusSubQueue | None = None) -> list:
    """Receive and complete until nothing comes: for ``wait`` seconds at
    first (the engine's scanner may still be evaluating the rules), then for
    1.5 s once messages flow."""
    got = []
    with client.get_subscription_receiver(topic, subscription, sub_queue=sub_queue) as receiver:
        while batch := receiver.receive_messages(50, max_wait_time=1.5 if got else wait):
            got += batch
            receiver.complete_messages(batch)
    return got


def _order(i: int, region: str, amount: int) -> ServiceBusMessage:
    return ServiceBusMessage(f"order {i}", message_id=f"o{i}", subject="order",
                             application_properties={"region": region, "amount": amount})


def test_admin_creates_lists_updates_and_deletes_topics_subscriptions_and_rules(
        admin: ServiceBusAdministrationClient, topic: str) -> None:
    assert topic in [t.name for t in admin.list_topics()]
    props = admin.get_topic(topic)
    props.default_message_time_to_live = 3600
    admin.update_topic(props)
    assert admin.get_topic(topic).default_message_time_to_live.total_seconds() == 3600
    with pytest.raises(MessagingEntityAlreadyExistsError):
        admin.create_queue(topic)  # queues and topics share one namespace of names

    sub = admin.create_subscription(topic, "audit", max_delivery_count=3,
                                    dead_lettering_on_filter_evaluation_exceptions=False)
    assert (sub.max_delivery_count, sub.dead_lettering_on_filter_evaluation_exceptions) == (
        3, False)
    default = admin.get_rule(topic, "audit", "$Default")
    assert isinstance(default.filter, TrueRuleFilter) and default.action is None
    sub.lock_duration = 7
    admin.update_subscription(topic, sub)
    assert admin.get_subscription(topic, "audit").lock_duration.total_seconds() == 7
    assert [s.name for s in admin.list_subscriptions(topic)] == ["audit"]

    admin.create_rule(topic, "audit", "big", filter=SqlRuleFilter("amount > @limit",
                                                                    {"@limit": 100}),
                      action=SqlRuleAction("SET tier = 'gold'"))
    with pytest.raises(MessagingEntityAlreadyExistsError):
        admin.create_rule(topic, "audit", "big")
    rule = admin.get_rule(topic, "audit", "big")
    assert rule.filter == SqlRuleFilter("amount > @limit", {"@limit": 100})
    assert rule.action == SqlRuleAction("SET tier = 'gold'")
    rule.filter = CorrelationRuleFilter(subject="order", properties={"region": "eu"})
    admin.update_rule(topic, "audit", rule)
    assert admin.get_rule(topic, "audit", "big").filter == CorrelationRuleFilter(
        subject="order", properties={"region": "eu"})
    assert [r.name for r in admin.list_rules(topic, "audit")] == ["$Default", "big"]
    admin.delete_rule(topic, "audit", "big")
    assert [r.name for r in admin.list_rules(topic, "audit")] == ["$Default"]

    runtime = admin.get_topic_runtime_properties(topic)
    assert runtime.subscription_count == 1
    admin.delete_subscription(topic, "audit")
    with pytest.raises(MessagingEntityNotFoundError):
        admin.get_subscription(topic, "audit")
    admin.delete_topic(topic)
    assert topic not in [t.name for t in admin.list_topics()]


def test_invalid_sql_is_refused_by_create_rule_with_the_position_of_the_error(
        admin: ServiceBusAdministrationClient, topic: str, subscribe: Subscribe) -> None:
    subscribe("s")
    with pytest.raises(SqlSyntaxError) as refused:
        admin.create_rule(topic, "s", "broken", filter=SqlRuleFilter("amount > > 3"))
    assert refused.value.column == 10
    assert "column 10" in str(refused.value)
    assert [r.name for r in admin.list_rules(topic, "s")] == ["$Default"]


def test_a_message_published_once_reaches_each_matching_subscription_once(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient, topic: str,
        subscribe: Subscribe) -> None:
    subscribe("eu", RuleProperties("eu", SqlRuleFilter("user.region = 'eu'")),
              RuleProperties("eu-again", SqlRuleFilter("region IN ('eu', 'uk')")))
    subscribe("big", RuleProperties("big", SqlRuleFilter("amount >= 100")))
    subscribe("orders", RuleProperties("orders", CorrelationRuleFilter(subject="order")))
    subscribe("none", RuleProperties("none", FalseRuleFilter()))
    subscribe("all")
    orders = [_order(0, "eu", 50), _order(1, "us", 150), _order(2, "eu", 500),
              _order(3, "us", 5)]
    _publish(client, topic, *orders)
    # Counted as soon as the send returned: only what the rules select.
    assert admin.get_subscription_runtime_properties(topic, "big").active_message_count == 2
    assert admin.get_subscription_runtime_properties(topic, "none").active_message_count == 0

    def ids(sub: str) -> list[str]:
        return sorted(m.message_id for m in _drain(client, topic, sub))

    assert ids("eu") == ["o0", "o2"]  # two of its rules match o0 and o2: once each
    assert ids("big") == ["o1", "o2"]
    assert ids("orders") == ["o0", "o1", "o2", "o3"]
    assert ids("all") == ["o0", "o1", "o2", "o3"]
    assert ids("none") == []
    # The topic's log holds each payload once, whatever the subscriptions.
    log_topic = names.topic_log(client.settings.namespace, topic)
    consumer = Consumer(client.settings.consumer_config("t-log-end"))
    try:
        ends = log_end_offsets(consumer, [(log_topic, 0)],
                               exact=client.settings.profile.exact_list_offsets)
    finally:
        consumer.close()
    assert ends[(log_topic, 0)] == len(orders)
    for sub in ("eu", "big", "all"):
        assert admin.get_subscription_runtime_properties(topic, sub).active_message_count == 0


def test_subscriptions_settle_independently_and_keep_their_own_dead_letters(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient, topic: str,
        subscribe: Subscribe) -> None:
    subscribe("slow", max_delivery_count=2, lock_duration=60)
    subscribe("fast")
    _publish(client, topic, *[ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(5)])
    with client.get_subscription_receiver(topic, "slow") as slow:
        held = slow.receive_messages(5, max_wait_time=10)  # locked, not settled
        assert len(held) == 5
        assert sorted(m.message_id for m in _drain(client, topic, "fast")) == [
            f"m{i}" for i in range(5)]  # not held up by "slow"'s locks
        slow.dead_letter_message(held[0], reason="Bad", error_description="test")
        slow.abandon_message(held[1])
        again = slow.receive_messages(1, max_wait_time=10)
        assert again[0].message_id == "m1" and again[0].delivery_count == 1
        slow.complete_messages([again[0], *held[2:]])
    dead = _drain(client, topic, "slow", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert [(m.message_id, m.dead_letter_reason) for m in dead] == [("m0", "Bad")]
    assert dead[0].dead_letter_source == names.subscription_path(topic, "slow")
    assert _drain(client, topic, "fast", sub_queue=ServiceBusSubQueue.DEAD_LETTER) == []
    runtime = admin.get_subscription_runtime_properties(topic, "slow")
    assert (runtime.active_message_count, runtime.dead_letter_message_count) == (0, 0)


def test_a_new_subscription_gets_what_is_published_from_then_on(
        client: ServiceBusClient, topic: str, subscribe: Subscribe) -> None:
    subscribe("first")
    _publish(client, topic, ServiceBusMessage("before", message_id="before"))
    subscribe("late")
    _publish(client, topic, ServiceBusMessage("after", message_id="after"))
    assert [m.message_id for m in _drain(client, topic, "late")] == ["after"]
    assert [m.message_id for m in _drain(client, topic, "first")] == ["before", "after"]


def test_rule_changes_apply_to_messages_not_yet_evaluated(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient, topic: str,
        subscribe: Subscribe) -> None:
    subscribe("eu", RuleProperties("eu", SqlRuleFilter("region = 'eu'")))
    _publish(client, topic, _order(0, "eu", 1), _order(1, "us", 1))
    assert [m.message_id for m in _drain(client, topic, "eu")] == ["o0"]
    rule = admin.get_rule(topic, "eu", "eu")
    rule.filter = SqlRuleFilter("region = 'us'")
    admin.update_rule(topic, "eu", rule)
    _publish(client, topic, _order(2, "eu", 1), _order(3, "us", 1))
    assert [m.message_id for m in _drain(client, topic, "eu")] == ["o3"]


def test_a_failing_filter_dead_letters_the_message_or_says_why_it_did_not_match(
        client: ServiceBusClient, topic: str, subscribe: Subscribe) -> None:
    failing = RuleProperties("math", SqlRuleFilter("amount / divisor > 1"))
    subscribe("strict", failing)
    subscribe("lenient", failing, dead_lettering_on_filter_evaluation_exceptions=False)
    _publish(client, topic, ServiceBusMessage("ok", message_id="ok",
                                              application_properties={"amount": 10,
                                                                      "divisor": 2}),
             ServiceBusMessage("zero", message_id="zero",
                               application_properties={"amount": 10, "divisor": 0}))
    assert [m.message_id for m in _drain(client, topic, "strict")] == ["ok"]
    dead = _drain(client, topic, "strict", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert [(m.message_id, m.dead_letter_reason) for m in dead] == [
        ("zero", "FilterEvaluationException")]
    assert "math" in dead[0].dead_letter_error_description
    assert "zero" in dead[0].dead_letter_error_description.lower()

    assert [m.message_id for m in _drain(client, topic, "lenient")] == ["ok"]
    assert _drain(client, topic, "lenient", sub_queue=ServiceBusSubQueue.DEAD_LETTER) == []
    path = names.subscription_path(topic, "lenient")
    events = read_all(client, names.events(client.settings.namespace), f"{path}#0".encode(),
                      lambda found: any(e["type"] == "filter_failed" for e in found))
    failed = [e for e in events if e["type"] == "filter_failed"]
    assert failed and "math" in failed[0]["description"]


def test_a_rule_action_changes_the_properties_of_its_subscriptions_copy_only(
        client: ServiceBusClient, topic: str, subscribe: Subscribe) -> None:
    subscribe("gold", RuleProperties("big", SqlRuleFilter("amount > 100"),
                                     SqlRuleAction("SET tier = 'gold'; REMOVE internal")))
    subscribe("plain")
    _publish(client, topic, ServiceBusMessage("x", message_id="x", application_properties={
        "amount": 500, "internal": "secret"}))
    gold = _drain(client, topic, "gold")
    assert gold[0].application_properties == {"amount": 500, "tier": "gold"}
    plain = _drain(client, topic, "plain")
    assert plain[0].application_properties == {"amount": 500, "internal": "secret"}


def _first_arrivals(client: ServiceBusClient, queue: str) -> list[ServiceBusReceivedMessage]:
    """The first messages to arrive on ``queue`` within 20 s, completed."""
    got: list[ServiceBusReceivedMessage] = []
    with client.get_queue_receiver(queue) as receiver:
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = receiver.receive_messages(10, max_wait_time=2)
        receiver.complete_messages(got)
    return got


def test_a_subscription_forwards_to_a_queue(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient, topic: str,
        subscribe: Subscribe, queue_name: str) -> None:
    target = f"{queue_name}-inbox"
    admin.create_queue(target)
    subscribe("fwd", RuleProperties("eu", SqlRuleFilter("region = 'eu'")), forward_to=target)
    _publish(client, topic, _order(0, "eu", 1), _order(1, "us", 1))
    got = _first_arrivals(client, target)
    assert [m.message_id for m in got] == ["o0"]


def test_a_forwarded_copy_carries_the_actions_of_the_rule_that_selected_it(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient, topic: str,
        subscribe: Subscribe, queue_name: str) -> None:
    """Service Bus applies a rule's action when it evaluates the rule: a
    subscription that forwards hands the target the properties as the
    action left them (the target's receivers know nothing of its rules)."""
    target = f"{queue_name}-actioned"
    admin.create_queue(target)
    subscribe("fwd", RuleProperties("eu", SqlRuleFilter("region = 'eu'"),
                                    SqlRuleAction("SET tier = 'gold'; REMOVE internal")),
              forward_to=target)
    eu = ServiceBusMessage("order 0", message_id="o0", application_properties={
        "region": "eu", "amount": 1, "internal": "secret"})
    _publish(client, topic, eu, _order(1, "us", 1))
    got = _first_arrivals(client, target)
    assert [m.message_id for m in got] == ["o0"]
    properties = dict(got[0].application_properties or {})
    assert properties["tier"] == "gold"
    assert "internal" not in properties
    assert properties["region"] == "eu"


def test_a_subscription_receiver_has_every_queue_receiver_feature(
        client: ServiceBusClient, topic: str, subscribe: Subscribe) -> None:
    subscribe("work")
    _publish(client, topic, *[ServiceBusMessage(f"m{i}", message_id=f"m{i}") for i in range(6)])
    path = names.subscription_path(topic, "work")
    with client.get_subscription_receiver(topic, "work") as receiver:
        peeked = receiver.peek_messages(6)
        assert [m.message_id for m in peeked] == [f"m{i}" for i in range(6)]
        got = receiver.receive_messages(6, max_wait_time=10)
        assert len(got) == 6
        before = got[0].locked_until_utc
        time.sleep(0.2)
        assert receiver.renew_message_lock(got[0]) > before
        receiver.defer_message(got[1])
        receiver.dead_letter_message(got[2], reason="No", error_description="no")
        results = receiver.complete_messages([got[0], *got[3:]])
        assert all(r.succeeded for r in results)
        deferred = receiver.receive_deferred_messages([got[1].sequence_number])
        assert [m.message_id for m in deferred] == ["m1"]
        receiver.complete_message(deferred[0])
    # The dead-letter sub-queue, by path as in the SDK.
    with client.get_queue_receiver(f"{path}/$deadletterqueue", max_wait_time=5) as dlq:
        dead = []
        for message in dlq:
            dead.append(message)
            dlq.complete_message(message)
        assert [(m.message_id, m.dead_letter_reason) for m in dead] == [("m2", "No")]

    _publish(client, topic, *[ServiceBusMessage(f"p{i}", message_id=f"p{i}") for i in range(20)])
    seen: list[str] = []
    with client.get_subscription_receiver(topic, "work") as receiver:
        counts = receiver.process(lambda m: seen.append(m.message_id), max_concurrent_calls=4,
                                  max_wait_time=3)
    assert sorted(seen) == sorted(f"p{i}" for i in range(20))
    assert counts["completed"] == 20


def test_topic_messages_carry_the_wire_format_headers(
        client: ServiceBusClient, topic: str, subscribe: Subscribe) -> None:
    subscribe("all")
    _publish(client, topic, _order(7, "eu", 1))
    log_topic = names.topic_log(client.settings.namespace, topic)
    consumer = Consumer(client.settings.consumer_config("t-wire"))
    consumer.assign([TopicPartition(log_topic, 0, 0)])
    try:
        record = None
        deadline = time.monotonic() + 10
        while record is None and time.monotonic() < deadline:
            got = consumer.consume(1, timeout=0.5)
            record = got[0] if got and not got[0].error() else None
    finally:
        consumer.close()
    assert record is not None and record.value() == b"order 7"
    headers = dict(record.headers())
    assert headers["message-id"] == b"o7" and headers["subject"] == b"order"
    assert json.loads(headers["application-properties"]) == {"region": "eu", "amount": 1}


def test_a_subscriptions_time_to_live_dead_letters_what_it_did_not_settle_in_time(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient, topic: str,
        subscribe: Subscribe) -> None:
    subscribe("short", default_message_time_to_live=2, dead_lettering_on_message_expiration=True)
    subscribe("long")
    _publish(client, topic, ServiceBusMessage("x", message_id="x"))
    deadline = time.monotonic() + 20
    while admin.get_subscription_runtime_properties(
            topic, "short").dead_letter_message_count == 0 and time.monotonic() < deadline:
        time.sleep(0.5)  # expired by the engine's own timer, with no receiver
    dead = _drain(client, topic, "short", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
    assert [(m.message_id, m.dead_letter_reason) for m in dead] == [("x", "TTLExpiredException")]
    assert [m.message_id for m in _drain(client, topic, "long")] == ["x"]


def test_a_subscription_forwards_to_another_topic(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient, topic: str,
        subscribe: Subscribe) -> None:
    downstream = f"{topic}-next"
    admin.create_topic(downstream)
    admin.create_subscription(downstream, "in", lock_duration=30)
    subscribe("fwd", forward_to=downstream)
    _publish(client, topic, _order(1, "eu", 1))
    got = []
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        got = _drain(client, downstream, "in", wait=1)
    assert [m.message_id for m in got] == ["o1"]


def test_a_filter_failing_on_many_messages_dead_letters_them_all_and_the_engine_serves_on(
        client: ServiceBusClient, admin: ServiceBusAdministrationClient, topic: str,
        subscribe: Subscribe) -> None:
    failing = RuleProperties("math", SqlRuleFilter("amount / divisor > 1"))
    subscribe("strict", failing)
    subscribe("lenient", failing, dead_lettering_on_filter_evaluation_exceptions=False)
    count = 1_200  # more than one accept of the scanner may record errors for
    _publish(client, topic, *[ServiceBusMessage(
        f"m{i}", application_properties={"amount": i, "divisor": 0}) for i in range(count)])
    deadline = time.monotonic() + 60
    strict = admin.get_subscription_runtime_properties(topic, "strict")
    while strict.dead_letter_message_count < count and time.monotonic() < deadline:
        time.sleep(0.5)
        strict = admin.get_subscription_runtime_properties(topic, "strict")
    assert (strict.dead_letter_message_count, strict.active_message_count) == (count, 0)
    lenient = admin.get_subscription_runtime_properties(topic, "lenient")
    assert (lenient.dead_letter_message_count, lenient.active_message_count) == (0, 0)
    _publish(client, topic, ServiceBusMessage("fine", message_id="fine", application_properties={
        "amount": 10, "divisor": 2}))
    assert [m.message_id for m in _drain(client, topic, "lenient")] == ["fine"]


def test_subscription_receivers_take_their_rules_from_the_definitions_read_when_made(
        client: ServiceBusClient, topic: str, subscribe: Subscribe,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A receiver reads its subscription's definition when it is made; at its
    first message it takes the rules from that read, not from another read of
    the definitions log. The receivers of ten subscriptions each read it again
    there, one after the other (0.47-0.78 s of waiting summed over a drain)."""
    for k in range(10):
        subscribe(f"s{k}")
    receivers = [client.get_subscription_receiver(topic, f"s{k}") for k in range(10)]
    reads: list[float] = []
    log_end = EntityRegistry._log_end

    def counted(registry: EntityRegistry, consumer: Consumer) -> int:
        reads.append(time.monotonic())
        return log_end(registry, consumer)

    monkeypatch.setattr(EntityRegistry, "_log_end", counted)
    try:
        for receiver in receivers:  # what each does at its first message
            assert receiver._rules is not None
            assert not receiver._rules._current().has_actions  # $Default: all, no action
    finally:
        for receiver in receivers:
            receiver.close()
    # one read at most: the definitions read last may have gone stale meanwhile
    assert len(reads) <= 1, f"{len(reads)} reads of the definitions log for ten receivers' rules"
