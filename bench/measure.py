"""Measuring a bench phase: CPU seconds per process, wall time, percentiles."""

from __future__ import annotations

import gc
import os
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_TICK = os.sysconf("SC_CLK_TCK")
#: the names HotSpot gives its JIT compiler threads (``/proc/PID/task/*/comm``)
_COMPILER_THREADS = ("C1 CompilerThre", "C2 CompilerThre")
#: a broker is warm once its JIT compilers use less than this share of a core
#: through this many warm-up rounds in a row: after one quiet round they
#: compiled again (0.08, 0.15, 0.13, 0.08, 0.03 of a core, then 0.33 through
#: the first measured phase; a harness of 2026-12-03)
_WARM_SHARE = 0.05
_QUIET_ROUNDS = 2


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


#: the key of a phase's cores (:meth:`CpuMeter.usage`) for the broker's JIT
#: compiler threads, a part of the broker's own: a phase whose request paths
#: the warm-up did not compile (the asyncio phase, right after a warm-up of
#: sync rounds: 0.3 of a core, 2026-12-03) shares the machine with them
BROKER_JIT = "broker_jit"


class CpuMeter:
    """CPU seconds per process between two points of the bench; where one
    of them is the ``broker``, also those of its JIT compilers
    (:data:`BROKER_JIT`)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    def snapshot(self) -> dict[str, float]:
        seconds = {name: _cpu_seconds(pid) for name, pid in self.pids.items()}
        if "broker" in self.pids:
            seconds[BROKER_JIT] = compiler_seconds(self.pids["broker"])
        return seconds

    @staticmethod
    def usage(before: dict[str, float], after: dict[str, float], wall: float
              ) -> dict[str, float]:
        """Cores each process kept busy on average (1.0 = one core flat out)."""
        return {name: round((after[name] - before[name]) / wall, 2) if wall > 0 else 0.0
                for name in before}


class EngineDurations:
    """What an engine worker's ``/metrics`` says of its commands' time from
    their append to the commands topic to their answer
    (``settlement_command_duration_seconds``, by op): the engine's share of a
    caller's wait."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"

    def totals(self) -> dict[str, tuple[float, float]]:
        """Per op: seconds summed and commands counted so far."""
        with urllib.request.urlopen(self.url, timeout=5) as answer:
            text = answer.read().decode()
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name != "settlement_command_duration_seconds":
                continue
            for sample in family.samples:
                kept = {"settlement_command_duration_seconds_sum": sums,
                        "settlement_command_duration_seconds_count": counts}.get(sample.name)
                if kept is not None:
                    kept[sample.labels["op"]] = sample.value
        return {op: (sums[op], counts.get(op, 0.0)) for op in sums}

    def mean_ms_since(self, before: dict[str, tuple[float, float]], op: str) -> float | None:
        """The mean of ``op``'s commands answered since ``before`` (ms), if any."""
        now_sum, now_count = self.totals().get(op, (0.0, 0.0))
        then_sum, then_count = before.get(op, (0.0, 0.0))
        if now_count <= then_count:
            return None
        return (now_sum - then_sum) / (now_count - then_count) * 1000


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


#: the key of :attr:`Timed.cpu` for the client's garbage collections
CLIENT_GC = "client_gc"


class GcClock:
    """CPU seconds this process spends in the garbage collector's
    collections while it runs (``gc.callbacks``): a collection holds the
    GIL, so the client's every thread waits through it.

    The collecting thread's CPU time, not the wall clock: these callbacks
    are Python code, where a thread hands the GIL to one that asked for it
    and waits to get it back. Measured 2026-12-01 (ten subscriptions'
    drain, a harness): 28 young-generation-1 collections took 0.205 s by
    the wall clock and 0.045 s of CPU, with 30 voluntary context switches
    inside them and nothing collected; a thread can only block there in the
    callbacks. By the wall clock the bench printed 45 % of the drain."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._began

    def start(self) -> None:
        gc.callbacks.append(self._note)

    def stop(self) -> None:
        if self._note in gc.callbacks:
            gc.callbacks.remove(self._note)


class Timed:
    """``with Timed(meter) as t:`` gives ``t.seconds`` and ``t.cpu`` afterwards;
    where this process is the meter's ``client``, ``t.cpu`` also holds
    :data:`CLIENT_GC`: the share of the clock its garbage collections took
    (their CPU seconds over the wall seconds, as the cores of the others)."""

    def __init__(self, meter: CpuMeter) -> None:
        self.meter = meter
        self.seconds = 0.0
        self.cpu: dict[str, float] = {}
        self.end: float | None = None  # set to stop the clock before the block ends
        #: None where the meter's client is another process
        self.gc = GcClock() if meter.pids.get("client") == os.getpid() else None

    def __enter__(self) -> Timed:
        self._cpu0 = self.meter.snapshot()
        if self.gc is not None:
            self.gc.start()
        self.start = time.perf_counter()
        return self

    def stop(self) -> None:
        if self.end is None:
            self.end = time.perf_counter()
            if self.gc is not None:
                self.gc.stop()
            self._cpu1 = self.meter.snapshot()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        assert self.end is not None
        self.seconds = self.end - self.start
        self.cpu = CpuMeter.usage(self._cpu0, self._cpu1, self.seconds)
        if self.gc is not None and self.seconds > 0:
            self.cpu[CLIENT_GC] = round(self.gc.seconds / self.seconds, 3)


def median_trial(trials: list[Phase], figure: str = "rate") -> Phase:
    """Of trials of one phase, the one of median ``figure`` (its rate, or
    one of its extra figures); every trial's figure goes with it
    (``trials``), and the exactly-once check of the first trial that failed
    it, if one did: a trial that lost a message fails the phase, whatever
    its speed."""
    def value(p: Phase) -> float:
        return p.rate if figure == "rate" else float(p.extra[figure])
    median = sorted(trials, key=value)[len(trials) // 2]
    median.extra["trials"] = [round(value(p), 1) for p in trials]
    median.check = next((p.check for p in trials if p.check and not p.check.get("ok")),
                        median.check)
    return median


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def compiler_seconds(pid: int) -> float:
    """CPU seconds the JIT compiler threads of a JVM (HotSpot) have used so
    far; 0.0 for a process that has none (Tansu)."""
    total = 0.0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        try:
            if not (task / "comm").read_text().startswith(_COMPILER_THREADS):
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


@dataclass
class WarmUp:
    """How the broker was warmed up, and what its JIT compilers did after."""

    broker_pid: int
    rounds: int
    seconds: float
    #: cores the JIT compilers used in the last warm-up round
    jit_last_round: float
    #: compiler seconds and clock when the warm-up ended
    _since: tuple[float, float] = field(default=(0.0, 0.0), repr=False)

    def jit_since(self) -> float:
        """Cores the broker's JIT compilers used since the warm-up ended."""
        jit0, t0 = self._since
        return (compiler_seconds(self.broker_pid) - jit0) / max(time.monotonic() - t0, 1e-3)

    def as_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "seconds": self.seconds,
                "jit_cores_last_round": round(self.jit_last_round, 3),
                "jit_cores_while_measuring": round(self.jit_since(), 3)}



def warm_line(figures: dict[str, Any]) -> str:
    """The printed line of :meth:`WarmUp.as_dict`'s figures."""
    return (f"broker warmed up first: {figures['rounds']} round(s), {figures['seconds']:.0f} s, "
            f"until its JIT compilers used {figures['jit_cores_last_round']:.2f} of a core; "
            f"while measuring {figures['jit_cores_while_measuring']:.2f}")


def warm_up(broker_pid: int, one_round: Callable[[int], None], step: Callable[[str], None],
            *, most_s: float = 120.0) -> WarmUp:
    """Run ``one_round(i)`` until the broker's JIT compilers are quiet (or
    ``most_s`` seconds have passed), so that the phases measure the broker a
    deployment runs, not one compiling its own request paths: on a JVM just
    started, the compilers took 0.3-0.5 of a core through the first minute of
    load, a fourth of these 2 cores (Apache Kafka, a drain of bench/sessions.py:
    95 sessions/s cold, 172 warm)."""
    started = time.monotonic()
    rounds, share, quiet = 0, 0.0, 0
    while True:
        jit0, t0 = compiler_seconds(broker_pid), time.monotonic()
        one_round(rounds)
        rounds += 1
        jit1 = compiler_seconds(broker_pid)
        share = (jit1 - jit0) / max(time.monotonic() - t0, 1e-3)
        step(f"warm-up round {rounds}: the broker's JIT compilers used {share:.2f} of a core")
        quiet = quiet + 1 if share < _WARM_SHARE else 0
        # a broker without a JIT (Tansu) is as warm after one round as after two
        enough = _QUIET_ROUNDS if jit1 > 0 else 1
        if quiet >= enough or time.monotonic() - started > most_s:
            break
    return WarmUp(broker_pid, rounds, round(time.monotonic() - started, 1), share,
                  (compiler_seconds(broker_pid), time.monotonic()))


#: additions of :func:`python_speed`'s loop
_SPEED_LOOP = 10_000_000


def python_speed(additions: int = _SPEED_LOOP) -> float:
    """Seconds this interpreter takes for a loop of ``additions`` (ten
    million) additions, the best of three: how fast the machine runs Python
    this hour.

    The figures of one kind of machine moved by a factor of two between
    hours while its CPU model stayed the same (make bench's raw produce
    81,874 /s at 21:08 and 282,423 /s at 22:15 on 2026-12-01); the client
    and the engine are Python, so a run's figures are read beside this one
    (2026-12-02 02:13-02:50, 2 cores Intel Xeon, idle: 0.46-0.63 s)."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for i in range(additions):
            total += i
        best = min(best, time.perf_counter() - started)
    return round(best, 2)
