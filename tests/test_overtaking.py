"""Which completions an acquire may overtake (streams.overtaking): those it
commutes with, and only those. Records are encoded as clients send them."""

from __future__ import annotations

from streams.command_intake import CommandRecord
from streams.overtaking import overtaken
from topics.commands import (
    AcquireArgs,
    Action,
    Command,
    ReplyAddress,
    SettleArgs,
    SettleItem,
    encode_command,
)

NOW = 1_800_000_000_000  #: the log's time of the first record (ms)
LOCK_END = NOW + 30_000
KEY = b"work#0"


def _settle(offset: int, action: Action = Action.COMPLETE, items: int = 100,
            until: int = LOCK_END, entity: str = "work", at: int = NOW) -> CommandRecord:
    cmd = Command(f"s{offset}", entity, 0, SettleArgs(
        tuple(SettleItem(1000 + i, "token", action) for i in range(items)),
        quiet=True, until=until))
    return CommandRecord(0, offset, f"{entity}#0".encode(), encode_command(cmd), at, True)


def _acquire(offset: int, at: int = NOW + 2) -> CommandRecord:
    cmd = Command(f"a{offset}", "work", 0, AcquireArgs("active", "peek_lock", 100, 0),
                  ReplyAddress(0, "client"))
    return CommandRecord(0, offset, KEY, encode_command(cmd), at, True)


def _moved(*records: CommandRecord, sessions: bool | None = False) -> list[int]:
    return [r.offset for r in overtaken(records, lambda _: NOW - 5_000,
                                        lambda _: sessions, {})]


def test_completions_before_an_acquire_of_their_window_are_overtaken() -> None:
    assert _moved(_settle(1), _acquire(2)) == [1]
    assert _moved(_settle(1, items=30), _settle(2, items=30), _acquire(3)) == [1, 2]


def test_what_does_not_commute_with_the_acquire_stays_in_the_logs_order() -> None:
    # an abandoned message is the acquire's to take
    assert _moved(_settle(1, Action.ABANDON), _acquire(2)) == []
    assert _moved(_settle(1, items=60), _settle(2, Action.DEFER), _acquire(3)) == []
    # a lock ending by the acquire's time lapses there: the message is its to take
    assert _moved(_settle(1, until=NOW + 2), _acquire(2)) == []
    # a command of the window between them
    assert _moved(_settle(1), _acquire(2, at=NOW + 1), _settle(3, Action.ABANDON, items=1),
                  _acquire(4)) == []
    # sessions, or an entity the engine has no definition of
    assert _moved(_settle(1), _acquire(2), sessions=True) == []
    assert _moved(_settle(1), _acquire(2), sessions=None) == []


def test_only_what_is_worth_a_commit_record_of_its_own_is_moved() -> None:
    assert _moved(_settle(1, items=10), _acquire(2)) == []
    # nothing after it to overtake it, or only another window's acquire
    assert _moved(_settle(1)) == []
    assert _moved(_settle(1, entity="other"), _acquire(2)) == []


def test_a_settlement_not_final_at_its_append_is_waited_for_and_stays() -> None:
    late = _settle(1, until=NOW + 100)  # within the clock step bound of its lock's end
    assert _moved(late, _acquire(2, at=NOW + 1)) == []
    stamped_by_producer = CommandRecord(0, 1, KEY, _settle(1).value, NOW, False)
    assert _moved(stamped_by_producer, _acquire(2)) == []
