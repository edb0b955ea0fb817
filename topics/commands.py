"""Wire format of the commands clients send to the engine and of its replies.

One JSON object per record. Commands go to ``NS.__commands`` keyed by window
key (``entity#partition``) on the partition :func:`command_partition` gives, so
every command of a window lands on the engine partition that owns it. Replies
go to ``NS.__replies`` on the partition the command names, keyed by client id.

Command fields (all operations)::

    {"v": 1, "id": "<unique command id>", "op": "<operation>",
     "entity": "orders", "partition": 0,
     "reply": {"partition": 3, "client": "<client id>"} | null}

A queue's policy (lock duration, max delivery count, TTL...) is never part of
a command: the engine reads it from the queue's definition.

Operations clients send, and their own fields:

``acquire``           ``sub`` ("active"|"deadletter"), ``max``, ``mode``
                      ("peek_lock"|"receive_and_delete"), ``hw`` (log end seen)
``acquire_deferred``  ``offsets``
``settle``            ``items``: ``[[offset, lock_token, action, reason, description, at_ms,
                      enqueued_ms]]`` with action one of complete, abandon, dead_letter,
                      defer, renew, schedule (park until ``at_ms``: the receiver found the
                      message not yet due) and expire (its time to live has passed);
                      ``at_ms`` may be left out for the other actions; ``enqueued_ms``
                      (the record's log timestamp, for end-to-end latency) may be left out
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
again (clients wait 10 s first).
"""

from __future__ import annotations

import hashlib
import json
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.cimpl import murmur2

from topics.rule_set import RuleSpec, selects_everything

VERSION = 1
#: what clients may send on the commands topic
SESSION_OPERATIONS = frozenset({"lock_session", "renew_session", "release_session",
                                "session_state", "set_session_state"})
OPERATIONS = frozenset({"acquire", "acquire_deferred", "settle", "stats", "peek", "announce",
                        "cancel", "list_sessions"}) | SESSION_OPERATIONS
#: what only the engine's own timers and scanner issue, in-process
ENGINE_OPERATIONS = frozenset({"expire", "accept", "dead_forwarded"})
#: what takes effect only from an entity's definition, written by the
#: administration client (create, update and delete a queue)
ADMINISTRATIVE = frozenset({"define", "drop"})
ACTIONS = frozenset({"complete", "abandon", "release", "dead_letter", "defer", "renew", "schedule",
                     "expire"})
SUB_QUEUES = frozenset({"active", "deadletter", "transferdeadletter"})
MODES = frozenset({"peek_lock", "receive_and_delete"})
MAX_LOCK_MS = 5 * 60 * 1000
MAX_ACQUIRE = 5000
MAX_TEXT = 4096
#: the longest session id, as in Service Bus
MAX_SESSION_ID = 128
#: the largest session state, in bytes (before base64)
MAX_SESSION_STATE = 256 * 1024


class CommandError(ValueError):
    """A command record that does not follow this format (``code``
    BadCommand), or asks for what clients may not do (Unauthorized)."""

    def __init__(self, message: str, command_id: str | None = None,
                 reply: ReplyAddress | None = None, code: str = "BadCommand") -> None:
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


@dataclass
class Command:
    id: str
    op: str
    entity: str
    partition: int
    reply: ReplyAddress | None = None
    args: dict[str, Any] = field(default_factory=dict)

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


def command_partition(window_key: str, partitions: int) -> int:
    """The commands-topic partition of a window; clients and engine agree on it."""
    return zlib.crc32(window_key.encode()) % partitions


def session_partition(session_id: str, partitions: int) -> int:
    """The partition a session's messages are in: Kafka's murmur2 partitioner
    on the session id, the key senders give them (as Java clients do by
    default, and confluent-kafka with ``partitioner=murmur2_random``)."""
    return int(murmur2(session_id.encode(), partitions)) if partitions > 1 else 0


def encode_command(cmd: Command) -> bytes:
    body: dict[str, Any] = {
        "v": VERSION, "id": cmd.id, "op": cmd.op, "entity": cmd.entity,
        "partition": cmd.partition,
        "reply": None if cmd.reply is None else {"partition": cmd.reply.partition,
                                                  "client": cmd.reply.client},
    }
    body.update(cmd.args)
    return json.dumps(body, separators=(",", ":")).encode()


def _int(obj: dict[str, Any], key: str, low: int, high: int) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise CommandError(f"field {key!r} must be an integer in [{low}, {high}], got {value!r}")
    return value


def decode_command(raw: bytes | None) -> Command:
    """Parse and validate a command; raise CommandError naming what is wrong.

    When the id and reply address could be read they ride on the error, so the
    engine can still answer the sender of a malformed command.
    """
    try:
        obj = json.loads(raw or b"")
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
        if op in ENGINE_OPERATIONS:
            raise CommandError(f"{op!r} is an operation of the engine itself; clients may "
                               f"send {sorted(OPERATIONS)}", code="Unauthorized")
        if op in ADMINISTRATIVE:
            raise CommandError(f"{op!r} is not a command: queues are defined, changed and "
                               "deleted through their definitions (ServiceBusAdministrationClient, "
                               "with the Manage right)", code="Unauthorized")
        if op not in OPERATIONS:
            raise CommandError(f"unknown operation {op!r}; expected one of {sorted(OPERATIONS)}")
        entity = obj.get("entity")
        if not isinstance(entity, str) or not entity or len(entity) > 500:
            raise CommandError("field 'entity' must be a non-empty string")
        partition = _int(obj, "partition", 0, 1 << 20)
        if obj.get("policy") is not None:
            raise CommandError("a command cannot carry a policy: the engine reads each "
                               "queue's from its definition (update_queue changes it)",
                               code="Unauthorized")
        args = _decode_args(op, obj)
    except CommandError as exc:
        raise CommandError(str(exc), cmd_id, reply, exc.code) from None
    return Command(cmd_id, op, entity, partition, reply, args)


def _session_id(obj: dict[str, Any], *, required: bool) -> str | None:
    value = obj.get("session")
    if value is None and not required:
        return None
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


def _decode_session_args(op: str, obj: dict[str, Any]) -> dict[str, Any]:
    if op == "lock_session":
        return {"session": _session_id(obj, required=False)}
    args = {"session": _session_id(obj, required=True), "token": _token(obj)}
    if op == "set_session_state":
        state = obj.get("state")
        if state is not None and (not isinstance(state, str)
                                  or len(state) > (MAX_SESSION_STATE + 2) // 3 * 4):
            raise CommandError(f"field 'state' must be base64 of at most {MAX_SESSION_STATE} "
                               "bytes, or null")
        args["state"] = state
    return args


def _decode_args(op: str, obj: dict[str, Any]) -> dict[str, Any]:
    if op in SESSION_OPERATIONS:
        return _decode_session_args(op, obj)
    if op == "list_sessions":
        after = obj.get("after")
        if after is not None and not isinstance(after, str):
            raise CommandError("field 'after' must be a session id or null")
        updated = obj.get("updated_after")
        return {"after": after, "max": _int(obj, "max", 1, MAX_ACQUIRE),
                "updated_after": None if updated is None
                else _int(obj, "updated_after", 0, 1 << 62)}
    if op == "acquire":
        if obj.get("sub") not in SUB_QUEUES:
            raise CommandError(f"field 'sub' must be one of {sorted(SUB_QUEUES)}")
        if obj.get("mode") not in MODES:
            raise CommandError(f"field 'mode' must be one of {sorted(MODES)}")
        args = {"sub": obj["sub"], "mode": obj["mode"], "max": _int(obj, "max", 1, MAX_ACQUIRE),
                "hw": _int(obj, "hw", 0, 1 << 62)}
        if obj.get("session") is not None:  # a session receiver's
            args.update(session=_session_id(obj, required=True), token=_token(obj))
        return args
    if op in ("acquire_deferred", "cancel"):
        offsets = obj.get("offsets")
        if not isinstance(offsets, list) or not offsets or len(offsets) > MAX_ACQUIRE or not all(
            _is_count(o) for o in offsets
        ):
            raise CommandError("field 'offsets' must be a non-empty list of offsets")
        return {"offsets": offsets}
    if op == "announce":
        items = obj.get("items")
        if not isinstance(items, list) or not items or len(items) > MAX_ACQUIRE or not all(
            isinstance(i, list) and len(i) == 3 and all(_is_count(v) for v in i) for i in items
        ):
            raise CommandError("field 'items' must be a non-empty list of "
                               "[offset, due_ms, expires_ms]")
        return {"items": items}
    if op == "settle":
        return {"items": _decode_items(obj.get("items"))}
    if op == "stats":
        return {"hw": _int(obj, "hw", 0, 1 << 62),
                "version": _int(obj, "version", -1, 1 << 62) if "version" in obj else -1}
    if op == "peek":
        if obj.get("sub") not in SUB_QUEUES:
            raise CommandError(f"field 'sub' must be one of {sorted(SUB_QUEUES)}")
        args = {"sub": obj["sub"], "from": _int(obj, "from", 0, 1 << 62),
                "max": _int(obj, "max", 1, MAX_ACQUIRE), "hw": _int(obj, "hw", 0, 1 << 62)}
        if obj.get("session") is not None:
            args["session"] = _session_id(obj, required=True)
        return args
    return {}


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _decode_items(items: Any) -> list[list[Any]]:
    if not isinstance(items, list) or not items or len(items) > MAX_ACQUIRE:
        raise CommandError(f"field 'items' must be a list of 1..{MAX_ACQUIRE} settlements")
    out = []
    for item in items:
        if not (isinstance(item, list) and len(item) in (5, 6, 7)):
            raise CommandError("each settlement must be [offset, lock_token, action, reason, "
                               "description, at_ms, enqueued_ms]")
        offset, token, action, reason, description = item[:5]
        at = item[5] if len(item) >= 6 else None
        enqueued = item[6] if len(item) == 7 else None
        if enqueued is not None and not _is_count(enqueued):
            raise CommandError("settlement enqueued_ms must be a non-negative integer")
        if action == "schedule" and not _is_count(at):
            raise CommandError("a 'schedule' settlement needs at_ms, the time it is due")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise CommandError(f"settlement offset must be a non-negative integer, got {offset!r}")
        if not isinstance(token, str) or len(token) > 64:
            raise CommandError("settlement lock_token must be a string")
        if action not in ACTIONS:
            raise CommandError(f"settlement action {action!r} is not one of {sorted(ACTIONS)}")
        for text in (reason, description):
            if text is not None and (not isinstance(text, str) or len(text) > MAX_TEXT):
                raise CommandError("dead-letter reason and description must be text of "
                                   f"at most {MAX_TEXT} characters")
        out.append([offset, token, action, reason, description, at, enqueued])
    return out


def encode_reply(reply: Reply) -> bytes:
    body: dict[str, Any] = {"v": VERSION, "id": reply.id, "client": reply.client, "ok": reply.ok}
    if reply.ok:
        body["result"] = reply.result
    else:
        body["error"] = {"code": reply.error_code, "message": reply.error_message}
    return json.dumps(body, separators=(",", ":")).encode()


def decode_reply(raw: bytes | None) -> Reply | None:
    """Parse a reply; None for a record that is not one (it is then ignored)."""
    try:
        obj = json.loads(raw or b"")
        if not isinstance(obj, dict) or obj.get("v") != VERSION:
            return None
        if obj.get("ok"):
            return Reply(str(obj["id"]), str(obj["client"]), True, dict(obj.get("result") or {}))
        err = obj.get("error") or {}
        return Reply(str(obj["id"]), str(obj["client"]), False,
                     error_code=str(err.get("code", "")), error_message=str(err.get("message", "")))
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        return None


def lock_token(secret: bytes, batch: int, offset: int) -> str:
    """A lock token: a UUID (version 4, so 122 bits) keyed by the window's
    secret over the acquire (batch) and the offset it locks.

    Tokens are derived, not stored: the engine keeps one batch id per locked
    offset and recomputes the token to check a settlement. Without the
    secret, which only the engine reads, a token cannot be forged, and the
    token of an earlier lock on the same offset no longer matches.
    """
    digest = hashlib.blake2b(batch.to_bytes(8, "big") + offset.to_bytes(8, "big"),
                             key=secret, digest_size=16).digest()
    return str(uuid.UUID(bytes=digest, version=4))


def batch_id(command_id: str) -> int:
    """The lock batch of an acquire, derived from its command id so that
    processing the same command twice grants the very same locks."""
    return int.from_bytes(hashlib.blake2b(command_id.encode(), digest_size=6).digest(), "big")

