"""Starts one engine worker: ``settlement worker --connection-string ...``."""

from __future__ import annotations

import os
from pathlib import Path

from confluent_kafka.admin import AdminClient

from topics import specs
from topics.connection import parse_connection_string


def run_worker(connection_string: str, data_dir: str | Path = "data/engine",
               web_port: int | None = None, loglevel: str = "info") -> None:
    """Provision the namespace's topics, then run the Faust worker until stopped.

    Several workers of one namespace share its engine partitions; each needs its
    own ``data_dir`` (RocksDB holds a lock on it).
    """
    settings = parse_connection_string(connection_string)
    admin = AdminClient(settings.kafka_config())
    specs.provision(admin, specs.namespace_topics(settings.namespace))
    os.environ["SETTLEMENT_CONNECTION_STRING"] = connection_string
    os.environ["SETTLEMENT_DATA_DIR"] = str(data_dir)
    if web_port is not None:
        os.environ["SETTLEMENT_WEB_PORT"] = str(web_port)
    import faust

    from streams.app import app  # reads the environment set above, so imported last

    faust.Worker(app, loglevel=loglevel, quiet=True).execute_from_commandline()
