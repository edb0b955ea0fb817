"""The azure-servicebus SDK's own samples (sync and async, from its source
package on PyPI) run against the session's broker and engine with only their
import lines changed: one test per sample (see tests/sdk_samples.py).

The samples run in parallel subprocesses, all at once before the first test
reports; each test then reports its own sample (the tail of its output when
it fails). The ones of ``CANNOT_RUN`` are expected to fail, strictly. The
credential samples sign in with SASL: they run against a second cluster of
this module with SASL users."""

from __future__ import annotations

import difflib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from settlement.management import ServiceBusAdministrationClient
from settlement.testing.apache_kafka import KafkaCluster
from streams.process import EngineProcess
from tests import sdk_samples
from topics import rights
from topics.connection import parse_connection_string

SAMPLES = sdk_samples.samples()
#: Samples run at once (each mostly waits on the broker): on 2 cores, every
#: sample ran in 63 s four at a time, 49 s six at a time, 47 s eight at a time.
PARALLEL = 6
SASL_NAMESPACE = "samples"


def _param(sample: sdk_samples.Sample) -> object:
    unfit = sample.unfit()
    marks = [pytest.mark.xfail(reason=unfit, strict=True)] if unfit else []
    return pytest.param(sample, id=sample.id, marks=marks)


@pytest.fixture(scope="module")
def sasl_namespace(tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[sdk_samples.Namespace]:
    """Apache Kafka with SASL users and an engine: the credential samples sign
    in as ``RootManageSharedAccessKey``, with every right on the namespace."""
    key = uuid.uuid4().hex
    users = {"admin": uuid.uuid4().hex, "RootManageSharedAccessKey": key}
    cluster = KafkaCluster(users=users, data_dir=tmp_path_factory.mktemp("samples-kafka"))
    cluster.start()
    engine: EngineProcess | None = None
    try:
        from confluent_kafka.admin import AdminClient

        conn = cluster.connection_string(SASL_NAMESPACE)
        acls = AdminClient(parse_connection_string(conn).kafka_config())
        bindings = rights.acl_bindings(SASL_NAMESPACE, "User:RootManageSharedAccessKey",
                                       "Manage")  # Send and Listen too
        for done in acls.create_acls(bindings).values():
            done.result(30)
        engine = EngineProcess(conn, tmp_path_factory.mktemp("samples-engine")).start()
        with ServiceBusAdministrationClient.from_connection_string(conn) as admin:
            yield sdk_samples.Namespace(
                cluster.connection_string(SASL_NAMESPACE, "RootManageSharedAccessKey"), admin,
                sas_policy="RootManageSharedAccessKey", sas_key=key)
    finally:
        if engine is not None:
            engine.stop()
        cluster.stop()


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest, conn: str, admin: ServiceBusAdministrationClient,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, sdk_samples.Outcome]:
    """Every selected sample run once, in parallel; by sample id."""
    selected = [item.callspec.params["sample"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")]
    namespace = sdk_samples.Namespace(conn, admin)
    sasl = (request.getfixturevalue("sasl_namespace")
            if any(s.needs_sasl for s in selected) else namespace)
    workdir = tmp_path_factory.mktemp("sdk-samples")
    # the long ones first, so that they do not end the run alone
    selected.sort(key=lambda s: s.base not in sdk_samples.SHORTENED_SLEEPS)

    def run(sample: sdk_samples.Sample) -> sdk_samples.Outcome:
        where = sasl if sample.needs_sasl else namespace
        return sdk_samples.run(sample, where.prepare(sample), workdir)

    with ThreadPoolExecutor(PARALLEL) as pool:
        return {outcome.sample.id: outcome for outcome in pool.map(run, selected)}


@pytest.mark.parametrize("sample", [_param(s) for s in SAMPLES])
def test_sample_runs_with_only_its_imports_changed(
        sample: sdk_samples.Sample, outcomes: dict[str, sdk_samples.Outcome]) -> None:
    outcome = outcomes[sample.id]
    if not outcome.passed:
        pytest.fail(outcome.report(), pytrace=False)


def test_porting_changes_only_the_import_lines() -> None:
    for sample in SAMPLES:
        source = sample.path.read_text()
        ported = sdk_samples.port(source)
        changed = [line for line in difflib.ndiff(source.splitlines(), ported.splitlines())
                   if line.startswith(("- ", "+ "))]
        for line in changed:
            assert line[2:].lstrip().startswith(("from ", "import ")), (sample.id, line)
        assert "azure.servicebus" not in "".join(c for c in changed if c.startswith("+ "))
        assert len(ported.splitlines()) == len(source.splitlines())


def test_the_list_of_samples_that_cannot_run_names_real_samples() -> None:
    assert set(sdk_samples.CANNOT_RUN) <= {s.base for s in SAMPLES}
    for table in (sdk_samples.SEEDED, sdk_samples.MUST_PRINT, sdk_samples.RUNS_UNTIL_STOPPED,
                  sdk_samples.SHORTENED_SLEEPS):
        assert set(table) <= {s.base for s in SAMPLES}


def test_every_sample_of_the_release_is_found() -> None:
    flavours = [s.flavour for s in SAMPLES]
    assert (flavours.count("sync"), flavours.count("async")) == (29, 27)  # in 7.11.4


def test_shortened_sleeps_are_the_samples_own(tmp_path: Path) -> None:
    sample = tmp_path / "sleeper.py"
    sample.write_text(
        "import asyncio, time\n"
        "def took(run):\n"
        "    started = time.monotonic(); run(); return time.monotonic() - started\n"
        "print(took(lambda: time.sleep(20)), took(lambda: asyncio.run(asyncio.sleep(20))),\n"
        "      took(lambda: exec(compile('time.sleep(0.5)', 'library.py', 'exec'))))\n")
    done = subprocess.run([sys.executable, "-m", "tests.sdk_samples", str(sample), "10"],
                          cwd=sdk_samples.REPO, capture_output=True, text=True, timeout=60)
    own, own_async, library = map(float, done.stdout.split())
    assert 2 <= own < 10 and 2 <= own_async < 10
    assert library >= 0.5
