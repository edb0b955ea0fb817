"""What the local brokers this project starts have in common (the embedded
Tansu broker and Apache Kafka): free ports, waiting until a broker answers,
and the tail of its log for error messages."""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient

#: How many trailing bytes of a broker log go into error messages.
LOG_TAIL_BYTES = 4000


class BrokerStartError(RuntimeError):
    """A local broker could not be started (binary, port or start-up failure)."""


#: Where local brokers' ports are picked: below the kernel's ephemeral range
#: (``net.ipv4.ip_local_port_range``, 32768-60999 by default), from which
#: every outgoing connection takes its local port. A port the OS handed out
#: there could be taken by a connection in the seconds before a JVM bound it
#: (a three-node test cluster failed so: "Address already in use").
_PORTS = range(20_000, 32_768)


def free_port(host: str) -> int:
    """A TCP port on *host* nothing holds now, outside the ephemeral range.

    There is an unavoidable race between this probe and the broker binding
    the port; the brokers' ``start`` notices a lost race because the broker
    process then exits early.
    """
    for _ in range(100):
        port = random.choice(_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded range
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
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


def wait_until_answering(bootstrap: str, brokers: int, timeout: float, what: str,
                         failure: Callable[[], str | None], tail: Callable[[], str],
                         security: dict[str, str] | None = None) -> None:
    """Poll *bootstrap* with metadata requests until *brokers* brokers are
    registered. ``failure()`` returns why the broker cannot come up (a process
    exited), checked between attempts so a dead broker is noticed at once;
    errors end with ``tail()``, the broker's log tail."""
    admin = AdminClient({
        "bootstrap.servers": bootstrap, **(security or {}),
        # Keep librdkafka's own reconnect chatter out of the caller's log.
        "log_level": 0,
        "socket.connection.setup.timeout.ms": 1000,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 200,
    })
    deadline = time.monotonic() + timeout
    last: str = "no answer yet"
    while True:
        reason = failure()
        if reason is not None:
            raise BrokerStartError(f"{what} on {bootstrap} {reason}; log tail:\n{tail()}")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerStartError(f"{what} on {bootstrap} did not answer metadata within "
                                   f"{timeout:.0f} s (last: {last}); log tail:\n{tail()}")
        try:
            # Short attempts, so a broker that dies is noticed promptly.
            registered = len(admin.list_topics(timeout=min(0.5, max(remaining, 0.05))).brokers)
        except Exception as exc:  # KafkaException, or a timeout while connecting
            last = str(exc)
        else:
            if registered >= brokers:
                return
            last = f"{registered} of {brokers} brokers registered"
        time.sleep(0.1)


def log_tail(path: Path | None, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last *max_bytes* of a broker's output, for error messages."""
    if path is None:
        return "(no log)"
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(could not read {path}: {exc})"
    return text.strip() or "(log is empty)"
