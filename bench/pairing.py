"""Paired namespaces for send availability: what a paired sender costs while
its primary is healthy, how it carries on while the primary is paused, and
how long the way back takes.

``python -m bench.pairing [--broker kafka|tansu] [--calls 1000]
[--batch-calls 100] [--failover-interval 2]`` (``make bench-pairing``)
starts two brokers of the chosen kind (Apache Kafka single nodes by
default, or Tansu), each with its own engine worker: the primary namespace
``benchprimary`` and the secondary ``benchsecondary``. A client paired with
the secondary (``SendAvailabilityPairedNamespaceOptions(secondary,
failover_interval=...)``, 10 backlog queues) sends to the queue ``orders`` of
the primary, one message per ``send_messages`` call and in lists of 100, in
three stretches:

1. healthy: the paired client beside an unpaired client sending to another
   queue of the same broker and beside raw confluent-kafka produce to a
   topic of it (the sender's producer settings: acks=all, idempotent,
   linger.ms=2; a call waits for its delivery reports), in rounds that
   alternate the three;
2. paused: SIGSTOP of the primary broker's process. The first call waits
   for the failover interval, then fails over (the failover time); the
   rest go straight to a backlog queue of the secondary. Beside them, in the
   same rounds, the unpaired client and raw produce on the secondary, where
   the backlog is;
3. back: a second client, with ``enable_syphon=True`` (as a receiver would
   have it), is created, then SIGCONT. The paired client sends a message
   every 50 ms until its probe sees the primary answer and its sends go
   there again (the time from SIGCONT), then one call of one message and
   one of 100 to the primary. Meanwhile the syphon moves the backlog to the
   primary: the time from SIGCONT until it took every backlog message
   (and the backlog queues count none), and its rate from its first batch
   moved to its last.

Then every message the paired client sent is received from the primary
(``receive_messages(1000)`` + ``complete_messages``, the syphon client's
receiver) and must be there exactly once, with none left in the backlog.
Throughput is messages over the summed durations of back-to-back calls;
p50/p99 are per call. The table prints each figure beside the baselines of
the same run; the figures go to ``bench/results/pairing-kafka.json``
(``pairing-tansu.json`` on Tansu).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.brokers import add_broker_argument, broker_label, broker_pid, new_broker, results_path
from bench.measure import CpuMeter, percentile
from bench.run import (
    LOCK_SECONDS,
    machine_info,
    machine_label,
    settle_in_batches,
    wait_for_engine,
)
from bench.sessions import table
from settlement import (
    SendAvailabilityPairedNamespaceOptions,
    ServiceBusClient,
    ServiceBusMessage,
)
from settlement.management import ServiceBusAdministrationClient
from settlement.pairing import backlog_queue_names
from settlement.testing.apache_kafka import KafkaCluster
from settlement.testing.embedded import EmbeddedBroker
from settlement.testing.pause import pause, resume
from streams.process import EngineProcess

PRIMARY, SECONDARY = "benchprimary", "benchsecondary"
QUEUE, DIRECT = "orders", "direct"
BACKLOG_QUEUES = 10
PER_BATCH = 100
ROUNDS = 4                 # each stretch alternates its senders this many times
RESEND_EVERY_S = 0.05      # sends after SIGCONT, until they go to the primary again
SWITCH_BACK_TIMEOUT_S = 120.0
SYPHON_TIMEOUT_S = 600.0
SENDERS = ("paired", "unpaired", "raw")
SLOW_MS = 100.0            # a call this long is counted apart

Send = Callable[[list[ServiceBusMessage]], None]


# ------------------------------------------------------------------ clusters
@dataclass
class Cluster:
    """One broker of the bench's kind with its own engine worker."""

    broker: EmbeddedBroker | KafkaCluster
    engine: EngineProcess

    @property
    def conn(self) -> str:
        return self.engine.connection_string

    @property
    def pid(self) -> int:
        """The broker's process: what SIGSTOP pauses."""
        return broker_pid(self.broker)

    def pause(self) -> float:
        """SIGSTOP the broker; seconds until every thread of it has stopped."""
        return pause(self.pid)


@contextmanager
def cluster(kind: str, work: Path, namespace: str) -> Iterator[Cluster]:
    work.mkdir(parents=True)
    with (new_broker(kind, work) as broker,
          EngineProcess(broker.connection_string(namespace), work / "engine",
                        timer_interval=0.5) as engine):
        yield Cluster(broker, engine)


class RawSender:
    """confluent-kafka on a fresh topic of one broker, with the settlement
    sender's producer settings; a call produces its records and waits for
    their delivery reports, as ``send_messages`` does."""

    def __init__(self, bootstrap: str, size: int) -> None:
        self.topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(self.topic, 1, 1)])[self.topic].result(15)
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                  "enable.idempotence": True, "linger.ms": 2,
                                  "compression.type": "none", "batch.num.messages": 10_000})
        self.payload = os.urandom(size)

    def send_messages(self, messages: list[ServiceBusMessage]) -> None:
        waiting = [len(messages)]
        errors: list[Any] = []

        def delivered(err: Any, _msg: Any) -> None:
            waiting[0] -= 1
            if err is not None:
                errors.append(err)

        for m in messages:
            self.producer.produce(self.topic, self.payload, key=str(m.message_id).encode(),
                                  on_delivery=delivered)
        while waiting[0]:
            self.producer.poll(0.05)
        if errors:
            raise RuntimeError(f"raw produce failed: {errors[0]}")

    def close(self) -> None:
        """Flush and drop the producer (before its broker stops: it would
        log every failed reconnect)."""
        self.producer.flush(10)
        del self.producer


# ------------------------------------------------------------------ calls
class Messages:
    """Messages with ids unique in the run; keeps those the paired client sent."""

    def __init__(self, size: int) -> None:
        self.body = os.urandom(size)
        self.made = 0
        self.paired: list[str] = []

    def next(self, sender: str, count: int) -> list[ServiceBusMessage]:
        batch = [ServiceBusMessage(self.body, message_id=f"{sender}-{self.made + i}")
                 for i in range(count)]
        self.made += count
        if sender == "paired":
            self.paired += [str(m.message_id) for m in batch]
        return batch


@dataclass
class Calls:
    """How long each call of one sender took, at one size of call."""

    per_call: int
    seconds: list[float] = field(default_factory=list)

    def timed(self, send: Send, messages: list[ServiceBusMessage]) -> float:
        t0 = time.perf_counter()
        send(messages)
        self.seconds.append(time.perf_counter() - t0)
        return self.seconds[-1]

    def figures(self) -> dict[str, Any]:
        ms = [s * 1000 for s in self.seconds]
        busy = sum(self.seconds)
        return {"calls": len(ms), "per_call": self.per_call,
                "rate": round(self.per_call * len(ms) / busy, 1) if busy else 0.0,
                "p50_ms": round(percentile(ms, 50), 2), "p99_ms": round(percentile(ms, 99), 2),
                "max_ms": round(max(ms), 2) if ms else None,
                "slow_calls": sum(x > SLOW_MS for x in ms)}


def rounds(senders: dict[str, Send], messages: Messages, per_call: int, calls: int
           ) -> dict[str, dict[str, Any]]:
    """``calls`` back-to-back calls of ``per_call`` messages per sender, in
    ``ROUNDS`` rounds that alternate the senders; the figures of each."""
    timed = {name: Calls(per_call) for name in senders}
    for r in range(ROUNDS):
        for name, send in senders.items():
            for _ in range(calls // ROUNDS + (r < calls % ROUNDS)):
                timed[name].timed(send, messages.next(name, per_call))
    return {name: c.figures() for name, c in timed.items()}


def stretch(senders: dict[str, Send], messages: Messages, args: argparse.Namespace
            ) -> dict[str, dict[str, dict[str, Any]]]:
    """One message per call, then lists of ``PER_BATCH``: per size, per sender."""
    return {"single": rounds(senders, messages, 1, args.calls),
            "batch": rounds(senders, messages, PER_BATCH, args.batch_calls)}


# ------------------------------------------------------------------ the run
def backlog_left(admin: ServiceBusAdministrationClient) -> int:
    return sum(admin.get_queue_runtime_properties(q).active_message_count
               for q in backlog_queue_names(PRIMARY, BACKLOG_QUEUES))


def until(condition: Callable[[], bool], since: float, timeout: float, what: str,
          every: float = 0.01, meanwhile: Callable[[], None] | None = None) -> float:
    """Seconds from ``since`` (a ``perf_counter()``) until ``condition()``
    holds, calling ``meanwhile`` between checks."""
    while not condition():
        if time.perf_counter() - since > timeout:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        if meanwhile is not None:
            meanwhile()
        time.sleep(every)
    return time.perf_counter() - since


def way_back(paired: ServiceBusClient, send: Send, messages: Messages, primary: Cluster,
             syphon_client: ServiceBusClient, secondary: ServiceBusAdministrationClient,
             meter: CpuMeter) -> dict[str, Any]:
    """SIGCONT, then: when sends go to the primary again, and when the
    syphon has moved the whole backlog there."""
    assert paired._pairing is not None and syphon_client._pairing is not None
    route = paired._pairing.route("queue", QUEUE)  # what the client did, from its pairing
    syphon = syphon_client._pairing._syphon
    assert syphon is not None
    at_resume = route.sent_to_backlog
    next_send = [0.0]

    def keep_sending() -> None:
        if time.perf_counter() >= next_send[0]:
            send(messages.next("paired", 1))
            next_send[0] = time.perf_counter() + RESEND_EVERY_S

    cpu0 = meter.snapshot()
    resume(primary.pid)
    resumed = time.perf_counter()
    back_s = until(lambda: not route.to_backlog, resumed, SWITCH_BACK_TIMEOUT_S,
                   "sends back on the primary", every=0.005, meanwhile=keep_sending)
    after_resume = route.sent_to_backlog - at_resume
    first, hundred = Calls(1), Calls(PER_BATCH)
    first.timed(send, messages.next("paired", 1))
    hundred.timed(send, messages.next("paired", PER_BATCH))
    total = route.sent_to_backlog
    first_move: list[float] = []

    def all_moved() -> bool:
        done = syphon.moved + syphon.skipped
        if done and not first_move:
            first_move.append(time.perf_counter())
        return done >= total

    moved_s = until(all_moved, resumed, SYPHON_TIMEOUT_S, "the syphon moving the backlog")
    cpu1 = meter.snapshot()
    moving_s = resumed + moved_s - first_move[0]
    empty_s = until(lambda: backlog_left(secondary) == 0, resumed, 60,
                    "the backlog queues counting none", every=0.2)
    return {
        "to_backlog_while_paused": at_resume, "to_backlog_after_sigcont": after_resume,
        "to_backlog": total, "failovers": route.failovers,
        "sigcont_to_sends_on_primary_s": round(back_s, 3),
        "first_call_on_primary_ms": round(first.seconds[0] * 1000, 2),
        "call_of_100_on_primary_ms": round(hundred.seconds[0] * 1000, 2),
        "to_backlog_after_switch": route.sent_to_backlog - total,
        "sigcont_to_first_moved_s": round(first_move[0] - resumed, 3),
        "sigcont_to_all_moved_s": round(moved_s, 3),
        "sigcont_to_backlog_counted_empty_s": round(empty_s, 3),
        "syphon_moved": syphon.moved, "syphon_skipped_already_there": syphon.skipped,
        "syphon_rate": round((syphon.moved + syphon.skipped) / moving_s, 1) if moving_s else 0.0,
        "cpu_cores_until_all_moved": CpuMeter.usage(cpu0, cpu1, moved_s),
    }


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    started = time.monotonic()

    def step(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {msg}", flush=True)

    messages = Messages(args.size)
    interval = dt.timedelta(seconds=args.failover_interval)
    step(f"starting two {args.broker} brokers, an engine worker each; scratch dir {work}")
    with ExitStack() as stack:
        secondary = stack.enter_context(cluster(args.broker, work / "secondary", SECONDARY))
        primary = stack.enter_context(cluster(args.broker, work / "primary", PRIMARY))
        for c, queues in ((primary, (QUEUE, DIRECT)), (secondary, (DIRECT,))):
            with (ServiceBusAdministrationClient.from_connection_string(c.conn) as admin,
                  ServiceBusClient.from_connection_string(c.conn) as client):
                for queue in queues:
                    admin.create_queue(queue, lock_duration=LOCK_SECONDS, max_delivery_count=10)
                assert c.engine.proc is not None
                wait_for_engine(client, DIRECT, c.engine.proc)
        step("engines ready; pairing a client (finds or creates the backlog queues)")
        t0 = time.perf_counter()
        paired = stack.enter_context(ServiceBusClient.from_connection_string(
            primary.conn, paired_namespace=SendAvailabilityPairedNamespaceOptions(
                secondary.conn, backlog_queue_count=BACKLOG_QUEUES, failover_interval=interval)))
        pairing_s = time.perf_counter() - t0
        sender = paired.get_queue_sender(QUEUE)
        direct = {name: stack.enter_context(ServiceBusClient.from_connection_string(c.conn))
                  .get_queue_sender(DIRECT) for name, c in (("primary", primary),
                                                            ("secondary", secondary))}
        raw = {name: RawSender(c.broker.bootstrap, args.size)
               for name, c in (("primary", primary), ("secondary", secondary))}
        for r in raw.values():
            stack.callback(r.close)
        senders = {"primary": {"paired": sender.send_messages,
                               "unpaired": direct["primary"].send_messages,
                               "raw": raw["primary"].send_messages},
                   "secondary": {"unpaired": direct["secondary"].send_messages,
                                 "raw": raw["secondary"].send_messages}}
        for group in senders.values():  # producer ids and connections before the clock
            for name, send in group.items():
                send(messages.next(name, 1))
        step(f"healthy primary: {args.calls:,} calls of 1 and {args.batch_calls:,} of "
             f"{PER_BATCH} per sender")
        healthy = stretch(senders["primary"], messages, args)
        meter = CpuMeter({"client": os.getpid(), "primary_engine": primary.engine.pid,
                          "primary_broker": primary.pid,
                          "secondary_engine": secondary.engine.pid,
                          "secondary_broker": secondary.pid})
        step(f"SIGSTOP of the primary broker (pid {primary.pid})")
        try:
            stopping_s = primary.pause()
            failover = Calls(1)
            failover_s = failover.timed(sender.send_messages, messages.next("paired", 1))
            step(f"failed over after {failover_s:.2f} s; paused primary: the same calls, "
                 "beside the secondary's")
            paused = stretch({"paired": sender.send_messages, **senders["secondary"]},
                             messages, args)
            step("a syphon client (enable_syphon=True); SIGCONT")
            syphon_client = stack.enter_context(ServiceBusClient.from_connection_string(
                primary.conn, paired_namespace=SendAvailabilityPairedNamespaceOptions(
                    secondary.conn, backlog_queue_count=BACKLOG_QUEUES, enable_syphon=True)))
        except BaseException:
            resume(primary.pid)
            raise
        admin = stack.enter_context(
            ServiceBusAdministrationClient.from_connection_string(secondary.conn))
        back = way_back(paired, sender.send_messages, messages, primary, syphon_client, admin,
                        meter)
        step(f"sends on the primary {back['sigcont_to_sends_on_primary_s']:.2f} s after "
             f"SIGCONT; backlog of {back['to_backlog']:,} moved after "
             f"{back['sigcont_to_all_moved_s']:.2f} s; receiving all "
             f"{len(messages.paired):,} from the primary")
        sender.close()
        received = settle_in_batches(syphon_client, QUEUE, messages.paired, 1000, meter)
        check = {**received.check, "backlog_left": backlog_left(admin)}
        check["ok"] = check["ok"] and not check["backlog_left"]
    return {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(), "load_average": os.getloadavg(), "broker": args.broker,
        "size": args.size, "per_batch": PER_BATCH, "backlog_queues": BACKLOG_QUEUES,
        "failover_interval_s": args.failover_interval, "pairing_setup_s": round(pairing_s, 2),
        "healthy": healthy, "sigstop_to_all_threads_stopped_s": round(stopping_s, 4),
        "failover_call_s": round(failover_s, 3), "paused": paused,
        "back": back, "receive_rate": round(received.rate, 1),
        "check": check, "exactly_once_ok": bool(check["ok"]),
        "total_seconds": round(time.monotonic() - started, 1),
    }


# ------------------------------------------------------------------ report
def render(result: dict[str, Any]) -> str:
    m, b = result["machine"], result["back"]
    broker = broker_label(result["broker"], each=True)
    rows: list[tuple[str, ...]] = []
    for when, figures, where in (("healthy", result["healthy"], "primary"),
                                 ("paused", result["paused"], "secondary")):
        to = "the backlog (secondary)" if when == "paused" else "the primary"
        rows.append((f"primary {when}: paired sends go to {to}; baselines on the {where}",
                     "", "", "", ""))
        for size, label in (("single", "1 message per call"),
                            ("batch", f"{result['per_batch']} per call")):
            f = figures[size]
            p, u, r = (f[s] for s in SENDERS)
            rows.append((f"  {label}: msg/s", *(f"{x['rate']:,.0f}" for x in (p, u, r)),
                         f"{p['rate'] / u['rate']:.2f}" if u["rate"] else ""))
            rows.append((f"  {label}: p50 / p99 ms",
                         *(f"{x['p50_ms']:.2f} / {x['p99_ms']:.2f}" for x in (p, u, r)),
                         f"{p['p50_ms'] / u['p50_ms']:.2f}" if u["p50_ms"] else ""))
            rows.append((f"  {label}: calls over {SLOW_MS:.0f} ms of {p['calls']:,} (max ms)",
                         *(f"{x['slow_calls']} ({x['max_ms']:,.0f})" for x in (p, u, r)), ""))
    lines = ["", f"Paired namespaces benchmark ({broker}, 1 engine worker each); machine: "
             f"{machine_label(m)}; load "
             "average at the end " + " ".join(f"{x:.2f}" for x in result["load_average"]),
             f"{result['size']} B messages; failover_interval "
             f"{result['failover_interval_s']:g} s; {result['backlog_queues']} backlog queues "
             f"(pairing set-up {result['pairing_setup_s']:.1f} s)", ""]
    lines += table(("figure", "paired client", "unpaired client", "raw produce", "ratio"),
                   rows, (64, 15, 15, 15, 5))
    lines.append("  (msg/s over the summed durations of back-to-back calls; ratio: paired / "
                 "unpaired, rate or p50)")
    lines += [
        "",
        f"failover: the first call after SIGSTOP took {result['failover_call_s']:.2f} s "
        f"(failover_interval {result['failover_interval_s']:g} s); failovers: {b['failovers']}"
        f" (the call began once every broker thread had stopped, "
        f"{result['sigstop_to_all_threads_stopped_s'] * 1000:.0f} ms after SIGSTOP)",
        f"to the backlog: {b['to_backlog']:,} messages ({b['to_backlog_while_paused']:,} while "
        f"paused, {b['to_backlog_after_sigcont']:,} after SIGCONT before the switch back, "
        f"{b['to_backlog_after_switch']} after it)",
        f"SIGCONT -> sends on the primary again (the client's probe): "
        f"{b['sigcont_to_sends_on_primary_s']:.2f} s; the first call there took "
        f"{b['first_call_on_primary_ms']:.1f} ms, a call of {result['per_batch']} "
        f"{b['call_of_100_on_primary_ms']:.1f} ms",
        f"SIGCONT -> syphon's first move {b['sigcont_to_first_moved_s']:.2f} s, every backlog "
        f"message taken {b['sigcont_to_all_moved_s']:.2f} s, backlog queues count none "
        f"{b['sigcont_to_backlog_counted_empty_s']:.2f} s",
        f"syphon: {b['syphon_rate']:,.0f} msg/s from its first batch moved to its last; "
        f"moved {b['syphon_moved']:,}, skipped {b['syphon_skipped_already_there']:,} that had "
        "reached the primary already (a send that timed out and arrived after all)",
        "  cores busy until all moved: " + ", ".join(
            f"{k.replace('_', ' ')} {v:.2f}" for k, v in b["cpu_cores_until_all_moved"].items()),
    ]
    c = result["check"]
    if result["exactly_once_ok"]:
        lines.append(f"exactly-once: all {c['expected']:,} messages the paired client sent "
                     f"received from the primary once, none twice, none else, none left; "
                     f"backlog empty ({result['receive_rate']:,.0f} msg/s received)")
    else:
        lines.append(f"WARNING: not exactly once: {json.dumps(c)}")
    return "\n".join(lines)


# --------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.pairing",
                                description=__doc__.split("\n")[0])
    add_broker_argument(p)
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the scratch dir: both brokers' and workers' logs")
    p.add_argument("--output", type=Path, help="JSON results (default "
                   "bench/results/pairing-kafka.json; pairing-tansu.json on Tansu)")
    p.add_argument("--calls", type=int, default=1000,
                   help="calls of one message per sender and stretch (default 1,000)")
    p.add_argument("--batch-calls", type=int, default=100,
                   help=f"calls of {PER_BATCH} messages per sender and stretch (default 100)")
    p.add_argument("--failover-interval", type=float, default=2.0,
                   help="failover_interval of the paired client, seconds (default 2)")
    p.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    work = Path(tempfile.mkdtemp(prefix="settlement-pairing-"))
    try:
        result = measure(args, work)
    except BaseException:
        print(f"scratch dir kept: {work}", file=sys.stderr)
        raise
    print(render(result), flush=True)
    output = args.output or results_path("pairing", args.broker)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {output} (whole bench {result['total_seconds']}s)")
    if result["exactly_once_ok"] and not args.keep_logs:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"scratch dir kept: {work}", file=sys.stderr)
    return 0 if result["exactly_once_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
