"""The brokers every bench runs on, in one place.

Each bench takes ``--broker kafka|tansu``: Apache Kafka, one node with the
jars from Maven Central (the default, as everywhere in the project), or Tansu,
the embedded broker that holds everything in memory (the compatibility
target). A bench of stem ``X`` writes its figures to
``bench/results/X-kafka.json`` or ``bench/results/X-tansu.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from settlement.testing.apache_kafka import KAFKA_VERSION, KafkaCluster
from settlement.testing.embedded import EmbeddedBroker

BROKERS = ("kafka", "tansu")
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def add_broker_argument(parser: argparse.ArgumentParser) -> None:
    """``--broker kafka|tansu``, Kafka by default."""
    parser.add_argument(
        "--broker", choices=BROKERS, default="kafka",
        help="kafka: Apache Kafka, one node, jars from Maven Central (the default); "
             "tansu: the embedded Tansu broker, in memory (the compatibility target)")


def new_broker(kind: str, work: Path) -> EmbeddedBroker | KafkaCluster:
    """A broker of ``kind`` with its files under ``work``, not started: the
    caller starts it with ``with`` or with ``start()`` and ``stop()``."""
    if kind == "kafka":
        return KafkaCluster(data_dir=work / "kafka")
    if kind == "tansu":
        return EmbeddedBroker(log_path=work / "broker.log")
    raise ValueError(f"unknown broker {kind!r}, expected one of {BROKERS}")


def broker_pid(broker: EmbeddedBroker | KafkaCluster) -> int:
    """The broker's process: the one CPU meters read and SIGSTOP pauses."""
    if isinstance(broker, KafkaCluster):
        return broker.nodes[0].pid  # its one node
    return broker.pid


def broker_label(kind: str, each: bool = False) -> str:
    """The broker as the printed tables name it; ``each`` for a bench that
    starts several of them."""
    label = {"kafka": f"Apache Kafka {KAFKA_VERSION}, 1 node",
             "tansu": "Tansu, in memory"}[kind]
    return f"{label} each" if each else label


def results_path(stem: str, kind: str) -> Path:
    """Where a bench of ``stem`` keeps the figures of a run on ``kind``."""
    return RESULTS_DIR / f"{stem}-{kind}.json"
