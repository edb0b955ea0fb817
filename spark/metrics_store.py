"""The monitor's durable sink: Parquet, one directory per micro-batch.

The monitor's aggregation runs in update mode, so each micro-batch outputs
the *whole current value* of every window it changed. Batch ``N`` is written
to ``metrics/batch_id=N`` with overwrite: a micro-batch that Spark runs again
after a crash (same batch id, same offsets from the checkpoint) replaces its
own output instead of adding to it, so a restart never double counts.
Readers keep, per key, the row of the newest batch whose write completed
(its ``_SUCCESS`` marker is there).

A monitor on a 2-second trigger writes 43,200 directories a day, and the
dashboard reads them all on every refresh; so every ``compact_every``
batches the batches before the current one (Spark has committed them and
never runs them again) are merged, newest row per key, into one
``metrics/compacted-N.parquet``. The merged file is renamed into place
before the directories it replaces are removed, so a reader sees every row
at all times (at worst twice, which the newest-batch rule resolves).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:  # readers (the dashboard) must not need PySpark
    from pyspark.sql import DataFrame

#: A metric row is identified by these; the newest batch holds its value.
KEY = ["window_start", "entity", "metric", "label"]
COLUMNS = [*KEY, "window_end", "n", "total", "p50", "p95", "p99", "last"]


def metrics_dir(sink: str | Path) -> Path:
    return Path(sink) / "metrics"


def write_batch(frame: DataFrame, batch_id: int, sink: str | Path,
                compact_every: int = 100) -> None:
    """``foreachBatch`` body: replace this batch's directory with its rows,
    and now and then compact the batches before it (local sinks)."""
    # A plain path string: Spark would take the URI's %-escaped "=" literally.
    target = f"{str(sink).rstrip('/')}/metrics/batch_id={batch_id:012d}"
    frame.select(*COLUMNS).coalesce(1).write.mode("overwrite").parquet(target)
    local = "://" not in str(sink)
    if local and compact_every and batch_id and batch_id % compact_every == 0:
        compact(sink, before=batch_id)


def compact(sink: str | Path, before: int) -> int:
    """Merge the completed batches below ``before`` and earlier compactions
    into one file, newest row per key; return how many batches it merged."""
    root = metrics_dir(sink)
    batches = [d for d in completed_batches(sink) if _batch_of(d) < before]
    earlier = sorted(root.glob("compacted-*.parquet"))
    if not batches:
        return 0
    merged = _newest(_read(earlier + batches))
    target = root / f"compacted-{before - 1:012d}.parquet"
    scratch = root / f".compacting-{uuid.uuid4().hex}.parquet"
    pq.write_table(pa.Table.from_pandas(merged, preserve_index=False), scratch)
    os.replace(scratch, target)
    for directory in batches:
        shutil.rmtree(directory, ignore_errors=True)
    for path in earlier:
        if path != target:
            path.unlink(missing_ok=True)
    return len(batches)


def completed_batches(sink: str | Path) -> list[Path]:
    root = metrics_dir(sink)
    if not root.is_dir():
        return []
    return sorted(d for d in root.glob("batch_id=*") if (d / "_SUCCESS").exists())


def read_metrics(sink: str | Path) -> pd.DataFrame:
    """Every metric row at its newest value (pandas; empty before the first batch)."""
    root = metrics_dir(sink)
    tries = 3
    while True:
        parts = sorted(root.glob("compacted-*.parquet")) + completed_batches(sink)
        try:
            return _newest(_read(parts))
        except FileNotFoundError:  # a compaction removed what was listed: list again
            tries -= 1
            if not tries:
                raise


def _batch_of(directory: Path) -> int:
    return int(directory.name.partition("=")[2])


def _read(parts: list[Path]) -> pd.DataFrame:
    """Rows of batch directories (``batch_id`` from the name) and compacted
    files (which keep their rows' ``batch_id``)."""
    frames = []
    for part in parts:
        table = pq.read_table(part).to_pandas()
        if part.is_dir():
            table["batch_id"] = _batch_of(part)
        frames.append(table)
    if not frames:
        return pd.DataFrame(columns=[*COLUMNS, "batch_id"])
    return pd.concat(frames, ignore_index=True)


def _newest(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows.sort_values("batch_id", kind="stable")
    return rows.drop_duplicates(KEY, keep="last").sort_values(KEY).reset_index(drop=True)


def totals(metrics: pd.DataFrame, metric: str) -> dict[tuple[str, str], float]:
    """``(entity, label) -> sum over windows`` of one counted metric."""
    rows = metrics[metrics["metric"] == metric]
    summed = rows.groupby(["entity", "label"])["total"].sum()
    return {key: float(value) for key, value in summed.items()}


def current_sessions(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per entity and session, the latest of each session figure: columns
    ``entity``, ``session``, ``active``, ``locked_until`` (ms, 0: free) and
    ``state_size``; sessions with nothing left (no message, lock or state)
    are left out."""
    rows = metrics[metrics["metric"].str.startswith("session_")]
    columns = ["entity", "session", "active", "locked_until", "state_size"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    latest = rows.sort_values("window_start").drop_duplicates(
        ["entity", "metric", "label"], keep="last")
    table = latest.pivot_table(index=["entity", "label"], columns="metric", values="last",
                               aggfunc="last")
    table.columns = [c.removeprefix("session_") for c in table.columns]
    table = table.reindex(columns=columns[2:]).fillna(0).astype("int64").reset_index()
    table = table.rename(columns={"label": "session"})
    return table[(table[["active", "locked_until", "state_size"]] > 0).any(axis=1)]


def current_gauges(metrics: pd.DataFrame, prefix: str = "gauge_") -> pd.DataFrame:
    """Per entity, the latest value of each gauge summed over its labels
    (partitions; paired clients for ``pairing_``): columns ``entity`` and
    one per gauge (``active``, ``locked``, ...), named without ``prefix``."""
    rows = metrics[metrics["metric"].str.startswith(prefix)]
    if rows.empty:
        return pd.DataFrame(columns=["entity"])
    latest = rows.sort_values("window_start").drop_duplicates(
        ["entity", "metric", "label"], keep="last")
    table = latest.pivot_table(index="entity", columns="metric", values="last", aggfunc="sum")
    table.columns = [c.removeprefix(prefix) for c in table.columns]
    return table.fillna(0).astype(int).reset_index()


def window_seconds(metrics: pd.DataFrame) -> float:
    """The monitor's window length, in seconds."""
    return float((metrics["window_end"] - metrics["window_start"]).dt.total_seconds().max())


def window_range(metrics: pd.DataFrame) -> pd.DatetimeIndex:
    """Every window from the first to the last, so quiet windows show as 0."""
    step = pd.Timedelta(seconds=window_seconds(metrics))
    return pd.date_range(metrics["window_start"].min(), metrics["window_start"].max(), freq=step)


def gauge_over_time(metrics: pd.DataFrame, entity: str, gauge: str,
                    windows: pd.DatetimeIndex) -> pd.Series:
    """A gauge summed over the entity's partitions, each partition carrying its
    last value forward through windows in which its state did not change."""
    rows = metrics[(metrics["entity"] == entity) & (metrics["metric"] == f"gauge_{gauge}")]
    table = rows.pivot_table(index="window_start", columns="label", values="last",
                             aggfunc="last")
    return table.reindex(windows).ffill().fillna(0).sum(axis=1)
