"""The bench's account of a missed target names what bounds it."""

from __future__ import annotations

import gc
import os

from bench.measure import CLIENT_GC, CpuMeter, Phase, Timed
from bench.run import TARGETS, why_missed


def _phases(client: float, engine: float, broker: float) -> dict[str, Phase]:
    """This run's figures: the floor phases, and eight threads settling
    20,000 messages in 8 s with the processes' cores as given."""
    return {
        "settle_latency": Phase("settle_latency", "", 300, 1.0, extra={"p50_ms": 0.45}),
        "raw_round_trip": Phase("raw_round_trip", "", 300, 1.0, extra={"p50_ms": 1.27}),
        "raw_ack_latency": Phase("raw_ack_latency", "", 300, 1.0, extra={"p50_ms": 0.49}),
        "peek_lock_threads": Phase("peek_lock_threads", "", 20_000, 8.0, extra={"callers": 8},
                                   cpu={"client": client, "engine": engine, "broker": broker}),
    }


def test_processes_that_share_the_machine_s_busy_cores_are_called_cpu_bound() -> None:
    threads = next(t for t in TARGETS if t.phase == "peek_lock_threads")
    cores = os.cpu_count() or 1
    share = 0.95 * cores / 3  # each below a core (on two), all three near the machine's total
    why = why_missed(threads, _phases(share, share, share))
    assert f"together they keep {3 * share:.2f} of the {cores} cores busy" in why
    per_message = 3 * share / 2_500 * 1e6  # 20,000 messages in 8 s
    assert f"{per_message:,.0f} µs of CPU a message" in why

    idle = why_missed(threads, _phases(0.1, 0.1, 0.1))
    assert "neither the client nor the engine fills a core" in idle
    assert "together" not in idle


def _collect_cycles() -> None:
    """Make garbage only the collector frees (cycles), and collect it."""
    for _ in range(20):
        cycles = [[] for _ in range(5_000)]
        for a in cycles:
            a.append(a)
        del cycles
        gc.collect()


def test_a_phase_measures_the_time_the_client_s_garbage_collections_took() -> None:
    callbacks = len(gc.callbacks)
    with Timed(CpuMeter({"client": os.getpid()})) as timed:
        _collect_cycles()
    share = timed.cpu[CLIENT_GC]
    assert 0 < share <= 1, share

    threads = next(t for t in TARGETS if t.phase == "peek_lock_threads")
    phases = _phases(0.1, 0.1, 0.1)
    phases["peek_lock_threads"].cpu[CLIENT_GC] = 0.23
    assert "the client's garbage collections took 23% of the phase" in why_missed(threads,
                                                                                  phases)

    # another process's meter: this process is not its client
    with Timed(CpuMeter({"client": os.getppid()})) as other:
        _collect_cycles()
    assert CLIENT_GC not in other.cpu
    assert len(gc.callbacks) == callbacks  # each clock stopped with its phase
