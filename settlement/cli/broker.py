"""``settlement broker`` and ``settlement kafka``: run a broker in the foreground.

``broker`` runs one Apache Kafka node from its Maven Central jars, its data
in a directory kept across restarts (``--tansu``: the in-memory Tansu, no
JVM); ``kafka`` runs Apache Kafka of one node or three. Either prints where
it listens (scripts wait for the ``bootstrap:`` line), then stays up until it
is interrupted, and stops every process on the way out so no orphan is left
behind.

A Kafka node that dies (``kill -9``, say) is reported (``node N exited``)
and started again on its data a few seconds later, while the other nodes go
on: a failover can be watched and tried, and the cluster heals by itself. A
node that dies three times within a minute stops the command (its log tail
says why).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from settlement.testing._local_broker import BrokerStartError
from settlement.testing.apache_kafka import KafkaCluster
from settlement.testing.embedded import EmbeddedBroker
from settlement.testing.maven import JarFetchError

log = logging.getLogger(__name__)
#: how long a Kafka node that died stays down before it is started again
RESTART_AFTER_S = 3.0
#: a node that dies this many times within a minute is not started again
_MAX_DEATHS_PER_MINUTE = 3


def run_tansu(host: str, port: int) -> int:
    """Run an :class:`EmbeddedBroker` (Tansu) on *host*:*port* until SIGINT or SIGTERM."""
    broker = EmbeddedBroker(host=host, port=port)
    return _run(broker, lambda: [f"bootstrap: {broker.bootstrap}"])


def run_kafka(port: int, brokers: int, data_dir: str | None, version: str, *,
              tls: bool = False) -> int:
    """Run a :class:`KafkaCluster` until SIGINT or SIGTERM; on the same
    ``data_dir`` it is the same cluster, with its data. With ``tls`` its
    listener speaks TLS, and the CA file clients trust is printed as ``ca:``."""
    cluster = KafkaCluster(brokers=brokers, port=port, version=version,
                           data_dir=Path(data_dir) if data_dir else None, tls=tls)

    def lines() -> list[str]:
        nodes = [f"node {n.node_id}: pid {n.pid} port {n.port}" for n in cluster.nodes]
        trust = [f"ca: {cluster.ca_path}"] if tls else []
        return [*nodes, f"bootstrap: {cluster.bootstrap}", *trust]

    deaths: dict[int, list[float]] = {}

    def heal(stop: threading.Event) -> str | None:
        """Start again the nodes that died; why the command must stop, if so."""
        for node in cluster.nodes:
            if node.proc is None or node.proc.poll() is None:
                continue
            print(f"node {node.node_id} exited (exit code {node.proc.returncode}): starting "
                  f"it again on its data in {RESTART_AFTER_S:.0f} s", flush=True)
            now = time.monotonic()
            recent = [t for t in deaths.get(node.node_id, []) if now - t < 60] + [now]
            deaths[node.node_id] = recent
            if len(recent) >= _MAX_DEATHS_PER_MINUTE:
                return (f"node {node.node_id} exited {len(recent)} times within a minute; "
                        f"log tail:\n{cluster.log_tail()}")
            if stop.wait(RESTART_AFTER_S):
                return None
            try:
                cluster.start_node(node.node_id, wait=False)
            except BrokerStartError as exc:  # tried again at the next round
                print(f"node {node.node_id} could not start yet: {exc}", flush=True)
                continue
            print(f"node {node.node_id} started again: pid {node.pid} port {node.port}",
                  flush=True)
        return None

    return _run(cluster, lines, heal)


def _run(broker: EmbeddedBroker | KafkaCluster, lines: Callable[[], list[str]],
         heal: Callable[[threading.Event], str | None] | None = None) -> int:
    """Start ``broker``, print ``lines()``, wait for a signal or the broker's
    death, stop it. ``heal``, given, is called every second instead of
    stopping on a death: it restarts what died, or says why the command must
    stop. Returns 0 after a clean stop, 2 if the broker could not start or
    died (the reason is printed to stderr as ``error: ...``)."""
    stop = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s; stopping", signal.Signals(signum).name)
        stop.set()

    # Install the handlers before starting, so a signal that arrives during
    # start-up still leads to a clean stop rather than an orphaned broker.
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            broker.start()
        except (BrokerStartError, JarFetchError) as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 2
        try:
            for line in lines():
                print(line, flush=True)
            # Event.wait with a timeout returns promptly after a signal handler
            # runs, and lets us notice the broker dying underneath us.
            while not stop.wait(timeout=1.0):
                if heal is not None:
                    if (fatal := heal(stop)) is not None:
                        print(f"error: {fatal}", file=sys.stderr, flush=True)
                        return 2
                elif not broker.running:
                    print(f"error: broker on {broker.bootstrap} exited unexpectedly; "
                          f"log tail:\n{broker.log_tail()}", file=sys.stderr, flush=True)
                    return 2
        finally:
            broker.stop()
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
