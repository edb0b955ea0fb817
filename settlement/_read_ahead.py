"""Read-ahead of large peek-lock receives.

A receive is a round trip to the engine (lock a batch) and a read of the log;
settling the batch is another round trip. An application that receives
batches of hundreds and settles them one batch after the other would wait for
each round trip in turn, with every process idle in between. When such a
receive comes back full (the queue is busy), the receiver asks for the next
batch before it returns, and waits for it in a thread while the application
works on this one: the next ``receive_messages`` finds it ready. The request
is sent on the application's thread, so that the engine has it before the
settlement of this batch and locks the next batch first (a harness of receive
1,000 + ``complete_messages`` on Apache Kafka: ~37,500 -> ~44,000 msg/s; sent
from the thread, it waited for the GIL while the application built its
settlement, and usually came second). What was read ahead but never handed
out (the receiver closed, a smaller batch asked for) is released at once,
its delivery count untouched, as the receiver loop does.

Only receivers created with a ``prefetch_count`` read ahead (as in the SDK,
prefetching is asked for: a receiver left open would otherwise hold a
batch nobody asked for), and only peek-lock receives of the active queue:
receive-and-delete would settle messages the application may never get.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
#: the smallest batch that reads ahead: a busy queue drained in batches
MIN_BATCH = 100

M = TypeVar("M")


class ReadAhead(Generic[M]):
    """At most one batch acquired ahead of the application."""

    def __init__(self, start: Callable[[int], Callable[[], list[M]]],
                 release: Callable[[list[M]], None]) -> None:
        #: sends a receive's request at once; what it returns finishes it
        self._start = start
        self._release = release
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[list[M]] | None = None

    def start(self, want: int) -> None:
        """Acquire the next batch of ``want``: asked for on this thread, so
        that it is in the log before whatever this thread sends next, and
        waited for in the background."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="read-ahead")
        try:
            finish = self._start(want)
        except Exception as exc:  # noqa: BLE001 (raised by the receive that takes it)
            failed: Future[list[M]] = Future()
            failed.set_exception(exc)
            self._pending = failed
            return
        self._pending = self._pool.submit(finish)

    def take(self, want: int) -> list[M]:
        """The batch read ahead, at most ``want`` of it (the rest is
        released); empty when none was started or it found nothing. An error
        of the background receive is raised here."""
        if self._pending is None:
            return []
        pending, self._pending = self._pending, None
        got = pending.result()
        if len(got) > want:
            self._release(got[want:])
            got = got[:want]
        return got

    def cancel(self) -> None:
        """Release whatever was read ahead (the receiver is closing)."""
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        try:
            self._release(pending.result())
        except Exception as exc:  # noqa: BLE001 (closing: those locks lapse on their own)
            log.info("could not release the batch read ahead (%s); its locks lapse", exc)

    def close(self) -> None:
        self.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
