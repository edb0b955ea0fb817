"""Running the sync library's blocking calls off the event loop.

The asyncio twin shares the sync code's wire and state logic by calling it;
calls that wait on the broker or the engine run on a worker thread of the
client's own pool, so they neither block the loop nor take the loop's default
executor from the application.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

#: worker threads of one client: each blocking receive or send holds one while it waits
WORKERS = 32


class Offloader:
    """A client's worker threads for blocking calls. As in the SDK, a client
    may be used again after ``close`` (``async with client:`` twice): the
    threads start again with the next call."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on a worker thread; its result or its error."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="settlement-aio")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Stop taking calls; calls still running finish on their threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
