"""An engine worker keeps its threads on one CPU where waking a thread on another is slow.

Every command crosses threads inside the engine: librdkafka's threads fetch
it and wake the reader thread, which wakes the event loop; the commit record
goes to librdkafka's threads, and its acknowledgement comes back through the
delivery thread, which wakes the loop again. Where a thread woken on another
CPU waits for that CPU to be woken by a hypervisor (a nested virtual machine,
as the 2-core machines of 2026-12-06 were), each such hop cost about 25-35 us
against 3-4 us on one CPU (two threads handing a lock back and forth: 57 us a
round across two CPUs, 7 us on one), and a ``producer.produce`` that wakes
librdkafka's sender held the GIL for as long. With make bench's phases run
alternately with the engine's threads on one CPU and not (2026-12-06, three
pairs of trials in a run): asyncio ``receive(100)`` + ``gather`` of
``complete_message`` 12,740 -> 14,062 msg/s, one thread settling one message
at a time 2,344 -> 2,671, eight threads 4,204 -> 4,317; the engine's CPU a
message 10-15 % less.

The engine's Python runs one thread at a time anyway (the GIL); what it gives
up on one CPU is librdkafka's threads running beside it, which cost far less
than the wakes they save there. Where a wake across CPUs costs about what one
on the same CPU does, placement is left to the kernel. So a worker measures
both as it starts, before it starts any thread of its own, and decides: no
setting (a deployment that gives the worker one CPU has nothing to decide).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: a wake across CPUs at least this many times one on the same CPU keeps the
#: worker on one (57 / 7 us on the nested virtual machines of 2026-12-06)
WAKE_RATIO = 3.0
#: round trips per measurement, the best of three measurements taken (a few
#: milliseconds in all where hops are slow)
_ROUNDS = 200
#: how long either thread of the probe waits for the other before giving up
#: (a round takes microseconds; only a thread that stopped takes this long)
_ANSWER_WAIT_S = 2.0


@dataclass(frozen=True)
class Placement:
    """What a worker decided about its CPUs, and why."""

    #: the CPU its threads are kept on; None: the kernel places them
    cpu: int | None
    #: a thread's wake and answer on its own CPU, and across two, in us (None: not measured)
    same_cpu_us: float | None = None
    across_cpus_us: float | None = None

    def describe(self) -> str:
        """One line for the worker's log."""
        if self.same_cpu_us is None or self.across_cpus_us is None:
            return ("engine threads placed by the kernel (the worker may use one CPU only, "
                    "or its threads' wakes could not be measured)")
        measured = (f"a thread woken and answered across CPUs in {self.across_cpus_us:.0f} us, "
                    f"on one CPU in {self.same_cpu_us:.0f} us")
        if self.cpu is None:
            return f"engine threads placed by the kernel: {measured}"
        return f"engine threads kept on CPU {self.cpu}: {measured}"


def keeps_together(same_cpu_us: float, across_cpus_us: float) -> bool:
    """Whether wakes across CPUs are slow enough to keep a worker on one."""
    return across_cpus_us >= WAKE_RATIO * same_cpu_us


def wake_round_trip_us(here: int, there: int, rounds: int = _ROUNDS) -> float:
    """Microseconds for the calling thread, kept on CPU ``here``, to wake a
    thread kept on CPU ``there`` and be woken by it; the best of three
    measurements of ``rounds``. Leaves the calling thread on ``here``.
    Raises OSError where a thread may not be placed (a container that
    forbids it), TimeoutError if the other thread stops answering."""
    os.sched_setaffinity(0, {here})  # 0: the calling thread (Linux)
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()
    total = 3 * rounds
    refused: list[OSError] = []

    def answer() -> None:
        try:
            os.sched_setaffinity(0, {there})
        except OSError as exc:
            refused.append(exc)  # answers all the same, so that the caller's rounds end
        for _ in range(total):
            if not ping.acquire(timeout=_ANSWER_WAIT_S):
                return
            pong.release()

    partner = threading.Thread(target=answer, name="placement-probe", daemon=True)
    partner.start()
    best = float("inf")
    try:
        for _ in range(3):
            started = time.perf_counter()
            for _ in range(rounds):
                ping.release()
                if not pong.acquire(timeout=_ANSWER_WAIT_S):
                    raise TimeoutError("the probe's other thread stopped answering")
            best = min(best, (time.perf_counter() - started) / rounds * 1e6)
    finally:
        partner.join(_ANSWER_WAIT_S)
    if refused:
        raise refused[0]
    return best


def measure_wakes() -> tuple[int, float, float] | None:
    """The CPU the calling thread runs on, and the round trips (us) of
    :func:`wake_round_trip_us` on that CPU and across to another; None where
    the process may use one CPU only. The thread's CPUs are as they were after."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no CPU affinity here (not Linux)
        return None
    if len(allowed) < 2:
        return None
    here = _current_cpu(allowed)
    there = next(cpu for cpu in allowed if cpu != here)
    try:
        across = wake_round_trip_us(here, there)
        same = wake_round_trip_us(here, here)
    except (OSError, TimeoutError) as exc:
        log.warning("could not measure how long threads take to wake (%s); the kernel "
                    "places this process's threads", exc)
        return None
    finally:
        try:
            os.sched_setaffinity(0, set(allowed))
        except OSError:  # refused to place it in the first place: it is where it was
            pass
    return here, same, across


def keep_threads_together() -> Placement:
    """Measure this machine's wakes and, where they are slow across CPUs,
    keep this process's threads (and every thread they start) on the CPU it
    runs on. Call it before the process starts threads of its own."""
    measured = measure_wakes()
    if measured is None:
        return Placement(None)
    here, same, across = measured
    if not keeps_together(same, across):
        return Placement(None, same, across)
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]  # a library's, started already
    except OSError:  # no /proc: the calling thread, and those it starts
        threads = [0]
    for thread in threads:
        try:
            os.sched_setaffinity(thread, {here})
        except OSError:  # ended meanwhile
            pass
    return Placement(here, same, across)


def _current_cpu(allowed: list[int]) -> int:
    """The CPU this process last ran on (where the kernel put it: workers
    started together start apart), if it may run there; else the first allowed."""
    try:
        with open("/proc/self/stat") as stat:
            # field 39, counted after the command name, which may hold spaces
            cpu = int(stat.read().rpartition(")")[2].split()[36])
    except (OSError, ValueError, IndexError):
        return allowed[0]
    return cpu if cpu in allowed else allowed[0]
