"""One broker and one engine worker per test session; tests are isolated by
unique queue names (and by their own namespace where they need their own
engine, as the crash tests do).

``SETTLEMENT_TEST_BROKER`` picks the broker of the whole session: ``kafka``
(Apache Kafka from Maven Central, one node: the default, and every test that
needs a broker runs) or ``tansu`` (the in-memory Tansu, a compatibility target:
only the tests marked ``tansu`` run, core settlement, lifecycle and crashes);
``none`` runs the tests that need none (the state machine, the formats, the SQL
filters...) once. ``make test`` runs the three. A test needs a broker when it
uses the ``broker`` fixture (or one built on it: ``engine``, ``conn``,
``admin``, ``client``...) or is marked ``needs_broker`` (it starts brokers of
its own, for the broker of the session)."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from settlement import ServiceBusClient
from settlement.management import ServiceBusAdministrationClient
from settlement.testing.apache_kafka import KafkaCluster
from settlement.testing.embedded import EmbeddedBroker
from streams.process import EngineProcess
from tests.helpers import TEST_BROKER, Broker

if TEST_BROKER not in ("kafka", "tansu", "none"):
    raise pytest.UsageError(
        f"SETTLEMENT_TEST_BROKER must be 'kafka', 'tansu' or 'none', not {TEST_BROKER!r}")


def pytest_report_header() -> str:
    return f"broker: {TEST_BROKER} (SETTLEMENT_TEST_BROKER)"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_broker: the test starts brokers of its own, of "
                            "the session's kind (SETTLEMENT_TEST_BROKER), without the broker "
                            "fixture")
    config.addinivalue_line("markers", "tansu(only=False): in the compatibility subset that "
                            "also runs on Tansu (SETTLEMENT_TEST_BROKER=tansu); only=True: "
                            "about Tansu itself, so on Tansu only")


def needs_broker(item: pytest.Item) -> bool:
    return ("broker" in getattr(item, "fixturenames", ())
            or item.get_closest_marker("needs_broker") is not None)


def runs_here(item: pytest.Item) -> bool:
    """Whether ``item`` belongs to this session: those that need no broker run
    once, under ``none``; on Tansu only the compatibility subset runs."""
    if TEST_BROKER == "none":
        return not needs_broker(item)
    tansu = item.get_closest_marker("tansu")
    if tansu is None and TEST_BROKER == "tansu":
        return False
    if tansu is not None and tansu.kwargs.get("only") and TEST_BROKER == "kafka":
        return False
    return needs_broker(item)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tests of this run's kind (:func:`runs_here`)."""
    keep, drop = [], []
    for item in items:
        (keep if runs_here(item) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[None]:
    """A failed test's report ends with the log of each engine worker it
    started under its ``tmp_path``: what the engine did is often the why."""
    report = yield
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and isinstance(tmp, Path):
        for worker_log in sorted(tmp.rglob("worker.log")):
            lines = worker_log.read_text(errors="replace").splitlines()
            report.sections.append((f"engine worker log {worker_log} (last {_LOG_LINES} lines)",
                                    "\n".join(lines[-_LOG_LINES:])))
    return report


_LOG_LINES = 300


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    running: Broker = EmbeddedBroker() if TEST_BROKER == "tansu" else KafkaCluster()
    with running:
        yield running


@pytest.fixture(scope="session")
def engine(broker: Broker, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[EngineProcess]:
    conn = broker.connection_string(f"t{uuid.uuid4().hex[:8]}")
    process = EngineProcess(conn, tmp_path_factory.mktemp("engine")).start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def conn(engine: EngineProcess) -> str:
    return engine.connection_string


@pytest.fixture(scope="session")
def admin(conn: str) -> Iterator[ServiceBusAdministrationClient]:
    with ServiceBusAdministrationClient.from_connection_string(conn) as client:
        yield client


@pytest.fixture(scope="session")
def client(conn: str) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(conn) as sb:
        yield sb


@pytest.fixture
def queue_name(request: pytest.FixtureRequest) -> str:
    stem = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name.removeprefix("test_"))[:40]
    return f"{stem.strip('-')}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def make_queue(admin: ServiceBusAdministrationClient, queue_name: str
               ) -> Callable[..., str]:
    """Create the test's queue (short locks by default) and return its name."""

    def create(**kwargs: Any) -> str:
        kwargs.setdefault("lock_duration", 2)
        admin.create_queue(queue_name, **kwargs)
        return queue_name

    return create


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole test session (it takes seconds to start)."""
    from spark.session import spark_session

    session = spark_session("settlement-tests")
    yield session
    session.stop()


@pytest.fixture
def browser() -> None:
    """Headless Chromium for the dashboard tests: required, never skipped
    (``make test``, and so ``.ci/run``, installs Debian's ``chromium``)."""
    from spark.dashboard import ChromiumNotFound, chromium

    try:
        chromium()
    except ChromiumNotFound as exc:
        pytest.fail(f"{exc}; make test installs it before the tests")


@pytest.fixture
def dashboard_url(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The dashboard served on a free port: its URL and the monitor sink it shows."""
    from spark.dashboard import make_server

    sink = tmp_path / "monitor"
    server = make_server(sink, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", sink
    finally:
        server.shutdown()
        server.server_close()
