"""Sessions at scale beside a plain queue of the same run.

``python -m bench.sessions [--broker kafka|tansu] [--sessions 2000]
[--per-session 10] [--receivers 4] [--idle 100000] [--probes 200]``
(``make bench-sessions``) starts a broker and one engine worker, then
measures on that one broker:

1. a plain queue: the same number of messages (sessions x per-session) sent
   with ``send_messages`` in lists of 1,000, then drained by ``--receivers``
   threads, each doing ``receive_messages(per-session)`` +
   ``complete_messages`` (the same messages per round trip as a session
   receiver), and again with ``receive_messages(1000)`` (the plain queue's
   best);
2. a session queue (``requires_session=True``): ``--sessions`` sessions of
   ``--per-session`` messages, interleaved (the i-th message of every session,
   then the next), sent the same way. The engine's log scanner accepts each
   offset into its session: the bench waits until
   ``list_queue_sessions_runtime_properties`` lists every session with all of
   its messages (timed: end of sending to all accepted), then
   ``--receivers`` threads each loop: open a receiver on
   ``NEXT_AVAILABLE_SESSION`` (it locks the session whose oldest message
   waits longest), receive the session's messages, ``complete_messages``,
   leave the ``with`` (it releases the session), until no session is left.
   Every message must be completed exactly once, each session's in send
   order, and no session may be left listed. The clock stops at the last
   completion; messages/s and sessions/s are over it;
3. idle sessions: two session queues, each with ``--probes`` one-message
   sessions first and ``--idle`` messages after them that nobody receives:
   on one they are ``--idle`` one-message sessions, on the other one session
   of ``--idle`` messages. The logs are alike, so are the messages the
   engine tracks; only the number of sessions differs. The next available
   session is the one whose oldest message waits longest, so the probes
   come first. Rounds of 25 probe sessions alternate between the two queues,
   each opened, locked, received, completed and released (with a new
   receiver, whose log reader is new too); the p50 of each step is printed
   both ways. (The state machine alone:
   ``tests/test_session_window.py::test_idle_sessions_cost_a_command_nothing``.)

The issue's scale is ``--sessions 10000``; the default is 2,000 sessions
because on the embedded broker each command costs more the longer the run
(its broker's CPU per command grows with the records it holds), and 10,000
sessions there would take well over half an hour on two cores.

The engine's state size is the number of keys in its tables and the bytes
of their keys and values (the latest record of each key in the tables'
changelogs: what RocksDB holds once compacted; a read of its directory
beside the worker would miss what the memtables hold, as the worker writes
no write-ahead log), the size of its RocksDB directory (deletes shrink it
only after a compaction) and its resident memory, taken after each phase:
the plain queue's beside the session queue's. The table prints each figure beside the
plain queue's of the same run; the figures go to
``bench/results/sessions-kafka.json`` (``sessions-tansu.json`` on Tansu).
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
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

from bench.brokers import add_broker_argument, broker_label, broker_pid, new_broker, results_path
from bench.measure import (
    CpuMeter,
    EngineDurations,
    Phase,
    Timed,
    percentile,
    warm_line,
    warm_up,
)
from bench.run import (
    LOCK_SECONDS,
    check_exactly_once,
    machine_info,
    machine_label,
    make_messages,
    send,
    settle_batches_threads,
    wait_for_engine,
    warm_round,
)
from bench.scale import engine_footprint
from bench.topics import CHUNK, drain_in_threads, publish
from settlement import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from settlement.exceptions import OperationTimeoutError
from settlement.management import ServiceBusAdministrationClient
from settlement.testing._local_broker import free_port
from streams.process import EngineProcess
from topics import names, specs
from topics.connection import parse_connection_string
from topics.offsets import log_end_offsets, take

NAMESPACE = "benchsessions"
PLAIN, PLAIN_BEST, SESSIONS, FEW, CROWDED = "plain", "plain1000", "sessions", "few", "crowded"
WARM_SESSIONS = "warmsessions"
BEST_BATCH = 1000
ROUND = 25             # probe sessions per queue before switching to the other
SESSION_WAIT_S = 1.0   # max_wait_time of a NEXT_AVAILABLE_SESSION receiver
RECEIVE_WAIT_S = 0.2   # max_wait_time of a receive within a held session
ACCEPT_TIMEOUT_S = 600.0
STEPS = ("receiver", "lock", "receive", "complete", "release")
#: the engine's operations of a drained session, as its /metrics names them
#: (settlement_command_duration_seconds, by op), and what the bench calls them
ENGINE_OPS = {"lock_session": "lock", "settle": "settlements", "release_session": "release"}


# ------------------------------------------------------------ engine state
def engine_tables(worker: EngineProcess) -> dict[str, Any]:
    """The engine's state as its tables' changelogs hold it, the latest
    record of each key (a tombstone deletes it): ``keys``, ``bytes`` of keys
    and values, and ``by_entity``: the same per entity (a window's keys start
    ``ENTITY#PARTITION``), with the largest value. Not RocksDB's files: the
    worker writes no write-ahead log (streams/table_store.py), so a reader
    beside it sees only what its memtables flushed."""
    settings = parse_connection_string(worker.connection_string)
    topics = [names.table_changelog(settings.namespace, t) for t in specs.ENGINE_TABLES]
    consumer = Consumer(settings.consumer_config(f"bench-tables-{uuid.uuid4().hex}"))
    latest: dict[tuple[str, bytes], int] = {}  # (table, key) -> its value's length
    try:
        listed = consumer.list_topics(timeout=10).topics
        tps = [(t, p) for t in topics for p in listed[t].partitions]
        ends = {tp: end for tp, end in log_end_offsets(
            consumer, tps, exact=settings.profile.exact_list_offsets).items() if end > 0}
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in ends])
        while ends:
            for record in take(consumer, 10_000, 1.0):
                tp = (record.topic(), record.partition())
                if record.error() is not None or tp not in ends:
                    continue
                key, value = (record.topic(), record.key()), record.value()
                if value is None:
                    latest.pop(key, None)
                else:
                    latest[key] = len(value)
                if record.offset() + 1 >= ends[tp]:
                    del ends[tp]
    finally:
        consumer.close()
    by_entity: dict[str, dict[str, int]] = {}
    for (_, key), size in latest.items():
        entity = key.partition(b"#")[0].decode(errors="replace")
        tally = by_entity.setdefault(entity, {"keys": 0, "bytes": 0, "largest_value": 0})
        tally["keys"] += 1
        tally["bytes"] += len(key) + size
        tally["largest_value"] = max(tally["largest_value"], size)
    return {"keys": len(latest), "bytes": sum(t["bytes"] for t in by_entity.values()),
            "by_entity": by_entity}


def engine_state(worker: EngineProcess) -> dict[str, Any]:
    """Resident memory and RocksDB dir (bench.scale), and the tables' content."""
    tables = engine_tables(worker)
    return {**engine_footprint(worker), "keys": tables["keys"],
            "state_mb": round(tables["bytes"] / 1e6, 3), "by_entity": tables["by_entity"]}


# ------------------------------------------------------------- one session
class Laps:
    """Milliseconds between successive marks, by step."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._last = time.perf_counter()

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        self.ms[step] = (now - self._last) * 1000
        self._last = now


@dataclass
class Hold:
    """One session held by one receiver: what it got, and how long each step took."""

    session: str
    ids: list[str]
    settled: list[str]
    failures: list[str]
    ms: dict[str, float]


def hold_next_session(client: ServiceBusClient, queue: str, want: int) -> Hold | None:
    """Lock the next available session of ``queue``, receive up to ``want``
    of its messages, complete them and release it. None: no session became
    free within ``SESSION_WAIT_S``."""
    lap = Laps()
    receiver = client.get_queue_receiver(queue, session_id=NEXT_AVAILABLE_SESSION,
                                         max_wait_time=SESSION_WAIT_S)
    lap("receiver")
    try:
        receiver.__enter__()  # locks the session
    except OperationTimeoutError:
        receiver.close()
        return None
    lap("lock")
    with receiver:  # leaving it releases the session
        assert receiver.session is not None and receiver.session.session_id is not None
        msgs: list[Any] = []
        while len(msgs) < want:
            got = receiver.receive_messages(want - len(msgs), max_wait_time=RECEIVE_WAIT_S)
            if not got:
                break
            msgs += got
        lap("receive")
        results = receiver.complete_messages(msgs) if msgs else []
        lap("complete")
        session = receiver.session.session_id
    lap("release")
    return Hold(session, [m.message_id for m in msgs],
                [r.message.message_id for r in results if r.succeeded],
                [f"{r.message.message_id}: {r.error}" for r in results if not r.succeeded],
                lap.ms)


def step_figures(holds: list[Hold]) -> dict[str, dict[str, float]]:
    """p50 and p90 in ms of each step of ``holds``."""
    return {step: {"p50_ms": round(percentile([h.ms[step] for h in holds], 50), 2),
                   "p90_ms": round(percentile([h.ms[step] for h in holds], 90), 2)}
            for step in STEPS}


# ------------------------------------------------------------------- drain
@dataclass
class SessionDrain:
    """What the session receivers of one drain hold, got and settled, shared
    by their threads; stops ``timer`` at the last expected completion."""

    client: ServiceBusClient
    queue: str
    per_session: int
    expected: int
    timer: Timed
    lock: threading.Lock = field(default_factory=threading.Lock)
    holds: list[Hold] = field(default_factory=list)
    received: Counter[str] = field(default_factory=Counter)
    settled: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    order: dict[str, list[int]] = field(default_factory=dict)  # message numbers, as received
    #: completions so far, counted as they come (not summed again per session)
    completed: int = 0

    def add(self, hold: Hold) -> None:
        with self.lock:
            self.holds.append(hold)
            self.received.update(hold.ids)
            self.settled.update(hold.settled)
            self.completed += len(hold.settled)
            self.failures += hold.failures
            self.order.setdefault(hold.session, []).extend(
                int(i.rsplit("-", 1)[1]) for i in hold.ids)
            if self.completed + len(self.failures) >= self.expected:
                self.timer.stop()
            if len(self.holds) % 1000 == 0:
                print(f"    {len(self.holds):,} sessions held, "
                      f"{self.completed:,} messages completed", flush=True)


@dataclass
class SessionReceiverThread:
    """One of the drain's threads (run by ``bench.topics.drain_in_threads``):
    next available session after next, until none is left."""

    name: str
    drain_of: SessionDrain

    def drain(self) -> None:
        d = self.drain_of
        while (hold := hold_next_session(d.client, d.queue, d.per_session)) is not None:
            d.add(hold)


def session_messages(sessions: int, per_session: int, size: int) -> list[ServiceBusMessage]:
    """``per_session`` messages of each session ``s<k>``, interleaved: the
    i-th message of every session, then the next; ids ``s<k>-<i>``."""
    body = os.urandom(size)
    return [ServiceBusMessage(body, session_id=f"s{k}", message_id=f"s{k}-{i}")
            for i in range(per_session) for k in range(sessions)]


class ScanWatch:
    """How far the engine's log scanner has accepted each queue, as the
    window summaries on the state topic say, read from where the topic ended
    when the watch was made. Watching costs the engine nothing, where
    listing every session twice a second had it answer listings between
    accepting (100,000 sessions: accepted in 19.9 s with the listing, 18.3 s
    without, in two runs)."""

    def __init__(self, conn: str) -> None:
        self._settings = parse_connection_string(conn)
        self._consumer = Consumer(self._settings.consumer_config(f"bench-{uuid.uuid4().hex}"))
        topic = names.state(self._settings.namespace)
        count = len(self._consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        self._consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(count)])
        #: re-assigned by each reading of a log's end
        self._ends = Consumer(self._settings.consumer_config(f"bench-{uuid.uuid4().hex}"))
        self._scanned: dict[bytes, int] = {}

    def wait(self, queue: str, partitions: int, since: float) -> float:
        """Seconds from ``since`` (a ``perf_counter()``) until the scanner has
        accepted every partition of ``queue``'s log to its current end."""
        log_topic = names.entity_log(self._settings.namespace, queue)
        ends = log_end_offsets(self._ends, [(log_topic, p) for p in range(partitions)],
                               exact=self._settings.profile.exact_list_offsets)
        wanted = {f"{queue}#{p}".encode(): ends[(log_topic, p)] for p in range(partitions)}
        while any(self._scanned.get(key, -1) < end for key, end in wanted.items()):
            if time.perf_counter() - since > ACCEPT_TIMEOUT_S:
                raise RuntimeError(f"{queue}: accepted up to {self._scanned} after "
                                   f"{ACCEPT_TIMEOUT_S:.0f}s, not {wanted}")
            for record in take(self._consumer, 1000, 0.1):
                if record.error() is None and record.key() in wanted and record.value():
                    scanned = json.loads(record.value()).get("scanned")
                    if scanned is not None:
                        key = record.key()
                        self._scanned[key] = max(self._scanned.get(key, -1), scanned)
        return time.perf_counter() - since

    def close(self) -> None:
        self._consumer.close()
        self._ends.close()


def wait_for_sessions(admin: ServiceBusAdministrationClient, queue: str, sessions: int,
                      messages: int, since: float) -> tuple[float, int]:
    """Seconds from ``since`` (a ``perf_counter()``) until the engine lists
    ``sessions`` sessions holding ``messages`` active messages (its log
    scanner accepted every offset), and the sessions listed then."""
    while True:
        listed = admin.list_queue_sessions_runtime_properties(queue)
        active = sum(s.active_message_count for s in listed)
        if len(listed) >= sessions and active >= messages:
            return time.perf_counter() - since, len(listed)
        if time.perf_counter() - since > ACCEPT_TIMEOUT_S:
            raise RuntimeError(f"{queue}: {len(listed):,} sessions with {active:,} messages "
                               f"listed after {ACCEPT_TIMEOUT_S:.0f}s, not {sessions:,} with "
                               f"{messages:,}")
        time.sleep(0.5)


def session_check(admin: ServiceBusAdministrationClient, d: SessionDrain,
                  ids: list[str]) -> dict[str, Any]:
    """Every message completed once, each session's in send order, no
    session left listed."""
    check = check_exactly_once(ids, d.received, d.settled, len(d.failures))
    want = list(range(d.per_session))
    check["sessions_seen"] = len(d.order)
    check["sessions_out_of_order"] = sum(1 for got in d.order.values() if got != want)
    check["sessions_left_listed"] = len(admin.list_queue_sessions_runtime_properties(d.queue))
    check["ok"] = (check["ok"] and not check["sessions_out_of_order"]
                   and not check["sessions_left_listed"])
    if d.failures:
        check["failure_sample"] = d.failures[:3]
    return check


def session_phases(client: ServiceBusClient, admin: ServiceBusAdministrationClient,
                   worker: EngineProcess, args: argparse.Namespace, meter: CpuMeter,
                   state: dict[str, dict[str, float]], watch: ScanWatch,
                   durations: EngineDurations) -> dict[str, Phase]:
    """Send the sessions, wait until the engine holds them all, drain them
    with ``args.receivers`` threads of session receivers; ``durations``: the
    engine's time for each of the drain's commands, from its append to its
    answer."""
    messages = session_messages(args.sessions, args.per_session, args.size)
    total = len(messages)
    sent, t_send = publish(client.get_queue_sender(SESSIONS), messages, meter, "session_send",
                           f"send_messages to a session queue (lists of {CHUNK:,})")
    assert t_send.end is not None
    accept_s = watch.wait(SESSIONS, args.partitions, t_send.end)
    _, listed = wait_for_sessions(admin, SESSIONS, args.sessions, total, time.perf_counter())
    state["sessions_sent"] = {**engine_state(worker), "sessions_listed": listed}
    before = durations.totals()
    with Timed(meter) as t:
        drain = SessionDrain(client, SESSIONS, args.per_session, total, t)
        drain_in_threads([SessionReceiverThread(f"s{i}", drain)  # type: ignore[list-item]
                          for i in range(args.receivers)])
    in_engine = {op: durations.mean_ms_since(before, op) for op in ENGINE_OPS}
    state["sessions_drained"] = engine_state(worker)
    check = session_check(admin, drain, [m.message_id for m in messages])
    state["sessions_drained"]["sessions_listed"] = check["sessions_left_listed"]
    sessions_locked = len(drain.holds)
    settle = Phase("session_settle",
                   f"{args.receivers} threads x NEXT_AVAILABLE_SESSION: receive({args.per_session})"
                   " + complete_messages + release",
                   total, t.seconds, cpu=t.cpu, check=check,
                   extra={"sessions": args.sessions, "sessions_locked": sessions_locked,
                          "sessions_per_s": round(sessions_locked / t.seconds, 1),
                          "send_end_to_all_accepted_s": round(accept_s, 3),
                          "steps": step_figures(drain.holds),
                          "engine_mean_ms": {op: round(ms, 2) for op, ms in in_engine.items()
                                             if ms is not None}})
    return {"session_send": sent, "session_settle": settle}


def warm_sessions(client: ServiceBusClient, meter: CpuMeter, size: int) -> None:
    """A warm-up round's sessions: 200 of 5, drained as the phase drains them."""
    messages = session_messages(200, 5, size)
    with client.get_queue_sender(WARM_SESSIONS) as sender:
        for start in range(0, len(messages), CHUNK):
            sender.send_messages(messages[start:start + CHUNK])
    with Timed(meter) as t:
        drain = SessionDrain(client, WARM_SESSIONS, 5, len(messages), t)
        drain_in_threads([SessionReceiverThread(f"w{i}", drain)  # type: ignore[list-item]
                          for i in range(4)])


# ---------------------------------------------------------------- baseline
def plain_phases(client: ServiceBusClient, worker: EngineProcess, args: argparse.Namespace,
                 meter: CpuMeter, state: dict[str, dict[str, float]]) -> dict[str, Phase]:
    """The plain queue of the same run: the same messages sent the same way,
    drained by as many threads at the same count per receive, then (another
    queue) at receive(1000)."""
    total = args.sessions * args.per_session
    messages = make_messages("q", total, args.size)
    sent, _ = publish(client.get_queue_sender(PLAIN), messages, meter, "queue_send",
                      f"send_messages to a queue (lists of {CHUNK:,})")
    state["plain_sent"] = engine_state(worker)
    ids = [m.message_id for m in messages]
    settled = settle_batches_threads(client, PLAIN, ids, args.receivers, args.per_session,
                                     meter)
    state["plain_drained"] = engine_state(worker)
    settled.key, settled.label = "queue_settle", (
        f"{args.receivers} threads x receive({args.per_session}) + complete_messages")
    best_msgs = make_messages("b", total, args.size)
    send(client, PLAIN_BEST, best_msgs, CHUNK)
    best = settle_batches_threads(client, PLAIN_BEST, [m.message_id for m in best_msgs],
                                  args.receivers, BEST_BATCH, meter)
    best.key, best.label = "queue_settle_best", (
        f"{args.receivers} threads x receive({BEST_BATCH:,}) + complete_messages")
    return {"queue_send": sent, "queue_settle": settled, "queue_settle_best": best}


# ------------------------------------------------------------ idle sessions
def one_message_sessions(prefix: str, count: int, size: int) -> list[ServiceBusMessage]:
    body = os.urandom(size)
    return [ServiceBusMessage(body, session_id=f"{prefix}{k}", message_id=f"{prefix}{k}-0")
            for k in range(count)]


def idle_phase(client: ServiceBusClient, admin: ServiceBusAdministrationClient,
               worker: EngineProcess, args: argparse.Namespace,
               state: dict[str, dict[str, float]], watch: ScanWatch) -> dict[str, Any]:
    """The probe sessions' commands on a queue where ``args.idle`` messages
    wait in one session, and on one where they wait in as many sessions, in
    alternating rounds: the same log and the same messages, only the number
    of sessions differs."""
    probes = one_message_sessions("p", args.probes, args.size)
    probe_body = b"".join(probes[0].body)
    behind = {FEW: [ServiceBusMessage(probe_body, session_id="bulk", message_id=f"bulk-{i}")
                    for i in range(args.idle)],
              CROWDED: one_message_sessions("i", args.idle, args.size)}
    accept_s = {}
    for queue, sessions in ((FEW, 1), (CROWDED, args.idle)):
        send(client, queue, probes + behind[queue], CHUNK)
        accept_s[queue] = watch.wait(queue, args.partitions, time.perf_counter())
        wait_for_sessions(admin, queue, args.probes + sessions, args.probes + args.idle,
                          time.perf_counter())  # listed as the engine accepted them
    state["idle_sent"] = engine_state(worker)
    deep = state["idle_sent"]["by_entity"].get(FEW, {})
    holds: dict[str, list[Hold]] = {FEW: [], CROWDED: []}
    for first in range(0, args.probes, ROUND):
        for queue in (FEW, CROWDED):
            for _ in range(min(ROUND, args.probes - first)):
                hold = hold_next_session(client, queue, 1)
                if hold is not None:
                    holds[queue].append(hold)
    probe_ids = [m.message_id for m in probes]
    checks = {q: check_exactly_once(probe_ids, Counter(i for h in hs for i in h.ids),
                                    Counter(i for h in hs for i in h.settled),
                                    sum(len(h.failures) for h in hs))
              for q, hs in holds.items()}
    for queue, sessions in ((FEW, 1), (CROWDED, args.idle)):
        left = admin.list_queue_sessions_runtime_properties(queue)
        checks[queue]["sessions_left"] = len(left)
        checks[queue]["messages_left"] = sum(s.active_message_count for s in left)
        checks[queue]["ok"] = (checks[queue]["ok"] and len(left) == sessions
                               and checks[queue]["messages_left"] == args.idle)
    return {"idle_messages": args.idle, "probes": args.probes,
            "send_end_to_all_accepted_s": {q: round(v, 3) for q, v in accept_s.items()},
            "one_session_queue_kept": deep,
            "few": step_figures(holds[FEW]), "crowded": step_figures(holds[CROWDED]),
            "check": checks, "ok": all(c["ok"] for c in checks.values())}


# ------------------------------------------------------------------- report
def table(head: tuple[str, ...], rows: list[tuple[str, ...]], widths: tuple[int, ...]
          ) -> list[str]:
    """Rows under a header and a rule: the first column left-aligned, the
    others right-aligned, each ``widths[i]`` wide."""
    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()
    top = line(head)
    return [top, "-" * len(top)] + [line(r) for r in rows]


def beside(label: str, p: dict[str, Any], base: dict[str, Any]) -> tuple[str, ...]:
    """A rate row: the phase ``p`` beside the plain queue's ``base``."""
    busy = "/".join(f"{p['cpu_cores'].get(k, 0):.2f}" for k in ("client", "engine", "broker"))
    ratio = p["rate"] / base["rate"] if base["rate"] else None
    return (label, f"{p['rate']:,.0f} /s", f"{base['rate']:,.0f} /s",
            "" if ratio is None else f"{ratio:.{2 if ratio >= 0.1 else 3}f}", busy)


def render(result: dict[str, Any]) -> str:
    """Each session figure beside the plain queue's of the same run, then the
    idle sessions' commands beside those of one session holding as many messages."""
    ph, st, m = result["phases"], result["engine_state"], result["machine"]
    qs, qb, qp = ph["queue_settle"], ph["queue_settle_best"], ph["queue_send"]
    ss, sp = ph["session_settle"], ph["session_send"]
    broker = broker_label(result["broker"])
    e2e = ss["messages"] / (sp["seconds"] + ss["send_end_to_all_accepted_s"] + ss["seconds"])
    e2e_q = qs["messages"] / (qp["seconds"] + qs["seconds"])
    rows = [
        beside(f"send (send_messages, lists of {CHUNK:,})", sp, qp),
        ("end of sending -> every session accepted by the scanner",
         f"{ss['send_end_to_all_accepted_s']:.2f} s", "(not scanned)", "", ""),
        beside(f"drain: {result['receivers']} threads, receive({result['per_session']}) + "
               "complete_messages", ss, qs),
        beside(f"  the same, plain queue at receive({BEST_BATCH:,})", ss, qb),
        ("sessions/s (lock + receive + complete + release)", f"{ss['sessions_per_s']:,.0f} /s",
         "", "", ""),
        ("end to end: send + accept + drain", f"{e2e:,.0f} /s", f"{e2e_q:,.0f} /s",
         f"{e2e / e2e_q:.2f}", ""),
    ]
    for when, mine, base in (("after sending", "sessions_sent", "plain_sent"),
                             ("after draining", "sessions_drained", "plain_drained")):
        for key, what, fmt in (("keys", "keys in its tables", "{:,.0f}"),
                               ("state_mb", "their keys and values", "{:,.2f} MB"),
                               ("tables_mb", "RocksDB dir", "{:,.1f} MB"),
                               ("rss_mb", "resident memory", "{:,.1f} MB")):
            rows.append((f"engine state {when}: {what}", fmt.format(st[mine][key]),
                         fmt.format(st[base][key]), "", ""))
    rows.append(("  sessions listed by the engine", f"{st['sessions_sent']['sessions_listed']:,}"
                 f" -> {st['sessions_drained']['sessions_listed']:,}", "", "", ""))
    steps = ss["steps"]
    per_session = sum(steps[s]["p50_ms"] for s in STEPS)
    lines = ["", f"Sessions benchmark ({broker}, 1 engine worker); machine: {machine_label(m)}; "
             "load average at the end "
             + " ".join(f"{x:.2f}" for x in result["load_average"]),
             f"{ss['sessions']:,} sessions x {result['per_session']} messages of "
             f"{result['size']} B = {ss['messages']:,}; {result['receivers']} receiver threads; "
             f"{result['partitions']} partition(s)", warm_line(result["broker_warm_up"]), ""]
    lines += table(("figure", "sessions", "plain queue same run", "ratio",
                    "cores client/engine/broker"), rows, (58, 14, 20, 5, 26))
    lines.append("  one session, p50 (p90) ms: " + ", ".join(
        f"{s} {steps[s]['p50_ms']:.1f} ({steps[s]['p90_ms']:.1f})" for s in STEPS)
        + f"; p50s add up to {per_session:.0f} ms: {result['receivers']} threads -> "
        f"~{result['receivers'] * 1000 / per_session:.0f} sessions/s")
    lines.append("  ('receiver' is get_queue_receiver: a read on of the entity registry; "
                 "'lock' locks the session with its first messages and reads them from the "
                 "log, so 'receive' hands out what the lock got; 'complete' and 'release' "
                 "wait for Kafka, not for the engine)")
    checks = {"sessions": ss["check"], PLAIN: qs["check"], PLAIN_BEST: qb["check"]}
    if all(c.get("ok") for c in checks.values()):
        lines.append(f"exactly-once: every message completed once, each of the "
                     f"{ss['sessions']:,} sessions' in send order, no session left; "
                     "the plain queues likewise")
    lines += [f"WARNING: {name}: not exactly once: {json.dumps(c)}"
              for name, c in checks.items() if not c.get("ok")]
    idle, acc = result["idle"], result["idle"]["send_end_to_all_accepted_s"]
    n = idle["idle_messages"]
    lines += ["", f"idle sessions: {idle['probes']:,} one-message sessions held in turn "
              f"(NEXT_AVAILABLE_SESSION) before {n:,} messages nobody receives, in {n:,} "
              f"sessions or in one (the same log); accepted {acc[CROWDED]:.1f} s / "
              f"{acc[FEW]:.1f} s after sending; engine then {st['idle_sent']['keys']:,} keys, "
              f"{st['idle_sent']['tables_mb']:.1f} MB RocksDB, "
              f"{st['idle_sent']['rss_mb']:.1f} MB resident", ""]
    figures = [(s, idle["crowded"][s], idle["few"][s]) for s in STEPS]
    lines += table(("step, p50 (p90) ms", f"{n:,} idle sessions", "1 idle session", "ratio"),
                   [(s, f"{a['p50_ms']:.2f} ({a['p90_ms']:.2f})",
                     f"{b['p50_ms']:.2f} ({b['p90_ms']:.2f})",
                     f"{a['p50_ms'] / b['p50_ms']:.2f}" if b["p50_ms"] else "")
                    for s, a, b in figures], (34, 20, 18, 5))
    if not idle["ok"]:
        lines.append(f"WARNING: idle sessions: {json.dumps(idle['check'])}")
    if result["broker"] == "kafka":
        lines += ["", *targets(result)]
    lines.append("cores busy = CPU seconds / wall seconds of each process during the phase")
    return "\n".join(lines)


def _judged(what: str, measured: float, goal: float, unit: str, *, at_most: bool = False
            ) -> str:
    met = measured <= goal if at_most else measured >= goal
    share = measured / goal
    verdict = "met" if met else (f"MISSED: {share:.2f}x the limit" if at_most
                                 else f"MISSED: {share:.1%} of it" if share > 0.99
                                 else f"MISSED: {share:.0%} of it")
    sign = "<=" if at_most else ">="
    return f"  {what} {sign} {goal:,.0f}{unit}: {measured:,.1f}{unit} -> {verdict}"


#: the sessions of issue 25's "<= 2 MB on disk after sending 2,000 sessions x 10"
SESSIONS_PER_2_MB = 2_000


def targets(result: dict[str, Any]) -> list[str]:
    """Issue 25's targets for this run, each met or missed by how much."""
    ss, st = result["phases"]["session_settle"], result["engine_state"]
    sessions = ss["sessions"]
    # what the session queue added to the engine's tables: the plain queues'
    # phases left theirs (their commands' answers) before it
    keys = (st["sessions_sent"]["keys"] - st["plain_drained"]["keys"]) / sessions
    grown = st["sessions_sent"]["state_mb"] - st["plain_drained"]["state_mb"]
    lines = [f"targets (issue 25) on Apache Kafka, {sessions:,} sessions x "
             f"{result['per_session']}, {result['receivers']} receivers:",
             _judged("drained", ss["messages"] / ss["seconds"], 2000, " msg/s"),
             _judged("sessions drained", ss["sessions_per_s"], 200, " /s"),
             _judged("keys per session after sending", keys, 3, "", at_most=True),
             # the 2 MB is for 2,000 sessions: state that grows with
             # the sessions, not their messages, may grow as many times more
             _judged(f"engine tables grown by sending them (2 MB per {SESSIONS_PER_2_MB:,} "
                     "sessions)", grown, 2 * sessions / SESSIONS_PER_2_MB, " MB", at_most=True)
             + f" (their keys and values; RocksDB dir {st['plain_drained']['tables_mb']:.1f}"
             f" -> {st['sessions_sent']['tables_mb']:.1f} MB)"]
    if sessions >= 10_000:
        lines.append(_judged(f"{sessions:,} sessions drained in", ss["seconds"], 120, " s",
                             at_most=True))
    idle = result["idle"]
    lines.append(_judged(f"{idle['idle_messages']:,} new sessions accepted in",
                         idle["send_end_to_all_accepted_s"][CROWDED], 10, " s", at_most=True)
                 + " (the scanner's progress, as the engine's state topic says; listed "
                 "once after)")
    deep = idle["one_session_queue_kept"]
    lines.append(_judged(f"{idle['idle_messages']:,} messages in one session: all the engine "
                         "keeps of their queue", deep["bytes"] / 1e6, 1, " MB", at_most=True)
                 + f" ({deep['keys']:,} keys, the largest value {deep['largest_value']:,} B; "
                 f"with the {idle['probes']:,} probe sessions before them)")
    lines.append(drain_bound(ss, result["machine"]["cores"]))
    return lines


def drain_bound(ss: dict[str, Any], cores: int) -> str:
    """What bounds the session drain ``ss`` (its phase as stored): the steps
    of a session, the engine's share of them where the run measured it, and
    the cores busy."""
    steps, busy = ss["steps"], ss["cpu_cores"]
    whole = sum(steps[s]["p50_ms"] for s in STEPS)
    # results stored before the engine's share was measured have none
    in_engine = ss.get("engine_mean_ms", {})
    engine = ""
    if "lock_session" in in_engine:
        engine = ("; the engine's time from a command's append to its answer, mean: "
                  + ", ".join(f"{what} {in_engine[op]:.1f} ms" for op, what in ENGINE_OPS.items()
                              if op in in_engine)
                  + " (settlements and releases are sent quiet: the engine holds them "
                  "a few ms for more to join them, and applies them in the batch of the "
                  "next command somebody waits for)")
    return (f"    what bounds the drain: a receiver's session takes {whole:.0f} ms (p50s), "
            f"{steps['lock']['p50_ms']:.1f} ms of them the lock, an engine round trip "
            "(the command's append, the engine's read, its batch, its commit record's "
            f"acknowledgement, the answer's read){engine}; the machine's cores are "
            f"{sum(busy.values()):.2f} of {cores} busy (client/engine/"
            f"broker {busy.get('client', 0):.2f}/{busy.get('engine', 0):.2f}/"
            f"{busy.get('broker', 0):.2f}). A session's commands rewrite the chunk of 128 "
            "entries of each of its messages, which lie apart in the log")


# --------------------------------------------------------------------- main
#: the bench's numeric options: default and what it counts
SIZES = {"sessions": (2_000, "sessions of the session queue (the issue's scale: 10,000)"),
         "per-session": (10, "messages per session"),
         "receivers": (4, "receiver threads of each drain"),
         "idle": (100_000, "messages nobody receives behind the probes of the idle phase"),
         "probes": (200, "one-message sessions held on each queue of the idle phase"),
         "partitions": (1, "partition_count of every queue"),
         "size": (1024, "body bytes")}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.sessions",
                                description=__doc__.split("\n")[0])
    add_broker_argument(p)
    p.add_argument("--output", type=Path, help="JSON results (default "
                   "bench/results/sessions-kafka.json; sessions-tansu.json on Tansu)")
    for name, (default, what) in SIZES.items():
        p.add_argument(f"--{name}", type=int, default=default,
                       help=f"{what} (default {default:,})")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the scratch dir: broker and worker logs, the engine's tables")
    return p.parse_args(argv)


@contextmanager
def running(kind: str, work: Path
            ) -> Iterator[tuple[str, EngineProcess, CpuMeter, EngineDurations]]:
    """A broker of ``kind`` and one engine worker: the connection string, the
    worker, a meter of the client's, engine's and broker's CPU, and the
    worker's own account of its commands' time (its /metrics)."""
    with new_broker(kind, work) as broker:
        conn = broker.connection_string(NAMESPACE)
        port = free_port("127.0.0.1")
        with EngineProcess(conn, work / "engine", timer_interval=0.5,
                           env={"SETTLEMENT_METRICS_PORT": str(port)}) as worker:
            yield conn, worker, CpuMeter({"client": os.getpid(), "engine": worker.pid,
                                          "broker": broker_pid(broker)}), EngineDurations(port)


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every phase on one broker and engine; the result to print and store."""
    started = time.monotonic()

    def step(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {msg}", flush=True)

    phases: dict[str, Phase] = {}
    state: dict[str, dict[str, float]] = {}
    total = args.sessions * args.per_session
    step(f"starting the {args.broker} broker; scratch dir {work}")
    with (running(args.broker, work) as (conn, worker, meter, durations),
          ServiceBusAdministrationClient.from_connection_string(conn) as admin,
          ServiceBusClient.from_connection_string(conn) as client):
        for queue in ("warmup", PLAIN, PLAIN_BEST, WARM_SESSIONS, SESSIONS, FEW, CROWDED):
            admin.create_queue(queue, requires_session=queue in (WARM_SESSIONS, SESSIONS, FEW,
                                                                 CROWDED),
                               lock_duration=LOCK_SECONDS, max_delivery_count=10,
                               partition_count=args.partitions)
        assert worker.proc is not None
        step(f"engine ready after {wait_for_engine(client, 'warmup', worker.proc):.1f}s"
             "; warm-up")
        watch = ScanWatch(conn)

        def one_round(number: int) -> None:
            warm_round(client, conn, "warmup", args.size, meter, number)
            warm_sessions(client, meter, args.size)

        warmed = warm_up(meter.pids["broker"], one_round, step)
        state["start"] = engine_state(worker)
        step(f"plain queue: {total:,} messages, twice")
        phases |= plain_phases(client, worker, args, meter, state)
        step(f"session queue: {args.sessions:,} sessions x {args.per_session}")
        phases |= session_phases(client, admin, worker, args, meter, state, watch,
                                 durations)
        step(f"idle sessions: {args.probes:,} probes before {args.idle:,} messages, in "
             f"{args.idle:,} sessions or in one")
        idle = idle_phase(client, admin, worker, args, state, watch)
        watch.close()
        warm_figures = warmed.as_dict()
    return {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(), "load_average": os.getloadavg(), "broker": args.broker,
        "broker_warm_up": warm_figures, "per_session": args.per_session, "size": args.size,
        "receivers": args.receivers, "partitions": args.partitions,
        "phases": {k: p.as_dict() for k, p in phases.items()},
        "engine_state": state, "idle": idle,
        "exactly_once_ok": all(p.check.get("ok", True) for p in phases.values()) and idle["ok"],
        "total_seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    work = Path(tempfile.mkdtemp(prefix="settlement-sessions-"))
    result: dict[str, Any] = {}
    try:
        result = measure(args, work)
    finally:
        if result.get("exactly_once_ok") and not args.keep_logs:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"scratch dir kept: {work}", file=sys.stderr)
    print(render(result), flush=True)
    output = args.output or results_path("sessions", args.broker)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {output} (whole bench {result['total_seconds']}s)")
    return 0 if result["exactly_once_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
