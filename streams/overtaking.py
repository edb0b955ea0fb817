"""Acquires that overtake the completions appended just before them.

An application that receives a batch, completes each message and receives
again (asyncio: ``receive_messages(100)`` and a ``gather`` of
``complete_message`` each) appends its completions as one settlement sent
quiet (final once appended: docs/settlement-by-log.md), then its next
acquire. The engine reads both in one batch and, in the order of the log,
applied the settlement first: its work lay on the acquire's path (traces of
the asyncio phase on Apache Kafka, 400 rounds: the acquire answered 3.9 ms
after its append, of which 1.25 ms applying the two and 0.81 ms the
acknowledgement of their 15 KB commit record).

Such a settlement is applied after the acquire instead, in the next batch,
once the acquire's batch is answered, when the two commute: every item of it
completes its message, sent quiet and final at its append, on a queue
without sessions, and the earliest lock it settles (``until``) ends after
the time the acquire is applied at. Then each of its messages is either
locked by the settled lock all that time (the acquire takes none of them,
before or after; the completion succeeds either way) or not (the completion
is refused either way, and whether the acquire may take the message does
not depend on it). No other command of the window may lie between them.

Until the settlement is applied, the engine's clock (what its own
operations, lapses among them, are judged at) and the commands offsets it
commits stop short of it, so that neither a lapse nor a restart passes over
it: a restart reads it again, and the acquire too, whose command id returns
its first answer (the engine's state machine is deterministic given the
command and its time). ``until`` is the client's: a client that stated a
later end than its lock's could lose only its own completions, as a quiet
settlement it took as final that the engine refused.

It decides on the records the commands intake hands out, decoded; the
running of the two batches is :func:`streams.command_agent.run_batches`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from streams.command_intake import CommandRecord
from topics.commands import (
    TICK_KEY,
    AcquireArgs,
    Action,
    Command,
    CommandError,
    SettleArgs,
    answered_by_no_one,
    decode_command,
    final_at_append,
)

#: Fewest items the settlements moved from a batch must carry together. Each
#: move costs the window a commit record of its own (the acquire's, then the
#: settlement's); a round's 100 in one command are worth it, a few threads'
#: few items are not.
MOVED_ITEMS = 50

#: (partition, offset) -> the command read there, decoded once
Decoded = dict[tuple[int, int], Command]


def overtaken(records: Sequence[CommandRecord], clock: Callable[[int], int | None],
              requires_session: Callable[[str], bool | None], decoded: Decoded
              ) -> list[CommandRecord]:
    """The settlements of ``records`` that the acquires after them may
    overtake (see the module), in log order; none if they carry fewer than
    :data:`MOVED_ITEMS` items. ``clock`` is each partition's time before
    ``records``; ``requires_session`` says whether an entity does (None:
    unknown). The commands it decoded are left in ``decoded``."""
    waited = {r.key for r in records if not answered_by_no_one(r.key, r.value)}
    if not any(r.key in waited and r.key != TICK_KEY and answered_by_no_one(r.key, r.value)
               for r in records):
        return []
    # the partition's time at each record: the newest append time up to it
    times: list[int] = []
    newest: dict[int, int] = {}
    for record in records:
        now = max(newest.get(record.partition) or clock(record.partition) or 0,
                  record.timestamp_ms)
        newest[record.partition] = now
        times.append(now)
    moved: list[int] = []
    items = 0
    by_key: dict[bytes | None, list[int]] = {}
    for at, record in enumerate(records):
        if record.key in waited:
            by_key.setdefault(record.key, []).append(at)
    for indexes in by_key.values():
        latest: int | None = None  # the time of the last acquire after, if any
        for at in reversed(indexes):
            record = records[at]
            cmd = _decode(record, decoded)
            if cmd is None:
                break
            if isinstance(cmd.args, AcquireArgs) and cmd.args.session is None:
                latest = max(latest or 0, times[at])
                continue
            settle = _completes(record, cmd, requires_session)
            if settle is None or latest is None or settle.until is None \
                    or settle.until <= latest:
                break
            moved.append(at)
            items += len(settle.items)
    if items < MOVED_ITEMS:
        return []
    return [records[at] for at in sorted(moved)]


def _decode(record: CommandRecord, decoded: Decoded) -> Command | None:
    """The command ``record`` holds, decoded once; None if it holds none."""
    place = (record.partition, record.offset)
    cmd = decoded.get(place)
    if cmd is None and record.key != TICK_KEY:
        try:
            cmd = decoded[place] = decode_command(record.value or b"")
        except CommandError:
            return None  # the engine refuses it when it comes to it
    return cmd


def _completes(record: CommandRecord, cmd: Command,
               requires_session: Callable[[str], bool | None]) -> SettleArgs | None:
    """``cmd``'s settlement if it only completes, sent quiet and final at
    its append, on an entity known to have no sessions; else None."""
    args = cmd.args
    if not isinstance(args, SettleArgs) or not args.quiet or not final_at_append(
            record.timestamp_ms if record.log_append_time else None, args.until):
        return None
    if requires_session(cmd.entity) is not False:
        return None
    if any(item.action is not Action.COMPLETE for item in args.items):
        return None
    return args
