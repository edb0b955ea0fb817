"""Spark over topics: the monitor counts per subscription, and the audit
judges each subscription over its topic's log from where it began."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.management import ServiceBusAdministrationClient, SqlRuleFilter
from spark.metrics_store import read_metrics, totals
from tests.helpers import receive_exactly, run_monitor
from topics import names

pytest.importorskip("pyspark")


def test_monitor_and_audit_count_each_subscription_of_a_topic(
        spark: Any, conn: str, client: ServiceBusClient, admin: ServiceBusAdministrationClient,
        queue_name: str, tmp_path: Path) -> None:
    from spark.audit import run_audit

    topic = queue_name
    admin.create_topic(topic)
    admin.create_subscription(topic, "all")
    with client.get_topic_sender(topic) as sender:
        sender.send_messages([ServiceBusMessage(f"early {i}") for i in range(2)])
        admin.create_subscription(topic, "eu")  # begins after the early ones
        admin.delete_rule(topic, "eu", "$Default")
        admin.create_rule(topic, "eu", "eu", filter=SqlRuleFilter("region = 'eu'"))
        sender.send_messages([ServiceBusMessage(f"m{i}", application_properties={
            "region": "eu" if i < 6 else "us"}) for i in range(10)])
    with client.get_subscription_receiver(topic, "eu") as receiver:
        got = receive_exactly(receiver, 6)
        receiver.complete_messages(got[:5])
        receiver.dead_letter_message(got[5], reason="bad-region", error_description="test")
    with client.get_subscription_receiver(topic, "all") as receiver:
        receiver.complete_messages(receive_exactly(receiver, 12))

    eu, every = names.subscription_path(topic, "eu"), names.subscription_path(topic, "all")
    report = run_audit(spark, conn, [eu, every])
    assert report.ok, report.summary()
    assert report.messages == 10 + 12  # "eu" owns only what came after it began

    sink = tmp_path / "monitor"
    run_monitor(spark, conn, sink)
    counts = totals(read_metrics(sink), "count")
    assert (counts[(eu, "completed")], counts[(eu, "dead_lettered")],
            counts[(eu, "filtered")]) == (5, 1, 4)
    assert counts[(every, "completed")] == 12 and (every, "filtered") not in counts
