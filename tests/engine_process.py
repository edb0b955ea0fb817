"""A real engine worker process for tests: start, kill -9, restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class EngineProcess:
    """``settlement worker`` in a subprocess, logging to ``data_dir/worker.log``."""

    def __init__(self, connection_string: str, data_dir: Path) -> None:
        self.connection_string = connection_string
        self.data_dir = data_dir
        self.log_path = data_dir / "worker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> EngineProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        start_at = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {**os.environ, "SETTLEMENT_TIMER_INTERVAL": "0.2", "PYTHONUNBUFFERED": "1"}
        code = (f"from streams.worker import run_worker; "
                f"run_worker({self.connection_string!r}, {str(self.data_dir / 'rocks')!r})")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine worker exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            with open(self.log_path, "rb") as log:
                log.seek(start_at)
                if b"Worker]: Ready" in log.read():
                    return self
            time.sleep(0.1)
        raise RuntimeError("engine worker not ready in time:\n" + self.log_tail())

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """``kill -9``: no shutdown, no flush, no commit."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
