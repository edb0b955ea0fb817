"""Sessions in the window's state machine, on its own (no Kafka, no Faust):
order, exclusivity, lapses, state, listing, and what idle sessions cost."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import time

import pytest

from streams import entries, session_index
from streams.acceptance import NO_SESSION, AcceptArgs, Item
from streams.states import SESSION_ID_NULL_REASON, Refused
from streams.store import MemoryStore, Txn
from streams.window import InflightWindow
from tests.wire_commands import wire_command
from topics.commands import ClientArgs, Command, Policy, grants_from_wire

_ids = itertools.count()
POLICY = Policy(lock_ms=1000, max_delivery=3, requires_session=True)


def cmd(op: str, **args: object) -> Command[ClientArgs]:
    return wire_command(op, f"c{next(_ids)}", **args)


def window_with(sessions: list[str | None]) -> InflightWindow:
    """A session queue whose log holds one message per entry of ``sessions``
    (None: a message without a session id), accepted by the scanner."""
    win = InflightWindow("q", 0)
    win.apply(cmd("stats", hw=0, version=-1), 0, policy=(0, POLICY))
    items = [Item(o, session=s) if s is not None else Item(o, mark=NO_SESSION)
             for o, s in enumerate(sessions)]
    accept = Command(f"c{next(_ids)}", "q", 0, AcceptArgs(0, len(sessions), tuple(items)))
    result = win.apply(accept, 0)
    assert result.result["accepted"]
    return win


def lock(win: InflightWindow, session: str | None, now: int) -> dict:
    return win.apply(cmd("lock_session", session=session), now).result


def receive(win: InflightWindow, held: dict, now: int, n: int = 10) -> list[list]:
    grants = win.apply(cmd("acquire", sub="active", mode="peek_lock", max=n, hw=0,
                           session=held["session"], token=held["token"]), now).result["grants"]
    return [g.to_wire() for g in grants_from_wire(grants)]


def settle(win: InflightWindow, grants: list[list], action: str, now: int) -> list[str]:
    items = [[g[0], g[1], action, None, None, None, None] for g in grants]
    return [r[0] for r in win.apply(cmd("settle", items=items), now).result["results"]]


def test_a_session_is_handed_out_in_order_and_only_to_its_holder() -> None:
    win = window_with(["a", "b", "a", "b", "a"])
    held = lock(win, "a", 0)
    assert [g[0] for g in receive(win, held, 1)] == [0, 2, 4]
    assert lock(win, "a", 2)["taken"]
    other = lock(win, None, 2)  # the next available session is b
    assert other["session"] == "b"
    assert [g[0] for g in receive(win, other, 3)] == [1, 3]
    assert lock(win, None, 4) == {"session": None}


def test_abandoned_message_comes_back_before_later_ones() -> None:
    win = window_with(["a", "a", "a"])
    held = lock(win, "a", 0)
    first = receive(win, held, 1, n=1)
    assert settle(win, first, "abandon", 2) == ["ok"]
    again = receive(win, held, 3, n=2)
    assert [(g[0], g[3]) for g in again] == [(0, 2), (1, 1)]  # (offset, delivery count)


def test_session_lock_lapse_releases_its_messages_counting_a_delivery() -> None:
    win = window_with(["a", "a"])
    held = lock(win, "a", 0)
    grants = receive(win, held, 1)
    with pytest.raises(Refused, match="lock on session 'a'"):
        receive(win, held, 1500)  # lapsed (lock_ms 1000)
    assert settle(win, grants, "complete", 1500) == ["lock_lost", "lock_lost"]
    after = lock(win, None, 1600)
    assert after["session"] == "a"
    assert [(g[0], g[3]) for g in receive(win, after, 1601)] == [(0, 2), (1, 2)]


def test_renewing_the_session_keeps_its_messages_locked() -> None:
    win = window_with(["a"])
    held = lock(win, "a", 0)
    grants = receive(win, held, 1)
    until = win.apply(cmd("renew_session", session="a", token=held["token"]), 900).result
    assert until == {"until": 1900}
    assert grants[0][2] == 1000 and win.entries.get(0).until == 1900
    assert settle(win, grants, "complete", 1500) == ["ok"]
    assert win.stats()["active"] == 0


def test_completing_a_session_leaves_no_key_behind_but_its_state() -> None:
    win = window_with(["a", "a"])
    held = lock(win, "a", 0)
    state = base64.b64encode(b"step 2").decode()
    win.apply(cmd("set_session_state", session="a", token=held["token"], state=state), 1)
    settle(win, receive(win, held, 2), "complete", 3)
    win.apply(cmd("release_session", session="a", token=held["token"]), 4)
    left = {k[len(win.prefix):len(win.prefix) + 1] for k in win.store._keys
            if k.startswith(win.prefix)}
    assert left == {b"s", b"v", b"e", b"a"}  # session record, its state, answers
    again = lock(win, "a", 5)
    assert win.apply(cmd("session_state", session="a", token=again["token"]),
                     6).result["state"] == state
    rows = win.apply(cmd("list_sessions", after=None, max=100, updated_after=None),
                     7).result["sessions"]
    assert rows == [["a", 0, 1005, 6, 1]]


def test_message_without_session_id_is_dead_lettered_with_the_seeds_reason() -> None:
    win = window_with([None, "a"])
    assert win.entries.get(0).reason == SESSION_ID_NULL_REASON
    assert win.stats()["dead_letter"] == 1 and win.stats()["active"] == 1


def test_a_plain_receive_is_refused_on_a_session_queue() -> None:
    win = window_with(["a"])
    with pytest.raises(Refused, match="requires sessions"):
        win.apply(cmd("acquire", sub="active", mode="peek_lock", max=1, hw=1), 1)


def test_idle_sessions_cost_a_command_nothing() -> None:
    """The next available session is the first key of an index: 20,000
    sessions waiting cost no more than 100 (bench.sessions measures 100,000
    end to end)."""
    def lock_time(count: int) -> float:
        win = window_with([f"s{i:06d}" for i in range(count)])
        started = time.perf_counter()
        for _ in range(50):
            held = lock(win, None, 1)
            settle(win, receive(win, held, 2), "complete", 3)
            win.apply(cmd("release_session", session=held["session"], token=held["token"]), 4)
        return time.perf_counter() - started

    # the best of three: one run may share the machine with other work
    few = min(lock_time(100) for _ in range(3))
    many = min(lock_time(20_000) for _ in range(3))
    assert many < few * 3 + 0.05, (few, many)


def test_interleaved_sessions_keep_two_keys_each_beside_the_chunks_of_their_offsets() -> None:
    """2,000 sessions of 10 whose messages lie 2,000 offsets apart: each
    keeps its record, with its pending offsets in it, and its ready-index
    key; the offsets' entries share chunks of 128 (before: a list of pending
    offsets of its own too, and earlier a list per 1,024 offsets a session's
    messages spanned, 15 keys a session in all)."""
    sessions, per_session = 2000, 10
    win = window_with([f"s{k}" for _ in range(per_session) for k in range(sessions)])
    chunks = -(-sessions * per_session // 128)
    keys = len(win.store)
    assert keys <= 2 * sessions + chunks
    held = lock(win, None, 1)
    assert held["session"] == "s0"
    assert settle(win, receive(win, held, 2), "complete", 3) == ["ok"] * per_session
    win.apply(cmd("release_session", session="s0", token=held["token"]), 4)
    # s0's two keys are gone; each of the four commands left its answer
    # (and when to forget it) for a retry of it
    assert len(win.store) == keys - 2 + 4 * 2


def test_a_session_past_the_offsets_its_record_keeps_moves_them_out_and_back() -> None:
    """A session with more pending messages than its record keeps moves them
    to a list of their own, in order, and back into the record once drained."""
    count = session_index.INLINE_MAX + 36
    win = window_with(["big"] * count + ["small"] * 3)

    def lists() -> list[bytes]:
        return [k for k in win.store._values if k.startswith(win.prefix + b"p")]

    assert len(lists()) == 1  # big's; small's three are in its record
    held = lock(win, "big", 1)
    grants = receive(win, held, 2, n=count)
    assert [g[0] for g in grants] == list(range(count))  # in log order
    assert settle(win, grants, "complete", 3) == ["ok"] * count
    assert lists() == []
    win.apply(cmd("release_session", session="big", token=held["token"]), 4)
    later = count + 3
    win.apply(Command(f"c{next(_ids)}", "q", 0,
                      AcceptArgs(later, later + 1, (Item(later, session="big"),))), 5)
    assert lists() == []  # back in its record
    assert [g[0] for g in receive(win, lock(win, "big", 6), 7)] == [later]
def test_a_deep_session_keeps_every_key_and_every_command_small() -> None:
    """100,000 messages in one session: more than one Kafka record could hold
    as one list, yet no stored value and no command's writes grow with them,
    and all the window keeps stays under 1 MB (queued messages are runs in
    their chunks, not an entry each: 5.3 MB before)."""
    win = window_with(["deep"] * 100_000)
    assert max(len(value) for value in win.store._values.values()) < 10_000
    assert sum(len(k) + len(v) for k, v in win.store._values.items()) < 1_000_000
    held = lock(win, "deep", 1)
    grants = receive(win, held, 2, n=100)
    items = [[g[0], g[1], "complete", None, None, None, None] for g in grants]
    outcome = win.apply(cmd("settle", items=items), 3)
    assert sum(len(k) + len(v or b"") for k, v in outcome.writes.items()) < 20_000
    assert win.stats()["active"] == 100_000 - 100


def test_queued_messages_read_back_from_the_store_keep_their_sessions_and_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk keeps queued session messages as runs per session beside the
    entries of the others; read back from the store (not from the chunks the
    process remembers), each session gets its own, in order."""
    win = window_with(["a", "b", "a", "a", "b", "c"])
    held = lock(win, "a", 1)
    assert [g[0] for g in receive(win, held, 2, n=1)] == [0]  # 0 locked: an entry
    chunk = json.loads(next(v for k, v in win.store._values.items()
                            if k.startswith(win.prefix + b"c")))
    assert chunk.keys() == {"0", "q"}
    assert chunk["q"] == {"a": [2, 4], "b": [1, 2, 4, 5], "c": [5, 6]}
    monkeypatch.setattr(entries._Chunk, "_parsed", {})
    assert [g[0] for g in receive(win, held, 3, n=5)] == [2, 3]
    assert [g[0] for g in receive(win, lock(win, "b", 4), 5)] == [1, 4]
    assert win.stats()["active"] == 6 and win.stats()["locked"] == 5


def test_a_session_stored_before_its_record_kept_offsets_reads_from_its_lists() -> None:
    """A session record of seven fields (stored before offsets were kept in
    it) still has its offsets in its list keys: they are read from there,
    and once drained the next ones are kept in its record."""
    store = MemoryStore()
    txn = Txn(store)
    index = session_index.SessionIndex(txn, b"q#0\x00")
    txn.put(b"q#0\x00sold", json.dumps([2, 0, 0, 5, 0, 0, [5]]).encode())
    txn.put(index._list_key("old", 5), b"[5,9]")
    assert list(index.offsets("old")) == [5, 9]
    index.remove("old", 5)
    index.remove("old", 9)
    index.add("old", 12)
    index.flush()
    assert [k for k in txn.writes if b"\x00p" in k and txn.writes[k] is not None] == []
    assert session_index.Session.decode("old", txn.get(b"q#0\x00sold") or b"").inline == [12]


def test_an_item_given_its_session_keeps_everything_else() -> None:
    """``Item.with_session`` makes the item field by field (faster than
    ``dataclasses.replace``): a field added to Item must be added there too."""
    item = Item(7, expires=10, due=20, mark=NO_SESSION, error="why")
    given = item.with_session("s-1")
    assert given == dataclasses.replace(item, session="s-1")
    assert [f.name for f in dataclasses.fields(Item)] == [
        "offset", "expires", "due", "mark", "error", "session"]
