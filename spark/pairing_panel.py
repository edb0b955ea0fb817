"""The dashboard's paired-namespace section, for a monitor on a namespace
that is the *secondary* of others: which entities of a primary failed over
to it and when, how many messages their clients sent to the backlog, and
how many wait in the backlog queues, now and over time.

Its numbers are the monitor's ``pairing_*`` facts, read from the status
records paired clients publish to ``NS.__pairing`` (entity
``PRIMARY/ENTITY``, one label per client), and the ordinary gauges of the
backlog queues (``x-servicebus-transfer.PRIMARY.<i>``). A client in the
backlog reports every few seconds and reports when it closes; one that died
without closing keeps its last mode, which the "last report" column dates.
"""

from __future__ import annotations

from collections.abc import Iterator
from html import escape
from typing import Any

import pandas as pd

from spark.charts import Series, clock, fmt, line_chart, points
from spark.metrics_store import current_gauges, gauge_over_time, totals
from topics import names

PREFIX = "pairing_"
COLORS = ["#e45756", "#4c78a8", "#f58518", "#54a24b", "#72b7b2", "#b279a2"]


def split(metrics: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(pairing facts, every other row)`` of the monitor's metrics."""
    paired = metrics["metric"].str.startswith(PREFIX)
    return metrics[paired], metrics[~paired]


def paired_entities(pairing: pd.DataFrame) -> list[dict[str, Any]]:
    """Per primary entity: ``failovers`` and ``sent_to_backlog`` (summed over
    its clients' latest reports), ``sending_to_backlog`` (clients whose sends
    go to the backlog now), ``switch_backs`` and ``last_report`` (the start
    of the newest window with a report)."""
    if pairing.empty:
        return []
    now = current_gauges(pairing[pairing["metric"] != "pairing_event"], PREFIX)
    now = now.set_index("entity")
    events = totals(pairing, "pairing_event")
    last = pairing.groupby("entity")["window_start"].max()
    return [{"entity": entity,
             "failovers": int(now.at[entity, "failovers"]),
             "switch_backs": int(events.get((entity, "switch_back"), 0)),
             "sending_to_backlog": int(now.at[entity, "mode"]),
             "sent_to_backlog": int(now.at[entity, "sent"]),
             "last_report": last[entity].isoformat()}
            for entity in sorted(now.index)]


def backlog_queues(metrics: pd.DataFrame) -> dict[str, list[str]]:
    """Primary namespace -> its backlog queues among the metrics' entities."""
    found: dict[str, list[str]] = {}
    for entity in sorted(metrics["entity"].unique()):
        if (primary := names.primary_of_backlog_queue(entity)) is not None:
            found.setdefault(primary, []).append(entity)
    return found


def backlog_depths(metrics: pd.DataFrame) -> list[dict[str, Any]]:
    """Per primary namespace: its backlog queues and the messages waiting
    in them now (active, locked or deferred by the syphon)."""
    gauges = current_gauges(metrics).set_index("entity")
    waiting = [g for g in ("active", "locked", "deferred") if g in gauges.columns]
    return [{"primary": primary, "queues": len(queues),
             "waiting": int(gauges.loc[[q for q in queues if q in gauges.index],
                                       waiting].to_numpy().sum())}
            for primary, queues in backlog_queues(metrics).items()]


def section(pairing: pd.DataFrame, metrics: pd.DataFrame) -> str:
    """The section's tables (nothing when no paired client reported here
    and no backlog queue exists)."""
    entities, depths = paired_entities(pairing), backlog_depths(metrics)
    if not entities and not depths:
        return ""
    html = ["<h2>Paired namespaces: sends kept here while their primary was away</h2>"]
    if entities:
        html.append("<table><tr><th>primary entity</th><th>failovers</th><th>switch backs</th>"
                    "<th>clients sending to the backlog now</th><th>sent to the backlog</th>"
                    "<th>last report (UTC)</th></tr>")
        for row in entities:
            cells = "".join(f'<td data-metric="{key}">{fmt(row[key])}</td>' for key in (
                "failovers", "switch_backs", "sending_to_backlog", "sent_to_backlog"))
            html.append(f'<tr data-paired="{escape(row["entity"])}"><td>'
                        f'{escape(row["entity"])}</td>{cells}<td data-metric="last_report">'
                        f'{row["last_report"][11:19]}</td></tr>')
        html.append("</table>")
    if depths:
        html.append("<p></p><table><tr><th>primary namespace</th><th>backlog queues</th>"
                    "<th>messages waiting now</th></tr>")
        html.extend(f'<tr data-backlog="{escape(row["primary"])}"><td>{escape(row["primary"])}'
                    f'</td><td data-metric="queues">{row["queues"]}</td>'
                    f'<td data-metric="waiting">{row["waiting"]}</td></tr>' for row in depths)
        html.append("</table>")
    return "".join(html)


def charts(pairing: pd.DataFrame, metrics: pd.DataFrame,
           windows: pd.DatetimeIndex) -> Iterator[str]:
    """Backlog depth per primary namespace and failovers per entity, per window."""
    queues = backlog_queues(metrics)
    if queues:
        yield line_chart(
            "Backlog queues: messages waiting (end of window)",
            [Series(primary, points(sum(gauge_over_time(metrics, q, "active", windows)
                                        for q in mine)), COLORS[i % len(COLORS)])
             for i, (primary, mine) in enumerate(queues.items())], clock)
    failovers = pairing[(pairing["metric"] == "pairing_event")
                        & (pairing["label"] == "failover")]
    if not pairing.empty:
        per_window = failovers.pivot_table(index="window_start", columns="entity",
                                           values="total", aggfunc="sum")
        entities = sorted(pairing["entity"].unique())
        yield line_chart(
            "Failovers to this namespace per window",
            [Series(e, points(per_window[e].reindex(windows).fillna(0)
                              if e in per_window.columns else pd.Series(0, index=windows)),
                    COLORS[i % len(COLORS)]) for i, e in enumerate(entities)], clock)
