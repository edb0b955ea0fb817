"""``settlement dashboard``: the monitor's Parquet results as one web page.

The page is rendered in Python from :func:`spark.metrics_store.read_metrics`
(pandas over Parquet: no Spark session) with inline SVG charts, so it works
offline and in a headless browser: outcome rates over time per entity,
dead-letters by reason, lock-time percentiles, backlog now and over time,
a table with the exact totals and, on a namespace paired clients fail over
to, their failovers and backlog depth (:mod:`spark.pairing_panel`). It
reloads itself every few seconds, so it follows a running monitor.
``/metrics.json`` serves the same numbers, and ``/metrics`` in Prometheus'
text format (:mod:`spark.dashboard_metrics`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from html import escape
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pandas as pd
from prometheus_client import CONTENT_TYPE_LATEST

from spark import pairing_panel
from spark.charts import Series, bar_chart, clock, fmt, line_chart, points
from spark.dashboard_metrics import prometheus_text
from spark.metrics_store import (
    current_gauges,
    current_sessions,
    gauge_over_time,
    read_metrics,
    totals,
    window_range,
    window_seconds,
)

log = logging.getLogger(__name__)

#: ``count`` labels shown as outcomes: label -> (heading, colour).
OUTCOMES = {
    "enqueued": ("sent", "#4c78a8"),
    "completed": ("completed", "#54a24b"),
    "received_and_deleted": ("received and deleted", "#88d27a"),
    "abandoned": ("abandoned", "#f58518"),
    "lock_expired": ("lock lapsed", "#b279a2"),
    "dead_lettered": ("dead-lettered", "#e45756"),
    "deferred": ("deferred", "#72b7b2"),
    "expired": ("expired", "#9d755d"),
    "duplicate": ("duplicate", "#ff9da6"),
    "filtered": ("not selected by the rules", "#bab0ac"),
}
#: Most sessions the page lists (those with the most active messages first).
MAX_SESSIONS_SHOWN = 50
#: Outcomes that get a column in the totals table (the rest only in charts).
TABLE_OUTCOMES = ["enqueued", "completed", "abandoned", "lock_expired", "dead_lettered",
                  "deferred", "expired", "duplicate"]
#: Gauges shown as backlog: gauge -> (heading, colour).
BACKLOG = {
    "active": ("active", "#4c78a8"),
    "locked": ("locked", "#f58518"),
    "deferred": ("deferred", "#72b7b2"),
    "scheduled": ("scheduled", "#bab0ac"),
    "dead_letter": ("dead letters", "#e45756"),
}
PERCENTILES = {"p50": "#9ecae9", "p95": "#4c78a8", "p99": "#1f3f66"}
ENTITY_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2",
                 "#eeca3b", "#9d755d", "#ff9da6", "#bab0ac"]
CHROMIUM_NAMES = ["chromium", "chromium-browser"]
STYLE = """
body { font: 14px system-ui, sans-serif; margin: 20px 28px; color: #222; background: #fafafa; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 22px 0 8px; }
.meta, .muted { color: #666; fill: #666; } code { background: #eee; padding: 1px 4px; }
table { border-collapse: collapse; background: #fff; font-size: 13px; }
th, td { padding: 3px 6px; border-bottom: 1px solid #e4e4e4; text-align: right; }
td { white-space: nowrap; font-variant-numeric: tabular-nums; }
th { font-weight: 600; background: #f0f0f0; } th.group { text-align: center; }
td:first-child, th:first-child { text-align: left; font-weight: 600; }
.charts { display: grid; grid-template-columns: repeat(2, 600px); gap: 14px; }
svg { background: #fff; border: 1px solid #e4e4e4; }
svg .title { font-size: 14px; font-weight: 600; } svg .small { font-size: 11px; fill: #444; }
svg .label { font-size: 12px; } svg .grid { stroke: #eee; }
"""


def render_html(sink: str | Path, refresh_seconds: int = 5) -> str:
    """The dashboard page for the metrics in ``sink`` (a page that says how to
    start the monitor when there are none yet)."""
    everything = read_metrics(sink)
    pairing, metrics = pairing_panel.split(everything)
    rendered = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    head = (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="refresh" content="{refresh_seconds}">'
            f"<title>settlement dashboard</title><style>{STYLE}</style></head><body>"
            f"<h1>Settlement dashboard</h1><p class=meta>sink <code>{escape(str(sink))}</code>"
            f" · rendered {rendered} · reloads every {refresh_seconds} s")
    if everything.empty:
        return (head + "</p><h2>No metrics yet</h2><p>Start the monitor on this sink: "
                f"<code>settlement monitor --sink {escape(str(sink))} --connection-string "
                "'Endpoint=kafka://HOST:PORT;Namespace=NAME'</code></p></body></html>")
    table = entity_table(metrics)
    charts = [*_charts(metrics, table, window_range(everything)),
              *pairing_panel.charts(pairing, metrics, window_range(everything))]
    return (head + f" · last micro-batch {int(everything['batch_id'].max())}"
            f" · windows of {fmt(window_seconds(everything))} s</p>"
            "<h2>Totals per entity</h2>" + _table(table) + _sessions(metrics)
            + pairing_panel.section(pairing, metrics)
            + '<h2>Charts</h2><div class="charts">'
            + "".join(f"<div>{chart}</div>" for chart in charts)
            + "</div></body></html>")


def entity_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """One row per entity: outcome totals, current gauges, and lock-held and
    end-to-end percentiles. The sink keeps percentiles per window only, so
    over several windows these are the windows' percentiles averaged by their
    message counts: exact for one window, an approximation beyond."""
    counts = totals(metrics, "count")
    gauges = current_gauges(metrics).set_index("entity")
    rows = []
    for entity in sorted(metrics["entity"].unique()):
        row: dict[str, Any] = {"entity": entity}
        row |= {label: int(counts.get((entity, label), 0)) for label in TABLE_OUTCOMES}
        row |= {f"now_{g}": int(gauges.at[entity, g]) if entity in gauges.index
                and g in gauges.columns else 0 for g in BACKLOG}
        mine = metrics[metrics["entity"] == entity]
        held = _weighted_percentiles(mine[mine["metric"] == "lock_held_ms"])
        row |= {f"lock_{p}_ms": held[p] for p in PERCENTILES}
        row["end_to_end_p50_ms"] = _weighted_percentiles(
            mine[mine["metric"] == "end_to_end_ms"])["p50"]
        rows.append(row)
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["entity"])


def metrics_json(sink: str | Path) -> dict[str, Any]:
    """The page's numbers: the totals table, dead-letters by reason, and the
    paired entities and backlog queues of primaries paired with this namespace."""
    pairing, metrics = pairing_panel.split(read_metrics(sink))
    table = entity_table(metrics) if not metrics.empty else pd.DataFrame()
    reasons = [{"entity": entity, "reason": reason, "count": int(n)}
               for (entity, reason), n in totals(metrics, "dead_letter_reason").items()]
    return {"sink": str(sink), "rendered": dt.datetime.now(dt.UTC).isoformat(),
            "entities": json.loads(table.to_json(orient="records")),
            "dead_letter_reasons": reasons,
            "paired_entities": pairing_panel.paired_entities(pairing),
            "backlog_queues": (pairing_panel.backlog_depths(metrics)
                               if not metrics.empty else [])}


def _weighted_percentiles(rows: pd.DataFrame) -> dict[str, float | None]:
    n = rows["n"].sum()
    return {p: round(float((rows[p] * rows["n"]).sum() / n), 1) if n else None
            for p in PERCENTILES}


def _table(table: pd.DataFrame) -> str:
    columns = ([(label, OUTCOMES[label][0]) for label in TABLE_OUTCOMES]
               + [(f"now_{g}", heading) for g, (heading, _) in BACKLOG.items()]
               + [(f"lock_{p}_ms", p) for p in PERCENTILES] + [("end_to_end_p50_ms", "p50")])
    head = ('<table><tr><th rowspan="2">entity</th>'
            f'<th class="group" colspan="{len(TABLE_OUTCOMES)}">messages (totals)</th>'
            f'<th class="group" colspan="{len(BACKLOG)}">now</th>'
            f'<th class="group" colspan="{len(PERCENTILES)}">lock held (ms)</th>'
            '<th class="group">end to end (ms)</th></tr><tr>'
            + "".join(f"<th>{escape(heading)}</th>" for _, heading in columns) + "</tr>")
    body = []
    for row in table.to_dict("records"):
        cells = "".join(f'<td data-metric="{key}">{_cell(row[key])}</td>' for key, _ in columns)
        body.append(f'<tr data-entity="{escape(row["entity"])}"><td>{escape(row["entity"])}'
                    f"</td>{cells}</tr>")
    return head + "".join(body) + "</table>"


def _sessions(metrics: pd.DataFrame) -> str:
    """The sessions of session-enabled entities: active messages, lock, state."""
    sessions = current_sessions(metrics)
    if sessions.empty:
        return ""
    shown = sessions.sort_values(["active", "entity", "session"],
                                 ascending=[False, True, True]).head(MAX_SESSIONS_SHOWN)
    rows = []
    for row in shown.to_dict("records"):
        until = (dt.datetime.fromtimestamp(row["locked_until"] / 1000, dt.UTC)
                 .strftime("%H:%M:%S") if row["locked_until"] else "–")
        rows.append(f'<tr data-session="{escape(row["session"])}">'
                    f'<td>{escape(row["entity"])}</td><td>{escape(row["session"])}</td>'
                    f'<td data-metric="active">{row["active"]}</td>'
                    f'<td data-metric="locked_until">{until}</td>'
                    f'<td data-metric="state_size">{row["state_size"]}</td></tr>')
    more = (f'<p class=muted>{len(sessions) - len(shown)} more not shown</p>'
            if len(sessions) > len(shown) else "")
    return (f"<h2>Sessions ({len(sessions)})</h2><table><tr><th>entity</th><th>session</th>"
            "<th>active</th><th>locked until (UTC)</th><th>state (bytes)</th></tr>"
            + "".join(rows) + "</table>" + more)


def _cell(value: float | None) -> str:
    return "–" if value is None or pd.isna(value) else fmt(value)


def _charts(metrics: pd.DataFrame, table: pd.DataFrame,
            windows: pd.DatetimeIndex) -> Iterator[str]:
    entities = list(table["entity"])
    colors = {e: ENTITY_COLORS[i % len(ENTITY_COLORS)] for i, e in enumerate(entities)}
    reasons: dict[str, dict[str, float]] = {}
    for (entity, reason), n in sorted(totals(metrics, "dead_letter_reason").items()):
        reasons.setdefault(reason, {})[entity] = n
    yield bar_chart("Dead-letters by reason", reasons, colors)
    table = table.set_index("entity")
    yield bar_chart("Lock held, ms (p50 / p95 / p99)",
                    {e: {p: table.at[e, f"lock_{p}_ms"] for p in PERCENTILES}
                     for e in entities if pd.notna(table.at[e, "lock_p50_ms"])},
                    PERCENTILES, unit=" ms")
    yield bar_chart("Backlog now", {e: {heading: table.at[e, f"now_{g}"]
                                        for g, (heading, _) in BACKLOG.items()
                                        if table.at[e, f"now_{g}"]} for e in entities},
                    dict(BACKLOG.values()))
    yield line_chart("Active messages per entity (end of window)",
                     [Series(e, points(gauge_over_time(metrics, e, "active", windows)),
                             colors[e]) for e in entities], clock)
    for entity in entities:
        rates = _rates(metrics, entity, windows)
        yield line_chart(f"{entity}: outcomes per second",
                         [Series(OUTCOMES[label][0], points(rates[label]), OUTCOMES[label][1])
                          for label in OUTCOMES if label in rates], clock, unit="/s")


def _rates(metrics: pd.DataFrame, entity: str, windows: pd.DatetimeIndex) -> pd.DataFrame:
    """Per window (rows) and outcome (columns): messages per second."""
    rows = metrics[(metrics["entity"] == entity) & (metrics["metric"] == "count")
                   & metrics["label"].isin(list(OUTCOMES))]
    table = rows.pivot_table(index="window_start", columns="label", values="total",
                             aggfunc="sum")
    return table.reindex(windows).fillna(0) / window_seconds(metrics)


def make_server(sink: str | Path, host: str = "127.0.0.1", port: int = 8050,
                refresh_seconds: int = 5) -> ThreadingHTTPServer:
    """An HTTP server of the page (``/``) and its numbers (``/metrics.json``,
    and ``/metrics`` for Prometheus); port 0 picks a free one. The caller
    runs ``serve_forever``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server API)
            path = self.path.split("?")[0]
            if path == "/":
                self._send(render_html(sink, refresh_seconds).encode(),
                           "text/html; charset=utf-8")
            elif path == "/metrics.json":
                self._send(json.dumps(metrics_json(sink), indent=1).encode(),
                           "application/json; charset=utf-8")
            elif path == "/metrics":
                self._send(prometheus_text(metrics_json(sink), TABLE_OUTCOMES),
                           CONTENT_TYPE_LATEST)
            else:
                self.send_error(HTTPStatus.NOT_FOUND)

        def _send(self, body: bytes, content_type: str) -> None:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("%s " + format, self.address_string(), *args)

    return ThreadingHTTPServer((host, port), Handler)


class ChromiumNotFound(RuntimeError):
    """No headless browser to take screenshots with."""


def chromium() -> str:
    """The path of the Chromium binary, or a :class:`ChromiumNotFound` that
    says what to install."""
    for name in CHROMIUM_NAMES:
        if found := shutil.which(name):
            return found
    raise ChromiumNotFound("no chromium binary on PATH: install Debian's 'chromium' package "
                           "(apt-get install --no-install-recommends chromium)")


def _headless(*args: str, timeout: float = 60) -> str:
    """Run headless Chromium with a throw-away profile; its standard output."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                   "--hide-scrollbars", f"--user-data-dir={profile}", *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"chromium failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    return done.stdout


def dump_dom(url: str) -> str:
    """The page's DOM after loading ``url`` in headless Chromium."""
    return _headless("--dump-dom", url)


def screenshot(url: str, png: str | Path, width: int = 1280, height: int = 1600) -> Path:
    """A PNG of ``url`` (``file://`` or ``http://``) as headless Chromium shows it."""
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    _headless(f"--screenshot={png}", f"--window-size={width},{height}", url)
    if not png.is_file():
        raise RuntimeError(f"chromium wrote no screenshot to {png}")
    return png


def write_html(sink: str | Path, output: str | Path, refresh_seconds: int = 5) -> Path:
    """Render the page once into a static file (for the demo and screenshots)."""
    output = Path(output)
    output.write_text(render_html(sink, refresh_seconds), encoding="utf-8")
    return output


def run(args: argparse.Namespace) -> int:
    """``settlement dashboard``: write the page and/or a screenshot, else serve it."""
    if args.output or args.screenshot:
        with tempfile.TemporaryDirectory() as scratch:
            page = write_html(args.sink, args.output or Path(scratch) / "dashboard.html",
                              args.refresh)
            if args.output:
                print(f"dashboard: wrote {page}")
            if args.screenshot:
                try:
                    png = screenshot(page.resolve().as_uri(), args.screenshot)
                except ChromiumNotFound as exc:
                    print(f"error: {exc}", file=sys.stderr)
                    return 2
                print(f"dashboard: screenshot {png}")
        return 0
    server = make_server(args.sink, args.host, args.port, args.refresh)
    host, port = server.server_address[:2]
    # typeshed allows bytes for the host of any socket family; an HTTP server's is a str.
    assert isinstance(host, str), f"an AF_INET server bound to {host!r}"
    log.info("dashboard of %s on http://%s:%s/", args.sink, host, port)
    print(f"dashboard: http://{host}:{port}/ (metrics from {Path(args.sink).resolve()}; "
          "Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
