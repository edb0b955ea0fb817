"""Pausing a broker's process, as the pairing tests, bench and demo do to
make a primary namespace stop answering without closing its connections."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

#: how often the threads' states are read while a process stops
_EVERY_S = 0.001


def pause(pid: int, timeout: float = 10.0) -> float:
    """SIGSTOP ``pid`` and wait until every thread of it has stopped; the
    seconds that took. ``kill`` returns once one thread is told to stop, and
    that thread tells the others when it next runs: on a loaded machine a
    JVM broker answered requests sent after ``kill`` returned (a CI run saw
    a batch acknowledged by a "paused" primary)."""
    os.kill(pid, signal.SIGSTOP)
    started = time.perf_counter()
    tasks = Path(f"/proc/{pid}/task")
    while not all(_state(task) in "Tt" for task in _threads(tasks)):
        if time.perf_counter() - started > timeout:
            # resumed before raising: a caller's cleanup may not reach a
            # process left half-stopped, and the run would hang on it
            resume(pid)
            raise RuntimeError(f"process {pid} did not stop within {timeout:g} s of SIGSTOP "
                               "and was resumed; it may be in uninterruptible I/O (state D): "
                               "check its disk")
        time.sleep(_EVERY_S)
    return time.perf_counter() - started


def resume(pid: int) -> None:
    """SIGCONT ``pid`` (paused by :func:`pause`)."""
    os.kill(pid, signal.SIGCONT)


def _threads(tasks: Path) -> list[Path]:
    try:
        return list(tasks.iterdir())
    except OSError:  # the process is gone: nothing of it runs
        return []


def _state(task: Path) -> str:
    """The state letter of one thread (``T`` stopped, ``t`` traced); ``T``
    once the thread is gone."""
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "T"
