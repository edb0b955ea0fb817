"""The bench's account of a missed target names what bounds it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

from bench.measure import (
    BROKER_JIT,
    CLIENT_GC,
    CpuMeter,
    Phase,
    Timed,
    median_trial,
    python_speed,
    warm_up,
)
from bench.run import TARGETS, machine_info, machine_label, render_targets, why_missed
from bench.sessions import STEPS, drain_bound


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


def test_the_machine_line_says_how_fast_the_machine_ran_python() -> None:
    machine = machine_info()
    assert machine["python_loop_s"] > 0
    assert f"10M Python additions in {machine['python_loop_s']:.2f} s" in machine_label(machine)
    wakes = machine["thread_wake_us"]
    if len(os.sched_getaffinity(0)) > 1:
        assert wakes["same_cpu"] > 0 and wakes["across_cpus"] > 0
        assert (f"a thread woken and answered across CPUs in {wakes['across_cpus']:.0f} us, "
                f"on one in {wakes['same_cpu']:.0f} us") in machine_label(machine)
    else:
        assert wakes is None
    # results written before the probes existed still render
    del machine["python_loop_s"], machine["thread_wake_us"]
    assert "Python additions" not in machine_label(machine)
    assert "woken" not in machine_label(machine)
    assert machine["cpu_model"] in machine_label(machine)


def test_a_busier_machine_runs_the_speed_loop_slower() -> None:
    """The probe measures the interpreter's speed, not a constant: with four
    processes spinning for each core, it gets a fifth of a core and takes
    longer. (With two, it failed once on a busy 2-core machine: the best of
    three loops of 60 ms can fall in a lucky run of time slices.)"""
    alone = python_speed(2_000_000)
    # each spinner says when its interpreter is up: measured before they
    # spun (an interpreter takes tens of ms to start), the probe ran alone
    # (CI, 2026-12-04: 0.06 s busy against 0.07 s alone)
    spinners = [subprocess.Popen([sys.executable, "-c", "print(flush=True)\nwhile True: pass"],
                                 stdout=subprocess.PIPE)
                for _ in range(4 * (os.cpu_count() or 1))]
    try:
        for p in spinners:
            assert p.stdout is not None
            p.stdout.readline()
        busy = python_speed(2_000_000)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert busy > alone * 1.2


def _drain(**extra: object) -> dict[str, object]:
    """A session drain as bench.sessions stores it: 20 ms a session."""
    steps = {s: {"p50_ms": ms, "p90_ms": 2 * ms}
             for s, ms in zip(STEPS, (0.2, 15.8, 0.0, 2.2, 1.8), strict=True)}
    return {"steps": steps, "cpu_cores": {"client": 0.33, "engine": 0.69, "broker": 0.51},
            **extra}


def test_the_session_drain_s_bound_gives_the_engine_s_share_of_the_lock() -> None:
    line = drain_bound(_drain(engine_mean_ms={"lock_session": 13.53, "settle": 14.61,
                                              "release_session": 13.92}), 2)
    assert "a receiver's session takes 20 ms (p50s), 15.8 ms of them the lock" in line
    assert ("from a command's append to its answer, mean: lock 13.5 ms, settlements 14.6 ms, "
            "release 13.9 ms") in line
    assert "1.53 of 2 busy (client/engine/broker 0.33/0.69/0.51)" in line
    # results stored before the engine's share was measured still render
    older = drain_bound(_drain(), 2)
    assert "15.8 ms of them the lock" in older and "append to its answer" not in older


#: a process whose main thread is named as HotSpot names a JIT compiler
#: thread: it spins until a line comes on its standard input, then idles
#: until that closes
_COMPILER = """
import ctypes, select, sys
ctypes.CDLL(None).prctl(15, b"C2 CompilerThread0", 0, 0, 0)  # PR_SET_NAME
print("named", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:
    pass
sys.stdin.read()
"""


def _compiling() -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _COMPILER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "named\n"
    return proc


def _quiet(proc: subprocess.Popen[str]) -> None:
    """Stop its spinning; it stays alive."""
    assert proc.stdin is not None
    proc.stdin.write("stop\n")
    proc.stdin.flush()


def _stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)


def test_a_phase_measures_what_the_broker_s_jit_compilers_took() -> None:
    compiler = _compiling()
    try:
        with Timed(CpuMeter({"broker": compiler.pid})) as busy:
            time.sleep(0.5)
    finally:
        _stop(compiler)
    assert busy.cpu[BROKER_JIT] >= 0.5, busy.cpu  # a core, less what this machine shared
    with Timed(CpuMeter({"broker": os.getpid()})) as none:  # no JVM: no compiler threads
        time.sleep(0.1)
    assert none.cpu[BROKER_JIT] == 0.0

    threads = next(t for t in TARGETS if t.phase == "peek_lock_threads")
    phases = _phases(0.1, 0.1, 0.1)
    phases["peek_lock_threads"].cpu[BROKER_JIT] = 0.31
    assert "the broker's JIT compilers used 0.31 of a core" in why_missed(threads, phases)
    phases["peek_lock_threads"].cpu[BROKER_JIT] = 0.01
    assert "JIT" not in why_missed(threads, phases)


def test_the_warm_up_ends_after_two_rounds_in_a_row_without_compiling() -> None:
    """One quiet round is not enough: the compilers started again after one."""
    compiler = _compiling()
    rounds: list[int] = []

    def one_round(number: int) -> None:
        rounds.append(number)
        time.sleep(0.2)
        if number == 1:
            _quiet(compiler)  # compiles through rounds 0 and 1, then never again

    try:
        warmed = warm_up(compiler.pid, one_round, lambda _: None, most_s=30)
    finally:
        _stop(compiler)
    assert rounds == [0, 1, 2, 3]
    assert warmed.rounds == 4 and warmed.jit_last_round < 0.05


def test_a_broker_without_a_jit_is_warmed_in_one_round() -> None:
    """Tansu has no compiler threads: a second quiet round would only cost time."""
    rounds: list[int] = []
    warm_up(os.getpid(), rounds.append, lambda _: None, most_s=30)
    assert rounds == [0]


def test_a_phase_run_in_trials_is_their_median_and_fails_if_one_lost_a_message() -> None:
    ok = {"ok": True}
    trials = [Phase("peek_lock_threads", "", 20_000, s, check=dict(ok), extra={"callers": 8})
              for s in (4.0, 2.0, 5.0)]  # 5,000, 10,000 and 4,000 /s
    median = median_trial(trials)
    assert median.rate == 5_000 and median.extra["trials"] == [5_000, 10_000, 4_000]
    assert median.check["ok"]

    # every other target met by one run of its phase
    phases = _phases(0.1, 0.1, 0.1) | {
        t.phase: Phase(t.phase, "", 1_000_000, 1.0, extra={
            "receive_and_complete_rate": 1e6, "engine_commands_per_s": 1.0,
            "engine_commands": 1}) for t in TARGETS if t.figure != "p50_ms"}
    phases["settle_latency"].extra.update(p50_ms=0.45, p99_ms=1.0)
    phases["peek_lock_threads"] = median
    threads = next(t for t in TARGETS if t.phase == "peek_lock_threads")
    lines = render_targets(phases)
    assert f"  {threads.label}: 5,000.00 msg/s (the median of 5,000, 10,000, 4,000) -> met" \
        in lines
    assert sum("the median of" in line for line in lines) == 1

    lost = {"ok": False, "missing": 1}
    trials = [Phase("sdk_loop", "", 2_000, s, check=c, extra={"rate_of": s})
              for s, c in ((1.0, ok), (2.0, lost), (3.0, ok))]
    median = median_trial(trials, "rate_of")  # by an extra figure
    assert median.extra["trials"] == [1.0, 2.0, 3.0] and median.seconds == 2.0
    assert median.check == lost
