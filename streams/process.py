"""An engine worker in a child process, for the demo, the bench and the tests.

Starts ``run_worker`` in a new Python process, waits until Faust reports the
worker ready, and stops it with SIGTERM (or ``kill -9`` for crash tests).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent
_READY = b"Worker]: Ready"


class EngineProcess:
    """``settlement worker`` as a child process, logging to ``data_dir/worker.log``."""

    def __init__(self, connection_string: str, data_dir: Path, *,
                 timer_interval: float = 0.2, env: dict[str, str] | None = None) -> None:
        self.connection_string = connection_string
        self.data_dir = Path(data_dir)
        self.log_path = self.data_dir / "worker.log"
        self.timer_interval = timer_interval
        self.proc: subprocess.Popen[bytes] | None = None
        #: extra environment of the worker (its next start)
        self.env = dict(env or {})

    def start(self, timeout: float = 90.0) -> EngineProcess:
        """Start the worker (again, after a stop or kill) and wait until it is ready."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        start_at = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "SETTLEMENT_TIMER_INTERVAL": str(self.timer_interval), **self.env}
        code = (f"from streams.worker import run_worker; "
                f"run_worker({self.connection_string!r}, {str(self.data_dir / 'rocks')!r})")
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                                         stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT)
        log.info("started engine worker (pid %d, log %s)", self.proc.pid, self.log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine worker exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            with open(self.log_path, "rb") as out:
                out.seek(start_at)
                if _READY in out.read():
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"engine worker not ready within {timeout:.0f} s:\n" + self.log_tail())

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the worker was never started"
        return self.proc.pid

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """``kill -9``: no shutdown, no flush, no commit."""
        assert self.proc is not None, "the worker was never started"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL when it has not stopped within ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("engine worker did not stop in %.0f s; killing it", timeout)
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> EngineProcess:
        """Starts the worker unless it is running already."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
