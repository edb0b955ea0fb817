"""The dashboard in a real headless Chromium: the numbers of a known workload,
run through the engine and the Spark monitor, appear on the served page, and
its screenshot is a real picture. Chromium is required, never skipped:
``make test`` (and so ``.ci/run``) installs Debian's ``chromium`` when it is missing."""

from __future__ import annotations

import json
import re
import struct
import urllib.request
from pathlib import Path
from typing import Any

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.management import ServiceBusAdministrationClient
from spark.dashboard import dump_dom, screenshot
from tests.helpers import drive_workload, run_monitor


def test_the_page_shows_the_numbers_of_a_known_workload(
        browser: None, spark: Any, conn: str, client: ServiceBusClient, make_queue: Any,
        admin: ServiceBusAdministrationClient, dashboard_url: tuple[str, Path],
        tmp_path: Path) -> None:
    url, sink = dashboard_url
    assert "No metrics yet" in dump_dom(url)
    queue = make_queue()
    # 12 sent: 7 completed, 2 abandoned then completed, 3 dead-lettered ("poison")
    drive_workload(client, queue, sent=12, complete=7, abandon=2, dead_letter=3,
                   reason="poison")
    sessions = _drive_sessions(client, admin, f"{queue}-sessions")
    run_monitor(spark, conn, sink)

    dom = dump_dom(url)
    row = re.search(rf'<tr data-entity="{queue}">(.*?)</tr>', dom)
    assert row, f"no row for {queue} in the page"
    cells = dict(re.findall(r'data-metric="(\w+)">([^<]*)<', row.group(1)))
    assert {key: cells[key] for key in ("enqueued", "completed", "abandoned", "dead_lettered",
                                        "deferred", "now_active", "now_dead_letter")} == {
        "enqueued": "12", "completed": "9", "abandoned": "2", "dead_lettered": "3",
        "deferred": "0", "now_active": "0", "now_dead_letter": "3"}
    assert all(re.fullmatch(r"[\d.,]+", cells[key]) for key in (
        "lock_p50_ms", "lock_p95_ms", "lock_p99_ms", "end_to_end_p50_ms"))
    assert f"poison · {queue}: 3" in dom  # the dead-letters-by-reason bar
    assert f"{queue}: outcomes per second" in dom
    shown = {session: dict(re.findall(r'data-metric="(\w+)">([^<]*)<', cells))
             for session, cells in re.findall(r'<tr data-session="([^"]+)">(.*?)</tr>', dom)}
    assert {s: shown[s] for s in sessions} == {
        "waiting": {"active": "3", "locked_until": "–", "state_size": "0"},
        "done": {"active": "0", "locked_until": "–", "state_size": "9"}}, shown

    with urllib.request.urlopen(url + "metrics.json", timeout=10) as response:
        numbers = json.load(response)
    mine = next(row for row in numbers["entities"] if row["entity"] == queue)
    assert (mine["enqueued"], mine["completed"], mine["dead_lettered"]) == (12, 9, 3)
    assert {"entity": queue, "reason": "poison", "count": 3} in numbers["dead_letter_reasons"]

    png = screenshot(url, tmp_path / "dashboard.png", width=1280, height=1600)
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert struct.unpack(">II", data[16:24]) == (1280, 1600)  # IHDR width, height
    assert len(data) > 20_000  # charts and text, not a blank page


def _drive_sessions(client: ServiceBusClient, admin: ServiceBusAdministrationClient,
                    queue: str) -> list[str]:
    """Session ``waiting`` keeps 3 messages; ``done`` is completed, with state."""
    admin.create_queue(queue, requires_session=True)
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(f"w{i}", session_id="waiting")
                              for i in range(3)] + [ServiceBusMessage("d", session_id="done")])
    with client.get_queue_receiver(queue, session_id="done", max_wait_time=10) as receiver:
        receiver.complete_messages(receiver.receive_messages(1))
        receiver.session.set_state(b"completed")
    return ["waiting", "done"]
