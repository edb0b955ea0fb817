"""Prometheus metrics of an engine worker (``settlement worker --metrics-port PORT``).

prometheus_client's own HTTP server, a thread of the worker, serves them at
``/metrics``. Each worker counts what it runs, so Prometheus sums the
workers of a namespace. What is measured where:

* at the command agent's hooks (``on_client_command``, ``on_answered``):
  ``settlement_commands_total{op,outcome}`` (every command answered, the
  engine's own operations and quiet settlements included; outcome ``ok`` or
  the refusal's error code), ``settlement_command_duration_seconds{op}``
  (admitted client commands, from when Kafka appended the command to when
  its answer was handed to the producer: the broker's clock against this
  worker's, so it includes the wait in the commands topic),
  ``settlement_settlements_total{entity,action,status}`` (one per settle
  item: complete, abandon, dead_letter, defer, renew... answered ok,
  lock_lost or invalid) and ``settlement_delivered_messages_total{entity}``
  (messages handed out by receives);
* at each scrape, from the windows this worker holds (their stored headers:
  the summary the state topic carries): ``settlement_windows{entity}``,
  ``settlement_locks{entity}`` (messages locked now) and
  ``settlement_messages{entity,state}``; and ``settlement_commands_lag{partition}``,
  commands appended to a commands partition of this worker that it has not
  finished (the high watermark of its last fetch minus its committed offset);
* ``settlement_engine_errors_total{logger}``: records the engine's own
  loggers (``streams.*``) write at ERROR or above: batches and windows that
  failed, unreadable windows. Refused commands are not errors: they are
  counted by outcome.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streams import command_agent
from streams.app import app, stored_headers
from streams.window import InflightWindow
from topics.commands import Command, SettleArgs, granted
from topics.errors import ErrorCode

log = logging.getLogger(__name__)

COMMANDS = Counter("settlement_commands_total",
                   "Commands answered, by operation and outcome (ok, or the error code "
                   "they were refused with)", ["op", "outcome"])
DURATION = Histogram("settlement_command_duration_seconds",
                     "Admitted client commands: from their append to the commands topic to "
                     "their answer", ["op"],
                     buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                              0.5, 1.0, 2.5, 5.0))
SETTLEMENTS = Counter("settlement_settlements_total",
                      "Settle items (one per message) by what they asked and their answer "
                      "(ok, lock_lost, invalid)", ["entity", "action", "status"])
DELIVERED = Counter("settlement_delivered_messages_total",
                    "Messages handed out by receives (peek-lock and receive-and-delete)",
                    ["entity"])
ERRORS = Counter("settlement_engine_errors_total",
                 "Records the engine's loggers wrote at ERROR or above", ["logger"])
#: the summary counts exported as settlement_messages{state}
MESSAGE_STATES = ("active", "deferred", "dead_letter", "transfer_dead_letter", "scheduled")
#: how long a scrape waits for the engine's event loop to read its windows
SCRAPE_WAIT_S = 5.0
#: client command id -> when Kafka appended it (ms), until it is answered
_appended_ms: dict[str, int] = {}
#: more admitted and unanswered commands than this means answers were lost
#: (a batch that failed): forget them rather than grow
_MAX_PENDING = 100_000


def serve(port: int) -> None:
    """Count at the engine's hooks and serve ``/metrics`` on ``port`` (all
    interfaces) from a thread of this process. Called once, before the
    worker starts (a port in use fails the start, saying so)."""
    command_agent.on_client_command.append(_admitted)
    command_agent.on_answered.append(_answered)
    logging.getLogger("streams").addHandler(_ErrorCounter())
    # app.loop is the loop the worker runs (both take this thread's)
    REGISTRY.register(_EngineView(app.loop))
    try:
        start_http_server(port)
    except OSError as exc:
        raise RuntimeError(f"cannot serve metrics on port {port} ({exc}): pick a free "
                           "--metrics-port") from exc


def _admitted(cmd: Command, appended_ms: int) -> None:
    if len(_appended_ms) >= _MAX_PENDING:
        _appended_ms.clear()
    _appended_ms[cmd.id] = appended_ms


def _answered(cmd: Command, result: dict[str, Any], code: ErrorCode | None) -> None:
    op = str(cmd.op)
    COMMANDS.labels(op, str(code) if code is not None else "ok").inc()
    appended = _appended_ms.pop(cmd.id, None)
    if appended is not None:  # clocks a little apart must not make it negative
        DURATION.labels(op).observe(max(0.0, time.time() - appended / 1000))
    if code is not None:
        return
    if isinstance(cmd.args, SettleArgs):
        # not strict: a command id used again with other items gets the first
        # command's answers, and counting must never fail an answer
        for item, (status, _until) in zip(cmd.args.items, result["results"], strict=False):
            SETTLEMENTS.labels(cmd.entity, str(item.action), status).inc()
    if "grants" in result:
        DELIVERED.labels(cmd.entity).inc(granted(result["grants"]))


class _ErrorCounter(logging.Handler):
    """Counts the engine's ERROR records by logger; writes nothing."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)

    def emit(self, record: logging.LogRecord) -> None:
        ERRORS.labels(record.name).inc()


class _EngineView(Collector):
    """The gauges read at scrape time, on the engine's event loop: its
    tables and its consumer belong to that loop, not to the server's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        future = asyncio.run_coroutine_threadsafe(_engine_view(), self._loop)
        try:
            view = future.result(SCRAPE_WAIT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            log.warning("the engine did not read its windows and offsets within %.0f s "
                        "(starting, or busy); this scrape has its counters only",
                        SCRAPE_WAIT_S)
            return
        except Exception as exc:  # a scrape that fails would lose the counters too
            log.warning("could not read the windows and offsets for this scrape (%s: %s); "
                        "it has the counters only", type(exc).__name__, exc)
            return
        yield from view


async def _engine_view() -> list[Metric]:
    windows = GaugeMetricFamily("settlement_windows", "Windows (entity partitions) this "
                                "worker holds", labels=["entity"])
    locks = GaugeMetricFamily("settlement_locks", "Messages locked now (in-flight locks)",
                              labels=["entity"])
    messages = GaugeMetricFamily("settlement_messages", "Messages by state (active includes "
                                 "the locked ones)", labels=["entity", "state"])
    lag = GaugeMetricFamily("settlement_commands_lag", "Commands appended to a commands "
                            "partition of this worker and not finished yet",
                            labels=["partition"])
    if not app.consumer.assignment():  # not started, or between rebalances
        return [windows, locks, messages, lag]
    per_entity: dict[str, dict[str, int]] = {}
    for _, raw in stored_headers():
        if not raw:
            continue
        summary = InflightWindow.from_header(raw).summary()
        counts = per_entity.setdefault(summary["entity"], dict.fromkeys(
            ("windows", "locked", *MESSAGE_STATES), 0))
        counts["windows"] += 1
        for name in ("locked", *MESSAGE_STATES):
            counts[name] += summary[name]
    for entity, counts in sorted(per_entity.items()):
        windows.add_metric([entity], counts["windows"])
        locks.add_metric([entity], counts["locked"])
        for state in MESSAGE_STATES:
            messages.add_metric([entity, state], counts[state])
    for partition, behind in sorted((await command_agent.intake.lag()).items()):
        lag.add_metric([str(partition)], behind)
    return [windows, locks, messages, lag]
