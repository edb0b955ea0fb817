"""Apache Kafka on this machine, from its Maven Central jars: one combined
broker+controller, or three on loopback.

Users deploy on Apache Kafka, so the tests, the bench and the Spark jobs run
on it too, without Docker: :class:`KafkaCluster` fetches the broker's jars
once (``settlement/testing/jars/kafka/pom.xml``, cached outside the work tree),
formats KRaft storage once per data directory (``kafka.tools.StorageTool``)
and runs ``kafka.Kafka`` per node::

    with KafkaCluster(brokers=3) as cluster:
        conn = cluster.connection_string("shop")

A cluster started again on the same ``data_dir`` is the same cluster with its
data: the cluster id and every node's ports are kept in ``cluster.json``.

With ``tls=True`` the client listener speaks TLS (``SSL``, or ``SASL_SSL``
with users) with a certificate for 127.0.0.1 and localhost signed by a
private CA made for the cluster (``tls/ca.pem`` in its data directory, kept
with the data so that clients go on trusting a restarted cluster); its
connection strings are ``kafkas://`` ones naming that CA as ``CaFile``.

Every node is broker and controller at once (``controller.quorum.voters`` lists
them all), so one or three processes make a complete cluster. The settings in
:data:`BROKER_SETTINGS` are those of every Kafka the project runs; the
``docker-compose.yml`` deployment uses them too (a test compares them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from settlement.testing._local_broker import (
    BrokerStartError,
    free_port,
    log_tail,
    port_in_use,
    wait_until_answering,
)
from settlement.testing.maven import POMS, fetch_jars, require_java
from settlement.testing.tls import CertificateFiles, make_certificates

log = logging.getLogger(__name__)

#: The newest Apache Kafka 4.x release on Maven Central when this was written;
#: share groups (KIP-932) are generally available from 4.2.
KAFKA_VERSION = "4.4.0"
#: The settings of every Apache Kafka the project runs, whatever its size.
BROKER_SETTINGS = {
    # Topics are created by the settlement layer with explicit partition
    # counts and configs; a typo must fail loudly, not create a topic.
    "auto.create.topics.enable": "false",
    # Groups form at once: engines and tests must not wait 3 s per join.
    "group.initial.rebalance.delay.ms": "0",
    # A broker that stops heartbeating is fenced, and its partitions get new
    # leaders, after 6 s instead of 9 s: sends and settlements resume sooner.
    "broker.session.timeout.ms": "6000",
    # A log segment's two indexes are sparse files of this size, mapped into
    # memory; the first touches of a new one had the kernel (6.18) zero
    # large page-cache folios: with Kafka's default of 10 MB that was 78 %
    # of the request handlers' CPU while a new topic with ten subscriptions
    # was first published to (the broker at 0.94 of a core, 0.42 with 1 MB;
    # perf, 2026-11-28). At 1 MB a segment rolls after ~350 MB of log.
    "log.index.size.max.bytes": "1048576",
}
START_TIMEOUT_S = 90.0
STOP_GRACE_S = 30.0
_HOST = "127.0.0.1"
_JVM_OPTIONS = [
    # As in Kafka's bin/kafka-server-start.sh and kafka-run-class.sh, and so as
    # the apache/kafka image of docker-compose.yml runs it: the heap is Kafka's
    # default 1 GB. With 512 MB, G1's concurrent marking ran through the
    # benches' phases (0.28 core-s of a 0.5 s publish of 20 MB) and halved
    # their rates at random.
    "-Xms1g", "-Xmx1g", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]
_LOG4J = """\
# The broker's own log, to stdout (redirected to the node's server.log).
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
"""


def replication_settings(brokers: int) -> dict[str, str]:
    """Replication of internal topics and the topic default: three replicas and
    two in sync on a 3-node cluster, one on a single node."""
    replicas, in_sync = str(min(3, brokers)), str(min(2, brokers))
    return {
        "default.replication.factor": replicas,
        "min.insync.replicas": in_sync,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": in_sync,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": in_sync,
    }


@dataclass
class KafkaNode:
    """One ``kafka.Kafka`` process: broker and controller with id ``node_id``."""

    node_id: int
    port: int
    controller_port: int
    directory: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"node {self.node_id} was never started"
        return self.proc.pid


#: the broker's SASL/PLAIN handler that also checks shared access signatures
SAS_HANDLER = "settlement.kafka.SasPlainServerCallbackHandler"


def sas_auth_jars(version: str = KAFKA_VERSION) -> Path:
    """The directory holding the jar of :data:`SAS_HANDLER`, built by Maven
    from ``settlement/testing/jars/sas-auth`` once per Kafka version and source (a
    changed source is a new cache entry, so an edit never runs a stale jar)."""
    sources = sorted((POMS / "sas-auth").rglob("*.java")) + [POMS / "sas-auth" / "pom.xml"]
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()[:12]
    return fetch_jars("sas-auth", {"kafka.version": version, "source.digest": digest},
                      goals=("compiler:compile", "jar:jar"))


class KafkaCluster:
    """An Apache Kafka cluster of ``brokers`` local nodes (1 or 3) that lives
    as long as this object is started. ``port`` is the first node's client
    port (the others follow it); 0 picks free ports. Without ``data_dir`` the
    data lives in a temporary directory removed by :meth:`stop`.

    With ``users`` (name -> password, ``admin`` among them) clients must
    authenticate (SASL/PLAIN) and Kafka's ``StandardAuthorizer`` allows only
    what ACLs grant; ``admin`` is the super user who grants them. A user signs
    in with its password or with a shared access signature made with it as the
    key (:data:`SAS_HANDLER` checks both)."""

    def __init__(self, brokers: int = 1, port: int = 0, data_dir: str | os.PathLike[str] | None
                 = None, version: str = KAFKA_VERSION, users: dict[str, str] | None = None,
                 tls: bool = False) -> None:
        if brokers not in (1, 3):
            raise ValueError(f"brokers must be 1 or 3, got {brokers}")
        if users is not None and "admin" not in users:
            raise ValueError("a secured cluster needs a user named 'admin' (its super user)")
        self.users = users
        self.tls = tls
        self.certificates: CertificateFiles | None = None
        self.brokers = brokers
        self.version = version
        self._requested_port = port
        self._owns_data = data_dir is None
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self.nodes: list[KafkaNode] = []
        self._classpath = ""

    # -- properties -----------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: every node's ``HOST:PORT``."""
        return ",".join(f"{_HOST}:{node.port}" for node in self.nodes)

    @property
    def data_dir(self) -> Path:
        assert self._data_dir is not None, "the cluster was never started"
        return self._data_dir

    @property
    def running(self) -> bool:
        """True while every node runs."""
        return bool(self.nodes) and all(node.running for node in self.nodes)

    @property
    def protocol(self) -> str:
        """The client listener's security protocol (Kafka's name)."""
        return {(False, False): "PLAINTEXT", (False, True): "SASL_PLAINTEXT",
                (True, False): "SSL", (True, True): "SASL_SSL"}[(self.tls,
                                                                 self.users is not None)]

    @property
    def ca_path(self) -> Path:
        """The PEM file of the CA that signed the nodes' certificates (TLS)."""
        assert self.certificates is not None, "the cluster has no TLS listener"
        return self.certificates.ca

    def connection_string(self, namespace: str, user: str = "admin") -> str:
        """A settlement connection string for this cluster and *namespace*
        (on a secured cluster, as ``user``; with TLS, trusting its CA)."""
        conn = f"Endpoint=kafka://{self.bootstrap};Namespace={namespace}"
        if self.tls:
            conn = f"Endpoint=kafkas://{self.bootstrap};Namespace={namespace};CaFile={self.ca_path}"
        if self.users is None:
            return conn
        return f"{conn};SharedAccessKeyName={user};SharedAccessKey={self.users[user]}"

    def _admin_security(self) -> dict[str, str]:
        security = {"security.protocol": self.protocol}
        if self.tls:
            security["ssl.ca.location"] = str(self.ca_path)
        if self.users is not None:
            security |= {"sasl.mechanism": "PLAIN", "sasl.username": "admin",
                         "sasl.password": self.users["admin"]}
        return security

    def node(self, node_id: int) -> KafkaNode:
        return next(node for node in self.nodes if node.node_id == node_id)

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> Self:
        """Fetch the jars, format new storage, start every node and wait until
        all of them are registered; :class:`BrokerStartError` says why not."""
        if self.running:
            raise BrokerStartError(f"Kafka cluster already running on {self.bootstrap}")
        jars = [fetch_jars("kafka", {"kafka.version": self.version})]
        if self.users is not None:
            jars.append(sas_auth_jars(self.version))
        self._classpath = os.pathsep.join(f"{directory}/*" for directory in jars)
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="kafka-cluster-"))
        self._data_dir.mkdir(parents=True, exist_ok=True)
        cluster_id = self._load_or_lay_out()
        if self.tls:
            self.certificates = make_certificates(self.data_dir / "tls", [_HOST, "localhost"])
        try:
            for node in self.nodes:
                self._write_config(node)
                if not (node.directory / "data" / "meta.properties").exists():
                    self._format(node, cluster_id)
            for node in self.nodes:
                self.start_node(node.node_id, wait=False)
            self._wait_ready(self.brokers)
        except BaseException:
            self.stop()
            raise
        log.info("Apache Kafka %s ready on %s", self.version, self.bootstrap)
        return self

    def start_node(self, node_id: int, wait: bool = True) -> None:
        """Start one node (again, after :meth:`kill_node`) on its data."""
        node = self.node(node_id)
        if node.running:
            return
        for port in (node.port, node.controller_port):
            if port_in_use(_HOST, port):
                raise BrokerStartError(f"port {_HOST}:{port} of Kafka node {node_id} is in "
                                       "use: stop what holds it, or use another --data-dir")
        command = [require_java(), *_JVM_OPTIONS,
                   f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                   "-cp", self._classpath, "kafka.Kafka",
                   str(node.directory / "server.properties")]
        with open(node.log_path, "ab") as out:
            node.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        log.info("started Kafka node %d (pid %d, port %d)", node_id, node.pid, node.port)
        if wait:
            self._wait_ready(self.brokers)

    def kill_node(self, node_id: int) -> None:
        """``kill -9`` one node: no controlled shutdown, no flush."""
        node = self.node(node_id)
        if node.proc is not None and node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait()

    def stop(self) -> None:
        """SIGTERM every node (a controlled shutdown), SIGKILL after
        :data:`STOP_GRACE_S` seconds. Safe to call more than once."""
        live = [node for node in self.nodes if node.running]
        for node in live:
            assert node.proc is not None
            node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for node in live:
            assert node.proc is not None
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("Kafka node %d did not stop in %.0f s; killing it",
                            node.node_id, STOP_GRACE_S)
                node.proc.kill()
                node.proc.wait()
        if self._owns_data and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None

    def log_tail(self) -> str:
        """The end of every node's log, for error messages."""
        return "\n".join(f"--- node {node.node_id} ({node.log_path})\n"
                         f"{log_tail(node.log_path, 2000)}" for node in self.nodes)

    # -- internals ------------------------------------------------------------------

    def _load_or_lay_out(self) -> str:
        """The cluster id and nodes kept in ``cluster.json``, or a new layout."""
        layout_path = self.data_dir / "cluster.json"
        if layout_path.exists():
            layout = json.loads(layout_path.read_text())
            ports = [node["port"] for node in layout["nodes"]]
            if len(layout["nodes"]) != self.brokers:
                raise BrokerStartError(
                    f"{self.data_dir} holds a cluster of {len(layout['nodes'])} node(s), not "
                    f"{self.brokers}: pass --brokers {len(layout['nodes'])} or another --data-dir")
            if self._requested_port not in (0, ports[0]):
                raise BrokerStartError(
                    f"{self.data_dir} holds a cluster on port {ports[0]}, not "
                    f"{self._requested_port}: pass --port {ports[0]} or another --data-dir")
        else:
            first = self._requested_port
            layout = {"cluster_id": self._random_cluster_id(), "nodes": [
                {"node_id": i + 1, "port": first + i if first else free_port(_HOST),
                 "controller_port": free_port(_HOST)} for i in range(self.brokers)]}
            layout_path.write_text(json.dumps(layout, indent=2))
        self.nodes = [KafkaNode(n["node_id"], n["port"], n["controller_port"],
                                self.data_dir / f"node-{n['node_id']}") for n in layout["nodes"]]
        (self.data_dir / "log4j2.properties").write_text(_LOG4J)
        return str(layout["cluster_id"])

    def server_properties(self, node: KafkaNode) -> dict[str, str]:
        """The ``server.properties`` of ``node``."""
        voters = ",".join(f"{n.node_id}@{_HOST}:{n.controller_port}" for n in self.nodes)
        # The client listener (which the nodes also use between them) is
        # named after its protocol; the controller listener stays on loopback.
        protocol = self.protocol
        controller = "SASL_PLAINTEXT" if self.users is not None else "PLAINTEXT"
        return {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"{protocol}://{_HOST}:{node.port},CONTROLLER://{_HOST}:"
                         f"{node.controller_port}",
            "advertised.listeners": f"{protocol}://{_HOST}:{node.port}",
            "listener.security.protocol.map": f"{protocol}:{protocol},CONTROLLER:{controller}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": protocol,
            "log.dirs": str(node.directory / "data"),
            **replication_settings(self.brokers),
            **BROKER_SETTINGS,
            **self._secured_settings(protocol),
            **self._tls_settings(),
        }

    def _write_config(self, node: KafkaNode) -> None:
        node.directory.mkdir(parents=True, exist_ok=True)
        (node.directory / "server.properties").write_text(
            "".join(f"{key}={value}\n" for key, value in self.server_properties(node).items()))

    def _secured_settings(self, protocol: str) -> dict[str, str]:
        """SASL/PLAIN on every listener, and ACLs enforced. The nodes sign in
        to each other and to the quorum as ``admin``, the only super user
        (an unauthenticated connection is nobody's)."""
        if self.users is None:
            return {}
        admin = f'username="admin" password="{self.users["admin"]}"'
        accounts = " ".join(f'user_{name}="{password}"' for name, password in self.users.items())
        login = "org.apache.kafka.common.security.plain.PlainLoginModule required"
        listener = f"listener.name.{protocol.lower()}.plain"
        return {
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "sasl.mechanism.controller.protocol": "PLAIN",
            f"{listener}.sasl.jaas.config": f"{login} {admin} {accounts};",
            f"{listener}.sasl.server.callback.handler.class": SAS_HANDLER,
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config":
                f'{login} {admin} user_admin="{self.users["admin"]}";',
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin",
        }

    def _tls_settings(self) -> dict[str, str]:
        """The nodes' key and certificate, and the CA they check each other
        against, as PEM files (Kafka reads PEM since 2.7)."""
        if self.certificates is None:
            return {}
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.certificates.server),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.certificates.ca),
        }

    def _format(self, node: KafkaNode, cluster_id: str) -> None:
        done = self._storage_tool("format", "-t", cluster_id, "-c",
                                  str(node.directory / "server.properties"))
        log.info("formatted KRaft storage of node %d", node.node_id)
        log.debug("kafka.tools.StorageTool format: %s", done.strip())

    def _random_cluster_id(self) -> str:
        return self._storage_tool("random-uuid").strip().splitlines()[-1]

    def _storage_tool(self, *args: str) -> str:
        done = subprocess.run([require_java(), "-cp", self._classpath, "kafka.tools.StorageTool",
                               *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise BrokerStartError(f"kafka.tools.StorageTool {args[0]} failed (exit "
                                   f"{done.returncode}): {(done.stderr or done.stdout).strip()}")
        return done.stdout

    def _wait_ready(self, brokers: int) -> None:
        def failure() -> str | None:
            dead = [f"node {n.node_id} exited with code {n.proc.returncode}"
                    for n in self.nodes if n.proc is not None and n.proc.poll() is not None]
            return "; ".join(dead) or None

        # Each node on its own: a node registered with the quorum may not take
        # connections yet, and a client sent to it then fails (Faust's topic
        # creation gives up at once with NodeNotReadyError).
        for node in self.nodes:
            wait_until_answering(f"{_HOST}:{node.port}", brokers, START_TIMEOUT_S,
                                 f"Apache Kafka {self.version} node {node.node_id}", failure,
                                 self.log_tail, self._admin_security())

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"KafkaCluster({self.brokers} node(s), {self.bootstrap!r}, {state})"
