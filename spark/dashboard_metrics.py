"""The dashboard's numbers in Prometheus' text format: its ``/metrics``.

Made at each scrape from :func:`spark.dashboard.metrics_json`, the numbers
the page draws and ``/metrics.json`` serves, so the three always agree.
Every name starts ``settlement_dashboard_``; times are in seconds. The
totals are sums over the monitor's sink (what the monitor counted since its
checkpoint began), so they are counters; the rest are gauges.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "settlement_dashboard_"
#: ``now_<state>`` columns: the backlog gauges
BACKLOG_COLUMN = "now_"
#: ``lock_<quantile>_ms`` columns: the lock-held percentiles
LOCK_QUANTILES = {"lock_p50_ms": "0.5", "lock_p95_ms": "0.95", "lock_p99_ms": "0.99"}


def prometheus_text(numbers: dict[str, Any], outcomes: list[str]) -> bytes:
    """``numbers`` (:func:`spark.dashboard.metrics_json`) as a Prometheus
    scrape; ``outcomes`` are the totals table's outcome columns."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Numbers(numbers, outcomes))
    return generate_latest(registry)


class _Numbers(Collector):
    def __init__(self, numbers: dict[str, Any], outcomes: list[str]) -> None:
        self._numbers = numbers
        self._outcomes = outcomes

    def collect(self) -> Iterator[Metric]:
        entities = self._numbers["entities"]
        messages = CounterMetricFamily(PREFIX + "messages", "Messages per entity and outcome "
                                       "(enqueued, completed, dead_lettered...)",
                                       labels=["entity", "outcome"])
        backlog = GaugeMetricFamily(PREFIX + "backlog", "Messages per entity and state now "
                                    "(active, locked, deferred, scheduled, dead_letter)",
                                    labels=["entity", "state"])
        lock_held = GaugeMetricFamily(PREFIX + "lock_held_seconds", "How long messages were "
                                      "locked before settlement, percentiles",
                                      labels=["entity", "quantile"])
        end_to_end = GaugeMetricFamily(PREFIX + "end_to_end_seconds", "From enqueue to "
                                       "settlement, median", labels=["entity", "quantile"])
        for row in entities:
            entity = row["entity"]
            for outcome in self._outcomes:
                messages.add_metric([entity, outcome], row[outcome])
            for key, value in row.items():
                if key.startswith(BACKLOG_COLUMN):
                    backlog.add_metric([entity, key.removeprefix(BACKLOG_COLUMN)], value)
            for key, quantile in LOCK_QUANTILES.items():
                if row[key] is not None:
                    lock_held.add_metric([entity, quantile], row[key] / 1000)
            if row["end_to_end_p50_ms"] is not None:
                end_to_end.add_metric([entity, "0.5"], row["end_to_end_p50_ms"] / 1000)
        yield from (messages, backlog, lock_held, end_to_end)
        reasons = CounterMetricFamily(PREFIX + "dead_letters", "Dead-lettered messages per "
                                      "entity and reason", labels=["entity", "reason"])
        for row in self._numbers["dead_letter_reasons"]:
            reasons.add_metric([row["entity"], row["reason"]], row["count"])
        yield reasons
        yield from _pairing(self._numbers["paired_entities"], self._numbers["backlog_queues"])


def _pairing(paired: list[dict[str, Any]], depths: list[dict[str, Any]]) -> Iterator[Metric]:
    """The paired-namespaces panel: clients' failovers per primary entity,
    and the backlog queues kept here per primary namespace."""
    failovers = CounterMetricFamily(PREFIX + "failovers", "Paired clients' failovers per "
                                    "primary entity", labels=["entity"])
    switch_backs = CounterMetricFamily(PREFIX + "switch_backs", "Paired clients' switches "
                                       "back to the primary", labels=["entity"])
    sent = CounterMetricFamily(PREFIX + "sent_to_backlog", "Messages paired clients sent to "
                               "the backlog", labels=["entity"])
    sending = GaugeMetricFamily(PREFIX + "sending_to_backlog", "Paired clients sending to "
                                "the backlog now", labels=["entity"])
    for row in paired:
        failovers.add_metric([row["entity"]], row["failovers"])
        switch_backs.add_metric([row["entity"]], row["switch_backs"])
        sent.add_metric([row["entity"]], row["sent_to_backlog"])
        sending.add_metric([row["entity"]], row["sending_to_backlog"])
    queues = GaugeMetricFamily(PREFIX + "backlog_queues", "Backlog queues kept here per "
                               "primary namespace", labels=["primary"])
    waiting = GaugeMetricFamily(PREFIX + "backlog_waiting", "Messages waiting in them",
                                labels=["primary"])
    for row in depths:
        queues.add_metric([row["primary"]], row["queues"])
        waiting.add_metric([row["primary"]], row["waiting"])
    yield from (failovers, switch_backs, sent, sending, queues, waiting)
