"""The pauses of a call that tries again until something turns up.

A receive waits for messages, a NEXT_AVAILABLE_SESSION receiver for a free
session, by asking the engine again and again, more and more apart. The
sync client sleeps the pauses on its thread; the asyncio one awaits them on
its event loop, so a waiting call holds a thread only while it asks, and a
cancelled one stops asking at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator


def pauses(wait: float | None, first: float, longest: float) -> Iterator[float]:
    """The pause before each try: 0 before the first, then ``first`` seconds,
    doubling up to ``longest``, until ``wait`` seconds from now have passed
    (the last pause ends then); for ever when ``wait`` is None."""
    deadline = None if wait is None else time.monotonic() + wait
    return _pauses(deadline, first, longest)


def _pauses(deadline: float | None, pause: float, longest: float) -> Iterator[float]:
    yield 0.0
    while deadline is None or time.monotonic() < deadline:
        remaining = longest if deadline is None else deadline - time.monotonic()
        yield max(0.0, min(pause, remaining))
        pause = min(pause * 2, longest)
