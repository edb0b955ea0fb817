"""The monitoring job with real Spark: its counts equal the ground truth of a
workload driven through the engine, and a restart does not double count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from settlement import ServiceBusClient, ServiceBusMessage
from spark.audit import run_audit
from spark.metrics_store import (
    compact,
    completed_batches,
    current_gauges,
    read_metrics,
    totals,
)
from tests.helpers import (
    drive_topic_workload,
    drive_workload,
    receive_exactly,
    run_monitor,
    wait_for_events,
)

pytest.importorskip("pyspark")


def test_monitor_counts_equal_the_workload_and_survive_restarts(
        spark: Any, conn: str, client: ServiceBusClient, admin: Any, make_queue: Any,
        tmp_path: Path) -> None:
    queue = make_queue()
    # 30 sent: 20 completed at once, 5 abandoned then completed, 3 dead-lettered, 2 deferred
    drive_workload(client, queue, sent=30, complete=20, abandon=5, dead_letter=3,
                   reason="bad-input", defer=2, renew_first=True)
    eu, every = drive_topic_workload(client, admin, f"{queue}-topic")
    for entity, kind, count in ((queue, "completed", 25), (queue, "deferred", 2),
                                (eu, "dead_lettered", 1), (every, "completed", 12)):
        wait_for_events(client, entity, kind, count)
    sink = tmp_path / "monitor"
    run_monitor(spark, conn, sink)

    metrics = read_metrics(sink)
    # Per subscription: what its rules left out counts as filtered.
    by_subscription = totals(metrics, "count")
    assert (by_subscription[(eu, "completed")], by_subscription[(eu, "dead_lettered")],
            by_subscription[(eu, "filtered")]) == (5, 1, 4)
    assert by_subscription[(every, "completed")] == 12
    assert (every, "filtered") not in by_subscription
    # the audit reads the offsets the filtered events give as ranges: eu's
    # 10 are all settled, 4 of them left out by its rule
    report = run_audit(spark, conn, [eu, every])
    assert report.ok and report.messages == 22, report.summary()
    counts = {label: n for (entity, label), n in totals(metrics, "count").items()
              if entity == queue}
    assert counts == {"enqueued": 30, "locked": 35, "renewed": 1, "completed": 25,
                      "abandoned": 5, "dead_lettered": 3, "deferred": 2}
    assert totals(metrics, "dead_letter_reason")[(queue, "bad-input")] == 3
    deliveries = {label: n for (entity, label), n in totals(metrics, "delivery_count").items()
                  if entity == queue}
    assert deliveries == {"1": 23, "2": 5}
    mine = metrics[metrics["entity"] == queue]
    held = mine[mine["metric"] == "lock_held_ms"]
    assert held["n"].sum() == 35 and (held["p99"] >= held["p50"]).all()
    assert (held["p50"] >= 0).all() and (held["p99"] < 60_000).all()
    latency = mine[mine["metric"] == "end_to_end_ms"]
    assert latency["n"].sum() == 25 and (latency["p50"] > 0).all()
    gauges = current_gauges(metrics).set_index("entity").loc[queue]
    assert (gauges["active"], gauges["locked"], gauges["deferred"],
            gauges["dead_letter"]) == (0, 0, 2, 3)

    # More work, and a restart from the checkpoint: totals grow by exactly that.
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"n{i}") for i in range(10)])
    with client.get_queue_receiver(queue) as receiver:
        receiver.complete_messages(receive_exactly(receiver, 10))
    wait_for_events(client, queue, "completed", 35)
    run_monitor(spark, conn, sink)
    counts = totals(read_metrics(sink), "count")
    assert (counts[(queue, "enqueued")], counts[(queue, "completed")]) == (40, 35)

    # A crash after a batch's output was written but before Spark committed
    # it: the batch runs again on restart and overwrites its own output.
    commits = sorted((sink / "_checkpoint" / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last_output = completed_batches(sink)[-1]
    assert int(last_output.name.partition("=")[2]) == int(commits[-1].name)
    written = (last_output / "_SUCCESS").stat().st_mtime_ns
    commits[-1].unlink()
    (commits[-1].parent / f".{commits[-1].name}.crc").unlink()
    run_monitor(spark, conn, sink)
    assert (last_output / "_SUCCESS").stat().st_mtime_ns != written  # it did run again
    counts = totals(read_metrics(sink), "count")
    assert (counts[(queue, "enqueued")], counts[(queue, "completed")]) == (40, 35)

    # Compaction merges the batch directories into one file, changing no number,
    # and the monitor counts on from there.
    before = read_metrics(sink)
    batches = completed_batches(sink)
    assert compact(sink, before=int(batches[-1].name.partition("=")[2]) + 1) == len(batches)
    assert completed_batches(sink) == []
    assert len(list((sink / "metrics").glob("compacted-*.parquet"))) == 1
    pd.testing.assert_frame_equal(read_metrics(sink), before)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"o{i}") for i in range(5)])
    with client.get_queue_receiver(queue) as receiver:
        receiver.complete_messages(receive_exactly(receiver, 5))
    wait_for_events(client, queue, "completed", 40)
    run_monitor(spark, conn, sink, compact_every=1)
    counts = totals(read_metrics(sink), "count")
    assert (counts[(queue, "enqueued")], counts[(queue, "completed")]) == (45, 40)


def test_settlement_monitor_command_writes_the_metrics(
        spark: Any, conn: str, client: ServiceBusClient, make_queue: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from settlement import cli

    queue = make_queue()
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
    with client.get_queue_receiver(queue) as receiver:
        receiver.complete_messages(receive_exactly(receiver, 2))
    sink = tmp_path / "sink"
    args = ["monitor", "--available-now", "--sink", str(sink), "--connection-string", conn]
    assert cli.main(args) == 0
    assert str(sink.resolve()) in capsys.readouterr().out
    assert totals(read_metrics(sink), "count")[(queue, "completed")] == 2
