"""Prometheus metrics: an engine worker's ``/metrics`` (``--metrics-port``) and
the dashboard's, scraped around a known workload, move by what it did."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.management import ServiceBusAdministrationClient
from settlement.testing._local_broker import free_port
from spark.dashboard import TABLE_OUTCOMES
from streams.process import EngineProcess
from tests.helpers import Broker, drive_workload, receive_exactly, run_monitor
from topics.entities import DEFAULT_ENGINE_PARTITIONS

SENT, DEAD = 10, 3


class Scrape:
    """One scrape's samples: ``scrape["name", label=value...]``, 0 when absent."""

    def __init__(self, url: str) -> None:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        self.samples = [sample for family in text_string_to_metric_families(text)
                        for sample in family.samples]

    def __getitem__(self, query: tuple[str, ...] | str) -> float:
        return self.total(query) if isinstance(query, str) else self.total(*query)

    def total(self, name: str, *labels: str) -> float:
        """The sum of ``name`` over the samples whose labels include ``labels``
        (``"key=value"`` each)."""
        wanted = dict(label.split("=", 1) for label in labels)
        return sum(s.value for s in self.samples
                   if s.name == name and wanted.items() <= s.labels.items())

    def labels(self, name: str, key: str) -> set[str]:
        return {s.labels[key] for s in self.samples if s.name == name}


def _scrape_until(url: str, done: Callable[[Scrape], bool], timeout: float = 20) -> Scrape:
    """Scrape until ``done`` holds (what clients were answered for may still
    be on its way: settlements final once appended are run just after)."""
    deadline = time.monotonic() + timeout
    while not done(scrape := Scrape(url)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return scrape


def test_engine_metrics_move_by_what_a_workload_did(broker: Broker, tmp_path: Path) -> None:
    conn = broker.connection_string(f"metrics{uuid.uuid4().hex[:6]}")
    port = free_port("127.0.0.1")
    engine = EngineProcess(conn, tmp_path, env={"SETTLEMENT_METRICS_PORT": str(port)}).start()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with ServiceBusAdministrationClient.from_connection_string(conn) as admin, \
                ServiceBusClient.from_connection_string(conn) as client:
            admin.create_queue("work", lock_duration=60)
            before = Scrape(url)
            with client.get_queue_sender("work") as sender:
                sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(SENT)])
            with client.get_queue_receiver("work") as receiver:
                got = receive_exactly(receiver, SENT)
                during = _scrape_until(url, lambda s: s["settlement_locks", "entity=work"] == SENT)
                receiver.complete_messages(got[DEAD:])
                for message in got[:DEAD]:
                    receiver.dead_letter_message(message, reason="poison")
            after = _scrape_until(url, lambda s: (
                s["settlement_settlements_total", "entity=work"]
                - before["settlement_settlements_total", "entity=work"] == SENT
                and s["settlement_locks", "entity=work"] == 0
                and s["settlement_commands_lag"] == 0))
    finally:
        engine.stop()

    def moved(name: str, *labels: str) -> float:
        return after.total(name, *labels) - before.total(name, *labels)

    assert during["settlement_locks", "entity=work"] == SENT
    assert during["settlement_messages", "entity=work", "state=active"] == SENT
    # one settle item per message, answered ok, as the client asked
    assert moved("settlement_settlements_total", "entity=work", "action=complete",
                 "status=ok") == SENT - DEAD
    assert moved("settlement_settlements_total", "entity=work", "action=dead_letter",
                 "status=ok") == DEAD
    assert moved("settlement_settlements_total", "entity=work") == SENT
    assert moved("settlement_delivered_messages_total", "entity=work") == SENT
    for op in ("acquire", "settle"):
        commands = moved("settlement_commands_total", f"op={op}")
        assert commands >= 1 and moved("settlement_commands_total", f"op={op}",
                                       "outcome=ok") == commands
        # every client command is timed once
        assert moved("settlement_command_duration_seconds_count", f"op={op}") == commands
        assert 0 < moved("settlement_command_duration_seconds_sum", f"op={op}") < commands * 5
    assert after["settlement_windows", "entity=work"] >= 1
    assert after["settlement_locks", "entity=work"] == 0
    assert after["settlement_messages", "entity=work", "state=active"] == 0
    assert after["settlement_messages", "entity=work", "state=dead_letter"] == DEAD
    # this worker owns every commands partition, and has finished what they hold
    assert after.labels("settlement_commands_lag", "partition") == {
        str(p) for p in range(DEFAULT_ENGINE_PARTITIONS)}
    assert after["settlement_commands_lag"] == 0
    assert after["settlement_engine_errors_total"] == 0


def test_dashboard_serves_the_numbers_of_metrics_json_to_prometheus(
        spark: Any, conn: str, client: ServiceBusClient, make_queue: Any,
        dashboard_url: tuple[str, Path]) -> None:
    url, sink = dashboard_url
    queue = make_queue()
    drive_workload(client, queue, sent=6, complete=3, abandon=1, dead_letter=2,
                   reason="poison")
    run_monitor(spark, conn, sink)

    with urllib.request.urlopen(url + "metrics.json", timeout=10) as response:
        numbers = json.load(response)
    scrape = Scrape(url + "metrics")
    row = next(row for row in numbers["entities"] if row["entity"] == queue)
    assert (row["enqueued"], row["completed"], row["dead_lettered"]) == (6, 4, 2)
    for outcome in TABLE_OUTCOMES:
        assert scrape["settlement_dashboard_messages_total", f"entity={queue}",
                      f"outcome={outcome}"] == row[outcome], outcome
    assert scrape["settlement_dashboard_backlog", f"entity={queue}",
                  "state=dead_letter"] == row["now_dead_letter"] == 2
    assert scrape["settlement_dashboard_lock_held_seconds", f"entity={queue}",
                  "quantile=0.5"] == row["lock_p50_ms"] / 1000
    assert scrape["settlement_dashboard_dead_letters_total", f"entity={queue}",
                  "reason=poison"] == 2
