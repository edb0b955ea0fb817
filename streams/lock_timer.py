"""Lock expiry: a timer that lapses locks whose time is up.

The timer reads the windows (only the wake-up time in front of each stored
window) and runs an ``expire`` for each window that has a lock to lapse, in
this worker, between two commands: expiry is the engine's own operation,
which no client can send. Expiry is idempotent, so a sweep that repeats
itself does no harm.
"""

from __future__ import annotations

import time
import uuid

from streams.app import app, headers, timer_interval
from streams.command_agent import run_internal
from streams.window import InflightWindow
from topics.commands import Command, ExpireArgs
from topics.names import split_window_key


@app.timer(interval=timer_interval)
async def sweep_lapsed_locks() -> None:
    now = int(time.time() * 1000)
    for key, raw in list(headers.items()):
        wake = InflightWindow.wake_of(raw) if raw else None
        if wake is None or wake > now:
            continue
        entity, partition = split_window_key(key.decode())
        await run_internal(Command(f"expire-{uuid.uuid4().hex}", entity, partition, ExpireArgs()))
