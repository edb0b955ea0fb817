"""Does the engine's cost stay with what is in flight? Settle rates next to a
huge dead-letter queue and a huge backlog, and recovery after ``kill -9``.

``python -m bench.scale [--broker kafka|tansu] [--parked 1000000]
[--backlog 1000000] [--sample 20000]`` (``make bench-scale``) starts a broker
and one engine worker, then measures on that one broker:

1. the settle rate of peek-lock batches (``receive_messages(1000)`` +
   ``complete_messages``, the better of two rounds of ``--sample / 2``) on
   an empty queue: the reference;
2. the same rate on a queue whose partition holds ``--parked`` dead letters
   (sent, received and dead-lettered first), and the engine's memory (RSS)
   and table size on disk with them;
3. the rate of settling the first ``--sample`` messages of a ``--backlog``
   backlog, against a 10,000-message queue;
4. the time from ``kill -9`` of the worker to a message sent, received and
   completed again, with the dead letters still parked.

Ratios are printed against the targets of issue 9 (>= 0.8; recovery <= 10 s);
the figures also go to ``bench/results/scale-kafka.json`` (``scale-tansu.json``
on Tansu).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.brokers import add_broker_argument, new_broker, results_path
from bench.run import machine_info, make_messages, send
from settlement import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from settlement.management import ServiceBusAdministrationClient
from streams.process import EngineProcess

BATCH = 1000
SMALL_BACKLOG = 10_000
log = logging.getLogger("bench.scale")


def settle_rate(client: ServiceBusClient, queue: str, count: int) -> float:
    """Messages per second of peek-lock batches completing ``count`` messages,
    the better of two rounds of ``count // 2`` (a timer sweep or a log trim in
    one round would otherwise decide a ratio)."""
    rates = []
    with client.get_queue_receiver(queue) as receiver:
        for _ in range(2):
            done, want = 0, count // 2
            started = time.perf_counter()
            while done < want:
                batch = receiver.receive_messages(min(BATCH, want - done), max_wait_time=10)
                if not batch:
                    raise RuntimeError(f"{queue}: nothing to receive after {done} of {want}")
                done += sum(r.succeeded for r in receiver.complete_messages(batch))
            rates.append(done / (time.perf_counter() - started))
    return max(rates)


def dead_letter_all(client: ServiceBusClient, queue: str, count: int) -> float:
    """Receive and dead-letter ``count`` messages; returns messages per second."""
    done = 0
    with client.get_queue_receiver(queue) as receiver:
        started = time.perf_counter()
        while done < count:
            batch = receiver.receive_messages(5000, max_wait_time=10)
            if not batch:
                raise RuntimeError(f"{queue}: nothing to receive after {done} of {count}")
            results = receiver.settle_messages(batch, "dead_letter", "Bench", "parked")
            done += sum(r.succeeded for r in results)
            if done % 100_000 < len(batch):
                print(f"    dead-lettered {done:,}", flush=True)
        return done / (time.perf_counter() - started)


def engine_footprint(worker: EngineProcess) -> dict[str, float]:
    """Resident memory of the worker and the size of its RocksDB tables, in MB."""
    status = Path(f"/proc/{worker.pid}/status").read_text()
    rss_kb = next(int(line.split()[1]) for line in status.splitlines()
                  if line.startswith("VmRSS:"))
    disk = sum(f.stat().st_size for f in (worker.data_dir / "rocks").rglob("*") if f.is_file())
    return {"rss_mb": round(rss_kb / 1024, 1), "tables_mb": round(disk / 2**20, 1)}


def round_trip(client: ServiceBusClient, queue: str, deadline: float) -> None:
    """Send one message, receive it and complete it, retrying until ``deadline``."""
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("after the crash"))
    with client.get_queue_receiver(queue) as receiver:
        while time.monotonic() < deadline:
            try:
                for message in receiver.receive_messages(1, max_wait_time=1):
                    receiver.complete_message(message)
                    return
            except Exception as exc:  # the engine is still starting  # noqa: BLE001
                log.info("not yet: %s", exc)
                time.sleep(0.1)
    raise RuntimeError(f"{queue} did not serve again in time")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale")
    add_broker_argument(p)
    p.add_argument("--parked", type=int, default=1_000_000, help="dead letters to park")
    p.add_argument("--backlog", type=int, default=1_000_000, help="messages in the backlog")
    p.add_argument("--sample", type=int, default=20_000, help="messages settled per rate")
    p.add_argument("--size", type=int, default=64, help="body bytes (default 64)")
    p.add_argument("--keep", action="store_true", help="keep the scratch dir (logs, tables)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="settlement-scale-"))
    broker = new_broker(args.broker, work)
    results: dict[str, Any] = {"machine": machine_info(), "broker": args.broker,
                               "parked": args.parked, "backlog": args.backlog,
                               "sample": args.sample}
    started = time.monotonic()

    def step(msg: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {msg}", flush=True)

    with broker:
        conn = broker.connection_string("scale")
        worker = EngineProcess(conn, work / "engine", timer_interval=0.5).start()
        try:
            admin = ServiceBusAdministrationClient.from_connection_string(conn)
            for queue in ("warmup", "empty", "parked", "small", "backlog"):
                admin.create_queue(queue, lock_duration=300, max_delivery_count=10)
            with ServiceBusClient.from_connection_string(conn) as client:
                step("warm-up")
                send(client, "warmup", make_messages("w", args.sample, args.size), 5000)
                settle_rate(client, "warmup", args.sample)
                step(f"reference: {args.sample:,} messages on an empty queue")
                send(client, "empty", make_messages("e", args.sample, args.size), 5000)
                results["empty_rate"] = settle_rate(client, "empty", args.sample)
                results["empty_engine"] = engine_footprint(worker)

                step(f"parking {args.parked:,} dead letters")
                send(client, "parked", make_messages("d", args.parked, args.size), 5000)
                results["dead_letter_rate"] = dead_letter_all(client, "parked", args.parked)
                step(f"{args.sample:,} messages beside them")
                send(client, "parked", make_messages("p", args.sample, args.size), 5000)
                results["parked_rate"] = settle_rate(client, "parked", args.sample)
                results["parked_engine"] = engine_footprint(worker)

                step(f"backlog of {args.backlog:,} against one of {SMALL_BACKLOG:,}")
                send(client, "small", make_messages("s", SMALL_BACKLOG, args.size), 5000)
                results["small_rate"] = settle_rate(client, "small", min(args.sample,
                                                                         SMALL_BACKLOG))
                send(client, "backlog", make_messages("b", args.backlog, args.size), 5000)
                results["backlog_rate"] = settle_rate(client, "backlog", args.sample)
                results["backlog_engine"] = engine_footprint(worker)

                step("kill -9 of the worker")
                worker.kill()
                killed = time.monotonic()
                worker.start()
                results["restart_s"] = time.monotonic() - killed
                round_trip(client, "parked", killed + 120)
                results["recovery_s"] = time.monotonic() - killed
                dead = admin.get_queue_runtime_properties("parked").dead_letter_message_count
                results["parked_after_crash"] = dead
                with client.get_queue_receiver(
                        "parked", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
                    results["dlq_receives_after_crash"] = bool(dlq.receive_messages(
                        10, max_wait_time=10))
        finally:
            worker.stop()
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    render(results)
    out = results_path("scale", args.broker)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}")
    return 0


def render(r: dict[str, Any]) -> None:
    def ratio(key: str, base: str, target: float) -> str:
        value = r[key] / r[base]
        return f"{value:5.2f} ({'meets' if value >= target else 'misses'} >= {target})"

    print(f"\nscale on {r['broker']}: {r['parked']:,} dead letters, {r['backlog']:,} backlog, "
          f"{r['sample']:,} messages per rate")
    print(f"  empty queue                  {r['empty_rate']:10,.0f} msg/s  "
          f"engine {r['empty_engine']}")
    print(f"  dead-lettering them          {r['dead_letter_rate']:10,.0f} msg/s")
    print(f"  beside the dead letters      {r['parked_rate']:10,.0f} msg/s  ratio "
          f"{ratio('parked_rate', 'empty_rate', 0.8)}  engine {r['parked_engine']}")
    print(f"  {SMALL_BACKLOG:,} backlog              {r['small_rate']:10,.0f} msg/s")
    print(f"  {r['backlog']:,} backlog          {r['backlog_rate']:10,.0f} msg/s  ratio "
          f"{ratio('backlog_rate', 'small_rate', 0.8)}  engine {r['backlog_engine']}")
    target = "meets" if r["recovery_s"] <= 10 else "misses"
    print(f"  kill -9 -> serving again     {r['recovery_s']:10.1f} s      ({target} <= 10 s; "
          f"worker ready after {r['restart_s']:.1f} s); dead letters after it: "
          f"{r['parked_after_crash']:,}")


if __name__ == "__main__":
    raise SystemExit(main())
