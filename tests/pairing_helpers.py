"""A primary namespace for the pairing tests: a broker of the session's kind
with its own engine, that a test may pause (SIGSTOP) and resume; the
session's broker and engine (the ``conn`` fixture) are the secondary."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from settlement.testing.apache_kafka import KafkaCluster
from settlement.testing.embedded import EmbeddedBroker
from settlement.testing.pause import pause, resume
from streams.process import EngineProcess
from tests.helpers import TEST_BROKER, Broker


class Primary:
    """A broker of the session's kind with an engine, that a test may pause."""

    def __init__(self, broker: Broker, engine: EngineProcess) -> None:
        self.broker, self.engine = broker, engine
        self.conn = engine.connection_string

    @property
    def pid(self) -> int:
        if isinstance(self.broker, KafkaCluster):
            return self.broker.nodes[0].pid
        return self.broker.pid

    def pause(self) -> None:
        pause(self.pid)

    def resume(self) -> None:
        resume(self.pid)


@contextmanager
def running_primary(workdir: Path) -> Iterator[Primary]:
    """Start a broker and an engine (its data in ``workdir``); stop both after."""
    broker: Broker = EmbeddedBroker() if TEST_BROKER == "tansu" else KafkaCluster()
    with broker:
        engine = EngineProcess(broker.connection_string(f"p{uuid.uuid4().hex[:8]}"),
                               workdir).start()
        try:
            yield Primary(broker, engine)
        finally:
            engine.stop()
