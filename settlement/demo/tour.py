"""``make demo``: every settlement path against a real broker and engine worker.

Starts Apache Kafka (one node, from its Maven Central jars, fetched once)
and one engine worker, creates queue ``orders``
(2 s locks, 3 deliveries at most) and drives complete, abandon, a lapsed lock,
dead-letter, defer, max delivery count, batch completion, (on a second
queue) receive-and-delete and (on a third, with duplicate detection) a
duplicate, an expiring and a scheduled message. A topic, ``placed-orders``,
gets a handful of orders published once; three subscriptions select them
with SQL rules (one with an action that tags what it selects). A session
queue, ``checkouts``, gets two carts' steps interleaved; session receivers
take each cart whole, in order, keep its progress in the session state, and a
second receiver is refused the cart that is held. Then it reads
the dead-letter sub-queue and prints the outcomes, what each subscription
received and the runtime counts. Last, Spark: the
monitoring job turns the engine's events into metrics, the audit checks that
no message was lost, stuck or settled twice, and the dashboard page is
written to ``demo-output/dashboard.html`` (with a screenshot where Chromium
is installed). Last, because it pauses the demo's broker, paired namespaces:
a second Apache Kafka node with its own engine is the secondary namespace of
``demo``; a sender paired with it sends to queue ``payments`` while the demo
pauses its own broker (SIGSTOP) for a few seconds, so the sends carry on into
backlog queues of the secondary (messages per second logged, with the
failover and the switch back); ``settlement pair status`` shows what the
sender reported and what waits in the backlog, and a receiver with
``enable_syphon=True`` receives every message once, from the primary. It
shuts everything down and exits 0 -- or 1, saying which expectation failed.

Run it with ``python -m settlement.demo``.
"""

from __future__ import annotations

import datetime as dt
import gc
import io
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path

from settlement import (
    NEXT_AVAILABLE_SESSION,
    SendAvailabilityPairedNamespaceOptions,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceivedMessage,
    ServiceBusReceiveMode,
    ServiceBusReceiver,
    ServiceBusSubQueue,
)
from settlement.cli.output import format_table
from settlement.cli.pair import print_status
from settlement.exceptions import (
    MessageLockLostError,
    ServiceBusError,
    SessionCannotBeLockedError,
)
from settlement.management import (
    QueueRuntimeProperties,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
)
from settlement.pairing import backlog_queue_names, read_status
from settlement.testing._local_broker import BrokerStartError
from settlement.testing.apache_kafka import KafkaCluster
from settlement.testing.maven import JarFetchError
from settlement.testing.pause import pause, resume
from streams.process import EngineProcess
from topics.connection import parse_connection_string

log = logging.getLogger("settlement.demo")

NAMESPACE = "demo"
QUEUE = "orders"
RAD_QUEUE = "notifications"
LIFE_QUEUE = "invoices"
#: Not "orders": queues and topics share one namespace of names.
TOPIC = "placed-orders"
#: (order id, region, amount), published once to TOPIC.
TOPIC_ORDERS = [("A-1", "eu", 40), ("A-2", "us", 250), ("A-3", "eu", 120), ("A-4", "apac", 15)]
#: subscription -> (SQL filter, SQL action, the orders it must get); no filter
#: keeps the ``$Default`` rule, which selects every message.
TOPIC_SUBSCRIPTIONS: dict[str, tuple[str | None, str | None, list[str]]] = {
    "eu": ("region = 'eu'", None, ["A-1", "A-3"]),
    "big": ("amount >= 100", "SET priority = 'high'", ["A-2", "A-3"]),
    "all": (None, None, ["A-1", "A-2", "A-3", "A-4"]),
}
#: A session-enabled queue: each cart's steps, in order, to one receiver at a time.
SESSION_QUEUE = "checkouts"
CARTS = {"cart-1": ["add book", "add pen", "pay"], "cart-2": ["add lamp", "pay"]}
LOCK_S = 2
MAX_DELIVERY = 3
#: How long to wait for a message that should be there.
WAIT_S = 10.0
#: How long to wait to be sure no message comes.
QUIET_S = 1.0
WORKER_READY_TIMEOUT_S = 90.0
MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
#: Where the monitor's results and the dashboard page go (kept after the demo).
OUTPUT_DIR = Path("demo-output")
DEAD_LETTER_REASON = "InvalidOrder"
DEAD_LETTER_DESCRIPTION = "quantity must be positive, got -2"
#: Paired namespaces (last: the demo's broker is the primary, and is paused):
#: a queue of the demo namespace, and the secondary on a second broker.
PAIRED_QUEUE = "payments"
SECONDARY_NAMESPACE = "demo-secondary"
BACKLOG_QUEUES = 2
FAILOVER = dt.timedelta(seconds=1)
#: The sender sends PAIRED_BATCH messages every PAIRED_SPACING_S s; the
#: primary is paused PAUSE_AT_S s after it starts, for PAUSE_S s, and the
#: sender carries on AFTER_PAUSE_S s after that (the probe sees it back).
PAIRED_BATCH = 20
PAIRED_SPACING_S = 0.05
PAUSE_AT_S = 2.0
PAUSE_S = 5.0
AFTER_PAUSE_S = 4.0


class DemoFailure(Exception):
    """An expectation the demo cannot continue without."""


@dataclass
class Outcome:
    path: str
    message_id: str
    delivery_count: int
    outcome: str


@dataclass
class SubscriptionOutcome:
    """What one subscription of TOPIC received, for the summary."""

    name: str
    rule: str
    received: list[ServiceBusReceivedMessage]


@dataclass
class PairedSends:
    """What the paired sender did: a first batch, then each batch's (start,
    end, message ids) in seconds since that one, and when the primary was
    paused and resumed."""

    first: list[str] = field(default_factory=list)
    batches: list[tuple[float, float, list[str]]] = field(default_factory=list)
    paused_at: float = 0.0
    resumed_at: float = 0.0

    def phases(self) -> list[tuple[str, float, float]]:
        end = self.batches[-1][1] if self.batches else self.resumed_at
        return [("before the pause", 0.0, self.paused_at),
                ("primary paused", self.paused_at, self.resumed_at),
                ("after the pause", self.resumed_at, end)]

    def ids(self) -> list[str]:
        return self.first + [i for _, _, ids in self.batches for i in ids]

    def next_batch(self) -> list[ServiceBusMessage]:
        first = len(self.ids())
        return [ServiceBusMessage(f"payment {i}", message_id=f"payment-{i}")
                for i in range(first, first + PAIRED_BATCH)]

    def in_phase(self, start: float, end: float) -> list[tuple[float, float, list[str]]]:
        """The batches acknowledged between ``start`` and ``end``."""
        return [b for b in self.batches if start <= b[1] < end]


class Demo:
    """The paths, in order; each records its outcome and checks what it saw."""

    def __init__(self, client: ServiceBusClient, admin: ServiceBusAdministrationClient) -> None:
        self.client = client
        self.admin = admin
        self.outcomes: list[Outcome] = []
        self.failures: list[str] = []
        self.receiver: ServiceBusReceiver | None = None
        self.topic_outcomes: list[SubscriptionOutcome] = []
        #: session id -> (the steps received, in order; the state left with it)
        self.session_outcomes: dict[str, tuple[list[str], bytes | None]] = {}

    # ----------------------------------------------------------------- checks
    def expect(self, ok: bool, what: str) -> bool:
        if not ok:
            log.error("EXPECTATION FAILED: %s", what)
            self.failures.append(what)
        return ok

    def record(self, path: str, message: ServiceBusReceivedMessage, outcome: str) -> None:
        self.outcomes.append(Outcome(path, str(message.message_id), message.delivery_count,
                                     outcome))

    def receive_one(self, message_id: str, delivery_count: int,
                    wait: float = WAIT_S) -> ServiceBusReceivedMessage:
        """Receive the next message; it must be ``message_id`` with ``delivery_count``
        (its earlier deliveries, as the SDK counts)."""
        assert self.receiver is not None
        got = self.receiver.receive_messages(1, max_wait_time=wait)
        if not got:
            raise DemoFailure(f"{message_id} was not delivered (delivery_count {delivery_count}) "
                              f"within {wait:.0f} s")
        message = got[0]
        if message.message_id != message_id:
            raise DemoFailure(f"expected {message_id} (delivery_count {delivery_count}), got "
                              f"{message.message_id} (delivery_count {message.delivery_count})")
        self.expect(message.delivery_count == delivery_count,
                    f"{message_id}: delivery count {message.delivery_count}, "
                    f"expected {delivery_count}")
        log.info("  received %-16s seq=%d delivery_count=%d body=%s", message_id,
                 message.sequence_number, message.delivery_count, _show(b"".join(message.body)))
        return message

    def expect_nothing(self, why: str) -> None:
        assert self.receiver is not None
        got = self.receiver.receive_messages(5, max_wait_time=QUIET_S)
        if self.expect(not got, f"{why}, but received "
                                f"{[(m.message_id, m.delivery_count) for m in got]}"):
            log.info("  nothing to receive: %s", why)
        else:
            self.receiver.abandon_messages(got)

    # ------------------------------------------------------------------ paths
    def send_workload(self) -> None:
        """One batch, in the order the paths below receive it; the lapse path
        comes last so that waiting for its redelivery meets no fresh message."""
        messages = [
            _order("order-complete", 1, kind="order"),
            _order("order-abandon", 2, kind="order"),
            _order("order-deadletter", -2, kind="order"),
            _order("order-defer", 3, kind="order", priority="low"),
            ServiceBusMessage(b"\x00\xffnot json", message_id="order-poison",
                              content_type="application/octet-stream",
                              application_properties={"kind": "poison"}),
            *[_order(f"batch-{i}", i, kind="bulk") for i in range(1, 6)],
            _order("order-lapse", 7, kind="order"),
        ]
        with self.client.get_queue_sender(QUEUE) as sender:
            batch = sender.create_message_batch()
            for message in messages:
                batch.add_message(message)
            sender.send_messages(batch)
        log.info("sent %d messages to %r in one batch", len(messages), QUEUE)

    def path_complete(self) -> None:
        log.info("[complete] receive and complete")
        message = self.receive_one("order-complete", 0)
        assert self.receiver is not None
        self.receiver.complete_message(message)
        self.record("complete", message, "completed")

    def path_abandon(self) -> None:
        log.info("[abandon] abandon, expect redelivery with delivery_count + 1, complete")
        assert self.receiver is not None
        first = self.receive_one("order-abandon", 0)
        self.receiver.abandon_message(first)
        again = self.receive_one("order-abandon", 1)
        self.receiver.complete_message(again)
        self.record("abandon", again, "abandoned once, completed on redelivery")

    def path_dead_letter(self) -> None:
        log.info("[dead-letter] dead_letter_message(reason=%r)", DEAD_LETTER_REASON)
        assert self.receiver is not None
        message = self.receive_one("order-deadletter", 0)
        self.receiver.dead_letter_message(message, reason=DEAD_LETTER_REASON,
                                          error_description=DEAD_LETTER_DESCRIPTION)
        self.record("dead-letter", message, "dead-lettered")

    def path_defer(self) -> None:
        log.info("[defer] defer, receive_deferred_messages([seq]), complete")
        assert self.receiver is not None
        message = self.receive_one("order-defer", 0)
        seq = message.sequence_number
        self.receiver.defer_message(message)
        counts = self.admin.get_queue_runtime_properties(QUEUE)
        self.expect(counts.deferred_message_count == 1,
                    f"deferred count {counts.deferred_message_count} after defer, expected 1")
        log.info("  deferred seq=%d (runtime deferred count: %d)", seq,
                 counts.deferred_message_count)
        deferred = self.receiver.receive_deferred_messages([seq])
        if not deferred:
            raise DemoFailure(f"receive_deferred_messages([{seq}]) returned nothing")
        message = deferred[0]
        self.expect(message.message_id == "order-defer" and message.sequence_number == seq,
                    f"deferred receive returned {message.message_id} seq "
                    f"{message.sequence_number}, expected order-defer seq {seq}")
        self.expect(message.state == ServiceBusMessageState.DEFERRED,
                    f"deferred message has state {message.state!r}, expected DEFERRED")
        self.receiver.complete_message(message)
        log.info("  received deferred seq=%d delivery=%d, completed", seq,
                 message.delivery_count)
        self.record("defer", message, "deferred, received by sequence number, completed")

    def path_max_delivery(self) -> None:
        log.info("[max delivery] abandon until the engine dead-letters it (max %d)",
                 MAX_DELIVERY)
        assert self.receiver is not None
        message = None
        for delivery in range(MAX_DELIVERY):  # delivery_count: earlier deliveries
            message = self.receive_one("order-poison", delivery)
            self.receiver.abandon_message(message)
        assert message is not None
        self.record("max delivery count", message, "dead-lettered")

    def path_batch(self) -> None:
        log.info("[batch] receive 5 messages, complete_messages(list) in one settlement")
        assert self.receiver is not None
        want = {f"batch-{i}" for i in range(1, 6)}
        got = receive_count(self.receiver, len(want))
        ids = {m.message_id for m in got}
        if ids != want:
            raise DemoFailure(f"batch receive got {sorted(map(str, ids))}, "
                              f"expected {sorted(want)}")
        results = self.receiver.complete_messages(got)
        failed = [r.message.message_id for r in results if not r.succeeded]
        self.expect(not failed, f"complete_messages failed for {failed}")
        log.info("  completed %d messages in one call: %s", len(results),
                 ", ".join(str(m.message_id) for m in got))
        for message in got:
            self.record("batch complete", message, "completed (complete_messages)")

    def path_lapse(self) -> None:
        log.info("[lapse] receive, do not settle, wait for the %d s lock to lapse", LOCK_S)
        assert self.receiver is not None
        first = self.receive_one("order-lapse", 0)
        started = time.monotonic()
        again = self.receive_one("order-lapse", 1, wait=LOCK_S + WAIT_S)
        waited = time.monotonic() - started
        self.expect(waited >= LOCK_S * 0.9,
                    f"order-lapse came back after {waited:.1f} s, before its {LOCK_S} s lock")
        log.info("  redelivered after %.1f s", waited)
        try:
            self.receiver.complete_message(first)
            self.expect(False, "completing with the lapsed lock token succeeded")
        except MessageLockLostError:
            log.info("  completing the first delivery: MessageLockLostError, as expected")
        self.receiver.complete_message(again)
        self.record("lapsed lock", again, "lock lapsed, redelivered, completed")

    def path_receive_and_delete(self) -> None:
        log.info("[receive-and-delete] on %r: settled on receipt, nothing to settle", RAD_QUEUE)
        with self.client.get_queue_sender(RAD_QUEUE) as sender:
            sender.send_messages([ServiceBusMessage(f"notify {i}", message_id=f"notify-{i}")
                                  for i in range(1, 4)])
        with self.client.get_queue_receiver(
                RAD_QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) as receiver:
            got = receive_count(receiver, 3)
            self.expect(len(got) == 3, f"receive-and-delete got {len(got)} messages, expected 3")
            self.expect(all(m.lock_token is None for m in got),
                        "receive-and-delete messages carry lock tokens")
            again = receiver.receive_messages(3, max_wait_time=QUIET_S)
            self.expect(not again, f"receive-and-delete messages came back: "
                                   f"{[m.message_id for m in again]}")
        log.info("  received and deleted %s; nothing comes back",
                 ", ".join(str(m.message_id) for m in got))
        for message in got:
            self.record("receive-and-delete", message, "deleted on receipt")

    def path_lifecycle(self) -> None:
        """Duplicate detection, expiry and a scheduled message on LIFE_QUEUE."""
        log.info("[lifecycle] on %r: a duplicate, a 1 s time to live, a message due in 3 s",
                 LIFE_QUEUE)
        due = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)
        with self.client.get_queue_sender(LIFE_QUEUE) as sender:
            sender.send_messages([
                ServiceBusMessage("invoice 1", message_id="invoice-1"),
                ServiceBusMessage("invoice 1 again", message_id="invoice-1"),
                ServiceBusMessage("short-lived", message_id="invoice-stale",
                                  time_to_live=dt.timedelta(seconds=1))])
            sender.schedule_messages(ServiceBusMessage("later", message_id="invoice-later"), due)
        time.sleep(1.5)
        with self.client.get_queue_receiver(LIFE_QUEUE) as receiver:
            first = receiver.receive_messages(10, max_wait_time=WAIT_S)
            self.expect([m.message_id for m in first] == ["invoice-1"],
                        f"expected only invoice-1 before the scheduled time, got "
                        f"{[m.message_id for m in first]}")
            receiver.complete_messages(first)
            for message in first:
                self.record("duplicate detection", message,
                            "delivered once; its second send was acknowledged, never delivered")
            later = receiver.receive_messages(1, max_wait_time=WAIT_S)
            on_time = bool(later) and dt.datetime.now(dt.UTC) >= due
            self.expect(on_time, "the scheduled message did not arrive at its time")
            receiver.complete_messages(later)
            for message in later:
                self.record("scheduled", message, "invisible until due, then delivered")
        dlq = self.client.get_queue_receiver(LIFE_QUEUE, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        expired = dlq.peek_messages(5)
        self.expect([m.dead_letter_reason for m in expired] == ["TTLExpiredException"],
                    "the expired message is not in the dead-letter sub-queue")
        for message in expired:
            self.record("time to live", message, "expired unreceived: TTLExpiredException")
        dlq.close()

    def path_topic(self) -> None:
        """Publish TOPIC_ORDERS once; each subscription gets what its rules
        select, and ``big``'s action tags what it gets."""
        log.info("[topic] %r: %d orders published once, subscriptions %s select them with "
                 "SQL rules", TOPIC, len(TOPIC_ORDERS), ", ".join(TOPIC_SUBSCRIPTIONS))
        self.admin.create_topic(TOPIC)
        for name, (sql, action, _) in TOPIC_SUBSCRIPTIONS.items():
            self.admin.create_subscription(TOPIC, name)
            if sql is not None:  # the new rule first, so no message finds no rule
                self.admin.create_rule(TOPIC, name, name, filter=SqlRuleFilter(sql),
                                       action=SqlRuleAction(action) if action else None)
                self.admin.delete_rule(TOPIC, name, "$Default")
        with self.client.get_topic_sender(TOPIC) as sender:
            sender.send_messages([_order(order_id, 1, region=region, amount=amount)
                                  for order_id, region, amount in TOPIC_ORDERS])
        for name, (sql, action, want) in TOPIC_SUBSCRIPTIONS.items():
            with self.client.get_subscription_receiver(TOPIC, name) as receiver:
                got = receive_count(receiver, len(want))
                got += receiver.receive_messages(5, max_wait_time=QUIET_S)
                receiver.complete_messages(got)
            ids = sorted(str(m.message_id) for m in got)
            self.expect(ids == want, f"subscription {name!r} received {ids}, expected {want}")
            if action is not None:
                untagged = [m.message_id for m in got
                            if (m.application_properties or {}).get("priority") != "high"]
                self.expect(not untagged, f"{name!r}: the action did not tag {untagged}")
            rule = "; ".join(filter(None, [sql or "$Default (every message)", action]))
            self.topic_outcomes.append(SubscriptionOutcome(name, rule, got))
            log.info("  %s received %s", name, ", ".join(ids))

    def path_sessions(self) -> None:
        """Two carts' steps, interleaved in one session queue: each session
        receiver gets one cart whole and in order, and records its progress
        in the session state; the held cart is refused to a second receiver."""
        log.info("[sessions] %r: carts %s, their steps interleaved", SESSION_QUEUE,
                 ", ".join(CARTS))
        self.admin.create_queue(SESSION_QUEUE, requires_session=True, lock_duration=10)
        longest = max(len(steps) for steps in CARTS.values())
        with self.client.get_queue_sender(SESSION_QUEUE) as sender:
            sender.send_messages([ServiceBusMessage(steps[i], session_id=cart)
                                  for i in range(longest) for cart, steps in CARTS.items()
                                  if i < len(steps)])
        for _ in CARTS:
            with self.client.get_queue_receiver(SESSION_QUEUE, session_id=NEXT_AVAILABLE_SESSION,
                                                max_wait_time=WAIT_S) as receiver:
                session = receiver.session
                assert session is not None, "a NEXT_AVAILABLE_SESSION receiver holds a session"
                cart = str(session.session_id)
                try:
                    self.client.get_queue_receiver(SESSION_QUEUE, session_id=cart).__enter__()
                    self.expect(False, f"a second receiver locked the held session {cart!r}")
                except SessionCannotBeLockedError:
                    pass
                got = receive_count(receiver, len(CARTS.get(cart, [])))
                receiver.complete_messages(got)
                session.set_state(f"{len(got)} steps done".encode())
                steps = [str(m) for m in got]
                self.session_outcomes[cart] = (steps, session.get_state())
            self.expect(steps == CARTS.get(cart), f"session {cart!r} got {steps}, "
                        f"expected {CARTS.get(cart)} in that order")
            log.info("  %s received %s", cart, " -> ".join(steps))
        listed = sorted(self.client.list_queue_sessions(SESSION_QUEUE))
        self.expect(listed == sorted(CARTS), f"list_queue_sessions gave {listed}")

    def path_paired_sends(self, secondary: str, primary_pid: int) -> PairedSends:
        """A sender paired with ``secondary`` sends to PAIRED_QUEUE while the
        primary's broker (``primary_pid``, this demo's) is paused for PAUSE_S s:
        the sends carry on into the backlog, then go to the primary again."""
        log.info("[paired sends] %r: a sender paired with namespace %r (failover after %g s) "
                 "sends %d messages every %g s; the primary's broker is paused after %g s, "
                 "for %g s", PAIRED_QUEUE, SECONDARY_NAMESPACE, FAILOVER.total_seconds(),
                 PAIRED_BATCH, PAIRED_SPACING_S, PAUSE_AT_S, PAUSE_S)
        self.admin.create_queue(PAIRED_QUEUE)
        options = SendAvailabilityPairedNamespaceOptions(
            secondary, backlog_queue_count=BACKLOG_QUEUES, failover_interval=FAILOVER)
        sends = PairedSends()
        paused = threading.Event()
        started = 0.0

        def resume_primary() -> None:
            log.info("  primary broker resumed (SIGCONT) after %g s", PAUSE_S)
            sends.resumed_at = time.monotonic() - started
            resume(primary_pid)
            paused.clear()

        timer = threading.Timer(PAUSE_S, resume_primary)
        try:
            with ServiceBusClient._from_settings(self.client.settings,
                                                 paired_namespace=options) as client, \
                    client.get_queue_sender(PAIRED_QUEUE) as sender:
                log.info("  %d backlog queues on %r (%d found, %d created)",
                         options.backlog_queue_count, SECONDARY_NAMESPACE,
                         options.backlog_queues_found, options.backlog_queues_created)
                # a sender's first send sets up its producer (about 1 s on Tansu)
                first = sends.next_batch()
                sender.send_messages(first)
                sends.first = [str(m.message_id) for m in first]
                rate = SecondByRate()
                started = time.monotonic()
                while (now := time.monotonic() - started) < PAUSE_AT_S + PAUSE_S + AFTER_PAUSE_S:
                    if now >= PAUSE_AT_S and not sends.paused_at:
                        pause(primary_pid)
                        sends.paused_at = now
                        paused.set()
                        timer.start()
                        rate.add(now, 0, paused=True)
                        log.info("  primary broker paused (SIGSTOP)")
                    batch = sends.next_batch()
                    sender.send_messages(batch)
                    done = time.monotonic() - started
                    sends.batches.append((now, done, [str(m.message_id) for m in batch]))
                    rate.add(done, len(batch), paused.is_set())
                    time.sleep(PAIRED_SPACING_S)
        finally:
            timer.cancel()
            resume(primary_pid)  # never leave the demo's broker paused
        longest = max(end - start for start, end, _ in sends.batches)
        self.expect(longest < FAILOVER.total_seconds() + 5,
                    f"a send took {longest:.1f} s while the primary was paused")
        during = sends.in_phase(sends.paused_at, sends.resumed_at)
        self.expect(len(during) > 1, f"{len(during)} batch(es) were sent while the primary "
                                     "was paused: the sends did not carry on")
        return sends

    def path_pair_status(self, secondary: str) -> dict[str, object]:
        """What the sender reported to the secondary: a failover, and the
        switch back once the probe saw the primary again."""
        settings = parse_connection_string(secondary)
        deadline = time.monotonic() + WAIT_S
        status: dict[str, object] = {}
        while time.monotonic() < deadline:
            status = next((s for s in read_status(settings, NAMESPACE)
                           if s["entity"] == PAIRED_QUEUE), {})
            if status.get("mode") == "primary":
                break
            time.sleep(0.5)
        self.expect(status.get("mode") == "primary" and bool(status.get("failovers")),
                    f"the paired sender reported {status or 'nothing'}, expected a failover "
                    "and the switch back to the primary")
        self.expect(int(str(status.get("sent_to_backlog", 0))) > 0,
                    "the paired sender reported no message sent to the backlog")
        log.info("  reported to %r: %s failover(s), %s message(s) sent to the backlog, "
                 "sending to the %s again", SECONDARY_NAMESPACE, status.get("failovers"),
                 status.get("sent_to_backlog"), status.get("mode"))
        return status

    def path_syphon(self, secondary: str, sends: PairedSends) -> None:
        """A receiver with ``enable_syphon=True``: its syphon moves the backlog
        to the primary, and every message is received once, from there."""
        want = sends.ids()
        log.info("[syphon] a receiver paired with %r, enable_syphon=True, receives %d messages "
                 "of %r from the primary", SECONDARY_NAMESPACE, len(want), PAIRED_QUEUE)
        options = SendAvailabilityPairedNamespaceOptions(
            secondary, backlog_queue_count=BACKLOG_QUEUES, enable_syphon=True)
        seen: Counter[str] = Counter()
        samples: dict[str, ServiceBusReceivedMessage] = {}
        picked = {want[0]: "sent before the pause", want[-1]: "sent last, after the pause"}
        during = sends.in_phase(sends.paused_at, sends.resumed_at)
        if len(during) > 1:  # the first may have reached the primary late; the last did not
            picked[during[-1][2][0]] = "sent to the backlog while paused, moved by the syphon"
        with ServiceBusClient._from_settings(self.client.settings,
                                             paired_namespace=options) as client, \
                client.get_queue_receiver(PAIRED_QUEUE) as receiver:
            deadline = time.monotonic() + 3 * WAIT_S
            while len(seen) < len(want) and time.monotonic() < deadline:
                batch = receiver.receive_messages(500, max_wait_time=2)
                receiver.complete_messages(batch)
                seen.update(str(m.message_id) for m in batch)
                samples.update((str(m.message_id), m) for m in batch
                               if m.message_id in picked)
            # a second copy of anything would come now
            extra = receiver.receive_messages(100, max_wait_time=QUIET_S)
            receiver.complete_messages(extra)
            seen.update(str(m.message_id) for m in extra)
        missing = [i for i in want if i not in seen]
        twice = sorted(i for i, n in seen.items() if n > 1)
        self.expect(not missing, f"{len(missing)} paired message(s) never arrived: "
                                 f"{missing[:5]}")
        self.expect(not twice, f"{len(twice)} paired message(s) arrived twice: {twice[:5]}")
        with ServiceBusAdministrationClient.from_connection_string(secondary) as admin:
            left = sum(admin.get_queue_runtime_properties(q).active_message_count
                       for q in backlog_queue_names(NAMESPACE, BACKLOG_QUEUES))
        self.expect(left == 0, f"{left} message(s) left in the backlog queues")
        log.info("  received %d distinct messages, %d twice; %d left in the backlog",
                 len(seen), len(twice), left)
        for message_id, what in picked.items():
            if message_id in samples:
                self.record("paired namespaces", samples[message_id],
                            f"{what}; received once, from the primary")

    def read_dead_letters(self) -> list[ServiceBusReceivedMessage]:
        """Peek-lock the dead-letter sub-queue, check the reasons, put them back."""
        log.info("[dead-letter sub-queue] receive %s/$deadletterqueue, abandon to keep them",
                 QUEUE)
        with self.client.get_queue_receiver(
                QUEUE, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
            got = receive_count(receiver, 2)
            extra = receiver.receive_messages(10, max_wait_time=QUIET_S)
            got += extra
            if got:
                receiver.abandon_messages(got)
        reasons = {m.message_id: m.dead_letter_reason for m in got}
        self.expect(reasons == {"order-deadletter": DEAD_LETTER_REASON,
                                "order-poison": MAX_DELIVERY_REASON},
                    f"dead-letter sub-queue holds {reasons}, expected order-deadletter "
                    f"({DEAD_LETTER_REASON}) and order-poison ({MAX_DELIVERY_REASON})")
        by_id = {m.message_id: m for m in got}
        explicit = by_id.get("order-deadletter")
        if explicit is not None:
            self.expect(explicit.dead_letter_error_description == DEAD_LETTER_DESCRIPTION,
                        f"dead-letter description {explicit.dead_letter_error_description!r}")
        for row in self.outcomes:
            if row.outcome == "dead-lettered":
                found = by_id.get(row.message_id)
                row.outcome = ("NOT in the dead-letter sub-queue" if found is None
                               else f"dead-lettered: {found.dead_letter_reason}")
        return got

    def runtime_counts(self) -> dict[str, QueueRuntimeProperties]:
        counts = {q: self.admin.get_queue_runtime_properties(q)
                  for q in (QUEUE, RAD_QUEUE, LIFE_QUEUE)}
        expected = {QUEUE: (0, 2, 0, 0), RAD_QUEUE: (0, 0, 0, 0), LIFE_QUEUE: (0, 1, 0, 0)}
        for name, runtime in counts.items():
            seen = _counts(runtime)
            self.expect(seen == expected[name],
                        f"{name} runtime counts (active, dead-letter, deferred, locked) "
                        f"{seen}, expected {expected[name]}")
        return counts


# ------------------------------------------------------------------------- helpers
def receive_count(receiver: ServiceBusReceiver, count: int) -> list[ServiceBusReceivedMessage]:
    """Up to ``count`` messages, waiting at most WAIT_S in all (they may
    arrive over several receives)."""
    got: list[ServiceBusReceivedMessage] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        got += receiver.receive_messages(count - len(got), max_wait_time=WAIT_S)
    return got


class SecondByRate:
    """Logs the messages acknowledged in each second of sending, as it goes."""

    def __init__(self) -> None:
        self.second = 0
        self.count = 0
        self.paused = False

    def add(self, at: float, count: int, paused: bool) -> None:
        """``count`` messages acknowledged ``at`` s after the start."""
        while int(at) > self.second:
            log.info("  second %2d: %4d messages sent%s", self.second + 1, self.count,
                     "  (primary paused)" if self.paused else "")
            self.second, self.count, self.paused = self.second + 1, 0, paused
        self.count += count
        self.paused = self.paused or paused


def _order(message_id: str, quantity: int, **properties: str | int) -> ServiceBusMessage:
    body = json.dumps({"order": message_id, "quantity": quantity})
    return ServiceBusMessage(body, message_id=message_id, content_type="application/json",
                             application_properties=properties)


def _show(body: bytes, width: int = 60) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return repr(body[:width])
    return text if text.isprintable() and len(text) <= width else repr(text[:width])


def _tagged(message: ServiceBusReceivedMessage) -> str:
    priority = (message.application_properties or {}).get("priority")
    return str(message.message_id) + (f" (priority={priority})" if priority else "")


def _counts(runtime: QueueRuntimeProperties) -> tuple[int, int, int, int]:
    return (runtime.active_message_count, runtime.dead_letter_message_count,
            runtime.deferred_message_count, runtime.locked_message_count)


def check_java() -> None:
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("java is not available (%s): Spark jobs will need Java 17 "
                    "(openjdk-17-jre-headless); the demo does not use Spark", exc)
        return
    first = (done.stderr or done.stdout).strip().splitlines()[:1]
    if done.returncode != 0:
        log.warning("'java -version' exited %d; Spark jobs will need Java 17",
                    done.returncode)
    else:
        log.info("java: %s", first[0] if first else "(no version output)")


def print_summary(demo: Demo, dead: list[ServiceBusReceivedMessage],
                  counts: dict[str, QueueRuntimeProperties]) -> None:
    print()
    print_outcomes(demo.outcomes)
    print()
    print(f"Dead-letter sub-queue of {QUEUE!r} (delivery count includes this read)")
    print(format_table(["SEQ", "MESSAGE ID", "DELIVERIES", "REASON", "DESCRIPTION"],
                       [[str(m.sequence_number), str(m.message_id), str(m.delivery_count),
                         str(m.dead_letter_reason), str(m.dead_letter_error_description)]
                        for m in dead]))
    print()
    print(f"Topic {TOPIC!r}: {len(TOPIC_ORDERS)} orders published once "
          f"({', '.join(f'{o} {r} {a}' for o, r, a in TOPIC_ORDERS)})")
    print(format_table(["SUBSCRIPTION", "RULE", "RECEIVED (application property set by the "
                        "rule's action)"],
                       [[o.name, o.rule, ", ".join(_tagged(m) for m in o.received)]
                        for o in demo.topic_outcomes]))
    print()
    print(f"Session queue {SESSION_QUEUE!r}: each cart to one receiver, whole and in order")
    print(format_table(["SESSION", "STEPS RECEIVED", "SESSION STATE"],
                       [[cart, " -> ".join(steps), repr(state)]
                        for cart, (steps, state) in demo.session_outcomes.items()]))
    print()
    print("Runtime counts (get_queue_runtime_properties)")
    print(format_table(["QUEUE", "ACTIVE", "DEAD-LETTER", "DEFERRED", "LOCKED"],
                       [[name, *map(str, _counts(rt))] for name, rt in counts.items()]))
    print()


def print_outcomes(outcomes: list[Outcome]) -> None:
    print("Outcomes")
    print(format_table(["PATH", "MESSAGE ID", "DELIVERIES", "OUTCOME / REASON"],
                       [[o.path, o.message_id, str(o.delivery_count), o.outcome]
                        for o in outcomes]))


def pair_status_text(secondary: str) -> str:
    """What ``settlement pair status`` prints now for the demo namespace."""
    out = io.StringIO()
    with redirect_stdout(out):
        print_status(NAMESPACE, parse_connection_string(secondary), BACKLOG_QUEUES)
    return out.getvalue().rstrip()


def print_paired_summary(demo: Demo, sends: PairedSends, statuses: dict[str, str]) -> None:
    print()
    print(f"Paired namespaces: {NAMESPACE!r} (the demo's broker, paused for {PAUSE_S:g} s) "
          f"with {SECONDARY_NAMESPACE!r} (a second broker); sends to {PAIRED_QUEUE!r}")
    rows = []
    for name, start, end in sends.phases():
        batches = sends.in_phase(start, end)
        sent = sum(len(ids) for _, _, ids in batches)
        longest = max((e - s for s, e, _ in batches), default=0.0)
        rows.append([name, f"{end - start:.1f}", str(sent),
                     f"{sent / (end - start):.0f}" if end > start else "-", f"{longest:.2f}"])
    print(format_table(["PHASE", "SECONDS", "MESSAGES SENT", "PER SECOND", "LONGEST SEND (S)"],
                       rows))
    for when, text in statuses.items():
        print()
        print(f"settlement pair status --backlog-queue-count {BACKLOG_QUEUES}, {when}")
        print(text)
    print()
    print_outcomes(demo.outcomes)
    print()


def run(workdir: Path) -> int:
    check_java()
    with KafkaCluster(data_dir=workdir / "broker") as broker:
        log.info("Apache Kafka on %s", broker.bootstrap)
        conn = broker.connection_string(NAMESPACE)
        try:
            engine = EngineProcess(conn, workdir / "engine").start(WORKER_READY_TIMEOUT_S)
        except RuntimeError as exc:
            raise DemoFailure(str(exc)) from None
        log.info("engine worker ready (log %s)", engine.log_path)
        try:
            code = drive(conn)
            if code == 0:
                code = monitor_and_dashboard(conn, OUTPUT_DIR)
            if code == 0:  # last: it pauses this broker
                code = drive_paired(conn, broker.nodes[0].pid, workdir)
            # Free the clients' librdkafka handles (some sit in reference cycles)
            # while the broker is up, so they disconnect quietly.
            gc.collect()
        finally:
            engine.stop()
        return code


def monitor_and_dashboard(conn: str, out_dir: Path) -> int:
    """Spark over what the demo did: metrics, an audit, the dashboard page."""
    # Imported here, not at the top: they load PySpark, which only this step needs.
    from spark.audit import run_audit
    from spark.dashboard import ChromiumNotFound, screenshot, write_html
    from spark.monitor import start_monitor
    from spark.session import spark_session

    log.info("Spark: monitoring job, audit and dashboard (starting a SparkSession)")
    sink = out_dir / "monitor"
    shutil.rmtree(sink, ignore_errors=True)  # a new namespace each run: start afresh
    out_dir.mkdir(parents=True, exist_ok=True)
    spark = spark_session("settlement-demo")
    try:
        query = start_monitor(spark, conn, sink, available_now=True)
        query.awaitTermination()
        query.stop()
        report = run_audit(spark, conn, [QUEUE, RAD_QUEUE, LIFE_QUEUE])
    finally:
        spark.stop()
    print(report.summary())
    page = write_html(sink, out_dir / "dashboard.html")
    print(f"Dashboard: open file://{page.resolve()}")
    print(f"  (or serve it live: .venv/bin/settlement dashboard --sink {sink})")
    try:
        print(f"  screenshot: {screenshot(page.resolve().as_uri(), out_dir / 'dashboard.png')}")
    except ChromiumNotFound as exc:
        log.info("no screenshot: %s", exc)
    if not report.ok:
        print("FAILED: the audit found problems (above)", file=sys.stderr)
        return 1
    return 0


@contextmanager
def demo_clients(conn: str, section: str) -> Iterator[Demo]:
    """A :class:`Demo` on clients of ``conn``, closed after; a DemoFailure or
    a service error ends ``section`` as a failed expectation."""
    admin = ServiceBusAdministrationClient.from_connection_string(conn)
    client = ServiceBusClient.from_connection_string(conn)
    demo = Demo(client, admin)
    try:
        yield demo
    except (DemoFailure, ServiceBusError) as exc:
        demo.failures.append(f"{type(exc).__name__}: {exc}")
        log.error("%s stopped: %s", section, exc)
    finally:
        client.close()
        admin.close()


def drive(conn: str) -> int:
    with demo_clients(conn, "the demo") as demo:
        admin, client = demo.admin, demo.client
        admin.create_queue(QUEUE, lock_duration=LOCK_S, max_delivery_count=MAX_DELIVERY)
        admin.create_queue(RAD_QUEUE)
        admin.create_queue(LIFE_QUEUE, requires_duplicate_detection=True,
                           dead_lettering_on_message_expiration=True)
        log.info("created queues %r (lock %d s, max delivery %d), %r and %r", QUEUE, LOCK_S,
                 MAX_DELIVERY, RAD_QUEUE, LIFE_QUEUE)
        demo.send_workload()
        with client.get_queue_receiver(QUEUE) as demo.receiver:
            for path in (demo.path_complete, demo.path_abandon, demo.path_dead_letter,
                         demo.path_defer, demo.path_max_delivery, demo.path_batch,
                         demo.path_lapse):
                path()
            demo.expect_nothing(f"every message of {QUEUE!r} is settled or dead-lettered")
        demo.path_receive_and_delete()
        demo.path_lifecycle()
        demo.path_topic()
        demo.path_sessions()
        dead = demo.read_dead_letters()
        counts = demo.runtime_counts()
        print_summary(demo, dead, counts)
    return verdict(demo, "All settlement paths behaved as expected.")


def verdict(demo: Demo, success: str) -> int:
    """Print ``success``, or the expectations that failed; the exit code."""
    if demo.failures:
        print("FAILED expectations:", file=sys.stderr)
        for failure in demo.failures:
            print(f"  - {failure}", file=sys.stderr)
        return 1
    print(success)
    return 0


def drive_paired(conn: str, primary_pid: int, workdir: Path) -> int:
    """Paired namespaces: a second Apache Kafka node with its own engine is the
    secondary of the demo namespace, whose broker (``primary_pid``) is paused."""
    log.info("[paired namespaces] a second Apache Kafka node, with its own engine, is the "
             "secondary namespace %r of %r", SECONDARY_NAMESPACE, NAMESPACE)
    with KafkaCluster(data_dir=workdir / "secondary-broker") as second:
        secondary = second.connection_string(SECONDARY_NAMESPACE)
        try:
            engine = EngineProcess(secondary, workdir / "secondary-engine").start(
                WORKER_READY_TIMEOUT_S)
        except RuntimeError as exc:
            raise DemoFailure(str(exc)) from None
        try:
            with demo_clients(conn, "the paired-namespace section") as demo:
                sends = demo.path_paired_sends(secondary, primary_pid)
                demo.path_pair_status(secondary)
                statuses = {"before the syphon ran": pair_status_text(secondary)}
                demo.path_syphon(secondary, sends)
                statuses["after"] = pair_status_text(secondary)
                print_paired_summary(demo, sends, statuses)
        finally:
            gc.collect()  # the clients' handles, while both brokers are up
            engine.stop()
    return verdict(demo, "Sends carried on while the primary was paused, and every message "
                         "arrived once.")


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    for name in ("settlement.demo", "settlement.testing.apache_kafka",
                 "settlement.testing.maven", "settlement.pairing", "settlement._syphon"):
        logging.getLogger(name).setLevel(logging.INFO)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="settlement-demo-"))
    code = 1
    try:
        code = run(workdir)
    except (DemoFailure, BrokerStartError, JarFetchError) as exc:
        log.error("%s", exc)
    except KeyboardInterrupt:
        log.error("interrupted")
        code = 130
    finally:
        if code == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log.error("kept the worker log for inspection: %s", workdir / "worker.log")
    log.info("demo finished in %.1f s with exit code %d", time.monotonic() - started, code)
    return code

