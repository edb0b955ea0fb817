"""A topic with ten filtered subscriptions beside a plain queue of the same run.

``python -m bench.topics [--broker kafka|tansu] [--messages N]
[--drain sequential|threads]`` (``make bench-topics``) starts a broker and
one engine worker, then measures on that one broker:

1. a plain queue: the messages the topic gets below, ``send_messages`` in
   lists of 1,000, then ``receive_messages(1000)`` + ``complete_messages``
   until all are settled;
2. a topic with subscriptions ``s0`` .. ``s9``, each with its ``$Default``
   rule replaced by the SQL filter ``bucket = K``: the same N messages are
   published (``bucket = i % 10``, so each subscription selects a tenth), then
   every subscription is drained with ``receive_messages(1000)`` +
   ``complete_messages`` (``prefetch_count=1000``, as the queue's receiver);
   1 and 2 are run ``TRIALS`` (5) times, in pairs on entities of their own,
   and each topic / queue row is the pair of median ratio, every pair
   printed beside it;
3. a topic with 3 subscriptions, as a ported application has them: ``all``
   (its ``$Default`` rule) and ``low`` / ``high`` (SQL filters taking half
   each); N/4 messages are published, then each subscription is drained by a
   thread of its own with ``receive_messages(100)`` and ``complete_message``
   on each message. Every message is settled twice, and the rate counts
   settlements. ``all`` settles half of them: when each subscription was
   drained is printed, and how long ``all``'s thread went on alone. This
   runs ``TRIALS`` times, each on a topic of its own; the row is the trial
   of median rate, every trial printed beside it.

A topic message is stored once, in the topic's log; the engine's log
scanner reads each topic partition once for all of its subscriptions (it
reuses its last read) and evaluates each subscription's rules before a
message may be handed out. The drain starts right after publishing,
so its clock (first receive to last subscription drained) includes the
filter evaluation, and the time from the end of publishing to the last
subscription drained bounds when every subscription's messages were all
acceptable. The settle rate across subscriptions counts each published
message once: N over that clock.

Each figure is printed beside issue 25's target, and by how much it is
missed: topic / queue ratios of 0.8 for publishing and settling, 3,000
settled msg/s for the 3 subscriptions.

Every subscription must get exactly its N/10 messages (by the ``bucket``
application property), none twice, none left or dead-lettered
(``get_subscription_runtime_properties``). The table prints each figure
beside the plain queue's, with the evaluations/s of compiled filters on one
core (``bench.filters``) next to the 100,000/s target; the figures go to
``bench/results/topics-kafka.json`` (``topics-tansu.json`` on Tansu).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import filters
from bench.brokers import add_broker_argument, broker_label, broker_pid, new_broker, results_path
from bench.measure import CLIENT_GC, CpuMeter, Phase, Timed, median_trial, warm_line, warm_up
from bench.run import (
    IDLE_S,
    LOCK_SECONDS,
    final_check,
    machine_info,
    machine_label,
    settle_in_batches,
    wait_for_engine,
    warm_round,
)
from settlement import ServiceBusClient, ServiceBusMessage
from settlement.exceptions import ServiceBusError
from settlement.management import ServiceBusAdministrationClient, SqlRuleFilter
from settlement.receiver import ServiceBusReceiver
from settlement.sender import ServiceBusSender
from streams.process import EngineProcess
from topics.rules import MessageView, compile_filter

NAMESPACE = "benchtopics"
TOPIC = "orders"
#: paired trials of the queue and the ten subscriptions, one after the
#: other; each ratio row shows the trial of median ratio. One pair
#: decided it before, and consecutive pairs of one broker and engine gave
#: ten-subscription ratios of 0.51 to 1.05 (a harness of these phases,
#: 2026-11-30, the machine otherwise idle): a single pair said more of
#: the machine's minute than of the code. Five since 2026-12-06: three
#: pairs of one run still gave 1.18, 0.78 and 0.73 (the queue's own rate
#: 31,566-45,082 /s), on a machine whose cross-CPU wakes cost 67 us.
TRIALS = 5
#: what a one-by-one drain receives at a time
ONE_BY_ONE_BATCH = 100
#: issue 25's targets: topic / queue ratios, and settled msg/s of the 3 subscriptions
RATIO_TARGET = 0.8
THREE_TARGET = 3_000
QUEUE = "plain"
BUCKETS = 10
#: the topic with 3 subscriptions, and each one's SQL filter (None: $Default)
TOPIC3 = "orders3"
THREE = {"all": None, "low": f"bucket < {BUCKETS // 2}", "high": f"bucket >= {BUCKETS // 2}"}
#: the buckets each subscription of ``THREE`` selects
SELECTED = {"all": frozenset(range(BUCKETS)), "low": frozenset(range(BUCKETS // 2)),
            "high": frozenset(range(BUCKETS // 2, BUCKETS))}
#: the warm-up's topic, with the "low" and "high" subscriptions of ``THREE``
WARM_TOPIC = "warmup-topic"
WARM_SUBSCRIPTIONS = ("low", "high")
BATCH = 1000
CHUNK = 1000
log = logging.getLogger("bench.topics")


# ------------------------------------------------------------------ publish
def bucket_messages(n: int, size: int) -> list[ServiceBusMessage]:
    """``n`` messages whose ``bucket`` property cycles 0..9: each subscription's
    filter selects every tenth."""
    body = os.urandom(size)
    return [ServiceBusMessage(body, message_id=f"t-{i}",
                              application_properties={"bucket": i % BUCKETS})
            for i in range(n)]


def publish(sender: ServiceBusSender, messages: list[ServiceBusMessage], meter: CpuMeter,
            key: str, label: str) -> tuple[Phase, Timed]:
    """Send the first message on its own, untimed (a new sender's producer
    waits for its producer id), then the rest in lists of ``CHUNK``, timed.
    Returns the phase and its timer, whose ``end`` marks the end of sending."""
    sender.send_messages(messages[0])
    with Timed(meter) as t:
        for start in range(1, len(messages), CHUNK):
            sender.send_messages(messages[start:start + CHUNK])
    sender.close()
    return Phase(key, label, len(messages) - 1, t.seconds, cpu=t.cpu), t


# -------------------------------------------------------------------- drain
@dataclass
class Subscription:
    """One subscription's receiver and what it got and settled; with
    ``one_by_one`` it receives ``ONE_BY_ONE_BATCH`` at a time and settles
    each with ``complete_message`` (what a ported worker loop does).

    Under the clock it lists the ids it received and settled, and counts
    and checks them after (:func:`subscription_check`), as the queue's phase
    does (``bench.run.settle_in_batches``): counted there with Counters and
    each message's ``bucket`` property read, the bench's own bookkeeping
    cost the subscriptions' client a few microseconds a message that the
    queue's did not pay (its properties made for every message received)."""

    topic: str
    name: str
    expected: list[str]
    receiver: ServiceBusReceiver
    one_by_one: bool = False
    received_ids: list[str] = field(default_factory=list)
    settled_ids: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    drained_at: float | None = None  # perf_counter() when its last expected one settled

    def drain(self) -> None:
        """Receive and complete until every expected message is settled, or
        nothing came for ``IDLE_S`` (the exactly-once check then says what is
        missing). Stops at the count rather than at an empty receive, so the
        clock does not include a final wait."""
        while len(self.settled_ids) + len(self.failures) < len(self.expected):
            msgs = self.receiver.receive_messages(
                ONE_BY_ONE_BATCH if self.one_by_one else BATCH, max_wait_time=IDLE_S)
            if not msgs:
                log.warning("%s: nothing received for %.0fs after %d of %d; giving up",
                            self.name, IDLE_S, len(self.settled_ids), len(self.expected))
                break
            self.received_ids += [m.message_id for m in msgs]
            if self.one_by_one:
                for m in msgs:
                    try:
                        self.receiver.complete_message(m)
                        self.settled_ids.append(m.message_id)
                    except ServiceBusError as exc:
                        self.failures.append(f"{m.message_id}: {exc}")
                continue
            for result in self.receiver.complete_messages(msgs):
                if result.succeeded:
                    self.settled_ids.append(result.message.message_id)
                else:
                    self.failures.append(f"{result.message.message_id}: {result.error}")
        self.drained_at = time.perf_counter()


def drain_sequentially(subscriptions: list[Subscription]) -> None:
    """One subscription after another, from one thread."""
    for sub in subscriptions:
        sub.drain()


def drain_in_threads(subscriptions: list[Subscription]) -> None:
    """One thread per subscription, each with its own receiver (a receiver is
    not thread-safe); round trips of different subscriptions overlap."""
    errors: list[BaseException] = []

    def work(sub: Subscription) -> None:
        try:
            sub.drain()
        except BaseException as exc:  # report, do not hang the bench
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(s,), name=f"bench-{s.name}", daemon=True)
               for s in subscriptions]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]


DRAINS: dict[str, Callable[[list[Subscription]], None]] = {
    "sequential": drain_sequentially, "threads": drain_in_threads}


def subscription_check(admin: ServiceBusAdministrationClient, sub: Subscription
                       ) -> dict[str, Any]:
    """Exactly its own messages, each settled once, nothing of another bucket,
    nothing left active or dead-lettered. Closes the receiver. A message of
    another bucket is one whose id the subscription does not expect: the ids
    of each bucket's messages are known (:func:`selected`)."""
    received = Counter(sub.received_ids)
    check = final_check([sub.receiver], sub.expected, received, Counter(sub.settled_ids),
                        sub.failures, BATCH)
    runtime = admin.get_subscription_runtime_properties(sub.topic, sub.name)
    expected = set(sub.expected)
    wrong_bucket = sum(1 for message_id in received if message_id not in expected)
    check["wrong_bucket"] = wrong_bucket
    check["active_after"] = runtime.active_message_count
    check["dead_letter_after"] = runtime.dead_letter_message_count
    check["ok"] = (check["ok"] and not wrong_bucket and not runtime.active_message_count
                   and not runtime.dead_letter_message_count)
    return check


def create_filtered_topic(admin: ServiceBusAdministrationClient, topic: str) -> None:
    """``topic`` and ``s0`` .. ``s9``, each with only the rule ``bucket = K``."""
    admin.create_topic(topic)
    for k in range(BUCKETS):
        admin.create_subscription(topic, f"s{k}", lock_duration=LOCK_SECONDS,
                                  max_delivery_count=10)
        admin.delete_rule(topic, f"s{k}", "$Default")
        admin.create_rule(topic, f"s{k}", "r", filter=SqlRuleFilter(f"bucket = {k}"))


def selected(messages: list[ServiceBusMessage], name: str) -> list[str]:
    """The ids of the messages subscription ``name`` of ``THREE`` selects."""
    return [str(m.message_id) for m in messages
            if (m.application_properties or {})["bucket"] in SELECTED[name]]


def create_warm_topic(admin: ServiceBusAdministrationClient) -> None:
    """The warm-up's topic: two subscriptions, each selecting half by a SQL filter."""
    admin.create_topic(WARM_TOPIC)
    for name in WARM_SUBSCRIPTIONS:
        admin.create_subscription(WARM_TOPIC, name, lock_duration=LOCK_SECONDS,
                                  max_delivery_count=10)
        admin.delete_rule(WARM_TOPIC, name, "$Default")
        admin.create_rule(WARM_TOPIC, name, "r", filter=SqlRuleFilter(THREE[name]))


def warm_topic_round(client: ServiceBusClient, conn: str, size: int, meter: CpuMeter,
                     number: int) -> None:
    """One round of the warm-up: the queue's (``bench.run.warm_round``), then
    2,000 messages published to the warm-up topic and its two subscriptions
    drained. A broker warmed on queues alone still compiled the paths of a
    topic's (the engine's log scanner fetching, its larger commit records)
    while the topic was measured."""
    warm_round(client, conn, "warmup", size, meter, number)
    messages = bucket_messages(2 * CHUNK, size)
    subs = [Subscription(WARM_TOPIC, name, selected(messages, name),
                         client.get_subscription_receiver(WARM_TOPIC, name))
            for name in WARM_SUBSCRIPTIONS]
    publish(client.get_topic_sender(WARM_TOPIC), messages, meter, "warm", "warm-up")
    drain_in_threads(subs)
    for sub in subs:
        sub.receiver.close()


def topic_phases(client: ServiceBusClient, admin: ServiceBusAdministrationClient,
                 topic: str, n: int, size: int, mode: str, meter: CpuMeter
                 ) -> dict[str, Phase]:
    """Publish ``n`` bucketed messages to ``topic``, then drain every
    subscription. The receivers are made before publishing, so the drain
    clock holds no receiver setup: only receives, settlements and the wait
    for the engine to filter what is received."""
    messages = bucket_messages(n, size)
    # prefetch_count as the queue's receiver has it (bench.run.settle_in_batches):
    # the same receives on both sides of the ratio
    subs = [Subscription(topic, f"s{k}", [m.message_id for m in messages[k::BUCKETS]],
                         client.get_subscription_receiver(topic, f"s{k}", prefetch_count=BATCH))
            for k in range(BUCKETS)]
    sent, t_pub = publish(client.get_topic_sender(topic), messages, meter, "topic_publish",
                          f"publish to the topic (lists of {CHUNK:,})")
    with Timed(meter) as t:
        DRAINS[mode](subs)
    assert t_pub.end is not None and t.end is not None
    checks = {s.name: subscription_check(admin, s) for s in subs}
    drained_after = {s.name: round((s.drained_at or t.end) - t_pub.end, 3) for s in subs}
    settle = Phase("topic_settle",
                   f"{BUCKETS} subscriptions: receive({BATCH}) + complete_messages, "
                   f"prefetch_count={BATCH}, {mode}",
                   n, t.seconds, cpu=t.cpu,
                   check={"ok": all(c["ok"] for c in checks.values()), "subscriptions": checks},
                   extra={"drain": mode,
                          "publish_end_to_all_drained_s": round(t.end - t_pub.end, 3),
                          "drained_after_publish_s": drained_after})
    return {"topic_publish": sent, "topic_settle": settle}


def create_three_subscriptions(admin: ServiceBusAdministrationClient, topic: str) -> None:
    """The topic of the issue's first table: ``all`` keeps its ``$Default``
    rule, ``low`` and ``high`` each select half by a SQL filter."""
    admin.create_topic(topic)
    for name, expression in THREE.items():
        admin.create_subscription(topic, name, lock_duration=LOCK_SECONDS,
                                  max_delivery_count=10)
        if expression is not None:
            admin.delete_rule(topic, name, "$Default")
            admin.create_rule(topic, name, "r", filter=SqlRuleFilter(expression))


def three_subscriptions_trials(client: ServiceBusClient, admin: ServiceBusAdministrationClient,
                               n: int, size: int, meter: CpuMeter,
                               step: Callable[[str], None]) -> Phase:
    """``TRIALS`` runs of :func:`three_subscriptions_phase`, each on a topic
    of its own made for it: the trial of median rate."""
    runs = []
    for number in range(1, TRIALS + 1):
        topic = f"{TOPIC3}-{number}"
        step(f"trial {number} of {TRIALS}: topic with 3 subscriptions: publish {n:,}, drain "
             "with complete_message each")
        create_three_subscriptions(admin, topic)
        runs.append(three_subscriptions_phase(client, admin, topic, n, size, meter))
    return median_trial(runs)


def three_subscriptions_phase(client: ServiceBusClient, admin: ServiceBusAdministrationClient,
                              topic: str, n: int, size: int, meter: CpuMeter) -> Phase:
    """Publish ``n`` bucketed messages to ``topic`` (with 3 subscriptions), then
    drain them, one thread each: ``receive_messages(100)``, then
    ``complete_message`` each. Every message is settled twice (``all``, and
    ``low`` or ``high``): the rate counts settlements."""
    messages = bucket_messages(n, size)
    subs = [Subscription(topic, name, selected(messages, name),
                         client.get_subscription_receiver(topic, name), one_by_one=True)
            for name in THREE]
    publish(client.get_topic_sender(topic), messages, meter, "three_publish", "")
    with Timed(meter) as t:
        drain_in_threads(subs)
    checks = {s.name: subscription_check(admin, s) for s in subs}
    settled = sum(len(s.expected) for s in subs)
    # ``all`` settles half of the messages, ``low`` and ``high`` a quarter
    # each: once they are done, ``all``'s thread settles on alone, so its
    # one-by-one rate bounds the phase.
    drained = {s.name: round((s.drained_at or t.start + t.seconds) - t.start, 3) for s in subs}
    return Phase(
        "three_settle", f"topic with 3 subscriptions (all, two SQL halves): "
        f"receive_messages({ONE_BY_ONE_BATCH}) + complete_message each, a thread each",
        settled, t.seconds, cpu=t.cpu,
        check={"ok": all(c["ok"] for c in checks.values()), "subscriptions": checks},
        extra={"topic": topic, "published": n, "drained_s": drained,
               "settled": {s.name: len(s.expected) for s in subs}})


def paired_trials(client: ServiceBusClient, admin: ServiceBusAdministrationClient,
                  n: int, size: int, mode: str, meter: CpuMeter, step: Callable[[str], None]
                  ) -> tuple[list[dict[str, Phase]], float]:
    """``TRIALS`` pairs, each on entities of its own: the plain queue, then
    the topic with ten filtered subscriptions. Returns them, and the
    seconds the topic's setup took (the median of the trials')."""
    trials: list[dict[str, Phase]] = []
    setups: list[float] = []
    for number in range(1, TRIALS + 1):
        queue, topic = f"{QUEUE}-{number}", f"{TOPIC}-{number}"
        admin.create_queue(queue, lock_duration=LOCK_SECONDS, max_delivery_count=10)
        step(f"trial {number} of {TRIALS}: plain queue, {n:,} messages")
        trial = queue_phases(client, queue, n, size, meter)
        t0 = time.perf_counter()
        create_filtered_topic(admin, topic)
        setups.append(time.perf_counter() - t0)
        step(f"trial {number} of {TRIALS}: topic with {BUCKETS} filtered subscriptions: "
             f"publish {n:,}, drain ({mode})")
        trials.append(trial | topic_phases(client, admin, topic, n, size, mode, meter))
    return trials, sorted(setups)[len(setups) // 2]


#: each topic figure and the queue figure it is measured against
PAIRS = {"topic_publish": "queue_send", "topic_settle": "queue_settle"}


def median_pairs(trials: list[dict[str, Phase]]) -> dict[str, Phase]:
    """Of each pair of :data:`PAIRS`, the trial of median topic / queue
    ratio; every trial's figures go with it (``trials``)."""
    chosen: dict[str, Phase] = {}
    for topic_key, queue_key in PAIRS.items():
        def ratio(trial: dict[str, Phase], t: str = topic_key, q: str = queue_key) -> float:
            return trial[t].rate / trial[q].rate if trial[q].rate else 0.0
        median = sorted(trials, key=ratio)[len(trials) // 2]
        chosen[topic_key], chosen[queue_key] = median[topic_key], median[queue_key]
        chosen[topic_key].extra["trials"] = [
            {"topic": round(t[topic_key].rate, 1), "queue": round(t[queue_key].rate, 1),
             "ratio": round(ratio(t), 3)} for t in trials]
    return chosen


def queue_phases(client: ServiceBusClient, queue: str, n: int, size: int, meter: CpuMeter
                 ) -> dict[str, Phase]:
    """The plain queue of the same run: the same messages as the topic's
    (body size, message id and ``bucket`` property), sent and settled in the
    same lists and batches. Messages without the property, sent before,
    spared the client the encoding of application properties, a fifth of its
    time: the ratio then measured that, not what a topic costs."""
    messages = bucket_messages(n, size)
    sent, _ = publish(client.get_queue_sender(queue), messages, meter, "queue_send",
                      f"send_messages to a queue (lists of {CHUNK:,})")
    settled = settle_in_batches(client, queue, [m.message_id for m in messages], BATCH, meter)
    return {"queue_send": sent, "queue_settle": settled}


# ------------------------------------------------------------------ filters
def filter_rates(seconds: float, pool_size: int = 1_000) -> dict[str, float]:
    """Evaluations/s on one core of this bench's ``bucket = 3`` and of every
    filter of ``bench.filters``, with that module's pool and loop."""
    views = [MessageView(system, {**user, "bucket": n % BUCKETS})
             for n, (system, user) in enumerate(map(filters.message, range(pool_size)))]
    expressions = {"bucket = K (this bench)": "bucket = 3", **filters.FILTERS}
    return {label: filters.rate(seconds, len(views),
                                filters.evaluating(compile_filter(expr).matches, views))
            for label, expr in expressions.items()}


# ------------------------------------------------------------------- report
def render(result: dict[str, Any]) -> str:
    """The table: each topic figure beside the plain queue's of the same run."""
    ph = result["phases"]
    tp, ts = ph["topic_publish"], ph["topic_settle"]
    qp, qs = ph["queue_send"], ph["queue_settle"]
    broker = broker_label(result["broker"])
    m = result["machine"]
    lines = [
        "",
        f"Topics benchmark ({broker}, 1 engine worker); machine: {machine_label(m)}",
        f"{result['messages']:,} messages x {result['size']} B; topic with {BUCKETS} "
        f"subscriptions, SQL filter 'bucket = K' each (a tenth each); drain: {ts['drain']}"
        + (" (one receiver at a time)" if ts["drain"] == "sequential"
           else " (one thread per subscription)"),
        warm_line(result["broker_warm_up"]),
        "",
    ]
    head = (f"{'figure':<60} {'this project':>14}  {'plain queue same run':>20}  "
            f"{'ratio':>5}  {'target':<24} {'cores client/engine/broker':>26}")
    lines += [head, "-" * len(head)]

    def row(label: str, value: float, base: float | None, unit: str, cpu: dict[str, float],
            target: str = "") -> None:
        busy = "/".join(f"{cpu.get(k, 0):.2f}" for k in ("client", "engine", "broker")
                        ) if cpu else ""
        fmt = (lambda x: f"{x:,.0f} /s") if unit == "/s" else (lambda x: f"{x:.2f} s")
        ratio = f"{value / base:>5.2f}" if base else " " * 5
        lines.append(f"{label:<60} {fmt(value):>14}  {fmt(base) if base else '':>20}  "
                     f"{ratio}  {target:<24} {busy:>26}")

    def ratio_target(value: float, base: float) -> str:
        return _verdict(f">= {RATIO_TARGET} x queue", value / base / RATIO_TARGET)

    def trials_line(topic_phase: dict[str, Any]) -> None:
        shown = topic_phase.get("trials", [])
        if len(shown) > 1:
            lines.append(f"  {len(shown)} trials, topic / queue (the row: the median ratio): "
                         + ", ".join(f"{t['topic']:,.0f} / {t['queue']:,.0f} = {t['ratio']:.2f}"
                                     for t in shown))

    row(f"publish (send_messages, lists of {CHUNK:,})", tp["rate"], qp["rate"], "/s",
        tp["cpu_cores"], ratio_target(tp["rate"], qp["rate"]))
    trials_line(tp)
    row(f"settle across all subscriptions (receive {BATCH:,} + complete)", ts["rate"],
        qs["rate"], "/s", ts["cpu_cores"], ratio_target(ts["rate"], qs["rate"]))
    trials_line(ts)
    row("end of publishing -> every subscription drained", ts["publish_end_to_all_drained_s"],
        qs["seconds"], "s", {})
    if CLIENT_GC in ts["cpu_cores"] and CLIENT_GC in qs["cpu_cores"]:
        lines.append(f"  the client's garbage collections took {ts['cpu_cores'][CLIENT_GC]:.0%} "
                     f"of the drain, {qs['cpu_cores'][CLIENT_GC]:.0%} of the queue's settling "
                     "(every thread of the client waits through one)")
    lines.append("  (the drain includes the log scanner's filter evaluation: a message is "
                 "handed out only once its subscription's rules have been evaluated)")
    per = ts["drained_after_publish_s"]
    lines.append("  each subscription drained after publishing (s): "
                 + ", ".join(f"{s} {v:.2f}" for s, v in per.items()))
    three = ph.get("three_settle")
    if three is not None:
        row(f"3 subscriptions, complete_message each ({three['published']:,} published)",
            three["rate"], None, "/s", three["cpu_cores"],
            _verdict(f">= {THREE_TARGET:,} /s", three["rate"] / THREE_TARGET))
        drained = sorted((secs, name) for name, secs in three["drained_s"].items())
        (before, _), (last_s, last) = drained[-2], drained[-1]
        lines.append("  each subscription drained after (s): " + ", ".join(
            f"{name} {secs:.2f} ({three['settled'][name]:,} settled)"
            for name, secs in three["drained_s"].items())
            + f"; {last}'s thread settled alone for the last {last_s - before:.2f} s")
        lines.append(f"  {len(three['trials'])} trials, each on a topic of its own (the row: "
                     "the median): " + ", ".join(f"{r:,.0f}" for r in three["trials"]) + " /s")
        for name, c in three["check"]["subscriptions"].items():
            if not c.get("ok"):
                lines.append(f"WARNING: {three['topic']}/{name}: not exactly once: "
                             f"{json.dumps(c)}")
    checks = ts["check"]["subscriptions"]
    if ts["check"]["ok"] and qs["check"].get("ok"):
        lines.append(f"exactly-once: every subscription got exactly its {100 // BUCKETS}% "
                     f"({', '.join(str(c['settled']) for c in checks.values())}), none twice, "
                     "none of another bucket, none left; the queue likewise")
    else:
        for name, c in {**checks, "queue": qs["check"]}.items():
            if not c.get("ok"):
                lines.append(f"WARNING: {name}: not exactly once: {json.dumps(c)}")
    for number, trial_ok in enumerate(result.get("trials_ok", []), 1):
        if not trial_ok:
            lines.append(f"WARNING: trial {number}: not exactly once (its checks: the JSON's "
                         f"failed_trials.{number})")
    rates = result["filter_evaluations_per_s"]
    own = rates["bucket = K (this bench)"]
    slowest = min((r, label) for label, r in rates.items())
    verdict = ("met" if min(own, slowest[0]) >= filters.TARGET
               else f"MISSED: slowest {slowest[0] / filters.TARGET:.0%} of it")
    lines.append(f"filter evaluations/s, one core (bench.filters): 'bucket = K' {own:,.0f}/s; "
                 f"slowest of its set ({slowest[1]}) {slowest[0]:,.0f}/s; target "
                 f"{filters.TARGET:,}/s -> {verdict}")
    lines.append(f"setting up the topic ({1 + 3 * BUCKETS} admin calls, each waits for the "
                 f"engine to read it): {result['topic_setup_s']:.1f} s")
    lines.append("cores busy = CPU seconds / wall seconds of each process during the phase")
    return "\n".join(lines)


def _verdict(target: str, share: float) -> str:
    """``target: met``, or by how much it was missed."""
    return f"{target}: " + ("met" if share >= 1 else f"MISSED ({share:.0%})")


# --------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.topics")
    add_broker_argument(p)
    p.add_argument("--messages", type=int, default=20_000,
                   help="messages published to the topic and sent to the queue (default "
                        "20,000: 2,000 per subscription)")
    p.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    p.add_argument("--drain", choices=sorted(DRAINS), default="threads",
                   help="drain the subscriptions one thread each, or one after another "
                        "(default threads: as fast or a little faster, since receives of one "
                        "subscription overlap the engine's filtering of the others)")
    p.add_argument("--filter-seconds", type=float, default=0.5,
                   help="measuring time per filter of the evaluations/s line")
    p.add_argument("--output", type=Path, default=None,
                   help="JSON results (default bench/results/topics-kafka.json, "
                        "topics-tansu.json on Tansu)")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the broker and worker logs and the engine's data dir")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    output = args.output or results_path("topics", args.broker)
    work = Path(tempfile.mkdtemp(prefix="settlement-topics-"))
    started = time.monotonic()

    def step(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {msg}", flush=True)

    broker = new_broker(args.broker, work)
    phases: dict[str, Phase] = {}
    ok = False
    step(f"starting the {args.broker} broker; scratch dir {work}")
    try:
        with broker:
            conn = broker.connection_string(NAMESPACE)
            with EngineProcess(conn, work / "engine", timer_interval=0.5) as worker:
                meter = CpuMeter({"client": os.getpid(), "engine": worker.pid,
                                  "broker": broker_pid(broker)})
                with (ServiceBusAdministrationClient.from_connection_string(conn) as admin,
                      ServiceBusClient.from_connection_string(conn) as client):
                    admin.create_queue("warmup", lock_duration=LOCK_SECONDS,
                                       max_delivery_count=10)
                    assert worker.proc is not None
                    step(f"engine ready after {wait_for_engine(client, 'warmup', worker.proc):.1f}s"
                         "; warm-up")
                    create_warm_topic(admin)
                    warmed = warm_up(
                        meter.pids["broker"],
                        lambda i: warm_topic_round(client, conn, args.size, meter, i), step)
                    trials, setup_s = paired_trials(client, admin, args.messages, args.size,
                                                    args.drain, meter, step)
                    phases |= median_pairs(trials)
                    phases["three_settle"] = three_subscriptions_trials(
                        client, admin, args.messages // 4, args.size, meter, step)
                    warm_figures = warmed.as_dict()
        step("filter evaluations/s (bench.filters), broker stopped")
        trials_ok = [all(p.check.get("ok", True) for p in trial.values()) for trial in trials]
        result = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine_info(), "broker": args.broker, "broker_warm_up": warm_figures,
            "messages": args.messages, "size": args.size,
            "phases": {k: p.as_dict() for k, p in phases.items()},
            "topic_setup_s": round(setup_s, 2),
            "filter_evaluations_per_s": {k: round(v) for k, v in
                                         filter_rates(args.filter_seconds).items()},
            "filter_target_per_s": filters.TARGET,
            "exactly_once_ok": all(p.check.get("ok", True) for p in phases.values())
            and all(trials_ok),
            "trials_ok": trials_ok,
            "failed_trials": {str(number): {k: p.check for k, p in trial.items()}
                              for number, trial in enumerate(trials, 1)
                              if not trials_ok[number - 1]},
            "total_seconds": round(time.monotonic() - started, 1),
        }
        print(render(result), flush=True)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nwrote {output} (whole bench {result['total_seconds']}s)")
        ok = result["exactly_once_ok"]
    finally:
        if args.keep_logs or not ok:
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
