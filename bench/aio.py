"""Grouped settlements of the asyncio client: 1,000 concurrent ``await complete_message``.

``python -m bench.aio [--broker kafka|tansu] [--messages N] [--concurrency 1000]``
(``make bench-aio``) starts a broker and one engine worker, then measures on
that one broker:

1. raw Kafka consume (a plain assigned consumer, no commits) and produce,
   from ``bench.run.raw_kafka``: the broker's own pace;
2. the sync client's batched peek-lock: ``receive_messages(1000)`` +
   ``complete_messages(batch)`` (``bench.run.settle_in_batches``);
3. the asyncio client (``settlement.aio``): messages received 1,000 at a
   time, then completed by 1,000 concurrent ``await
   receiver.complete_message(m)`` calls (``asyncio.gather``), one settle per
   call as SDK code writes it. The clock runs over the completes only
   (receive + complete end to end is reported beside), and the engine
   commands they cost are counted;
4. beside it, its floor: the same rounds with each batch completed by one
   sync ``complete_messages`` call (one settle command of 1,000, no asyncio).

Every message of phases 3 and 4 must be received and settled exactly once
(by message id, and nothing left in the queue). The table goes to stdout,
the figures to ``bench/results/aio-kafka.json`` (``aio-tansu.json`` on Tansu).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.brokers import add_broker_argument, broker_label, broker_pid, new_broker, results_path
from bench.measure import CpuMeter, Phase, Timed, percentile, warm_line, warm_up
from bench.run import (
    LOCK_SECONDS,
    check_exactly_once,
    machine_info,
    machine_label,
    make_messages,
    raw_kafka,
    send,
    settle_in_batches,
    wait_for_engine,
    warm_round,
)
from settlement import ServiceBusClient, ServiceBusSubQueue, aio
from settlement.management import ServiceBusAdministrationClient
from streams.process import EngineProcess
from topics.connection import parse_connection_string

NAMESPACE = "benchaio"
CHUNK = 1000
#: the figure issue 14 asks of the async settle path
TARGET = 20_000

log = logging.getLogger("bench.aio")


async def concurrent_completes(conn: str, queue: str, ids: list[str], concurrency: int,
                               meter: CpuMeter, *, one_call: bool = False) -> Phase:
    """Receive ``concurrency`` messages, complete them all concurrently; repeat.
    With ``one_call``, each round is instead one sync ``complete_messages``
    call of the whole batch: one settle command with no asyncio around it,
    the floor of what grouping can reach."""
    # ids listed under the clock, counted after it, as bench.run.settle_in_batches
    # does: summing a Counter twice a round walked every id received so far
    # (0.2-0.3 ms of a 7-8 ms round at 20,000 ids, py-spy --gil)
    received_ids: list[str] = []
    settled_ids: list[str] = []
    failures: list[str] = []
    round_s: list[float] = []
    async with aio.ServiceBusClient.from_connection_string(conn) as client:
        # Connected first, as a sender is (bench.run.warm_sender): a new
        # client's first command may wait for Kafka's producer id, 0.5 s
        # (librdkafka's idempotent producer retries it on a 500 ms timer:
        # one new producer in twelve, here), which the other phases' client,
        # made before the warm-up, paid long before; inside the clock that
        # is a third of this phase. A peek of the empty dead-letter
        # sub-queue sends one command without receiving anything.
        async with client.get_queue_receiver(
                queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead_letters:
            await dead_letters.peek_messages(1)
        async with client.get_queue_receiver(queue) as receiver:
            # From once connected: the rounds' own pace and CPU, receives included.
            with Timed(meter) as rounds:
                while len(received_ids) < len(ids):
                    want = min(concurrency, len(ids) - len(received_ids))
                    batch: list[Any] = []
                    while len(batch) < want:
                        got = await receiver.receive_messages(want - len(batch), max_wait_time=10)
                        if not got:
                            break
                        batch += got
                    if not batch:
                        log.warning("async phase: nothing received for 10 s; giving up")
                        break
                    received_ids += [m.message_id for m in batch]
                    # the clock alone: a CPU snapshot of the three processes
                    # at each end (Timed) read /proc six times a round, on
                    # the event loop, inside the phase's own clock
                    started = time.perf_counter()
                    if one_call:
                        results = [r.error for r in receiver._opened().complete_messages(batch)]
                    else:
                        results = await asyncio.gather(
                            *(receiver.complete_message(m) for m in batch),
                            return_exceptions=True)
                    round_s.append(time.perf_counter() - started)
                    for message, result in zip(batch, results, strict=True):
                        if result is None:
                            settled_ids.append(message.message_id)
                        else:
                            failures.append(f"{message.message_id}: {result!r}")
            leftover = await receiver.receive_messages(10, max_wait_time=0.5)
        commands = client._sync._batcher.commands_sent if client._sync._batcher else 0
    check = check_exactly_once(ids, Counter(received_ids), Counter(settled_ids), len(failures))
    check["left_in_queue"] = len(leftover)
    check["ok"] = check["ok"] and not leftover
    if failures:
        check["failure_sample"] = failures[:3]
    key, label = (("one_settle_command", f"floor: sync complete_messages({concurrency:,}) per "
                   "round") if one_call else
                  ("aio_concurrent_complete", f"aio: {concurrency:,} concurrent await "
                   "complete_message"))
    return Phase(key, label, len(ids), sum(round_s),
                 cpu=rounds.cpu, check=check,
                 extra={"rounds": len(round_s), "engine_commands": commands,
                        "round_ms_p50": round(percentile(round_s, 50) * 1000, 1),
                        "round_ms_best": round(min(round_s, default=0) * 1000, 1),
                        "settles_per_command": round(len(ids) / max(commands, 1), 1),
                        "receive_and_complete_rate": round(len(ids) / rounds.seconds, 1)})


def render(result: dict[str, Any]) -> str:
    ph = result["phases"]
    broker = broker_label(result["broker"])
    m = result["machine"]
    lines = ["", f"asyncio settlements ({broker}, 1 engine worker); machine: {machine_label(m)}",
             f"{result['messages']:,} messages x {result['size']} B per phase",
             warm_line(result["broker_warm_up"]), ""]
    head = f"{'figure':<62} {'msg/s':>10}  {'cores client/engine/broker':>26}"
    lines += [head, "-" * len(head)]
    for key in ("raw_consume", "raw_produce_lists", "peek_lock_batch", "one_settle_command",
                "aio_concurrent_complete"):
        p = ph[key]
        busy = "/".join(f"{p['cpu_cores'].get(k, 0):.2f}" for k in ("client", "engine",
                                                                    "broker"))
        lines.append(f"{p['label']:<62} {p['rate']:>10,.0f}  {busy:>26}")
    a = ph["aio_concurrent_complete"]
    lines += [
        f"  aio receive({result['concurrency']:,}) + concurrent completes, end to end: "
        f"{a['receive_and_complete_rate']:,.0f} msg/s",
        f"  engine commands for {a['messages']:,} completes: {a['engine_commands']} "
        f"({a['settles_per_command']:,} settles each); a round of {result['concurrency']:,} "
        f"completes: median {a['round_ms_p50']} ms, best {a['round_ms_best']} ms",
        f"  target >= {TARGET:,} msg/s: {'met' if a['rate'] >= TARGET else 'MISSED'}; "
        f"exactly once: {'ok' if a['check']['ok'] else 'FAILED ' + str(a['check'])}",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.aio", description=__doc__.split("\n")[0])
    add_broker_argument(p)
    p.add_argument("--messages", "-n", type=int, default=20_000,
                   help="messages per phase (default 20000)")
    p.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    p.add_argument("--concurrency", type=int, default=1000,
                   help="concurrent complete_message calls (default 1000)")
    p.add_argument("--output", type=Path, default=None,
                   help="default bench/results/aio-kafka.json (aio-tansu.json on Tansu)")
    p.add_argument("--keep-logs", action="store_true")
    return p.parse_args(argv)


@contextmanager
def broker_and_engine(kind: str, work: Path) -> Iterator[tuple[str, CpuMeter, EngineProcess]]:
    """A fresh broker of ``kind`` with one engine worker: the namespace's
    connection string, a CPU meter of the three processes, the worker."""
    with new_broker(kind, work) as broker:
        conn = broker.connection_string(NAMESPACE)
        with EngineProcess(conn, work / "engine", timer_interval=0.5) as worker:
            yield conn, CpuMeter({"client": os.getpid(), "engine": worker.pid,
                                  "broker": broker_pid(broker)}), worker


def measure(args: argparse.Namespace, work: Path, step: Callable[[str], None]
            ) -> tuple[dict[str, Phase], dict[str, Any]]:
    """Every phase, on one broker and engine; and how the broker was warmed up."""
    phases: dict[str, Phase] = {}
    n, size = args.messages, args.size
    with broker_and_engine(args.broker, work) as (conn, meter, worker), \
            ServiceBusAdministrationClient.from_connection_string(conn) as admin, \
            ServiceBusClient.from_connection_string(conn) as client:
        for queue in ("warmup", "peek", "floor", "aio"):
            admin.create_queue(queue, lock_duration=LOCK_SECONDS, max_delivery_count=10)
        assert worker.proc is not None
        step(f"engine ready after {wait_for_engine(client, 'warmup', worker.proc):.1f}s; "
             "warm-up")
        warmed = warm_up(meter.pids["broker"],
                         lambda i: warm_round(client, conn, "warmup", size, meter, i), step)
        step("raw Kafka baseline")
        bootstrap = parse_connection_string(conn).bootstrap_servers
        phases |= {p.key: p for p in raw_kafka(bootstrap, conn, n, size, meter, 20)}
        step("sync peek-lock receive(1000) + complete_messages")
        msgs = make_messages("p", n, size)
        send(client, "peek", msgs, CHUNK)
        phases["peek_lock_batch"] = settle_in_batches(
            client, "peek", [m.message_id for m in msgs], CHUNK, meter)
        step(f"floor: receive({args.concurrency:,}) + one sync complete_messages call")
        msgs = make_messages("f", n, size)
        send(client, "floor", msgs, CHUNK)
        phases["one_settle_command"] = asyncio.run(concurrent_completes(
            conn, "floor", [m.message_id for m in msgs], args.concurrency, meter,
            one_call=True))
        step(f"aio: {args.concurrency:,} concurrent await complete_message")
        msgs = make_messages("a", n, size)
        send(client, "aio", msgs, CHUNK)
        phases["aio_concurrent_complete"] = asyncio.run(concurrent_completes(
            conn, "aio", [m.message_id for m in msgs], args.concurrency, meter))
        return phases, warmed.as_dict()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    work = Path(tempfile.mkdtemp(prefix="settlement-aio-"))
    started = time.monotonic()

    def step(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {msg}", flush=True)

    step(f"starting the {args.broker} broker; scratch dir {work}")
    phases, warmed = measure(args, work, step)
    aio_phase = phases["aio_concurrent_complete"]
    result = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(), "broker": args.broker, "broker_warm_up": warmed,
        "messages": args.messages,
        "size": args.size, "concurrency": args.concurrency,
        "phases": {k: p.as_dict() for k, p in phases.items()},
        "target_msg_per_s": TARGET, "target_met": aio_phase.rate >= TARGET,
        "exactly_once_ok": all(p.check.get("ok", True) for p in phases.values()),
        "total_seconds": round(time.monotonic() - started, 1),
    }
    print(render(result), flush=True)
    output = args.output or results_path("aio", args.broker)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {output} (whole bench {result['total_seconds']}s)")
    if args.keep_logs or not result["exactly_once_ok"]:
        print(f"logs kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if result["exactly_once_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
