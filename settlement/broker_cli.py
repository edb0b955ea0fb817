"""``settlement broker``: run the embedded Tansu broker in the foreground.

This gives a developer a Kafka-protocol endpoint with one command and no JVM,
so ``settlement worker`` and friends can be tried locally.  The process prints
its bootstrap address (scripts wait for that line), then stays up until it is
interrupted, and stops the broker on the way out so no orphan is left behind.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType

from settlement.embedded import BrokerStartError, EmbeddedBroker

log = logging.getLogger(__name__)


def run_broker(host: str, port: int) -> int:
    """Run an :class:`EmbeddedBroker` on *host*:*port* until SIGINT or SIGTERM.

    Returns the process exit code: 0 after a clean stop, 2 if the broker could
    not start (the reason is printed to stderr as ``error: ...``).
    """
    stop = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s; stopping broker", signal.Signals(signum).name)
        stop.set()

    # Install the handlers before starting, so a signal that arrives during
    # start-up still leads to a clean stop rather than an orphaned broker.
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        broker = EmbeddedBroker(host=host, port=port)
        try:
            broker.start()
        except BrokerStartError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 2
        try:
            print(f"bootstrap: {broker.bootstrap}", flush=True)
            # Event.wait with a timeout returns promptly after a signal handler
            # runs; a plain wait() would also work but this also notices the
            # broker dying underneath us.
            while not stop.wait(timeout=1.0):
                if not broker.running:
                    print(
                        f"error: broker on {broker.bootstrap} exited unexpectedly; "
                        f"log tail:\n{broker.log_tail()}",
                        file=sys.stderr,
                        flush=True,
                    )
                    return 2
        finally:
            broker.stop()
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
