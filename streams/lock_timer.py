"""Lock expiry: a timer that asks the agent to lapse locks whose time is up.

Faust tables can only be written from inside an agent, so the timer reads the
windows (only the wake-up time in front of each stored window) and sends an
``expire`` command for each window that has a lock to lapse. Expiry is
idempotent, so a sweep that repeats itself, or a second worker that still
sees a window it no longer owns, does no harm.
"""

from __future__ import annotations

import time
import uuid

from streams.app import app, commands_topic, headers, timer_interval
from streams.window import InflightWindow
from topics import specs
from topics.commands import Command, command_partition, encode_command
from topics.names import split_window_key


@app.timer(interval=timer_interval)
async def sweep_lapsed_locks() -> None:
    now = int(time.time() * 1000)
    for key, raw in list(headers.items()):
        wake = InflightWindow.wake_of(raw) if raw else None
        if wake is None or wake > now:
            continue
        window_key = key.decode()
        entity, partition = split_window_key(window_key)
        cmd = Command(f"expire-{uuid.uuid4().hex}", "expire", entity, partition)
        await commands_topic.send(
            key=key, value=encode_command(cmd),
            partition=command_partition(window_key, specs.ENGINE_PARTITIONS),
        )
