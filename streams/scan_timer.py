"""Drives the log scanner: scanned windows get their next accept as soon as
their logs grow. Accepts run in this worker between two commands: they are
the engine's own operation, which no client can send.
"""

from __future__ import annotations

import asyncio
import logging
import time

from streams.app import app, entries, header_lines, headers, records, settings, window_partition
from streams.command_agent import definitions, on_window_dropped, parsed_header, run_internal
from streams.log_scanner import LogScanner
from streams.table_store import TableStore
from streams.window import InflightWindow
from topics.commands import Command
from topics.names import split_window_key

log = logging.getLogger(__name__)

_scanner = LogScanner(settings, definitions)
on_window_dropped.append(_scanner.release)


#: how long the scanner waits after a pass that found records, unless one of
#: its accepts was cut at a limit (then 5 ms), and after one that found none
#: (passing over each window whose log has not grown is cheap). What a pass
#: costs besides its records (loading the windows, a commit record each, its
#: events) is then shared by the records of 20 ms: publishing a topic with
#: ten subscriptions, the engine spent 10-13 us a published record instead
#: of 13-17 with 5 ms (harness, the same hour), and a record is still
#: accepted sooner under load than the 50 ms an idle log may wait.
PAUSE_AFTER_RECORDS_S = 0.02
PAUSE_WHEN_BEHIND_S = 0.005
PAUSE_WHEN_IDLE_S = 0.05


@app.task
async def scan_queue_logs() -> None:
    """Scan continuously (see :data:`PAUSE_AFTER_RECORDS_S`). Which windows
    are scanned is looked up once a second, and as soon as a window is
    added: a subscription created just before its topic was published was
    scanned up to a second late, and held back the scans of the others
    (they share one consumer, which the window furthest behind drives)."""
    scanned: list[bytes] = []
    listed_at, listed_changes = 0.0, -1
    while True:
        if time.monotonic() - listed_at > 1.0 or header_lines.changes != listed_changes:
            scanned = [key for key, line in header_lines.items()
                       if InflightWindow.is_scanned(line)]
            listed_at, listed_changes = time.monotonic(), header_lines.changes
        due = [window for key in scanned if not _scanner.nothing_new(key.decode())
               and (raw := headers.get(key)) and InflightWindow.is_scanned(raw)
               and (window := _window(key, raw)) is not None]
        # One hop to the scanner's thread for every window, and their accepts
        # in one commit round: the ten subscriptions of a topic each waited
        # for the acknowledgement of the one before.
        found, more = await asyncio.to_thread(_scan, due) if due else ([], False)
        if found:
            await run_internal(*found)
        await asyncio.sleep(PAUSE_WHEN_BEHIND_S if more else
                            PAUSE_AFTER_RECORDS_S if found else PAUSE_WHEN_IDLE_S)


def _scan(due: list[InflightWindow]) -> tuple[list[Command], bool]:
    """The commands the scanner has for the windows of ``due`` (those
    deleted, or defined again without what needs scanning, since listed are
    not among them), and whether a log holds more than they take."""
    found: list[Command] = []
    more = False
    for window in due:
        try:
            scanned = _scanner.scan(window)
        except Exception:  # never let one window's scan stop the engine; the next pass retries
            log.exception("scanning the log of window %s#%d failed", window.entity,
                          window.partition)
            continue
        found += scanned.commands
        more = more or scanned.more
    return found, more


def _window(key: bytes, raw: bytes) -> InflightWindow | None:
    """A stored window, read-only: the scanner reads its header and dead
    letters. Its header is parsed only when this worker did not write it
    (parsing it took 8 % of the engine's time accepting 100,000 sessions).
    None for one that cannot be read (logged; the next pass tries again)."""
    entity, partition = split_window_key(key.decode())
    store = TableStore(entries, window_partition(key.decode()), records)
    try:
        return InflightWindow.load(raw, entity, partition, store, parsed_header(key, raw))
    except (ValueError, KeyError, TypeError):
        log.exception("the header of window %s cannot be read; not scanned", key.decode())
        return None


@app.on_rebalance_complete.connect
async def _forget_positions(sender: object, /, *_: object, **__: object) -> None:
    """Windows may have moved between workers: start each scan from the table."""
    await asyncio.to_thread(_scanner.reset)
