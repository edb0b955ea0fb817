"""One process at a time fills a local cache (``settlement.testing.maven.
cache_lock``): ``make test`` runs two pytest workers, which may start Apache
Kafka (jars fetched by Maven) and Spark (its connector fetched by Ivy) at once
on a machine whose caches are still empty."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from settlement.testing.maven import cache_lock

ROOT = Path(__file__).resolve().parent.parent
#: takes the lock on argv[1], prints when it got it, holds it argv[2] seconds
HOLDER = """
import sys, time
from pathlib import Path
from settlement.testing.maven import cache_lock
with cache_lock(Path(sys.argv[1])):
    print(time.monotonic(), flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(directory: Path, hold_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), str(hold_s)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)


def test_a_second_process_waits_until_the_first_releases_the_lock(tmp_path: Path) -> None:
    with cache_lock(tmp_path / "ivy"):
        other = _holder(tmp_path / "ivy", 0)
        time.sleep(1.0)
        assert other.poll() is None, "the other process did not wait for the lock"
        released = time.monotonic()
    out, _ = other.communicate(timeout=30)
    assert other.returncode == 0
    assert float(out) >= released  # CLOCK_MONOTONIC: one clock for every process


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    holder = _holder(tmp_path, 300)
    assert holder.stdout is not None
    holder.stdout.readline()  # it holds the lock now
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(10)
    started = time.monotonic()
    with cache_lock(tmp_path):
        assert time.monotonic() - started < 5
