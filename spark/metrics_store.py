"""The monitor's durable sink: Parquet, one directory per micro-batch.

The monitor's aggregation runs in update mode, so each micro-batch outputs
the *whole current value* of every window it changed. Batch ``N`` is written
to ``metrics/batch_id=N`` with overwrite: a micro-batch that Spark runs again
after a crash (same batch id, same offsets from the checkpoint) replaces its
own output instead of adding to it, so a restart never double counts.
Readers keep, per key, the row of the newest batch whose write completed
(its ``_SUCCESS`` marker is there).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow.parquet as pq

if TYPE_CHECKING:  # readers (the dashboard) must not need PySpark
    from pyspark.sql import DataFrame

#: A metric row is identified by these; the newest batch holds its value.
KEY = ["window_start", "entity", "metric", "label"]
COLUMNS = [*KEY, "window_end", "n", "total", "p50", "p95", "p99", "last"]


def metrics_dir(sink: str | Path) -> Path:
    return Path(sink) / "metrics"


def write_batch(frame: DataFrame, batch_id: int, sink: str | Path) -> None:
    """``foreachBatch`` body: replace this batch's directory with its rows."""
    # A plain path string: Spark would take the URI's %-escaped "=" literally.
    target = f"{str(sink).rstrip('/')}/metrics/batch_id={batch_id:012d}"
    frame.select(*COLUMNS).coalesce(1).write.mode("overwrite").parquet(target)


def completed_batches(sink: str | Path) -> list[Path]:
    root = metrics_dir(sink)
    if not root.is_dir():
        return []
    return sorted(d for d in root.glob("batch_id=*") if (d / "_SUCCESS").exists())


def read_metrics(sink: str | Path) -> pd.DataFrame:
    """Every metric row at its newest value (pandas; empty before the first batch)."""
    frames = []
    for directory in completed_batches(sink):
        table = pq.read_table(directory).to_pandas()
        table["batch_id"] = int(directory.name.partition("=")[2])
        frames.append(table)
    if not frames:
        return pd.DataFrame(columns=[*COLUMNS, "batch_id"])
    rows = pd.concat(frames, ignore_index=True).sort_values("batch_id")
    return rows.drop_duplicates(KEY, keep="last").sort_values(KEY).reset_index(drop=True)


def totals(metrics: pd.DataFrame, metric: str) -> dict[tuple[str, str], float]:
    """``(entity, label) -> sum over windows`` of one counted metric."""
    rows = metrics[metrics["metric"] == metric]
    summed = rows.groupby(["entity", "label"])["total"].sum()
    return {key: float(value) for key, value in summed.items()}


def current_gauges(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per entity, the latest value of each gauge summed over its partitions:
    columns ``entity`` and one per gauge (``active``, ``locked``, ...)."""
    rows = metrics[metrics["metric"].str.startswith("gauge_")]
    if rows.empty:
        return pd.DataFrame(columns=["entity"])
    latest = rows.sort_values("window_start").drop_duplicates(
        ["entity", "metric", "label"], keep="last")
    table = latest.pivot_table(index="entity", columns="metric", values="last", aggfunc="sum")
    table.columns = [c.removeprefix("gauge_") for c in table.columns]
    return table.fillna(0).astype(int).reset_index()
