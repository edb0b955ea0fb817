"""Drives the log scanner: scanned windows get their next accept as soon as
their logs grow. Accepts run in this worker between two commands: they are
the engine's own operation, which no client can send.
"""

from __future__ import annotations

import asyncio
import logging
import time

from streams.app import app, entries, headers, records, settings, window_partition
from streams.command_agent import definitions, on_window_dropped, parsed_header, run_internal
from streams.log_scanner import LogScanner
from streams.table_store import TableStore
from streams.window import InflightWindow
from topics.names import split_window_key

log = logging.getLogger(__name__)

_scanner = LogScanner(settings, definitions)
on_window_dropped.append(_scanner.release)


@app.task
async def scan_queue_logs() -> None:
    """Scan continuously: right away while there is work, every 50 ms otherwise.
    Which windows are scanned is looked up in the whole table once a second."""
    scanned: list[bytes] = []
    listed_at = 0.0
    while True:
        if time.monotonic() - listed_at > 1.0:
            scanned = [key for key, raw in list(headers.items())
                       if raw and InflightWindow.is_scanned(raw)]
            listed_at = time.monotonic()
        busy = False
        for key in scanned:
            if _scanner.nothing_new(key.decode()):
                continue
            raw = headers.get(key)
            if not raw or not InflightWindow.is_scanned(raw):
                continue  # deleted, or defined again without what needs scanning, since listed
            try:
                found = await asyncio.to_thread(_scanner.scan, _window(key, raw))
            except Exception:  # never let one window's scan stop the engine; the next pass retries
                log.exception("scanning the log of window %s failed", key.decode())
                continue
            for cmd in found:
                busy = True
                await run_internal(cmd)
        await asyncio.sleep(0.005 if busy else 0.05)


def _window(key: bytes, raw: bytes) -> InflightWindow:
    """A stored window, read-only: the scanner reads its header and dead
    letters. Its header is parsed only when this worker did not write it
    (parsing it took 8 % of the engine's time accepting 100,000 sessions)."""
    entity, partition = split_window_key(key.decode())
    store = TableStore(entries, window_partition(key.decode()), records)
    return InflightWindow.load(raw, entity, partition, store, parsed_header(key, raw))


@app.on_rebalance_complete.connect
async def _forget_positions(sender: object, /, *_: object, **__: object) -> None:
    """Windows may have moved between workers: start each scan from the table."""
    await asyncio.to_thread(_scanner.reset)
