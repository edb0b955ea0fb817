"""The monitor on a Spark cluster: a standalone master and one worker started
from PySpark's own jars, the job sent there by ``spark-submit --master`` (as
the README shows) and by the job's own ``--master``, on Apache Kafka."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.testing._local_broker import free_port
from settlement.testing.maven import cache_dir
from spark.metrics_store import read_metrics, totals
from tests.helpers import drive_workload, receive_exactly

pyspark = pytest.importorskip("pyspark")

ROOT = Path(__file__).resolve().parent.parent
SPARK_BIN = Path(pyspark.__file__).parent / "bin"


@dataclass
class Standalone:
    """A running standalone cluster: its master's URL and web UI."""

    master: str
    web: str

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.web}/json/", timeout=5) as answer:
            return json.load(answer)  # type: ignore[no-any-return]


def spark_env() -> dict[str, str]:
    """The environment of the master, the worker and the jobs: the worker's
    executors run this interpreter, which imports this work tree."""
    return {**os.environ, "SPARK_HOME": str(SPARK_BIN.parent), "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    """A master and one worker (1 core, 1 GB) on 127.0.0.1, killed at the end."""
    port, web_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    cluster = Standalone(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}")
    daemons = {
        "master": ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                   "--port", str(port), "--webui-port", str(web_port)],
        "worker": ["org.apache.spark.deploy.worker.Worker", cluster.master,
                   "--host", "127.0.0.1", "--webui-port", "0", "--cores", "1",
                   "--memory", "1g", "--work-dir", str(tmp_path / "work")]}
    procs = []
    try:
        for name, args in daemons.items():
            with open(tmp_path / f"{name}.log", "wb") as log:
                procs.append(subprocess.Popen([str(SPARK_BIN / "spark-class"), *args],
                                              env=spark_env(), stdout=log,
                                              stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 60
        while _alive_workers(cluster) != 1:
            assert time.monotonic() < deadline, "\n".join(
                (tmp_path / f"{name}.log").read_text()[-3000:] for name in daemons)
            time.sleep(0.5)
        yield cluster
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)


def _alive_workers(cluster: Standalone) -> int:
    try:
        workers = cluster.state()["workers"]
    except OSError:  # not serving yet
        return 0
    except json.JSONDecodeError:
        # Once in CI an HTML page answered /json/ while the master started;
        # a wrong answer here counts as not ready (the deadline still holds).
        return 0
    return sum(w["state"] == "ALIVE" for w in workers)


def run_job(command: list[str]) -> str:
    """Run a monitor command to its end (``--available-now``); its output."""
    done = subprocess.run(command, cwd=ROOT, env=spark_env(), capture_output=True, text=True,
                          timeout=240, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    return done.stdout


def test_the_monitor_runs_on_a_standalone_cluster(
        standalone: Standalone, conn: str, client: ServiceBusClient, make_queue: Any,
        tmp_path: Path) -> None:
    from spark.session import KAFKA_PACKAGE, SHIPPED_WITH_PYSPARK

    queue = make_queue()
    drive_workload(client, queue, sent=10, complete=6, abandon=2, dead_letter=1,
                   reason="bad", defer=1)
    sink = tmp_path / "monitor"
    job = ["--connection-string", conn, "--sink", str(sink), "--available-now"]
    # The README's spark-submit (the cache options keep Ivy off the network)
    # picks the master: the job must not put its own in its place.
    out = run_job([str(SPARK_BIN / "spark-submit"), "--master", standalone.master,
                   "--packages", KAFKA_PACKAGE, "--exclude-packages", SHIPPED_WITH_PYSPARK,
                   "--conf", f"spark.jars.ivy={cache_dir() / 'ivy'}",
                   "spark/monitor.py", *job])
    assert "monitor: Spark UI at http://" in out  # on by default
    counts = {label: n for (entity, label), n in totals(read_metrics(sink), "count").items()
              if entity == queue}
    assert counts == {"enqueued": 10, "locked": 12, "completed": 8, "abandoned": 2,
                      "dead_lettered": 1, "deferred": 1}

    # The job's own --master, resuming from the checkpoint.
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"n{i}") for i in range(5)])
    with client.get_queue_receiver(queue) as receiver:
        receiver.complete_messages(receive_exactly(receiver, 5))
    run_job([sys.executable, "-m", "spark.monitor", "--master", standalone.master, *job])
    counts = totals(read_metrics(sink), "count")
    assert (counts[(queue, "enqueued")], counts[(queue, "completed")]) == (15, 13)

    # Both ran on the cluster, with an executor on its worker.
    apps = standalone.state()["completedapps"] + standalone.state()["activeapps"]
    assert [app["name"] for app in apps] == ["settlement-monitor"] * 2
