"""The audit's judgement of logs whose start the engine advanced
(DeleteRecords): offsets trimmed after settlement are fine, anything else
below the log start was lost. ``_judge`` is the audit's pure last step, fed
here with the rows Spark would hand it."""

from __future__ import annotations

import pandas as pd

from spark.audit import _judge
from topics.events import GAUGES


def _messages(rows: list[tuple[int, str, bool]]) -> pd.DataFrame:
    """(offset, final state, in the log now) for window q#0."""
    return pd.DataFrame([{"entity": "q", "partition": 0, "offset": o, "state": state,
                          "locked": False, "settled_by": int(state == "settled"),
                          "lock_ends": 0, "activated": False, "in_log": in_log}
                         for o, state, in_log in rows])


def _judge_with_start(rows: list[tuple[int, str, bool]], log_start: int,
                      begin: int = 0) -> dict:
    active = sum(1 for _, state, in_log in rows if state == "active" and in_log)
    states = pd.DataFrame([{"entity": "q", "partition": 0, "start": log_start, "hw": 10,
                            "ts": 2, **{g: 0 for g in GAUGES}, "active": active}])
    freshness = pd.DataFrame([{"entity": "q", "partition": 0, "last_ts": 1}])
    report = _judge(_messages(rows), states, freshness, {("q", 0): log_start}, now=10,
                    grace_ms=0, begins={("q", 0): begin})
    return {"ok": report.ok, "messages": report.messages, **report.findings}


def test_offsets_trimmed_after_settlement_are_counted_not_reported() -> None:
    rows = [(0, "settled", False), (1, "settled", False), (2, "active", True)]
    found = _judge_with_start(rows, log_start=2)
    assert found["ok"] and found["messages"] == 3 and not found["phantom"]


def test_an_unsettled_offset_below_the_log_start_is_lost() -> None:
    rows = [(0, "settled", False), (1, "dead_letter", False), (2, "active", True)]
    found = _judge_with_start(rows, log_start=2)
    assert found["lost"] == [{"entity": "q", "partition": 0, "offset": 1,
                              "state": "dead_letter", "trimmed": True}]


def test_trimmed_offsets_no_event_names_are_lost() -> None:
    rows = [(2, "settled", False), (3, "active", True)]
    found = _judge_with_start(rows, log_start=3)  # offsets 0 and 1: no events at all
    assert {"entity": "q", "partition": 0, "trimmed_without_events": 2} in found["lost"]


def test_a_subscriptions_trimmed_offsets_count_from_where_it_began() -> None:
    # Offsets 0-2 were published before the subscription began at 3: no event
    # of it names them, and trimming them lost nothing of it.
    rows = [(3, "settled", False), (4, "active", True)]
    assert _judge_with_start(rows, log_start=4, begin=3)["ok"]
    assert {"entity": "q", "partition": 0, "trimmed_without_events": 1} in (
        _judge_with_start([(4, "active", True)], log_start=4, begin=3)["lost"])
