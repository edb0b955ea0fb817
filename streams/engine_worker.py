"""The engine's Faust worker, calm while Kafka is away and quick to stop.

While no broker answers, aiokafka (under Faust) and librdkafka (the engine's
own consumers) log every failed connection and metadata request: about a
hundred lines a second from one worker. :class:`topics.connection.WaitingForKafka`
lets one line a second through, saying what the worker waits for and how
many lines like it were left out; the rest of the log is untouched.

Faust's shutdown waits for Kafka (offset commits, the producer's flush), so
a SIGTERM while the brokers are away never ended the worker. The engine is
built to survive ``kill -9`` (a command is final only once its commit record
is in Kafka; what was read and not committed is read again), so after
:data:`STOP_GRACE_S` of a shutdown that does not finish the worker exits as
it would after a crash, saying so.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
from typing import Any

import faust

from streams.placement import Placement
from topics.connection import WaitingForKafka

log = logging.getLogger(__name__)

#: how long a shutdown may wait for Kafka before the worker exits anyway
STOP_GRACE_S = 8.0
#: the worker's exit status when Kafka did not take a commit record
#: (EX_TEMPFAIL: start it again; streams.command_agent says why it stops)
COMMIT_REFUSED_EXIT = 75
#: allocations between two collections of the youngest objects (CPython's default: 700)
YOUNG_COLLECTION = 20_000
#: the loggers of the Kafka clients in the engine process (librdkafka's lines
#: pass its own filter first: topics.connection; this one bounds them all
#: together)
_CLIENT_LOGGERS = ("aiokafka", "librdkafka", "faust.transport", "faust.tables")


class EngineWorker(faust.Worker):
    """``faust.Worker`` with the engine's log filter and a bounded shutdown."""

    def __init__(self, app: faust.App, placement: Placement, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._waiting = WaitingForKafka(_CLIENT_LOGGERS)
        self._placement = placement

    async def on_startup_finished(self) -> None:
        await super().on_startup_finished()
        log.info("%s", self._placement.describe())
        # What the start made (modules, Faust's services, the tables' stores)
        # lives as long as the worker: the collector need not walk it again
        # and again. Each command leaves many short-lived containers behind;
        # collecting the young ones every YOUNG_COLLECTION allocations rather
        # than every 700 (a full collection took the engine 37 ms, 3 of them
        # in 2 s while a queue was drained 1,000 at a time).
        gc.freeze()
        gc.set_threshold(YOUNG_COLLECTION, *gc.get_threshold()[1:])

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        super().on_setup_root_logger(logger, level)
        for handler in logger.handlers:
            handler.addFilter(self._waiting)

    def _schedule_shutdown(self, signal: signal.Signals) -> None:
        super()._schedule_shutdown(signal)
        timer = threading.Timer(STOP_GRACE_S, _exit_after_grace)
        timer.daemon = True  # a shutdown that finishes in time ends the process first
        timer.start()


def _exit_after_grace() -> None:
    log.warning("the worker did not stop within %.0f s of the signal (Kafka does not answer); "
                "exiting now: what it read and did not commit is read again by the next "
                "worker, as after a crash", STOP_GRACE_S)
    logging.shutdown()
    os._exit(0)
