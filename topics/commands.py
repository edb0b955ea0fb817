"""Wire format of the commands clients send to the engine and of its replies.

One JSON object per record. Commands go to ``NS.__commands`` keyed by window
key (``entity#partition``) on the partition :func:`topics.partitions.command_partition` gives, so
every command of a window lands on the engine partition that owns it. Replies
go to ``NS.__replies`` on the partition the command names, keyed by client id.

Command fields (all operations)::

    {"v": 1, "id": "<unique command id>", "op": "<operation>",
     "entity": "orders", "partition": 0,
     "reply": {"partition": 3, "client": "<client id>"} | null}

A queue's policy (lock duration, max delivery count, TTL...) is never part of
a command: the engine reads it from the queue's definition.

In code an operation is an :class:`Op`, and :data:`OP_INFO` says who sends
it, whether its answer is remembered and whether it needs the session's lock.
Its fields are one frozen record (``AcquireArgs``, ``SettleArgs``...): a
client's write the fields below (``to_wire``) and validate them
(``from_wire``); the engine's own (``ExpireArgs``, ``DeadForwardedArgs``,
``streams.acceptance.AcceptArgs``) never travel. A grant and a settle item are
:class:`Grant` and :class:`SettleItem`, which keep the list forms below on the
wire; refusal codes are :class:`topics.errors.ErrorCode`.

Operations clients send, and their own fields:

``acquire``           ``sub`` ("active"|"deadletter"), ``max``, ``mode``
                      ("peek_lock"|"receive_and_delete"), ``hw`` (log end seen)
``acquire_deferred``  ``offsets``
``settle``            ``items``: ``[[offset, lock_token, action, reason, description, at_ms,
                      enqueued_ms]]`` with action one of complete, abandon, dead_letter,
                      defer, renew, schedule (park until ``at_ms``: the receiver found the
                      message not yet due) and expire (its time to live has passed);
                      ``at_ms`` may be left out for the other actions; ``enqueued_ms``
                      (the record's log timestamp, for end-to-end latency) may be left out.
                      Messages of one acquire settled alike travel as one group
                      instead, ``{"offsets": [...], "token": lock_token, "action": ...,
                      "enqueued": [...], "of": offset}`` (:class:`SettleItem` says why):
                      ``token`` is the lock token of ``of`` (left out: ``offsets[0]``), and
                      ``enqueued`` (one per offset, 0 for unknown) may be left out
``stats``             ``hw``: counts of the window; ``version`` (optional): first wait
                      until the engine has read the entities topic up to this offset
                      (the administration client, after writing a definition)
``peek``              ``sub``, ``from`` (offset), ``max``, ``hw``: browse without locking
``announce``          ``items``: ``[[offset, due_ms, expires_ms]]`` (0: none), from a sender:
                      keep messages invisible until due, expire them on time
``cancel``            ``offsets``: cancel scheduled messages

Sessions (entities with ``requires_session``; see ``streams.sessions``). ``session``
is a session id, ``token`` the session lock token ``lock_session`` answered:

``lock_session``      ``session`` (null: the next available one): lock a session
``renew_session``     ``session``, ``token``: extend the session lock
``release_session``   ``session``, ``token``: give the session up (its locked
                      messages are abandoned)
``session_state``     ``session``, ``token``: the session state (base64, or null)
``set_session_state`` ``session``, ``token``, ``state`` (base64, or null to clear)
``list_sessions``     ``after`` (a session id, or null), ``max``, ``updated_after`` (ms or
                      null): the window's sessions in id order
``acquire`` and ``peek`` take ``session`` (and ``acquire`` its ``token``) to read one
session's messages.

Operations of the engine itself, which it runs in-process and refuses from the
commands topic (error code ``Unauthorized``): ``expire`` (its lock timer
lapses locks), ``accept`` (its log scanner vouches for the offsets of
``[from, to)``, ``items``: what it found per offset, ``streams.acceptance.Item``),
``dead_forwarded`` (``offsets``: dead letters the scanner moved to their
target). A window of a deleted queue is forgotten when the engine reads the
deletion from the entities topic, never on a client's word.

A reply is ``{"v": 1, "id": ..., "client": ..., "ok": true, "result": {...}}``
or ``{"v": 1, "id": ..., "client": ..., "ok": false, "error": {"code", "message"}}``.
The code ``ServerBusy`` answers a command over the namespace's limit of
commands per second before the engine ran it: the same command may be sent
again (clients wait 10 s first). An acquire's result is ``{"grants":
[[offset, lock_token, locked_until_ms, deliveries, reason, description, source,
state]], "next": ...}``, the active messages it locked alike in a row as one
group ``{"offsets": [...], "token": lock token of offsets[0], "until":
locked_until_ms, "deliveries": n or [n per offset]}`` (:class:`GrantGroup`);
a settle's, announce's or cancel's ``{"results": [[status, until]]}``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, ClassVar, Generic, Self, TypeGuard, TypeVar

from topics import jsonbytes
from topics.errors import ErrorCode
from topics.immutable import immutable
from topics.rule_set import RuleSpec, selects_everything

VERSION = 1


class Op(StrEnum):
    """Every operation; :data:`OP_INFO` says who sends each and how the engine treats it."""

    ACQUIRE = "acquire"
    ACQUIRE_DEFERRED = "acquire_deferred"
    SETTLE = "settle"
    STATS = "stats"
    PEEK = "peek"
    ANNOUNCE = "announce"
    CANCEL = "cancel"
    LOCK_SESSION = "lock_session"
    RENEW_SESSION = "renew_session"
    RELEASE_SESSION = "release_session"
    SESSION_STATE = "session_state"
    SET_SESSION_STATE = "set_session_state"
    LIST_SESSIONS = "list_sessions"
    EXPIRE = "expire"
    ACCEPT = "accept"
    DEAD_FORWARDED = "dead_forwarded"
    DEFINE = "define"
    DROP = "drop"


class Sender(Enum):
    #: clients, on the commands topic
    CLIENT = "client"
    #: the engine's own timers and scanner, in-process (refused from the topic)
    ENGINE = "engine"
    #: takes effect only from an entity's definition, written by the
    #: administration client (create, update and delete a queue): never a command
    ADMINISTRATIVE = "administrative"


@dataclass(frozen=True)
class OpInfo:
    sender: Sender
    #: its answer is remembered by command id (the others are safe to apply twice)
    remembered: bool = False
    #: it needs the session lock held by the command's token
    holder: bool = False


_CLIENT, _ENGINE = Sender.CLIENT, Sender.ENGINE
OP_INFO: Mapping[Op, OpInfo] = {
    Op.ACQUIRE: OpInfo(_CLIENT, remembered=True),
    Op.ACQUIRE_DEFERRED: OpInfo(_CLIENT, remembered=True),
    Op.SETTLE: OpInfo(_CLIENT, remembered=True),
    Op.STATS: OpInfo(_CLIENT),
    Op.PEEK: OpInfo(_CLIENT),
    Op.ANNOUNCE: OpInfo(_CLIENT, remembered=True),
    Op.CANCEL: OpInfo(_CLIENT, remembered=True),
    Op.LOCK_SESSION: OpInfo(_CLIENT, remembered=True),
    Op.RENEW_SESSION: OpInfo(_CLIENT, remembered=True, holder=True),
    Op.RELEASE_SESSION: OpInfo(_CLIENT, remembered=True, holder=True),
    Op.SESSION_STATE: OpInfo(_CLIENT, holder=True),
    Op.SET_SESSION_STATE: OpInfo(_CLIENT, remembered=True, holder=True),
    Op.LIST_SESSIONS: OpInfo(_CLIENT),
    Op.EXPIRE: OpInfo(_ENGINE),
    Op.ACCEPT: OpInfo(_ENGINE),
    Op.DEAD_FORWARDED: OpInfo(_ENGINE),
    Op.DEFINE: OpInfo(Sender.ADMINISTRATIVE),
    Op.DROP: OpInfo(Sender.ADMINISTRATIVE),
}


class Action(StrEnum):
    """What a settle item does to its message."""

    COMPLETE = "complete"
    ABANDON = "abandon"
    #: abandoned without counting a delivery: locked, never handed to the application
    RELEASE = "release"
    DEAD_LETTER = "dead_letter"
    DEFER = "defer"
    RENEW = "renew"
    #: park until ``at_ms``: the receiver found the message not yet due
    SCHEDULE = "schedule"
    #: its time to live has passed
    EXPIRE = "expire"


SUB_QUEUES = frozenset({"active", "deadletter", "transferdeadletter"})
MODES = frozenset({"peek_lock", "receive_and_delete"})
MAX_ACQUIRE = 5000
#: The key of a tick: an empty record the engine appends to a commands
#: partition so that its time moves on (streams/log_clock.py). Window keys
#: all hold a '#', so no command's key is this one.
TICK_KEY = b"__tick__"
MAX_TEXT = 4096
#: the longest session id, as in Service Bus
MAX_SESSION_ID = 128
#: the largest session state, in bytes (before base64)
MAX_SESSION_STATE = 256 * 1024


class CommandError(ValueError):
    """A command record that does not follow this format (``code``
    BadCommand), or asks for what clients may not do (Unauthorized)."""

    def __init__(self, message: str, command_id: str | None = None,
                 reply: ReplyAddress | None = None,
                 code: ErrorCode = ErrorCode.BAD_COMMAND) -> None:
        super().__init__(message)
        self.command_id = command_id
        self.reply = reply
        self.code = code


@dataclass(frozen=True)
class ReplyAddress:
    partition: int
    client: str


@dataclass(frozen=True)
class Policy:
    lock_ms: int = 60_000
    max_delivery: int = 10
    dead_letter_expired: bool = False
    duplicate_window_ms: int = 0    # 0: no duplicate detection
    default_ttl_ms: int = 0         # 0: messages live until settled
    forward_to: str | None = None
    forward_dead_letters_to: str | None = None
    #: a subscription's rules (None: a queue, which takes every message)
    rules: tuple[RuleSpec, ...] | None = None
    #: a subscription's first offset per partition: it gets what was
    #: published from its creation on
    begin: tuple[int, ...] = ()
    #: a subscription dead-letters messages its filters fail on
    dead_letter_filter_errors: bool = False
    #: messages are delivered session by session (streams.sessions)
    requires_session: bool = False
    #: partitions of the entity's log (a session lives in one of them)
    partitions: int = 1

    @property
    def scanned(self) -> bool:
        """Whether the engine reads this entity's log before handing messages out."""
        filtered = self.rules is not None and not selects_everything(self.rules)
        return bool(self.duplicate_window_ms or self.default_ttl_ms or self.forward_to
                    or self.forward_dead_letters_to or filtered or self.requires_session)


# ------------------------------------------------------------------ records
@immutable
class SettleItem:
    """One settlement of a ``settle`` command; on the wire
    ``[offset, lock_token, action, reason, description, at_ms, enqueued_ms]``,
    or one offset of a group of them (:meth:`SettleArgs.to_wire`)."""

    offset: int
    lock_token: str | None
    action: Action
    reason: str | None = None
    description: str | None = None
    #: when a scheduled message is due (``schedule`` only)
    at_ms: int | None = None
    #: the record's log timestamp, for end-to-end latency
    enqueued_ms: int | None = None
    #: the offset ``lock_token`` was granted for, when it is not ``offset``:
    #: an item of a group (:meth:`SettleArgs.to_wire`), whose one token
    #: stands for every offset of its acquire. Never on the wire by itself.
    token_offset: int | None = None

    def grouped_with(self, first: SettleItem) -> bool:
        """Whether this item may travel in the group ``first`` opened
        (:meth:`SettleArgs.to_wire`): the same plain action, and a lock
        token of the same acquire (the tokens of one acquire share their
        first 19 characters: :func:`lock_token`), or the very token of
        ``first`` where both came in one group."""
        token, head = self.lock_token, first.lock_token
        if (self.action is not first.action or self.reason is not None
                or self.description is not None or self.at_ms is not None
                or token is None or head is None or len(head) <= _BATCH_HEAD):
            return False  # (a token too short to be one stays alone: lost alone)
        if self.token_offset is not None or first.token_offset is not None:
            return token == head and self.token_offset == first.token_offset
        return token.startswith(head[:_BATCH_HEAD])

    def to_wire(self) -> list[Any]:
        """The list form; trailing fields left out when null, as they may be."""
        item: list[Any] = [self.offset, self.lock_token, self.action.value, self.reason,
                           self.description, self.at_ms, self.enqueued_ms]
        while len(item) > 5 and item[-1] is None:
            item.pop()
        return item

    @classmethod
    def from_wire(cls, item: Any) -> SettleItem:
        """Validate one item of a ``settle`` command."""
        if not (isinstance(item, list) and len(item) in (5, 6, 7)):
            raise CommandError("each settlement must be [offset, lock_token, action, reason, "
                               "description, at_ms, enqueued_ms]")
        offset, token, action, reason, description = item[:5]
        at = item[5] if len(item) >= 6 else None
        enqueued = item[6] if len(item) == 7 else None
        if enqueued is not None and not _is_count(enqueued):
            raise CommandError("settlement enqueued_ms must be a non-negative integer")
        if action == Action.SCHEDULE and not _is_count(at):
            raise CommandError("a 'schedule' settlement needs at_ms, the time it is due")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise CommandError(f"settlement offset must be a non-negative integer, got {offset!r}")
        if not isinstance(token, str) or len(token) > 64:
            raise CommandError("settlement lock_token must be a string")
        # a dict lookup, not Action(action): the enum's call took a tenth of
        # decoding a settlement (a list or a dict there is not hashable)
        known = _ACTIONS.get(action) if isinstance(action, str) else None
        if known is None:
            raise CommandError(f"settlement action {action!r} is not one of {sorted(_ACTIONS)}")
        for text in (reason, description):
            if text is not None and (not isinstance(text, str) or len(text) > MAX_TEXT):
                raise CommandError("dead-letter reason and description must be text of "
                                   f"at most {MAX_TEXT} characters")
        return cls(offset, token, known, reason, description, at, enqueued)

    @classmethod
    def group_from_wire(cls, group: dict[str, Any]) -> list[SettleItem]:
        """Validate a group of a ``settle`` command (:meth:`SettleArgs.to_wire`)
        once, and give its items: each carries the group's token and the
        offset it was granted for, which the engine checks once for them
        all (``streams.window.InflightWindow._held``)."""
        offsets, token = group.get("offsets"), group.get("token")
        if not (isinstance(offsets, list) and offsets
                and all(_is_count(o) for o in offsets)):
            raise CommandError("a settlement group's 'offsets' must be a non-empty list of "
                               "non-negative integers")
        if not isinstance(token, str) or len(token) > 64:
            raise CommandError("a settlement group's 'token' must be a lock token")
        action = group.get("action")
        known = _ACTIONS.get(action) if isinstance(action, str) else None
        if known not in _GROUPED:
            raise CommandError(f"a settlement group's action must be one of "
                               f"{sorted(a.value for a in _GROUPED)}, got {action!r}")
        enqueued = group.get("enqueued")
        if enqueued is None:
            enqueued = [0] * len(offsets)
        elif not (isinstance(enqueued, list) and len(enqueued) == len(offsets)
                  and all(_is_count(e) for e in enqueued)):
            raise CommandError("a settlement group's 'enqueued' must hold a non-negative "
                               "integer per offset")
        of = group.get("of", offsets[0])
        if not _is_count(of):
            raise CommandError("a settlement group's 'of' must be the offset its token is of")
        return [cls(offset, token, known, None, None, None, stamp or None, of)
                for offset, stamp in zip(offsets, enqueued, strict=True)]


#: an action's wire name -> the action
_ACTIONS = {a.value: a for a in Action}
#: the actions a group of settlements may take: those with no texts or times
_GROUPED = frozenset({Action.COMPLETE, Action.ABANDON, Action.DEFER, Action.RENEW,
                      Action.RELEASE, Action.EXPIRE})
#: how long the part of a lock token shared by one acquire's tokens is
#: (:func:`lock_token`: a UUID's first three groups and their dashes)
_BATCH_HEAD = 19


@immutable
class Grant:
    """A message an ``acquire`` hands out (or a peek shows); on the wire
    ``[offset, lock_token, locked_until_ms, deliveries, reason, description,
    source, state]``. Without a lock token it was handed out settled
    (receive-and-delete) or only shown."""

    offset: int
    lock_token: str | None
    locked_until_ms: int
    #: deliveries counted by the engine, this one included
    deliveries: int
    #: dead-letter reason, description and source entity
    reason: str | None = None
    description: str | None = None
    source: str | None = None
    #: the sub-queue it is in: active, deferred, deadletter or transferdeadletter
    state: str = "active"

    def to_wire(self) -> list[Any]:
        return [self.offset, self.lock_token, self.locked_until_ms, self.deliveries,
                self.reason, self.description, self.source, self.state]

    @classmethod
    def from_wire(cls, grant: list[Any]) -> Grant:
        offset, token, until, deliveries, reason, description, source, state = grant
        return cls(offset, token, until, deliveries, reason, description, source, state)


@immutable
class GrantGroup:
    """Active messages one acquire locked alike, in the order it handed
    them out: one lock end, no dead-letter fields, and one lock token, that
    of ``offsets[0]``, from which the others follow (:func:`lock_token`).
    The engine derives one token per group rather than one per message
    (a tenth of its time locking batches of 1,000), and a receive of 1,000
    reads one small object instead of a thousand lists with a token each
    (85 -> 8 KB)."""

    offsets: list[int]
    lock_token: str
    locked_until_ms: int
    #: deliveries counted by the engine, this one included, per offset
    deliveries: list[int]

    def to_wire(self) -> dict[str, Any]:
        deliveries = self.deliveries
        same = all(d == deliveries[0] for d in deliveries)
        return {"offsets": self.offsets, "token": self.lock_token,
                "until": self.locked_until_ms, "deliveries": deliveries[0] if same else deliveries}

    @staticmethod
    def expand(group: dict[str, Any]) -> Iterator[Grant]:
        """The grant of each offset of a group on the wire, its token worked out."""
        offsets, until, deliveries = group["offsets"], group["until"], group["deliveries"]
        each = deliveries if isinstance(deliveries, list) else [deliveries] * len(offsets)
        tokens = sibling_tokens(group["token"], offsets[0], offsets)
        return (Grant(offset, token, until, count)
                for offset, token, count in zip(offsets, tokens, each, strict=True))


def grants_from_wire(wire: list[Any]) -> list[Grant]:
    """An acquire's grants on the wire, its groups made into their grants.
    Each wire form is let go as its grants are made (a thousand lists kept
    beside their grants were a thousand more objects for the client's
    garbage collector while a receive of 1,000 was read)."""
    wire.reverse()
    grants: list[Grant] = []
    for _ in range(len(wire)):
        item = wire.pop()
        if isinstance(item, dict):
            grants += GrantGroup.expand(item)
        else:
            grants.append(Grant.from_wire(item))
    return grants


def granted(wire: list[Any]) -> int:
    """How many messages wire entries name: an acquire's grants, or a
    settle command's items (a group names its offsets, anything else one)."""
    return sum(len(e["offsets"]) if isinstance(e, dict) and isinstance(e.get("offsets"), list)
               else 1 for e in wire)


# ------------------------------------------------------------- arguments
@dataclass(frozen=True)
class Args:
    """The arguments of one operation; each subclass is one operation's."""

    OP: ClassVar[Op]


@dataclass(frozen=True)
class WireArgs(Args):
    """Arguments of an operation clients send: their fields on the wire."""

    def to_wire(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Self:
        """Validate the command's fields into the record; raise CommandError."""
        raise NotImplementedError


@dataclass(frozen=True)
class AcquireArgs(WireArgs):
    OP = Op.ACQUIRE
    sub: str
    mode: str
    max: int
    hw: int
    #: a session receiver's session, and its lock token
    session: str | None = None
    token: str | None = None

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"sub": self.sub, "mode": self.mode, "max": self.max,
                                "hw": self.hw}
        if self.session is not None:
            body.update(session=self.session, token=self.token)
        return body

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Self:
        if not _one_of(obj.get("sub"), SUB_QUEUES):
            raise CommandError(f"field 'sub' must be one of {sorted(SUB_QUEUES)}")
        if not _one_of(obj.get("mode"), MODES):
            raise CommandError(f"field 'mode' must be one of {sorted(MODES)}")
        max_, hw = _int(obj, "max", 1, MAX_ACQUIRE), _int(obj, "hw", 0, 1 << 62)
        if obj.get("session") is None:
            return cls(obj["sub"], obj["mode"], max_, hw)
        return cls(obj["sub"], obj["mode"], max_, hw, _session_id(obj), _token(obj))


@dataclass(frozen=True)
class _OffsetsArgs(WireArgs):
    offsets: tuple[int, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"offsets": list(self.offsets)}

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Self:
        offsets = obj.get("offsets")
        if not isinstance(offsets, list) or not offsets or len(offsets) > MAX_ACQUIRE or not all(
            _is_count(o) for o in offsets
        ):
            raise CommandError("field 'offsets' must be a non-empty list of offsets")
        return cls(tuple(offsets))


@dataclass(frozen=True)
class AcquireDeferredArgs(_OffsetsArgs):
    OP = Op.ACQUIRE_DEFERRED


@dataclass(frozen=True)
class CancelArgs(_OffsetsArgs):
    """Cancel scheduled messages."""

    OP = Op.CANCEL


#: How long before a lock's end a settlement must have been appended to be
#: final without the engine's answer: the design's bound on how far a
#: broker's clock may step back (docs/settlement-by-log.md).
CLOCK_STEP_BOUND_MS = 500


def final_at_append(appended_ms: int | None, until_ms: int | None) -> bool:
    """Whether a settlement of locks ending at ``until_ms``, which Kafka
    appended at ``appended_ms`` (None: the broker did not stamp it), is final
    once appended. The client returns without the engine's answer exactly
    when this holds, and the engine, judging the same record by the same
    rule, knows that nobody will ask for that answer again."""
    return (appended_ms is not None and until_ms is not None
            and appended_ms < until_ms - CLOCK_STEP_BOUND_MS)


@dataclass(frozen=True)
class SettleArgs(WireArgs):
    OP = Op.SETTLE
    items: tuple[SettleItem, ...]
    #: the client takes the settlement as final once Kafka appended it early
    #: enough (:func:`final_at_append`), and waits for no answer; if it was
    #: appended too late, the client sends the same command id again without
    #: it, to get the (remembered) answer
    quiet: bool = False
    #: sent quiet: the end of the earliest lock it settles (ms, the log's
    #: time), which the client judges its append by
    until: int | None = None

    def to_wire(self) -> dict[str, Any]:
        """The items, those of one acquire settled alike in a row as one
        group: its offsets, one lock token and one action. A receive of
        1,000 then settles in one small object rather than a thousand lists
        of seven fields, each with its token, and the engine checks the
        group's token once (85 -> 22 KB a command of 1,000)."""
        wire: dict[str, Any] = {"items": _grouped(self.items)}
        if self.quiet:
            if self.until is not None:
                wire["until"] = self.until
            wire["quiet"] = True  # last: see answered_by_no_one
        return wire

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Self:
        items = obj.get("items")
        if not isinstance(items, list) or not items or len(items) > MAX_ACQUIRE:
            raise CommandError(f"field 'items' must be a list of 1..{MAX_ACQUIRE} settlements")
        quiet = obj.get("quiet", False)
        if not isinstance(quiet, bool):
            raise CommandError("field 'quiet' must be true or false")
        until = obj.get("until")
        if until is not None and (isinstance(until, bool) or not isinstance(until, int)
                                  or until < 0):
            raise CommandError("field 'until' must be a time in ms since the epoch")
        # counted before a group is made into items: a group's offsets are
        # bounded by the record's size alone
        if granted(items) > MAX_ACQUIRE:
            raise CommandError(f"a settle command settles at most {MAX_ACQUIRE} messages")
        settled: list[SettleItem] = []
        for item in items:
            if isinstance(item, dict):
                settled += SettleItem.group_from_wire(item)
            else:
                settled.append(SettleItem.from_wire(item))
        return cls(tuple(settled), quiet, until)


def _grouped(items: tuple[SettleItem, ...]) -> list[Any]:
    """``items`` on the wire: each run of items :meth:`SettleItem.grouped_with`
    its first as one group (a lone item as its list, unless its token is of
    another offset)."""
    wire: list[Any] = []
    at, count = 0, len(items)
    while at < count:
        first = items[at]
        end = at + 1
        if first.action in _GROUPED:
            while end < count and items[end].grouped_with(first):
                end += 1
        if end - at == 1 and first.token_offset in (None, first.offset):
            wire.append(first.to_wire())
        else:
            run = items[at:end]
            group: dict[str, Any] = {"offsets": [i.offset for i in run],
                                     "token": first.lock_token,
                                     "action": first.action.value}
            if any(i.enqueued_ms for i in run):
                group["enqueued"] = [i.enqueued_ms or 0 for i in run]
            if first.token_offset not in (None, first.offset):
                group["of"] = first.token_offset
            wire.append(group)
        at = end
    return wire


@dataclass(frozen=True)
class StatsArgs(WireArgs):
    OP = Op.STATS
    hw: int
    #: first wait until the engine has read the entities topic up to this
    #: offset (-1: do not wait)
    version: int = -1

    def to_wire(self) -> dict[str, Any]:
        return {"hw": self.hw} if self.version < 0 else {"hw": self.hw, "version": self.version}

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Self:
        return cls(_int(obj, "hw", 0, 1 << 62),
                   _int(obj, "version", -1, 1 << 62) if "version" in obj else -1)


@dataclass(frozen=True)
class PeekArgs(WireArgs):
    OP = Op.PEEK
    sub: str
    #: the first offset to show (``from`` on the wire)
    first: int
    max: int
    hw: int
    session: str | None = None

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"sub": self.sub, "from": self.first, "max": self.max,
                                "hw": self.hw}
        if self.session is not None:
            body["session"] = self.session
        return body

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Self:
        if not _one_of(obj.get("sub"), SUB_QUEUES):
            raise CommandError(f"field 'sub' must be one of {sorted(SUB_QUEUES)}")
        return cls(obj["sub"], _int(obj, "from", 0, 1 << 62), _int(obj, "max", 1, MAX_ACQUIRE),
                   _int(obj, "hw", 0, 1 << 62),
                   _session_id(obj) if obj.get("session") is not None else None)


@dataclass(frozen=True)
class AnnounceArgs(WireArgs):
    OP = Op.ANNOUNCE
    #: ``(offset, due_ms, expires_ms)`` (0: none)
    items: tuple[tuple[int, int, int], ...]

    def to_wire(self) -> dict[str, Any]:
        return {"items": [list(item) for item in self.items]}

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Self:
        items = obj.get("items")
        if not isinstance(items, list) or not items or len(items) > MAX_ACQUIRE or not all(
            isinstance(i, list) and len(i) == 3 and all(_is_count(v) for v in i) for i in items
        ):
            raise CommandError("field 'items' must be a non-empty list of "
                               "[offset, due_ms, expires_ms]")
        return cls(tuple((offset, due, expires) for offset, due, expires in items))


@dataclass(frozen=True)
class LockSessionArgs(WireArgs):
    OP = Op.LOCK_SESSION
    #: None: the next available session
    session: str | None = None
    #: the session's first messages to lock with it (peek-lock), up to this
    #: many: its receiver gets them without another round trip
    first: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"session": self.session, "first": self.first}

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Self:
        first = _int(obj, "first", 0, MAX_ACQUIRE) if "first" in obj else 0
        return cls(None if obj.get("session") is None else _session_id(obj), first)


@dataclass(frozen=True)
class HeldSessionArgs(WireArgs):
    """A held session and its lock token (what ``lock_session`` answered)."""

    session: str
    token: str

    def to_wire(self) -> dict[str, Any]:
        return {"session": self.session, "token": self.token}

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Self:
        return cls(_session_id(obj), _token(obj))


@dataclass(frozen=True)
class RenewSessionArgs(HeldSessionArgs):
    OP = Op.RENEW_SESSION


@dataclass(frozen=True)
class ReleaseSessionArgs(HeldSessionArgs):
    OP = Op.RELEASE_SESSION


@dataclass(frozen=True)
class SessionStateArgs(HeldSessionArgs):
    OP = Op.SESSION_STATE


@dataclass(frozen=True)
class SetSessionStateArgs(HeldSessionArgs):
    OP = Op.SET_SESSION_STATE
    #: base64, or None to clear it
    state: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {**super().to_wire(), "state": self.state}

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Self:
        held = HeldSessionArgs.from_wire(obj)
        state = obj.get("state")
        if state is not None and (not isinstance(state, str)
                                  or len(state) > (MAX_SESSION_STATE + 2) // 3 * 4):
            raise CommandError(f"field 'state' must be base64 of at most {MAX_SESSION_STATE} "
                               "bytes, or null")
        return cls(held.session, held.token, state)


@dataclass(frozen=True)
class ListSessionsArgs(WireArgs):
    OP = Op.LIST_SESSIONS
    after: str | None
    max: int
    updated_after: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"after": self.after, "max": self.max, "updated_after": self.updated_after}

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Self:
        after = obj.get("after")
        if after is not None and not isinstance(after, str):
            raise CommandError("field 'after' must be a session id or null")
        updated = obj.get("updated_after")
        return cls(after, _int(obj, "max", 1, MAX_ACQUIRE),
                   None if updated is None else _int(obj, "updated_after", 0, 1 << 62))


@dataclass(frozen=True)
class ExpireArgs(Args):
    """The lock timer's: what comes due before a command runs is all it asks for."""

    OP = Op.EXPIRE


@dataclass(frozen=True)
class DeadForwardedArgs(Args):
    """The log scanner's: dead letters it moved to their target."""

    OP = Op.DEAD_FORWARDED
    offsets: tuple[int, ...]


#: the arguments of what clients send
ClientArgs = (AcquireArgs | AcquireDeferredArgs | SettleArgs | StatsArgs | PeekArgs
              | AnnounceArgs | CancelArgs | LockSessionArgs | RenewSessionArgs
              | ReleaseSessionArgs | SessionStateArgs | SetSessionStateArgs | ListSessionsArgs)
_CLIENT_ARGS: Mapping[Op, type[ClientArgs]] = {cls.OP: cls for cls in (
    AcquireArgs, AcquireDeferredArgs, SettleArgs, StatsArgs, PeekArgs, AnnounceArgs, CancelArgs,
    LockSessionArgs, RenewSessionArgs, ReleaseSessionArgs, SessionStateArgs,
    SetSessionStateArgs, ListSessionsArgs)}
#: what clients may send on the commands topic
OPERATIONS = frozenset(op for op, info in OP_INFO.items() if info.sender is Sender.CLIENT)

A = TypeVar("A", bound=Args, covariant=True)


@dataclass(frozen=True)
class Command(Generic[A]):
    id: str
    entity: str
    partition: int
    args: A
    reply: ReplyAddress | None = None

    @property
    def op(self) -> Op:
        return self.args.OP

    @property
    def window_key(self) -> str:
        return f"{self.entity}#{self.partition}"


@dataclass
class Reply:
    id: str
    client: str
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error_code: str = ""
    error_message: str = ""

    @functools.cached_property
    def grants(self) -> list[Grant]:
        """What an acquire handed out (none if it handed out nothing),
        decoded once (:func:`grants_from_wire`): a receive reads them four
        times (a thousand grants took 0.56 ms each time)."""
        return grants_from_wire(self.result.pop("grants", []))

    @property
    def statuses(self) -> Iterator[tuple[str, int]]:
        """A settle's, announce's or cancel's answer per item, in order:
        ``(status, until)`` with status ok, lock_lost or invalid. One at a
        time: a list of a thousand pairs was a thousand more objects for the
        client's garbage collector."""
        return ((status, until) for status, until in self.result.get("results", ()))


def acquire_result(grants: Sequence[Grant | GrantGroup], next_offset: int,
                   batch: int | None = None) -> dict[str, Any]:
    """An acquire's answer (:attr:`Reply.grants` reads it); ``batch`` is the
    lock batch of a session's, which its replay needs."""
    result: dict[str, Any] = {"grants": [g.to_wire() for g in grants], "next": next_offset}
    if batch is not None:
        result["batch"] = batch
    return result


def encode_command(cmd: Command[ClientArgs]) -> bytes:
    body: dict[str, Any] = {
        "v": VERSION, "id": cmd.id, "op": cmd.op.value, "entity": cmd.entity,
        "partition": cmd.partition,
        "reply": None if cmd.reply is None else {"partition": cmd.reply.partition,
                                                  "client": cmd.reply.client},
    }
    body.update(cmd.args.to_wire())
    return jsonbytes.dumps(body)


#: how :func:`encode_command` ends a quiet settlement (``SettleArgs.to_wire``
#: puts the flag last)
_QUIET_END = b',"quiet":true}'


def sent_quiet(cmd: Command[Any]) -> bool:
    """Whether ``cmd`` is a settlement sent quiet (:attr:`SettleArgs.quiet`):
    nobody waits for its answer. The engine's intake keeps the flag only on
    one final at its append (:func:`final_at_append`)."""
    return isinstance(cmd.args, SettleArgs) and cmd.args.quiet


def answered_by_no_one(key: bytes | None, raw: bytes | None) -> bool:
    """Whether a commands record, read raw, is one no client waits for the
    engine to answer: a tick, or a settlement sent quiet. Read from the bytes
    alone, without decoding, as a hint: a quiet settlement encoded otherwise
    than by :func:`encode_command` is taken as one that is waited for."""
    return key == TICK_KEY or (raw is not None and raw.endswith(_QUIET_END))


#: On a broker that answers a waiting fetch as soon as it holds the bytes
#: asked for (Apache Kafka), the engine's fetches of the commands topic ask
#: for WAKE_BYTES and wait up to QUIET_FETCH_WAIT_MS, and a command somebody
#: waits for carries WAKE_BYTES of padding in a ``wake`` header: it ends the
#: wait at once, while quiet settlements and ticks, which nobody waits for,
#: are read a few to a fetch. A fetch for each of them slowed the Kafka
#: acknowledgements a thread settling one by one waits for (make bench, back
#: to back: one thread 1,147 and 970 -> 1,336 and 1,114 msg/s; the SDK loop
#: 1,033 and 920 -> 1,417 and 1,214). 20 ms served as well but cost an idle
#: broker 0.09 of a core in fetches; with 100 ms it idles as before.
WAKE_BYTES = 2048
QUIET_FETCH_WAIT_MS = 100
_WAKE_HEADERS: list[tuple[str, str | bytes | None]] = [("wake", bytes(WAKE_BYTES))]


def wake_headers(raw: bytes) -> list[tuple[str, str | bytes | None]] | None:
    """The headers of the commands record holding ``raw`` (an encoded
    command): the wake padding when somebody waits for its answer."""
    return None if answered_by_no_one(None, raw) else _WAKE_HEADERS


def _one_of(value: object, choices: Collection[str]) -> TypeGuard[str]:
    """Whether a field read from the wire is one of ``choices`` (a list or a
    dict there is not, rather than a TypeError)."""
    return isinstance(value, str) and value in choices


def _int(obj: dict[str, Any], key: str, low: int, high: int) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise CommandError(f"field {key!r} must be an integer in [{low}, {high}], got {value!r}")
    return value


def decode_command(raw: bytes | None) -> Command[ClientArgs]:
    """Parse and validate a command; raise CommandError naming what is wrong.

    When the id and reply address could be read they ride on the error, so the
    engine can still answer the sender of a malformed command.
    """
    try:
        obj = jsonbytes.loads(raw or b"")
    except (ValueError, UnicodeDecodeError) as exc:
        raise CommandError(f"command is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise CommandError("command must be a JSON object")
    cmd_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    reply = None
    rep = obj.get("reply")
    if isinstance(rep, dict) and isinstance(rep.get("client"), str):
        if isinstance(rep.get("partition"), int) and rep["partition"] >= 0:
            reply = ReplyAddress(rep["partition"], rep["client"])
    try:
        if obj.get("v") != VERSION:
            raise CommandError(f"unsupported command version {obj.get('v')!r}, expected {VERSION}")
        if not cmd_id or len(cmd_id) > 100:
            raise CommandError("field 'id' must be a non-empty string of at most 100 characters")
        op = obj.get("op")
        known = Op(op) if _one_of(op, _OP_NAMES) else None
        sender = None if known is None else OP_INFO[known].sender
        if sender is Sender.ENGINE:
            raise CommandError(f"{op!r} is an operation of the engine itself; clients may "
                               f"send {sorted(OPERATIONS)}", code=ErrorCode.UNAUTHORIZED)
        if sender is Sender.ADMINISTRATIVE:
            raise CommandError(f"{op!r} is not a command: queues are defined, changed and "
                               "deleted through their definitions (ServiceBusAdministrationClient, "
                               "with the Manage right)", code=ErrorCode.UNAUTHORIZED)
        if known is None or sender is not Sender.CLIENT:
            raise CommandError(f"unknown operation {op!r}; expected one of {sorted(OPERATIONS)}")
        entity = obj.get("entity")
        if not isinstance(entity, str) or not entity or len(entity) > 500:
            raise CommandError("field 'entity' must be a non-empty string")
        partition = _int(obj, "partition", 0, 1 << 20)
        if obj.get("policy") is not None:
            raise CommandError("a command cannot carry a policy: the engine reads each "
                               "queue's from its definition (update_queue changes it)",
                               code=ErrorCode.UNAUTHORIZED)
        args = _CLIENT_ARGS[known].from_wire(obj)
    except CommandError as exc:
        raise CommandError(str(exc), cmd_id, reply, exc.code) from None
    return Command(cmd_id, entity, partition, args, reply)


_OP_NAMES = frozenset(op.value for op in Op)


def _session_id(obj: dict[str, Any]) -> str:
    value = obj.get("session")
    if not valid_session_id(value):
        raise CommandError(f"field 'session' must be a session id of 1..{MAX_SESSION_ID} "
                           "characters without control characters")
    return str(value)


def valid_session_id(value: Any) -> bool:
    """Whether ``value`` can name a session: text of 1..128 characters
    without control characters (they would blur the engine's keys)."""
    return (isinstance(value, str) and 0 < len(value) <= MAX_SESSION_ID
            and value.isprintable())


def _token(obj: dict[str, Any]) -> str:
    token = obj.get("token")
    if not isinstance(token, str) or not 0 < len(token) <= 64:
        raise CommandError("field 'token' must be the session lock token lock_session answered")
    return token


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def encode_reply(reply: Reply) -> bytes:
    body: dict[str, Any] = {"v": VERSION, "id": reply.id, "client": reply.client, "ok": reply.ok}
    if reply.ok:
        body["result"] = reply.result
    else:
        body["error"] = {"code": reply.error_code, "message": reply.error_message}
    return jsonbytes.dumps(body)


def decode_reply(raw: bytes | None) -> Reply | None:
    """Parse a reply; None for a record that is not one (it is then ignored)."""
    try:
        obj = jsonbytes.loads(raw or b"")
        if not isinstance(obj, dict) or obj.get("v") != VERSION:
            return None
        if obj.get("ok"):
            return Reply(str(obj["id"]), str(obj["client"]), True, dict(obj.get("result") or {}))
        err = obj.get("error") or {}
        return Reply(str(obj["id"]), str(obj["client"]), False,
                     error_code=str(err.get("code", "")), error_message=str(err.get("message", "")))
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        return None


def lock_token(secret: str, batch: int, offset: int) -> str:
    """A lock token: a UUID (version 4) keyed by the window's secret (hex, as
    its header keeps it) over the acquire (batch) and the offset it locks.

    Tokens are derived, not stored: the engine keeps one batch id per locked
    offset and recomputes the token to check a settlement. Without the
    secret, which only the engine reads, a token cannot be forged, and the
    token of an earlier lock on the same offset no longer matches.

    The tokens of one batch share one keyed hash (:func:`_batch_key`), the
    offset mixed into its last 62 bits: hashing once per acquire rather than
    once per message made a token 2.9 -> 0.6 us (the engine derives one per
    message it locks and per one it settles). Whoever holds one token of an
    acquire can so work out the tokens of its other offsets, which that
    acquire locked for them anyway; a token of any other batch (another
    receiver's, an earlier lock of the same offset) stays 122 bits away.
    """
    head, tail = _batch_key(secret, batch)
    return _token_of(head, tail, offset)


def _token_of(head: str, tail: int, offset: int) -> str:
    """The token of ``offset`` in the batch whose keyed hash is ``head`` and ``tail``."""
    low = "%016x" % (tail ^ (offset & _LOW_62))
    return head + low[:4] + "-" + low[4:]


def sibling_tokens(token: str, offset: int, offsets: list[int]) -> Iterator[str]:
    """The lock tokens of ``offsets`` in the acquire that granted ``token``
    for ``offset`` (:class:`GrantGroup`): :func:`lock_token`'s keyed hash is
    read back from the one token."""
    head = token[:_BATCH_HEAD]
    tail = int(token[_BATCH_HEAD:].replace("-", ""), 16) ^ (offset & _LOW_62)
    return (_token_of(head, tail, other) for other in offsets)


_LOW_62 = (1 << 62) - 1


@functools.lru_cache(maxsize=4096)
def _batch_key(secret: str, batch: int) -> tuple[str, int]:
    """The keyed hash of one batch, as a UUID's first three groups (version
    4) and its last 8 bytes (RFC 4122 variant) as a number. One per acquire
    in flight: the settlements of a batch find it here."""
    hasher = hashlib.blake2b(batch.to_bytes(8, "big"), key=bytes.fromhex(secret),
                             digest_size=16)
    digest = bytearray(hasher.digest())
    digest[6] = (digest[6] & 0x0F) | 0x40
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-", int.from_bytes(digest[8:], "big")


def batch_id(command_id: str) -> int:
    """The lock batch of an acquire, derived from its command id so that
    processing the same command twice grants the very same locks."""
    return int.from_bytes(hashlib.blake2b(command_id.encode(), digest_size=6).digest(), "big")

