"""Running the sync library's blocking calls off the event loop.

The asyncio twin shares the sync code's wire and state logic by calling it;
calls that wait on the broker or the engine run on a worker thread of the
client's own pool, so they neither block the loop nor take the loop's default
executor from the application.

A thread cannot be stopped, so cancelling an await of such a call is made
safe in one of two ways (what each asyncio call does: :mod:`settlement.aio._receiver`):

* :meth:`Offloader.run` with ``if_abandoned``: the caller goes at once; what
  the call still does once its caller is gone (a receive that locks
  messages) is undone as soon as it returns (the messages are released);
* :meth:`Offloader.run_to_end`: a call that changes state (a send, a
  dead-lettering, a renewal) is never left half-known: cancelled before it
  started, it never runs; started, the cancelled await waits for its end.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: most worker threads of one client, made as calls need them. A thread is
#: held only while a call waits on the broker or the engine: a receive waits
#: for messages on the event loop between its round trips, and concurrent
#: settlements share commands (``_settle_groups``), so thousands of
#: concurrent awaits need a few threads, not one each.
WORKERS = 256


class Offloader:
    """A client's worker threads for blocking calls. As in the SDK, a client
    may be used again after ``close`` (``async with client:`` twice): the
    threads start again with the next call."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        #: calls whose callers were cancelled, until they and their undoing end
        self._abandoned: set[Future[None]] = set()
        self._lock = threading.Lock()

    def _submit(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]
                ) -> Future[T]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="settlement-aio")
        return self._pool.submit(functools.partial(fn, *args, **kwargs))

    def start(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> asyncio.Future[T]:
        """``fn(*args, **kwargs)`` started on a worker thread; its future."""
        return asyncio.wrap_future(self._submit(fn, args, kwargs))

    async def run(self, fn: Callable[..., T], /, *args: Any,
                  if_abandoned: Callable[[T], object] | None = None, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a worker thread; its result or its error.

        Cancelled: if the call had not started, it never runs; if it had, it
        goes on, and ``if_abandoned`` gets its result when it returns (on a
        thread of its own: the caller, maybe its event loop too, is gone)."""
        call = self._submit(fn, args, kwargs)
        try:
            return await asyncio.wrap_future(call)
        except asyncio.CancelledError:
            if not call.cancel() and if_abandoned is not None:
                self._abandon(call, if_abandoned)
            raise

    async def run_to_end(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a worker thread; its result or its error.

        Cancelled: if the call had not started, it never runs; if it had, the
        await waits for its end before it raises ``CancelledError``, so that
        what it changed (sent, settled, renewed) is decided by then."""
        call = self._submit(fn, args, kwargs)
        waiting = asyncio.wrap_future(call)
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            if not call.cancel():
                await asyncio.wait([waiting])
                if not waiting.cancelled():
                    waiting.exception()  # seen: the caller is gone, not told
            raise

    def _abandon(self, call: Future[T], undo: Callable[[T], object]) -> None:
        """Run ``undo`` on what ``call`` returns, on a thread of its own."""
        finished: Future[None] = Future()
        with self._lock:
            self._abandoned.add(finished)

        def undo_result(done: Future[T]) -> None:
            try:
                if done.exception() is None:
                    undo(done.result())
            except Exception as exc:  # noqa: BLE001 (its locks lapse on their own)
                log.warning("could not undo what a cancelled call did (%s): its locks lapse",
                            exc)
            finally:
                with self._lock:
                    self._abandoned.discard(finished)
                finished.set_result(None)

        # the thread that ends the call runs this, or the loop's if it has ended
        call.add_done_callback(lambda done: threading.Thread(
            target=undo_result, args=(done,), name="settlement-aio-undo").start())

    async def wait_abandoned(self) -> None:
        """Wait until every call whose caller was cancelled has ended and been
        undone (before the receivers they locked messages for close)."""
        with self._lock:
            abandoned = list(self._abandoned)
        if abandoned:
            await asyncio.wait([asyncio.wrap_future(f) for f in abandoned])

    def close(self) -> None:
        """Stop taking calls; calls still running finish on their threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
