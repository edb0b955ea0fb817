"""An engine worker keeps its threads on one CPU only where wakes across CPUs are slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from streams.placement import Placement, keeps_together

#: run in a process of its own: the decision changes the CPUs of the process's threads
_DECIDE = """
import json, os, sys, threading
from streams.placement import keep_threads_together
if len(sys.argv) > 1:
    os.sched_setaffinity(0, {int(sys.argv[1])})
placement = keep_threads_together()
later = []
thread = threading.Thread(target=lambda: later.append(sorted(os.sched_getaffinity(0))))
thread.start()
thread.join()
print(json.dumps({"cpu": placement.cpu, "same": placement.same_cpu_us,
                  "across": placement.across_cpus_us, "main": sorted(os.sched_getaffinity(0)),
                  "later": later[0], "line": placement.describe()}))
"""

two_cpus = pytest.mark.skipif(not hasattr(os, "sched_getaffinity")
                              or len(os.sched_getaffinity(0)) < 2,
                              reason="needs two CPUs this process may use")


def decide(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _DECIDE, *args], capture_output=True,
                          text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_slow_wakes_across_cpus_keep_the_worker_together() -> None:
    assert keeps_together(same_cpu_us=7.0, across_cpus_us=57.0)  # a nested VM, measured
    assert not keeps_together(same_cpu_us=5.0, across_cpus_us=8.0)  # a CPU woken directly
    assert not keeps_together(same_cpu_us=5.0, across_cpus_us=14.9)


@two_cpus
def test_the_decision_follows_the_measured_wakes_and_binds_later_threads() -> None:
    got = decide()
    assert got["same"] > 0 and got["across"] > 0
    allowed = sorted(os.sched_getaffinity(0))
    if keeps_together(got["same"], got["across"]):
        assert got["cpu"] in allowed
        # the process and a thread it starts afterwards both stay on that CPU
        assert got["main"] == got["later"] == [got["cpu"]]
        assert got["line"].startswith(f"engine threads kept on CPU {got['cpu']}: ")
    else:
        assert got["cpu"] is None
        assert got["main"] == got["later"] == allowed  # the measuring left nothing pinned
        assert got["line"].startswith("engine threads placed by the kernel: ")
    assert f"across CPUs in {got['across']:.0f} us" in got["line"]


@two_cpus
def test_a_worker_given_one_cpu_has_nothing_to_decide() -> None:
    cpu = str(max(os.sched_getaffinity(0)))
    got = decide(cpu)
    assert got["cpu"] is None and got["same"] is None
    assert got["main"] == got["later"] == [int(cpu)]
    assert got["line"] == Placement(None).describe()


@two_cpus
def test_a_thread_that_may_not_be_placed_ends_the_probe_with_the_reason() -> None:
    """A CPU the process may not use (as a container that forbids placing
    threads refuses any): the probe raises at once rather than waiting for
    an answer that never comes, and the worker leaves placement to the kernel."""
    probe = ("import os\n"
             "from streams.placement import wake_round_trip_us\n"
             "here = min(os.sched_getaffinity(0))\n"
             "try:\n"
             "    wake_round_trip_us(here, 100_000)\n"
             "except OSError as exc:\n"
             "    print('refused', exc.errno)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=30, check=True)
    assert done.stdout.startswith("refused ")
