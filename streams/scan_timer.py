"""Drives the log scanner: scanned windows get their next accept as soon as
their logs grow.

Faust tables are written only by agents, so the accept travels as a command
to the window's partition like every other change.
"""

from __future__ import annotations

import asyncio
import time

from streams.app import app, commands_topic, settings, windows
from streams.log_scanner import LogScanner
from streams.window import InflightWindow
from topics import specs
from topics.commands import command_partition, encode_command

_scanner = LogScanner(settings)


@app.task
async def scan_queue_logs() -> None:
    """Scan continuously: right away while there is work, every 50 ms otherwise.
    Which windows are scanned is looked up in the whole table once a second."""
    scanned: list[bytes] = []
    listed_at = 0.0
    while True:
        if time.monotonic() - listed_at > 1.0:
            scanned = [key for key, raw in list(windows.items())
                       if raw and InflightWindow.is_scanned(raw)]
            listed_at = time.monotonic()
        busy = False
        for key in scanned:
            raw = windows.get(key)
            if not raw:
                continue
            for cmd in await asyncio.to_thread(_scanner.scan, InflightWindow.from_bytes(raw)):
                busy = True
                await commands_topic.send(
                    key=key, value=encode_command(cmd),
                    partition=command_partition(key.decode(), specs.ENGINE_PARTITIONS))
        await asyncio.sleep(0.005 if busy else 0.05)


@app.on_rebalance_complete.connect
async def _forget_positions(sender: object, **_: object) -> None:
    """Windows may have moved between workers: start each scan from the table."""
    await asyncio.to_thread(_scanner.reset)
