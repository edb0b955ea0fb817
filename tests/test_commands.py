"""The command format rejects malformed records with a reason."""

from __future__ import annotations

import json
import random
import typing
import uuid
from typing import Any

import pytest

from settlement._engine_link import check_reply
from settlement.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusError,
    SessionLockLostError,
    for_code,
)
from streams.window import HANDLERS
from topics.commands import (
    CLOCK_STEP_BOUND_MS,
    OP_INFO,
    OPERATIONS,
    TICK_KEY,
    WAKE_BYTES,
    AcquireArgs,
    AcquireDeferredArgs,
    Action,
    AnnounceArgs,
    CancelArgs,
    ClientArgs,
    Command,
    CommandError,
    Grant,
    GrantGroup,
    ListSessionsArgs,
    LockSessionArgs,
    Op,
    PeekArgs,
    ReleaseSessionArgs,
    RenewSessionArgs,
    Reply,
    ReplyAddress,
    Sender,
    SessionStateArgs,
    SetSessionStateArgs,
    SettleArgs,
    SettleItem,
    StatsArgs,
    acquire_result,
    answered_by_no_one,
    decode_command,
    encode_command,
    final_at_append,
    granted,
    grants_from_wire,
    lock_token,
    wake_headers,
)
from topics.errors import ErrorCode
from topics.events import event_record, merge_event, own_event

EVERY_CLIENT_ARGS: list[ClientArgs] = [
    AcquireArgs("active", "peek_lock", 10, 7),
    AcquireArgs("active", "receive_and_delete", 1, 0, "s1", "token"),
    AcquireDeferredArgs((3, 5)),
    SettleArgs((SettleItem(4, "t", Action.COMPLETE, enqueued_ms=12),
                SettleItem(5, "t", Action.SCHEDULE, at_ms=99),
                SettleItem(6, "t", Action.DEAD_LETTER, "why", "because", None, 13))),
    SettleArgs((SettleItem(4, "t", Action.COMPLETE),), quiet=True),
    StatsArgs(0),
    StatsArgs(4, version=17),
    PeekArgs("deadletter", 3, 20, 9),
    PeekArgs("active", 0, 20, 9, session="s1"),
    AnnounceArgs(((1, 1000, 0), (2, 0, 5000))),
    CancelArgs((1, 2)),
    LockSessionArgs(None),
    LockSessionArgs("s1"),
    RenewSessionArgs("s1", "token"),
    ReleaseSessionArgs("s1", "token"),
    SessionStateArgs("s1", "token"),
    SetSessionStateArgs("s1", "token", "c3RhdGU="),
    ListSessionsArgs(None, 100, None),
    ListSessionsArgs("s1", 100, 1234),
]


@pytest.mark.parametrize("args", EVERY_CLIENT_ARGS, ids=lambda a: str(a.OP))
def test_command_round_trip(args: ClientArgs) -> None:
    cmd = Command("id1", "orders", 2, args, ReplyAddress(3, "client"))
    assert decode_command(encode_command(cmd)) == cmd


def test_every_client_operation_has_its_arguments_record() -> None:
    assert {cls.OP for cls in typing.get_args(ClientArgs)} == OPERATIONS
    assert {a.OP for a in EVERY_CLIENT_ARGS} == OPERATIONS


def test_the_wire_keeps_the_documented_fields() -> None:
    cmd = Command("id1", "orders", 0, PeekArgs("active", 3, 20, 9))
    body = json.loads(encode_command(cmd))
    assert body == {"v": 1, "id": "id1", "op": "peek", "entity": "orders", "partition": 0,
                    "reply": None, "sub": "active", "from": 3, "max": 20, "hw": 9}


def test_a_settlement_is_quiet_only_when_it_says_so() -> None:
    items = (SettleItem(4, "t", Action.COMPLETE),)
    loud = json.loads(encode_command(Command("id1", "orders", 0, SettleArgs(items))))
    assert "quiet" not in loud  # the wire of every settlement before it stays the same
    quiet = encode_command(Command("id1", "orders", 0, SettleArgs(items, quiet=True)))
    decoded = decode_command(quiet).args
    assert isinstance(decoded, SettleArgs) and decoded.quiet
    with pytest.raises(CommandError, match="'quiet' must be true or false"):
        decode_command(json.dumps({**json.loads(quiet), "quiet": "yes"}).encode())


def test_a_quiet_settlement_carries_the_lock_end_its_client_judges_its_append_by() -> None:
    items = (SettleItem(4, "t", Action.COMPLETE),)
    quiet = encode_command(Command("id1", "orders", 0, SettleArgs(items, quiet=True,
                                                                  until=10_000)))
    assert answered_by_no_one(b"orders#0", quiet)  # the flag stays last
    decoded = decode_command(quiet).args
    assert isinstance(decoded, SettleArgs) and (decoded.quiet, decoded.until) == (True, 10_000)
    for bad in ("soon", -1, True):
        with pytest.raises(CommandError, match="'until' must be a time in ms"):
            decode_command(json.dumps({**json.loads(quiet), "until": bad}).encode())


def test_a_settlement_is_final_at_its_append_only_well_before_its_lock_ends() -> None:
    """The one rule the client (returning without an answer) and the engine
    (keeping no answer) both judge an append by."""
    until = 10_000
    assert final_at_append(until - CLOCK_STEP_BOUND_MS - 1, until)
    assert not final_at_append(until - CLOCK_STEP_BOUND_MS, until)
    assert not final_at_append(until + 5, until)
    assert not final_at_append(None, until)  # the broker did not stamp it
    assert not final_at_append(1_000, None)  # sent without its lock's end


def test_only_ticks_and_quiet_settlements_are_read_as_answered_by_no_one() -> None:
    """The engine's intake tells them from the bytes alone (a hint: it lets
    them wait for company); every other command is someone's call."""
    items = (SettleItem(4, "t", Action.COMPLETE), SettleItem(5, "t", Action.ABANDON))
    quiet = encode_command(Command("id1", "orders", 0, SettleArgs(items, quiet=True)))
    assert answered_by_no_one(b"orders#0", quiet)
    assert answered_by_no_one(TICK_KEY, b"")
    for args in (SettleArgs(items), AcquireArgs("active", "peek_lock", 10, 0),
                 PeekArgs("active", 0, 10, 0)):
        raw = encode_command(Command("id1", "orders", 0, args, ReplyAddress(0, "c")))
        assert not answered_by_no_one(b"orders#0", raw), args
    assert not answered_by_no_one(b"orders#0", None)


def test_every_command_somebody_waits_for_carries_the_bytes_that_wake_the_engines_fetch(
        ) -> None:
    """The engine's fetches wait for WAKE_BYTES (Apache Kafka): a command
    waited for carries them, so it is read at once; a quiet settlement
    carries nothing, and waits for company."""
    for args in EVERY_CLIENT_ARGS:
        raw = encode_command(Command("id1", "orders", 0, args, ReplyAddress(0, "c")))
        headers = wake_headers(raw)
        if isinstance(args, SettleArgs) and args.quiet:
            assert headers is None
            continue
        assert headers is not None, args
        assert sum(len(name) + len(value or b"") for name, value in headers) >= WAKE_BYTES


def test_op_metadata_is_declared_for_every_op() -> None:
    assert set(OP_INFO) == set(Op)
    remembered = {op for op, info in OP_INFO.items() if info.remembered}
    assert remembered == {"acquire", "acquire_deferred", "settle", "announce", "cancel",
                          "lock_session", "renew_session", "release_session",
                          "set_session_state"}
    holder = {op for op, info in OP_INFO.items() if info.holder}
    assert holder == {"renew_session", "release_session", "session_state",
                      "set_session_state"}


def test_the_window_has_a_handler_for_every_op_it_accepts() -> None:
    accepted = {op for op, info in OP_INFO.items() if info.sender is not Sender.ADMINISTRATIVE}
    assert set(HANDLERS) == accepted


@pytest.mark.parametrize("op", sorted(HANDLERS))
def test_each_handler_takes_the_arguments_of_its_op(op: Op) -> None:
    hints = typing.get_type_hints(HANDLERS[op])
    [args] = typing.get_args(hints["cmd"])
    assert args.OP is op


GRANTS: list[list[Any]] = [
    [4, "0b5e6c1e-1111-4a4a-8b8b-000000000000", 61000, 1, None, None, None, "active"],
    [5, None, 0, 2, None, None, None, "active"],
    [6, "t", 5, 3, "MaxDeliveryCountExceeded", "delivered 3 times", "orders", "deadletter"],
]


@pytest.mark.parametrize("wire", GRANTS)
def test_a_grant_round_trips_through_its_list_form(wire: list[Any]) -> None:
    grant = Grant.from_wire(wire)
    assert grant.to_wire() == wire
    assert (grant.offset, grant.lock_token, grant.deliveries, grant.state) == (
        wire[0], wire[1], wire[3], wire[7])


def test_a_reply_reads_its_grants_by_name() -> None:
    reply = Reply("id", "client", True, {"grants": GRANTS, "next": 7})
    assert [g.offset for g in reply.grants] == [4, 5, 6]
    assert reply.grants[2].reason == "MaxDeliveryCountExceeded"


def test_a_group_of_grants_gives_each_offset_the_token_the_engine_derives_for_it() -> None:
    secret, batch = "cd" * 16, 41
    offsets = [5, 6, 9, (1 << 62) + 3]
    group = GrantGroup(offsets, lock_token(secret, batch, 5), 900, [1, 1, 2, 1])
    dead = Grant(11, lock_token(secret, batch, 11), 900, 3, "bad", "why", "q", "deadletter")
    wire = acquire_result([group, dead, GrantGroup([12], lock_token(secret, batch, 12), 900,
                                                    [1])], 13)["grants"]
    assert wire[2] == {"offsets": [12], "token": lock_token(secret, batch, 12), "until": 900,
                       "deliveries": 1}
    assert granted(wire) == 6
    grants = grants_from_wire(wire)
    assert [(g.offset, g.lock_token, g.deliveries) for g in grants] == [
        (o, lock_token(secret, batch, o), d) for o, d in zip([*offsets, 11, 12],
                                                             [1, 1, 2, 1, 3, 1], strict=True)]
    assert grants[4] == dead and grants[5].state == "active"


SETTLE_ITEMS: list[list[Any]] = [
    [0, "t", "complete", None, None],
    [1, "t", "schedule", None, None, 4000],
    [2, "t", "dead_letter", "bad", "why", None, 70],
    [3, "t", "complete", None, None, None, 60],
]


@pytest.mark.parametrize("wire", SETTLE_ITEMS)
def test_a_settle_item_round_trips_through_its_list_form(wire: list[Any]) -> None:
    item = SettleItem.from_wire(wire)
    assert item.to_wire() == wire
    assert (item.offset, item.lock_token, item.action) == (wire[0], wire[1], Action(wire[2]))


def test_settlements_of_one_acquire_travel_as_one_group_and_come_back_as_its_items() -> None:
    secret = "ab" * 16
    mine = [SettleItem(o, lock_token(secret, 7, o), Action.COMPLETE, enqueued_ms=100 + o)
            for o in (3, 4, 9)]
    other = SettleItem(10, lock_token(secret, 8, 10), Action.COMPLETE)
    dead = SettleItem(11, lock_token(secret, 8, 11), Action.DEAD_LETTER, "bad", "why")
    wire = SettleArgs((*mine, other, dead)).to_wire()["items"]
    assert wire == [{"offsets": [3, 4, 9], "token": mine[0].lock_token, "action": "complete",
                     "enqueued": [103, 104, 109]},
                    other.to_wire(), dead.to_wire()]
    items = SettleArgs.from_wire({"items": wire}).items
    assert [(i.offset, i.lock_token, i.token_offset, i.enqueued_ms) for i in items[:3]] == [
        (3, mine[0].lock_token, 3, 103), (4, mine[0].lock_token, 3, 104),
        (9, mine[0].lock_token, 3, 109)]
    assert items[3:] == (other, dead)
    # a token changed by the application to one too short goes alone, never
    # heading a group that would lose the others' locks with it
    bad = [SettleItem(3, "", Action.COMPLETE), *mine[1:]]
    assert [w if isinstance(w, list) else w["offsets"]
            for w in SettleArgs(tuple(bad)).to_wire()["items"]] == [
        [3, "", "complete", None, None], [4, 9]]
    # the engine's items travel again as they came, the token's offset with them
    assert SettleArgs(items[1:3]).to_wire()["items"] == [
        {"offsets": [4, 9], "token": mine[0].lock_token, "action": "complete",
         "enqueued": [104, 109], "of": 3}]


@pytest.mark.parametrize("group, fragment", [
    ({"offsets": [], "token": "t", "action": "complete"}, "'offsets'"),
    ({"offsets": [1, -2], "token": "t", "action": "complete"}, "'offsets'"),
    ({"offsets": [1], "token": None, "action": "complete"}, "'token'"),
    ({"offsets": [1], "token": "t", "action": "dead_letter"}, "action must be one of"),
    ({"offsets": [1, 2], "token": "t", "action": "complete", "enqueued": [1]}, "'enqueued'"),
    ({"offsets": [1], "token": "t", "action": "complete", "of": "x"}, "'of'"),
    ({"offsets": list(range(5001)), "token": "t", "action": "complete"}, "at most 5000"),
])
def test_a_malformed_settlement_group_is_refused_with_its_reason(
        group: dict[str, Any], fragment: str) -> None:
    with pytest.raises(CommandError, match=fragment):
        SettleArgs.from_wire({"items": [group]})


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_code_raises_its_own_exception(code: ErrorCode) -> None:
    error = for_code(code)
    assert issubclass(error, ServiceBusError)
    with pytest.raises(error, match="orders") as raised:
        check_reply(Reply("id", "client", False, error_code=code, error_message="no"), "orders")
    assert raised.value.error_code == code


def test_the_engine_error_codes_map_to_the_sdk_exceptions() -> None:
    assert for_code("MessagingEntityNotFound") is MessagingEntityNotFoundError
    assert for_code("SessionLockLost") is SessionLockLostError
    assert for_code("SomethingNew") is ServiceBusError


@pytest.mark.parametrize("raw, fragment", [
    (b"\x00\xff garbage", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"v": 9, "id": "x", "op": "acquire"}).encode(), "version"),
    (json.dumps({"v": 1, "id": "x", "op": "explode", "entity": "q", "partition": 0}).encode(),
     "unknown operation"),
    (json.dumps({"v": 1, "id": "x", "op": {"a": 1}, "entity": "q", "partition": 0}).encode(),
     "unknown operation"),
    (json.dumps({"v": 1, "id": "x", "op": ["acquire"], "entity": "q", "partition": 0}).encode(),
     "unknown operation"),
    (json.dumps({"v": 1, "id": "x", "op": "acquire", "entity": "q", "partition": -1}).encode(),
     "partition"),
    (json.dumps({"v": 1, "id": "x", "op": "settle", "entity": "q", "partition": 0,
                 "items": [[0, "t", "vanish", None, None]]}).encode(), "action"),
])
def test_malformed_commands_are_rejected_with_a_reason(raw: bytes, fragment: str) -> None:
    with pytest.raises(CommandError, match=fragment):
        decode_command(raw)


def test_rejection_keeps_the_reply_address_when_readable() -> None:
    raw = json.dumps({"v": 1, "id": "abc", "op": "nope", "reply": {"partition": 1,
                                                                 "client": "me"}}).encode()
    with pytest.raises(CommandError) as info:
        decode_command(raw)
    assert info.value.command_id == "abc" and info.value.reply == ReplyAddress(1, "me")


def test_lock_tokens_are_keyed_uuid4s() -> None:
    secret, other = "6b" * 16, "6f" * 16
    token = lock_token(secret, 12345, 678)
    assert uuid.UUID(token).version == 4 and lock_token(secret, 12345, 678) == token
    assert len({token, lock_token(other, 12345, 678), lock_token(secret, 12346, 678),
                lock_token(secret, 12345, 679)}) == 4
    # the largest offsets (a session's lock takes the slot 2**63 - 1) keep
    # the UUID's version and variant
    for offset in (0, (1 << 62) - 1, (1 << 63) - 1):
        parsed = uuid.UUID(lock_token(secret, 12345, offset))
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_events_of_one_kind_merge_into_one_record_and_leave_their_sources_alone() -> None:
    def abandoned(offset: int, cmd_id: str, reason: str = "why") -> dict[str, Any]:
        return event_record("abandoned", "q", 0, [offset], 1, offset, cmd_id,
                            {"deliveries": [offset % 3], "reason": reason})

    first = abandoned(0, "c0")
    merged = own_event(first)
    sources = [abandoned(i, f"c{i}") for i in range(1, 1000)]
    assert all(merge_event(merged, record) for record in sources)
    assert merged["offsets"] == list(range(1000)) and merged["count"] == 1000
    assert merged["deliveries"] == [i % 3 for i in range(1000)]
    assert (merged["cmd"], merged["ts"]) == ("c0", 0)  # the first command names the record
    assert first["offsets"] == [0] and sources[0]["offsets"] == [1]
    assert not merge_event(merged, abandoned(1000, "c1000", reason="other"))
    assert merged["count"] == 1000


def test_mistyped_commands_are_refused_as_commands_never_with_another_error() -> None:
    """A field of the wrong type (a list where a name belongs, say) is a
    CommandError: anything else would fail the engine's batch of commands."""
    from tests.test_fuzz import FORGED_OPS, HARMLESS_OPS, command_body, mistyped

    rng = random.Random(7)
    for _ in range(20_000):
        body = mistyped(rng, command_body(rng, "q", rng.choice(HARMLESS_OPS + FORGED_OPS)))
        try:
            decode_command(json.dumps(body).encode())
        except CommandError:
            pass
