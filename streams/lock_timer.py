"""Lock expiry: a timer that lapses locks whose time is up.

The timer reads the windows (only the wake-up time in front of each stored
window) and runs an ``expire`` for each window that has a lock to lapse, in
this worker, between two commands: expiry is the engine's own operation,
which no client can send. Expiry is idempotent, so a sweep that repeats
itself does no harm.

Time is the commands log's (:mod:`streams.log_clock`): a window is due once
the time of its commands partition has reached its wake-up time. Where the
log has not (the partition is idle), the sweep appends a tick to it, and the
tick, once read, runs the windows of that partition that came due.
"""

from __future__ import annotations

import time
import uuid

from streams.app import app, header_lines, timer_interval, window_partition
from streams.command_agent import clock, on_tick, request_tick, run_internal
from streams.window import InflightWindow
from topics.commands import Command, ExpireArgs
from topics.names import split_window_key


@app.timer(interval=timer_interval)
async def sweep_lapsed_locks() -> None:
    await _sweep(None)


async def _sweep_partition(partition: int) -> None:
    await _sweep(partition)


on_tick.append(_sweep_partition)


async def _sweep(only: int | None) -> None:
    """Expire what is due in every window (or those of commands partition
    ``only``); tick the partitions whose log is behind the wall clock."""
    wall = int(time.time() * 1000)
    ticked: set[int] = set()
    for key, line in header_lines.items():
        wake = InflightWindow.wake_of(line)
        if wake is None or wake > wall:
            continue
        entity, partition = split_window_key(key.decode())
        commands_partition = window_partition(key.decode())
        if only is not None and commands_partition != only:
            continue
        if clock.behind(commands_partition, wake):
            if commands_partition not in ticked and only is None:
                ticked.add(commands_partition)
                request_tick(commands_partition)
            continue
        await run_internal(Command(f"expire-{uuid.uuid4().hex}", entity, partition, ExpireArgs()))
