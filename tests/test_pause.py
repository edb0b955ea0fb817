"""``settlement.testing.pause``: a paused process runs nothing once
:func:`pause` returns, whatever its threads were doing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from settlement.testing.pause import pause, resume

#: a process of busy threads; each counts into its own line of a file, so
#: whether any of them ran is read from outside
_BUSY = """
import os, sys, threading, time
path = sys.argv[1]
counts = [0] * 6
def spin(i):
    while True:
        counts[i] += 1
        if counts[i] % 1000 == 0:
            time.sleep(0)
for i in range(len(counts)):
    threading.Thread(target=spin, args=(i,), daemon=True).start()
while True:
    with open(path + ".new", "w") as out:
        out.write(" ".join(map(str, counts)))
    os.replace(path + ".new", path)  # a reader never sees half a write
    time.sleep(0.001)
"""


def _counts(path: Path) -> str:
    deadline = time.monotonic() + 10
    while not (text := path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline, "the busy process never wrote its counts"
        time.sleep(0.01)
    return text


def _states(pid: int) -> set[str]:
    return {(task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            for task in Path(f"/proc/{pid}/task").iterdir()}


def test_a_paused_process_runs_nothing_until_resumed(tmp_path: Path) -> None:
    path = tmp_path / "counts"
    busy = subprocess.Popen([sys.executable, "-c", _BUSY, str(path)])
    try:
        _counts(path)
        for _ in range(20):  # each pause on its own: kill returns before the threads stop
            took = pause(busy.pid)
            assert 0 <= took < 10
            assert _states(busy.pid) == {"T"}
            frozen = _counts(path)
            time.sleep(0.02)
            assert _counts(path) == frozen, "a thread ran after pause() returned"
            resume(busy.pid)
            time.sleep(0.005)
        deadline = time.monotonic() + 10
        while _counts(path) == frozen:  # resumed, the threads count again
            assert time.monotonic() < deadline, "the process did not run again after resume()"
            time.sleep(0.01)
    finally:
        busy.kill()
        busy.wait()



#: a process whose main thread has ended (a zombie, state Z: it never stops)
#: while another thread still counts into the file
_HALF_GONE = """
import ctypes, os, sys, threading, time
path = sys.argv[1]
def count():
    n = 0
    while True:
        n += 1
        with open(path + ".new", "w") as out:
            out.write(str(n))
        os.replace(path + ".new", path)
        time.sleep(0.001)
threading.Thread(target=count).start()
ctypes.CDLL(None).pthread_exit(None)
"""


def test_a_process_that_does_not_stop_is_resumed_and_named(tmp_path: Path) -> None:
    path = tmp_path / "counts"
    half_gone = subprocess.Popen([sys.executable, "-c", _HALF_GONE, str(path)])
    try:
        _counts(path)
        with pytest.raises(RuntimeError, match=f"process {half_gone.pid} did not stop within "
                           "0.2 s of SIGSTOP and was resumed"):
            pause(half_gone.pid, timeout=0.2)
        before = _counts(path)
        deadline = time.monotonic() + 10
        while _counts(path) == before:  # left running, not stopped, by the failed pause
            assert time.monotonic() < deadline, "pause() left the process stopped when it gave up"
            time.sleep(0.01)
    finally:
        half_gone.kill()
        half_gone.wait()
