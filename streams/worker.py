"""Starts one engine worker: ``settlement worker --connection-string ...``."""

from __future__ import annotations

import os
from pathlib import Path

from streams.placement import keep_threads_together
from topics.connection import parse_connection_string


def run_worker(connection_string: str, data_dir: str | Path = "data/engine",
               web_port: int | None = None, loglevel: str = "info",
               metrics_port: int | None = None) -> None:
    """Run the Faust worker of the namespace until stopped (:mod:`streams.app`
    provisions the namespace's topics first; :mod:`streams.engine` registers
    the agents and timers).

    ``metrics_port``: serve Prometheus metrics there (:mod:`streams.metrics`).

    Several workers of one namespace share its engine partitions; each needs its
    own ``data_dir`` (RocksDB holds a lock on it).
    """
    parse_connection_string(connection_string)  # fail here, clearly, on a bad string
    placement = keep_threads_together()  # before any thread of the worker starts
    os.environ["SETTLEMENT_CONNECTION_STRING"] = connection_string
    os.environ["SETTLEMENT_DATA_DIR"] = str(data_dir)
    if web_port is not None:
        os.environ["SETTLEMENT_WEB_PORT"] = str(web_port)
    if metrics_port is not None:
        os.environ["SETTLEMENT_METRICS_PORT"] = str(metrics_port)
    # Imported here, not at the top: Faust and the engine (RocksDB) are heavy and only
    # a worker needs them, and streams.app reads the environment set above on import.
    from streams.engine import app
    from streams.engine_worker import EngineWorker

    EngineWorker(app, placement, loglevel=loglevel, quiet=True).execute_from_commandline()
