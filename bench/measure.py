"""Measuring a bench phase: CPU seconds per process, wall time, percentiles."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


class CpuMeter:
    """CPU seconds per process between two points of the bench."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    def snapshot(self) -> dict[str, float]:
        return {name: _cpu_seconds(pid) for name, pid in self.pids.items()}

    @staticmethod
    def usage(before: dict[str, float], after: dict[str, float], wall: float
              ) -> dict[str, float]:
        """Cores each process kept busy on average (1.0 = one core flat out)."""
        return {name: round((after[name] - before[name]) / wall, 2) if wall > 0 else 0.0
                for name in before}


@dataclass
class Phase:
    """One measured figure."""

    key: str
    label: str
    messages: int
    seconds: float
    unit: str = "msg/s"
    cpu: dict[str, float] = field(default_factory=dict)
    check: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "messages": self.messages,
                "seconds": round(self.seconds, 3), "rate": round(self.rate, 1),
                "unit": self.unit, "cpu_cores": self.cpu, "check": self.check, **self.extra}


class Timed:
    """``with Timed(meter) as t:`` gives ``t.seconds`` and ``t.cpu`` afterwards."""

    def __init__(self, meter: CpuMeter) -> None:
        self.meter = meter
        self.seconds = 0.0
        self.cpu: dict[str, float] = {}
        self.end: float | None = None  # set to stop the clock before the block ends

    def __enter__(self) -> Timed:
        self._cpu0 = self.meter.snapshot()
        self.start = time.perf_counter()
        return self

    def stop(self) -> None:
        if self.end is None:
            self.end = time.perf_counter()
            self._cpu1 = self.meter.snapshot()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        assert self.end is not None
        self.seconds = self.end - self.start
        self.cpu = CpuMeter.usage(self._cpu0, self._cpu1, self.seconds)


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]
