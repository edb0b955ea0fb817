"""The in-flight window's state machine, on its own (no Kafka, no Faust)."""

from __future__ import annotations

import itertools

from streams.acceptance import FILTERED, AcceptArgs, Item
from streams.answers import KEEP_MS
from streams.states import MAX_DELIVERY_REASON
from streams.window import MAX_LEFT_OUT_RANGES, InflightWindow
from tests.wire_commands import wire_command
from topics.commands import ClientArgs, Command, ExpireArgs, Policy, grants_from_wire
from topics.runs import as_runs

_ids = itertools.count()
POLICY = Policy(lock_ms=1000, max_delivery=3)


def cmd(op: str, cmd_id: str | None = None, **args: object) -> Command[ClientArgs]:
    return wire_command(op, cmd_id or f"c{next(_ids)}", **args)


def new_window() -> InflightWindow:
    """A window of a queue defined with :data:`POLICY`."""
    win = InflightWindow("q", 0)
    win.apply(cmd("stats", hw=0, version=-1), 0, policy=(0, POLICY))
    return win


def acquire(win: InflightWindow, now: int, n: int = 10, hw: int = 0, sub: str = "active",
            mode: str = "peek_lock", cmd_id: str | None = None) -> list[list]:
    grants = win.apply(cmd("acquire", cmd_id, sub=sub, mode=mode, max=n, hw=hw),
                       now).result["grants"]
    return [g.to_wire() for g in grants_from_wire(grants)]


def settle(win: InflightWindow, now: int, grants: list[list], action: str,
           reason: str | None = None) -> list[str]:
    items = [[g[0], g[1], action, reason, "why", None, None] for g in grants]
    return [r[0] for r in win.apply(cmd("settle", items=items), now).result["results"]]


def test_acquire_grants_fresh_offsets_up_to_reported_log_end() -> None:
    win = new_window()
    grants = acquire(win, 0, n=3, hw=5)
    assert [g[0] for g in grants] == [0, 1, 2]
    assert [g[0] for g in acquire(win, 0, n=10, hw=5)] == [3, 4]
    assert acquire(win, 0, n=10, hw=5) == []


def test_locked_offsets_are_not_granted_twice() -> None:
    win = new_window()
    first = {g[0] for g in acquire(win, 0, hw=4)}
    second = {g[0] for g in acquire(win, 0, hw=8)}
    assert first == {0, 1, 2, 3} and second == {4, 5, 6, 7}


def test_abandon_redelivers_first_with_a_higher_delivery_count() -> None:
    win = new_window()
    grants = acquire(win, 0, n=2, hw=5)
    assert settle(win, 10, grants[:1], "abandon") == ["ok"]
    again = acquire(win, 20, n=2, hw=5)
    assert [(g[0], g[3]) for g in again] == [(0, 2), (2, 1)]


def test_a_group_settles_with_one_token_only_what_its_acquire_still_locks() -> None:
    win = new_window()
    first = acquire(win, 0, n=3, hw=6)
    assert settle(win, 10, first[1:2], "abandon") == ["ok"]
    second = acquire(win, 20, n=3, hw=6)  # offset 1 again, and 3, 4
    assert [g[0] for g in second] == [1, 3, 4]
    group = {"offsets": [0, 1, 2, 3], "token": first[0][1], "action": "complete"}
    results = win.apply(cmd("settle", items=[group]), 30).result["results"]
    # 1 is the second acquire's now, 3 was never the first's
    assert [r[0] for r in results] == ["ok", "lock_lost", "ok", "lock_lost"]
    forged = {"offsets": [4], "token": first[0][1], "action": "complete", "of": 0}
    assert win.apply(cmd("settle", items=[forged]), 30).result["results"] == [["lock_lost", 0]]
    held = {"offsets": [1, 3, 4], "token": second[2][1], "action": "complete", "of": 4}
    assert [r[0] for r in win.apply(cmd("settle", items=[held]), 30).result["results"]] == [
        "ok", "ok", "ok"]


def test_lapsed_lock_counts_a_delivery_and_loses_the_token() -> None:
    win = new_window()
    grants = acquire(win, 0, n=1, hw=1)
    assert settle(win, 1500, grants, "complete") == ["lock_lost"]
    again = acquire(win, 1500, n=1, hw=1)
    assert again[0][0] == 0 and again[0][3] == 2 and again[0][1] != grants[0][1]


def test_max_delivery_count_moves_message_to_dead_letter() -> None:
    win = new_window()
    now = 0
    for _ in range(3):
        grants = acquire(win, now, n=1, hw=1)
        assert settle(win, now, grants, "abandon") == ["ok"]
        now += 1
    assert acquire(win, now, n=1, hw=1) == []
    dead = acquire(win, now, n=5, sub="deadletter")
    assert dead[0][0] == 0 and dead[0][4] == MAX_DELIVERY_REASON and "3 times" in dead[0][5]


def test_dead_letter_sub_queue_never_dead_letters_again() -> None:
    win = new_window()
    settle(win, 0, acquire(win, 0, n=1, hw=1), "dead_letter", reason="r")
    for now in (0, 2000, 4000, 6000, 8000):  # lapse many times: stays in the sub-queue
        dead = acquire(win, now, n=1, sub="deadletter")
        assert len(dead) == 1 and dead[0][4] == "r"
    assert settle(win, 8000, dead, "dead_letter") == ["invalid"]
    assert settle(win, 8000, dead, "complete") == ["ok"]
    assert win.stats()["dead_letter"] == 0


def test_long_dead_letter_texts_stay_out_of_the_chunk_a_settlement_rewrites() -> None:
    win = new_window()
    grants = acquire(win, 0, n=101, hw=101)
    reason, description = "r" * 4096, "d" * 4096
    for g in grants[:100]:  # one by one, as the engine takes them (each fits a record)
        win.apply(cmd("settle", items=[[g[0], g[1], "dead_letter", reason, description,
                                        None, None]]), 1)
    last = grants[100]
    outcome = win.apply(cmd("settle", items=[[last[0], last[1], "complete", None, None, None,
                                              None]]), 2)
    assert outcome.result["results"] == [["ok", 0]]
    # the chunk it rewrites holds 100 dead letters, not their 800 KB of texts
    assert sum(len(k) + len(v or b"") for k, v in outcome.writes.items()) < 20_000
    dead = acquire(win, 3, n=100, sub="deadletter")
    assert len(dead) == 100 and all(g[4] == reason and g[5] == description for g in dead)
    settle(win, 4, dead, "complete")
    assert not [k for k in win.store._keys if k.startswith(win.prefix + b"x")]


def test_a_long_description_without_a_reason_is_kept_apart_and_dropped_with_its_message() -> None:
    win = new_window()
    grant = acquire(win, 0, n=1, hw=1)[0]
    win.apply(cmd("settle", items=[[grant[0], grant[1], "dead_letter", None, "d" * 1000,
                                    None, None]]), 1)
    texts = win.prefix + b"x"
    assert [k for k in win.store._keys if k.startswith(texts)]
    dead = acquire(win, 2, n=1, sub="deadletter")
    assert dead[0][4] is None and dead[0][5] == "d" * 1000
    settle(win, 3, dead, "complete")
    assert not [k for k in win.store._keys if k.startswith(texts)]


def test_defer_parks_message_until_fetched_by_offset() -> None:
    win = new_window()
    grants = acquire(win, 0, n=2, hw=2)
    settle(win, 0, grants[:1], "defer")
    assert [g[0] for g in acquire(win, 0, hw=2)] == []
    fetched = win.apply(cmd("acquire_deferred", offsets=[0, 1]), 0).result["grants"]
    assert [g[0] for g in fetched] == [0] and fetched[0][7] == "deferred"
    assert settle(win, 0, fetched, "complete") == ["ok"]
    assert win.stats()["deferred"] == 0


def test_renew_extends_the_lock() -> None:
    win = new_window()
    grants = acquire(win, 0, n=1, hw=1)
    renew = [[0, grants[0][1], "renew", None, None, None, None]]
    assert win.apply(cmd("settle", items=renew), 900).result["results"] == [["ok", 1900]]
    assert settle(win, 1500, grants, "complete") == ["ok"]


def test_settlement_events_carry_lock_time_deliveries_and_enqueue_time() -> None:
    """What the Spark monitor aggregates: a renewal keeps the original lock time."""
    win = new_window()
    first = acquire(win, 100, n=2, hw=3)
    settle(win, 200, first[1:], "abandon")
    again = acquire(win, 300, n=2)
    assert [g[0] for g in again] == [1, 2]
    renew = [[1, again[0][1], "renew", None, None, None, None]]
    win.apply(cmd("settle", items=renew), 900)
    items = [[0, first[0][1], "complete", None, None, None, 50],
             [1, again[0][1], "complete", None, None, None, 60],
             [2, again[1][1], "dead_letter", "bad", "why", None, 70]]
    events = {e.type: e for e in win.apply(cmd("settle", items=items), 1000).events}
    assert events["completed"].offsets == [0, 1]
    assert events["completed"].extra["held"] == [900, 700]
    assert events["completed"].extra["deliveries"] == [1, 2]
    assert events["completed"].extra["enqueued"] == [50, 60]
    assert events["dead_lettered"].extra["held"] == [700]
    assert events["dead_lettered"].extra["reason"] == "bad"


def test_repeated_command_id_returns_the_first_answer() -> None:
    win = new_window()
    first = acquire(win, 0, n=2, hw=4, cmd_id="same")
    again = acquire(win, 10, n=2, hw=4, cmd_id="same")
    assert again == first
    items = [[g[0], g[1], "complete", None, None, None, None] for g in first]
    settle_cmd = cmd("settle", "settle-1", items=items)
    assert win.apply(settle_cmd, 20).result == win.apply(settle_cmd, 30).result
    assert win.stats()["active"] == 2


def test_receive_and_delete_settles_on_handout() -> None:
    win = new_window()
    grants = acquire(win, 0, n=3, hw=3, mode="receive_and_delete")
    assert [g[0] for g in grants] == [0, 1, 2] and all(g[1] is None for g in grants)
    assert acquire(win, 5000, hw=3) == [] and win.start == 3


def test_window_header_round_trips_with_wake_time_in_front() -> None:
    win = new_window()
    grants = acquire(win, 100, n=2, hw=5)
    raw = win.to_bytes()
    assert InflightWindow.wake_of(raw) == 1100
    copy = InflightWindow.load(raw, "q", 0, win.store)
    assert copy.stats() == win.stats() == {**copy.stats(), "locked": 2, "active": 5}
    assert settle(copy, 200, grants, "complete") == ["ok", "ok"]


def test_expire_without_policy_keeps_the_queue_policy() -> None:
    win = new_window()
    acquire(win, 0, n=1, hw=1)
    win.apply(Command("e1", "q", 0, ExpireArgs()), 5000)
    assert win.max_delivery == 3 and win.stats()["active"] == 1


def test_scheduled_offsets_stay_hidden_until_due_then_are_granted() -> None:
    win = new_window()
    result = win.apply(cmd("announce", items=[[1, 5000, 0], [2, 9000, 0]]), 0).result
    assert result["results"] == [["ok", 5000], ["ok", 9000]]
    assert [g[0] for g in acquire(win, 0, hw=4)] == [0, 3]
    assert win.stats()["scheduled"] == 2 and win.stats()["active"] == 2
    assert win.wake_at() == 1000  # the locks lapse first
    assert [g[0] for g in acquire(win, 5000, n=1, hw=4)] == [0]  # redelivery first
    assert [g[0] for g in acquire(win, 5000, hw=4)] == [1, 3]
    assert win.stats()["scheduled"] == 1


def test_cancelled_scheduled_offsets_are_never_granted() -> None:
    win = new_window()
    win.apply(cmd("announce", items=[[0, 5000, 0], [1, 5000, 0]]), 0)
    assert win.apply(cmd("cancel", offsets=[0, 7]), 0).result["results"] == [
        ["ok", 0], ["invalid", 0]]
    granted = [g[0] for g in acquire(win, 6000, hw=3)]
    assert granted == [1, 2] and win.stats()["scheduled"] == 0 and win.stats()["active"] == 2


def test_receiver_parks_a_message_it_met_before_due() -> None:
    win = new_window()
    grants = acquire(win, 0, n=1, hw=1)
    items = [[0, grants[0][1], "schedule", None, None, 4000, None]]
    assert win.apply(cmd("settle", items=items), 10).result["results"] == [["ok", 0]]
    assert acquire(win, 100, hw=1) == [] and win.stats()["scheduled"] == 1
    [again] = acquire(win, 4000, hw=1)
    assert again[0] == 0 and again[3] == 1  # the early look did not count as a delivery


def test_expired_message_is_dropped_or_dead_lettered_by_policy() -> None:
    win = new_window()
    grants = acquire(win, 0, n=2, hw=2)
    assert settle(win, 0, grants[:1], "expire") == ["ok"]
    assert win.totals["expired"] == 1 and win.stats()["active"] == 1
    items = [[grants[1][0], grants[1][1], "expire", None, None, None, None]]
    dlq_on_expiry = (1, Policy(1000, 3, True))  # the queue was updated meanwhile
    assert win.apply(cmd("settle", items=items), 0, dlq_on_expiry).result["results"] == [
        ["ok", 0]]
    dead = acquire(win, 0, sub="deadletter")
    assert dead[0][0] == 1 and dead[0][4] == "TTLExpiredException"


def test_announced_expiry_is_applied_by_the_timer_without_a_receiver() -> None:
    win = new_window()
    win.apply(cmd("announce", items=[[0, 0, 3000], [1, 0, 0]]), 0)
    win.see_log_end(2, [])
    assert win.wake_at() == 3000
    win.apply(Command("tick", "q", 0, ExpireArgs()), 3000)  # what the lock timer sends
    assert win.totals.get("expired") == 1 and win.stats()["active"] == 1
    assert [g[0] for g in acquire(win, 3000, hw=2)] == [1]


def test_a_policy_is_adopted_only_if_newer_than_the_one_the_window_has() -> None:
    win = new_window()
    newer = Policy(lock_ms=5000, max_delivery=7)
    win.apply(cmd("stats", hw=0), 0, policy=(3, newer))
    assert (win.lock_ms, win.max_delivery, win.policy_version) == (5000, 7, 3)
    win.apply(cmd("stats", hw=0), 0, policy=(1, POLICY))  # an older definition
    assert (win.lock_ms, win.policy_version) == (5000, 3)
    assert acquire(win, 100, n=1, hw=1)[0][2] == 5100


def test_settled_locks_leave_the_timer_nothing_to_do() -> None:
    win = new_window()
    grants = acquire(win, 0, n=4, hw=4)
    assert win.wake_at() == 1000
    settle(win, 10, grants[:2], "complete")
    assert win.wake_at() == 1000  # two locks still run
    settle(win, 20, grants[2:3], "renew")
    settle(win, 30, grants[3:], "abandon")
    assert win.wake_at() == 1020  # only the renewed lock
    settle(win, 40, grants[2:3], "complete")
    assert win.wake_at() is None


def scanned_window() -> InflightWindow:
    """A window the log scanner accepts offsets for (duplicate detection on)."""
    win = InflightWindow("q", 0)
    win.apply(cmd("stats", hw=0, version=-1), 0,
              policy=(0, Policy(lock_ms=1000, max_delivery=3, duplicate_window_ms=60_000)))
    return win


def accept_all(win: InflightWindow, end: int, plain: set[int], per_command: int = 5000,
               start: int = 0) -> None:
    """Accept ``[start, end)``: the offsets of ``plain`` are messages, the rest
    left out by the subscription's rules (in commands as the scanner sends them)."""
    for first in range(start, end, per_command):
        stop = min(first + per_command, end)
        left_out = as_runs([o for o in range(first, stop) if o not in plain])
        assert win.apply(Command(f"a{first}", "q", 0, AcceptArgs(first, stop, (), tuple(left_out))),
                         0).result["accepted"]


def test_a_million_offsets_left_out_by_the_rules_keep_no_key_each() -> None:
    win = scanned_window()
    plain = set(range(50_000, 1_000_000, 100_000))  # ten messages among a million left out
    accept_all(win, 1_000_010, plain)
    assert len(list(win.store.range(b"", b"\xff"))) <= 100  # not one per offset left out
    assert win.stats()["active"] == len(plain)
    assert [m[0] for m in win.apply(cmd("peek", sub="active", max=20, hw=0, **{"from": 0}),
                                    0).result["messages"]] == sorted(plain)
    assert [g[0] for g in acquire(win, 0, n=20)] == sorted(plain)
    assert win.stats()["active"] == len(plain) and win.left_out == []


def test_the_filtered_event_names_what_the_rules_left_out_as_runs() -> None:
    win = scanned_window()
    # 2 selected; 5 failed the filter and is not dead-lettered: left out too
    outcome = win.apply(Command("a0", "q", 0, AcceptArgs(
        0, 10, (Item(5, mark=FILTERED, error="no"),), (0, 2, 3, 5, 6, 10))), 0)
    filtered = [(e.offsets, e.extra["ranges"], e.count) for e in outcome.events
                if e.type == "filtered"]
    assert filtered == [([], [0, 2, 3, 10], 9)]
    assert [g[0] for g in acquire(win, 0, n=10)] == [2]


def test_offsets_left_out_one_by_one_past_the_ranges_kept_are_never_handed_out() -> None:
    win = scanned_window()
    plain = set(range(0, 1000, 2))  # every other message left out: 500 ranges of one
    accept_all(win, 1000, plain, per_command=100)
    assert len(win.left_out) <= MAX_LEFT_OUT_RANGES
    assert win.stats()["active"] == len(plain)
    got = [g[0] for g in acquire(win, 0, n=300)] + [g[0] for g in acquire(win, 0, n=300)]
    assert got == sorted(plain)
    assert win.stats()["active"] == len(plain)
    assert win.spilled == 0 and not list(win.store.range(win.prefix + b"l", win.prefix + b"m"))


def test_a_million_offsets_left_out_in_ten_thousand_runs_keep_few_keys_and_go_in_order() -> None:
    win = scanned_window()
    plain = set(range(50, 1_000_000, 100))  # rules that select one message in a hundred
    accept_all(win, 1_000_000, plain, per_command=10_000)
    assert len(list(win.store.range(b"", b"\xff"))) <= 100
    assert win.stats()["active"] == len(plain)
    peeked = win.apply(cmd("peek", sub="active", max=5, hw=0, **{"from": 120}), 0).result
    assert [m[0] for m in peeked["messages"]] == [150, 250, 350, 450, 550]
    got: list[int] = []
    while len(got) < len(plain):  # a receiver taking 777 at a time, settling each batch
        grants = acquire(win, 0, n=777)
        assert grants, "every selected message is handed out"
        got += [g[0] for g in grants]
        settle(win, 0, grants, "complete")
        assert win.stats()["active"] == len(plain) - len(got)
    assert got == sorted(plain)
    assert acquire(win, 0, n=10) == []
    assert win.spilled == 0 and not list(win.store.range(win.prefix + b"l", win.prefix + b"m"))


def test_a_subscription_selecting_one_message_in_ten_keeps_its_entries_in_wider_chunks(
) -> None:
    """Its entries lie ten offsets apart: chunks of 128 offsets each held 13,
    and an acquire and a settlement of 1,000 each wrote 78 of them. Chunks
    spread while the window holds no entry (none is stored under either
    span), as the scanner found the log; messages go in order across it."""
    win = scanned_window()
    accept_all(win, 10_000, set(range(5, 10_000, 10)), per_command=2000)
    assert win.chunk_span == 1024
    outcome = win.apply(cmd("acquire", sub="active", mode="peek_lock", max=1000, hw=0), 0)
    grants = [g.to_wire() for g in grants_from_wire(outcome.result["grants"])]
    assert len(grants) == 1000
    assert sum(k.startswith(win.prefix + b"c") for k in outcome.writes) <= 10
    accept_all(win, 12_000, set(range(10_000, 12_000)), start=10_000)  # dense; entries held
    assert win.chunk_span == 1024
    grants += acquire(win, 0, n=1500) + acquire(win, 0, n=1500)
    assert [g[0] for g in grants] == [*range(5, 10_000, 10), *range(10_000, 12_000)]
    for first in range(0, len(grants), 500):
        assert set(settle(win, 0, grants[first:first + 500], "complete")) == {"ok"}
    assert not win.counts  # nothing held: the next accept decides again
    accept_all(win, 14_000, set(range(12_000, 14_000)), start=12_000)
    assert win.chunk_span == 128
    assert [g[0] for g in acquire(win, 0, n=5)] == list(range(12_000, 12_005))
    half = scanned_window()  # rules selecting half: queue-sized chunks
    accept_all(half, 2000, set(range(0, 2000, 2)), per_command=1000)
    assert half.chunk_span == 128


def test_answers_are_forgotten_a_few_per_command_once_kept_long_enough() -> None:
    win = new_window()
    grants = acquire(win, 0, n=40, hw=40)  # its answer is remembered, from time 0
    for g in grants[:20]:  # and twenty more
        settle(win, 0, [g], "complete")
    last = [[grants[39][0], grants[39][1], "complete", None, None, None, None]]
    first = win.apply(cmd("settle", "at-one", items=last), 1).result  # one at 1 ms
    keys_then = len(list(win.store.range(b"", b"\xff")))
    later = KEEP_MS + 1  # those of time 0 may now go, 16 per command at most
    settle(win, later, [grants[20]], "complete")
    assert win.answers_due == KEEP_MS  # five of time 0 are left
    settle(win, later, [grants[21]], "complete")
    assert win.answers_due == KEEP_MS + 1  # the one given at 1 ms is the oldest left
    assert len(list(win.store.range(b"", b"\xff"))) < keys_then
    again = win.apply(cmd("settle", "at-one", items=last), later)
    assert not again.changed and again.result == first  # still remembered
    win.apply(cmd("stats", hw=40), KEEP_MS + 2)
    assert win.answers.get("at-one") is None and win.answers_due == later + KEEP_MS


def test_the_log_is_retained_from_the_oldest_message_still_held() -> None:
    win = new_window()
    grants = acquire(win, 0, n=300, hw=300)
    settle(win, 0, grants[:5], "complete")
    settle(win, 0, [grants[5]], "defer")  # parked at offset 5
    settle(win, 0, grants[6:290], "complete")
    assert (win.start, win.retained) == (290, 5)
    got = win.apply(cmd("acquire_deferred", offsets=[5]), 0).result["grants"]
    settle(win, 0, got, "complete")
    assert win.retained == 290
    settle(win, 0, grants[290:], "complete")
    assert win.retained == win.start == 300


def _twins() -> tuple[InflightWindow, InflightWindow, list[list], list]:
    """Two windows alike, with the same 8 offsets locked in each (the same
    lock tokens), the grants, and the 4th grant with a wrong token."""
    alone, together = new_window(), new_window()
    together.secret = alone.secret
    grants = acquire(alone, 0, n=8, hw=8, cmd_id="a1")
    assert acquire(together, 0, n=8, hw=8, cmd_id="a1") == grants
    return alone, together, grants, [grants[3][0], "not-the-token", *grants[3][2:]]


def test_settlements_applied_together_answer_and_store_as_one_by_one() -> None:
    """The engine applies consecutive settle commands of a window in one
    transaction: each is judged at its own time, a repeated id gets its first
    answer, and what is stored is what applying them one by one stores."""
    alone, together, grants, bad = _twins()

    def item(grant: list, action: str) -> list:
        return [grant[0], grant[1], action, None, None, None, None]

    batch = [(cmd("settle", "s1", items=[item(grants[0], "complete")]), 10),
             (cmd("settle", "s2", items=[item(grants[1], "abandon"),
                                          item(grants[2], "renew")]), 20),
             (cmd("settle", "s1", items=[item(grants[0], "complete")]), 30),  # repeated id
             (cmd("settle", "s3", items=[item(bad, "complete")]), 40),
             (cmd("settle", "s4", items=[item(grants[5], "defer")]), 50),
             # after the batch's lock ended (lock_ms 1000): lapsed, lost
             (cmd("settle", "s5", items=[item(grants[6], "complete")]), 1500)]
    one_by_one = [alone.apply(c, now) for c, now in batch]
    done = together.apply_settlements(batch)
    assert [each[0] for each in done.each] == [o.result for o in one_by_one]  # type: ignore[index]
    assert [r[0] for o in one_by_one for r in o.result["results"]] == [
        "ok", "ok", "ok", "ok", "lock_lost", "ok", "lock_lost"]
    assert done.changed
    assert together.header() == alone.header()
    assert together.stats() == alone.stats()
    assert isinstance(together.store, type(alone.store))
    index = together.prefix + b"e"  # the answers by time: one key per transaction
    assert _keys(together, b"", index) == _keys(alone, b"", index)
    assert _keys(together, index + b"~", b"\xff") == _keys(alone, index + b"~", b"\xff")
    assert [k for k, _ in _keys(together, index, index + b"~")] == [
        index + b"0000000000000a1", index + f"{1500:013x}s1".encode()]
    again = [g[0] for g in acquire(together, 1600, hw=8, cmd_id="a2")]
    assert again == [g[0] for g in acquire(alone, 1600, hw=8, cmd_id="a2")]
    assert 0 not in again and 5 not in again  # completed, deferred
    # the answers are forgotten with their keys (the group's: one), once kept long enough
    together.apply(cmd("stats", hw=8), 1601 + KEEP_MS)
    ids = ("a1", "s1", "s2", "s3", "s4", "s5", "a2")
    assert [together.answers.get(i) for i in ids] == [None] * len(ids)
    assert _keys(together, index, index + b"~") == []


def test_quiet_settlements_in_one_pass_answer_store_and_announce_as_one_by_one() -> None:
    """Settlements final at their append that meet no timer are settled in
    one pass over their items (the one-message-at-a-time path): each is
    answered, stored and announced as when applied one by one, each item at
    its own command's time; one waited for, or one whose lock lapsed by its
    time, ends the pass and runs alone."""
    alone, together, grants, bad = _twins()

    def item(grant: list, action: str) -> list:
        return [grant[0], grant[1], action, None, None, None, 5]

    def quiet(cmd_id: str, *items: list) -> Command[ClientArgs]:
        return cmd("settle", cmd_id, items=list(items), quiet=True, until=1000)

    batch = [(quiet("q1", item(grants[0], "complete")), 10),
             (quiet("q2", item(grants[1], "complete"), item(bad, "complete")), 20),
             (quiet("q3", item(grants[2], "abandon")), 30),
             (cmd("settle", "s1", items=[item(grants[4], "complete")]), 40),  # waited for
             (quiet("q4", item(grants[5], "defer")), 50),
             (quiet("q5", item(grants[0], "complete")), 60),  # settled before: lost
             (quiet("q6", item(grants[6], "complete")), 1500)]  # the lock lapsed at 1000
    one_by_one = [alone.apply(c, now) for c, now in batch]
    done = together.apply_settlements(batch)
    assert [each[0] for each in done.each] == [o.result for o in one_by_one]  # type: ignore[index]
    assert [[r[0] for r in o.result["results"]] for o in one_by_one] == [
        ["ok"], ["ok", "lock_lost"], ["ok"], ["ok"], ["ok"], ["lock_lost"], ["lock_lost"]]
    # one pass for q1-q3 and one for q4-q5: their events ride on the first of each
    assert [bool(each[1]) for each in done.each] == [  # type: ignore[index]
        True, False, False, True, True, False, True]

    def announced(events: list) -> dict[str, list]:
        """Each kind's offsets with their details, in order: what the
        engine's merged event records carry."""
        out: dict[str, list] = {}
        for ev in events:
            details = zip(*(ev.extra.get(k, [None] * len(ev.offsets))
                            for k in ("held", "deliveries", "enqueued")), strict=True)
            out.setdefault(ev.type, []).extend(zip(ev.offsets, details, strict=True))
        return out

    assert announced([ev for each in done.each for ev in each[1]]) == announced(  # type: ignore[index]
        [ev for o in one_by_one for ev in o.events])
    assert announced([ev for o in one_by_one for ev in o.events])["completed"] == [
        (grants[0][0], (10, 1, 5)), (grants[1][0], (20, 1, 5)), (grants[4][0], (40, 1, 5))]
    assert together.header() == alone.header()
    assert together.stats() == alone.stats()
    index = together.prefix + b"e"  # the answers by time: one key per transaction
    assert _keys(together, b"", index) == _keys(alone, b"", index)
    assert _keys(together, index + b"~", b"\xff") == _keys(alone, index + b"~", b"\xff")
    # kept: the answers of the one waited for and of those with an item refused
    assert [i for i in ("q1", "q2", "q3", "s1", "q4", "q5", "q6")
            if together.answers.get(i) is not None] == ["q2", "s1", "q5", "q6"]


def _keys(win: InflightWindow, start: bytes, stop: bytes) -> list[tuple[bytes, bytes]]:
    return list(win.store.range(start, stop))


def test_a_quiet_settlement_whose_every_item_applied_keeps_no_answer() -> None:
    """Final at its append, its client never asks for its answer again: only
    a settlement somebody may ask about again (waited for, or with an item
    refused) keeps its answer, under its id."""
    win = new_window()
    grants = acquire(win, 0, n=4, hw=4)

    def items(*picked: list) -> list[list]:
        return [[g[0], g[1], "complete", None, None, None, None] for g in picked]

    answers = win.prefix + b"a"
    quiet = win.apply(cmd("settle", "quiet-ok", items=items(*grants[:2]), quiet=True,
                          until=1000), 10)
    assert [r[0] for r in quiet.result["results"]] == ["ok", "ok"]
    assert win.answers.get("quiet-ok") is None
    assert not [k for k in quiet.writes if k.startswith(answers)]
    # read again (the engine restarted before committing its offset): its
    # locks are gone, it changes nothing
    again = win.apply(cmd("settle", "quiet-ok", items=items(*grants[:2]), quiet=True,
                          until=1000), 10)
    assert [r[0] for r in again.result["results"]] == ["lock_lost", "lock_lost"]
    assert win.stats()["active"] == 2
    refused = win.apply(cmd("settle", "quiet-refused", items=items(grants[0], grants[2]),
                            quiet=True, until=1000), 20)
    assert win.answers.get("quiet-refused") is not None
    waited = win.apply(cmd("settle", "waited", items=items(grants[3])), 30)
    assert [r[0] for r in refused.result["results"]] == ["lock_lost", "ok"]
    assert win.answers.get("waited") is not None and waited.result["results"] == [["ok", 0]]
