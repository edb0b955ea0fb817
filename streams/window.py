"""The in-flight window of one entity partition: the engine's state machine.

Payloads stay in the entity's log; the engine only tracks offsets. A window
is a small header and, in an ordered store, what it knows of single offsets:

* header: ``start`` (every offset below it is settled or parked), ``next``
  (the first offset never handed out), ``hw`` (the highest log end a client
  reported), the queue's policy, per-state counts and event totals;
* entries (:mod:`streams.entries`): one per offset that is locked, released
  for redelivery, deferred, dead-lettered, scheduled or cancelled, in bounded
  chunks with ordered sub-queue indexes; an offset below ``next`` without an
  entry is settled;
* timers (:mod:`streams.due_index`): lock ends, scheduled messages and
  time-to-live expiries, ordered by when they are due;
* answers (:mod:`streams.answers`): what each recent command was answered.

A command reads what it needs and writes what it changed, nothing more, into
a transaction (:class:`streams.store.Txn`) that the engine makes durable
before answering. Settlement events carry, per offset, how long the lock was
held, the delivery count and the enqueue time the receiver read from the log:
what the Spark monitor needs for lock-time percentiles and end-to-end latency.

Every operation is deterministic given the command and ``now``, and a command
id seen before returns its first answer, so the engine can re-process
commands after a crash (Kafka delivers them at least once) without granting or
settling anything twice. Nothing here knows Faust or Kafka.
"""

from __future__ import annotations

import heapq
import hmac
import itertools
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from streams import acceptance, scheduling, sessions
from streams.answers import KEEP_MS, Answers
from streams.due_index import EXPIRY, LOCK, SCHEDULE, SESSION, DueIndex
from streams.entries import CHUNK, FAMILIES, MAX_SPREAD, UNREAD, Entries, Entry, Unread
from streams.left_out import LeftOutBlocks
from streams.session_index import SessionIndex
from streams.states import (
    AVAILABLE,
    CANCELLED,
    DEAD,
    DEAD_LOCKED,
    DEFERRED,
    DEFERRED_LOCKED,
    LOCKED,
    MAX_DELIVERY_REASON,
    PARKED_LOCKED,
    QUEUED,
    SCHEDULED,
    SUB_QUEUE_STATES,
    TRANSFER_DEAD,
    TRANSFER_DEAD_LOCKED,
    TTL_EXPIRED_REASON,
    UNLOCKED,
    Event,
    Outcome,
    Refused,
    Settlements,
)
from streams.store import MemoryStore, Store, Txn
from topics import jsonbytes
from topics.commands import (
    OP_INFO,
    AcquireArgs,
    AcquireDeferredArgs,
    Action,
    AnnounceArgs,
    Args,
    Command,
    ExpireArgs,
    Grant,
    GrantGroup,
    Op,
    PeekArgs,
    Policy,
    SettleArgs,
    SettleItem,
    StatsArgs,
    acquire_result,
    batch_id,
    lock_token,
    sent_quiet,
)
from topics.runs import run_pairs, run_total

#: settle actions -> the event they produce
_SETTLED = {"complete": "completed", "abandon": "abandoned", "release": "abandoned",
            "defer": "deferred",
            "renewed": "renewed", "scheduled": "scheduled"}
#: what an acquire's answer holds (the rest of an answer with grants is kept whole)
_ACQUIRE_KEYS = frozenset({"grants", "next", "batch"})
#: most timer entries one command handles; the rest wait for the next sweep
MAX_DUE_PER_COMMAND = 5_000
#: most ranges of left-out offsets the header keeps (see :meth:`InflightWindow.leave_out`)
MAX_LEFT_OUT_RANGES = 64
#: states of offsets still to be handed out or settled (they hold ``start``)
_IN_PLAY = (LOCKED, AVAILABLE, QUEUED)
_GRANT_STATE = {DEAD_LOCKED: "deadletter", TRANSFER_DEAD_LOCKED: "transferdeadletter",
                DEFERRED_LOCKED: "deferred"}
#: what the window knows of an offset it has no entry for, about to be locked
_NEVER_LOCKED = Entry(AVAILABLE)


class InflightWindow:
    """In-flight offsets of one entity partition, and their state transitions.

    ``InflightWindow(entity, partition)`` keeps its state in memory and
    commits each command itself (tests, bench); the engine builds windows
    with :meth:`load` over its RocksDB store and commits their writes only
    once Kafka holds them."""

    def __init__(self, entity: str, partition: int, store: Store | None = None) -> None:
        self.entity = entity
        self.partition = partition
        self.start = 0
        self.next = 0
        self.hw = 0
        self.lock_ms = 60_000
        self.max_delivery = 10
        self.dead_letter_expired = False
        self.duplicate_window_ms = 0
        self.default_ttl_ms = 0
        self.forward_to: str | None = None
        self.forward_dead_letters_to: str | None = None
        #: messages are handed out session by session (streams.sessions)
        self.requires_session = False
        #: the offset of the queue definition the policy above comes from (-1: none yet)
        self.policy_version = -1
        #: Accepted up to here (queues whose headers the engine scans); None: not scanned.
        self.scanned: int | None = None
        #: state -> entries in it
        self.counts: dict[str, int] = {}
        #: the offsets one chunk of entries spans (see :meth:`fit_chunks`)
        self.chunk_span = CHUNK
        #: entries at or after ``next`` (scheduled, cancelled... not yet reached)
        self.ahead = 0
        #: ``[first, end)`` ranges of offsets at or after ``next`` that are never
        #: handed out (left out by a subscription's rules, duplicates,
        #: forwarded), in order: a million in a row cost one range, not an entry each
        self.left_out: list[list[int]] = []
        #: left-out offsets past those ranges, kept in blocks (streams.left_out),
        #: and where the last block starts (-1: none); while any is kept there,
        #: the next ones go there too, so the header's ranges come first
        self.spilled = 0
        self.spill_tail = -1
        self.totals: dict[str, int] = {}
        self.wake: int | None = None
        #: the oldest offset the log must keep (see :meth:`retained_from`)
        self.retained = 0
        #: when the oldest remembered answer may be forgotten (None: none is
        #: kept; 0: not known yet, the next command looks)
        self.answers_due: int | None = 0
        #: keys this window's lock tokens (see topics.commands.lock_token)
        self.secret = os.urandom(16).hex()
        self._own_store = store is None
        self.store: Store = MemoryStore() if store is None else store
        self._begin()

    @property
    def prefix(self) -> bytes:
        """Where this window's keys start in the store."""
        return f"{self.entity}#{self.partition}".encode() + b"\x00"

    def _begin(self) -> None:
        """A fresh transaction for the next command."""
        self.txn = Txn(self.store)
        self.entries = Entries(self.txn, self.prefix, self.counts, self.chunk_span)
        self.due = DueIndex(self.txn, self.prefix)
        self.answers = Answers(self.txn, self.prefix)
        self.sessions = SessionIndex(self.txn, self.prefix)
        self.left_out_blocks = LeftOutBlocks(self.txn, self.prefix)

    # ----------------------------------------------------------------- header
    _HEADER_FIELDS = ("start", "next", "hw", "lock_ms", "max_delivery", "dead_letter_expired",
                      "duplicate_window_ms", "default_ttl_ms", "forward_to",
                      "forward_dead_letters_to", "requires_session", "policy_version",
                      "scanned", "counts", "chunk_span", "ahead", "left_out", "spilled",
                      "spill_tail", "totals", "wake", "retained", "answers_due", "secret")

    def header(self) -> dict[str, Any]:
        return {"entity": self.entity, "partition": self.partition,
                **{name: getattr(self, name) for name in self._HEADER_FIELDS}}

    def to_bytes(self, **extra: Any) -> bytes:
        """The header, ``b"<wake_ms> [scan]\\n<json>"``: timers read only the
        first line. ``extra`` rides along (the engine's redo log and outbox)."""
        head = ("-" if self.wake is None else str(self.wake)) + (
            "" if self.scanned is None else " scan")
        return head.encode() + b"\n" + jsonbytes.dumps({**self.header(), **extra})

    def commit_record(self, writes: dict[bytes, bytes | None],
                      outbox: list[dict[str, Any]] | None = None) -> bytes:
        """The header with what a command wrote and the events it produced:
        the one record that makes the command durable (see streams.command_agent)."""
        redo = [[k.decode("latin-1"), None if v is None else v.decode()]
                for k, v in writes.items()]
        return self.to_bytes(redo=redo, outbox=outbox or [])

    @staticmethod
    def redo_of(body: dict[str, Any]) -> dict[bytes, bytes | None]:
        """The writes a stored commit record carries."""
        return {k.encode("latin-1"): None if v is None else v.encode()
                for k, v in body.get("redo", [])}

    @classmethod
    def load(cls, raw: bytes | None, entity: str, partition: int, store: Store,
             header: dict[str, Any] | None = None) -> InflightWindow:
        """The window whose header is ``raw`` (None: a new one) over ``store``;
        ``header`` is that header already parsed (:meth:`header`), if at hand."""
        window = cls(entity, partition, store)
        if raw:
            body = header if header is not None else cls.body_of(raw)
            for name in cls._HEADER_FIELDS:
                if name in body:
                    value = body[name]
                    setattr(window, name, dict(value) if isinstance(value, dict) else value)
            window._begin()  # the entries must share the loaded counts
        return window

    @classmethod
    def from_header(cls, raw: bytes) -> InflightWindow:
        """A window's header alone (its entries are not readable)."""
        body = cls.body_of(raw)
        return cls.load(raw, body["entity"], body["partition"], MemoryStore())

    @staticmethod
    def body_of(raw: bytes) -> dict[str, Any]:
        body: dict[str, Any] = jsonbytes.loads(raw.partition(b"\n")[2])
        return body

    @staticmethod
    def wake_of(raw: bytes) -> int | None:
        """When the stored window next has work for the timer, without
        parsing it (``raw``: the stored header, or its first line)."""
        head = raw.partition(b"\n")[0].split(b" ")[0]
        return None if head in (b"-", b"") else int(head)

    @staticmethod
    def is_scanned(raw: bytes) -> bool:
        """Whether the engine reads this window's log, without parsing it
        (``raw``: the stored header, or its first line)."""
        return raw.partition(b"\n")[0].endswith(b" scan")

    def wake_at(self) -> int | None:
        """The next time the timer has work here: a lock to lapse, a message due."""
        return self.due.first()

    # -------------------------------------------------------------- dispatcher
    def apply(self, cmd: Command[Args], now: int, policy: tuple[int, Policy] | None = None
              ) -> Outcome:
        """Apply one command; a command id seen before returns its first answer.
        ``policy`` is the queue's newest known ``(version, policy)``, from
        its definition. The outcome's ``writes`` are what the command changed
        in the store."""
        self._begin()
        before = self.header()
        if policy is not None:
            self._adopt(*policy)
        sessions.guard(self, cmd, now)
        replayed, result, events = self._dispatch(cmd, now)
        if replayed:
            return Outcome(result, [], changed=False)
        writes, changed = self._conclude(before)
        return Outcome(result, events, changed=changed, writes=writes)

    def apply_settlements(self, cmds: Sequence[tuple[Command[SettleArgs], int]],
                          policy: tuple[int, Policy] | None = None) -> Settlements:
        """Apply settle commands in one transaction, each at its own time
        ``now`` and answered as if alone: what every command does once
        (reading and writing the entry chunks, moving the start, the next
        wake-up) is done once for all. Only on a window without sessions: a
        session's summary is made once per transaction."""
        self._begin()
        before = self.header()
        if policy is not None:
            self._adopt(*policy)
        assert not self.requires_session
        each: list[tuple[dict[str, Any], list[Event]] | Refused] = []
        run: list[tuple[Command[SettleArgs], int]] = []
        for cmd, now in cmds:
            try:
                sessions.guard(self, cmd, now)
            except Refused as refused:  # it changed nothing; the others go on
                each += self._settle_run(run)
                run = []
                each.append(refused)
                continue
            if self._plain(cmd, now):
                run.append((cmd, now))
                continue
            each += self._settle_run(run)
            run = []
            _, result, events = self._dispatch(cmd, now)
            each.append((result, events))
        each += self._settle_run(run)
        writes, changed = self._conclude(before)
        return Settlements(each, changed, writes)

    def _plain(self, cmd: Command[SettleArgs], now: int) -> bool:
        """Whether ``cmd`` may be settled in one pass with its neighbours
        (:meth:`_settle_run`): final at its append (no kept answer to look
        up), with no timer and no forgetting of answers due by its time.
        ``wake`` and ``answers_due`` change only when such work runs or the
        transaction ends, so the pass does what one command after the other
        would."""
        return (sent_quiet(cmd) and (self.wake is None or self.wake > now)
                and (self.answers_due is None or self.answers_due > now))

    def _settle_run(self, run: Sequence[tuple[Command[SettleArgs], int]]
                    ) -> list[tuple[dict[str, Any], list[Event]]]:
        """Settle plain commands (:meth:`_plain`) in one pass over all their
        items, each item at its command's time, each command answered as if
        alone. Their events are one of each kind, on the first command: the
        engine merges consecutive commands' events so all the same
        (:func:`topics.events.merge_event`). Threads settling one message at
        a time send commands of one item: applied one by one, each paid for
        a whole pass (``python -m bench.window_cost --each 17``, interleaved
        with the code before: 41-52 -> 28-37 us a command; in the engine,
        one thread settling one by one, its CPU per message against the
        client's 1.21 -> 1.14 times)."""
        if not run:
            return []
        events: list[Event] = []
        statuses = self._settle_items(
            [(item, now) for cmd, now in run for item in cmd.args.items], events)
        out: list[tuple[dict[str, Any], list[Event]]] = []
        at = 0
        for cmd, now in run:
            result = {"results": statuses[at:at + len(cmd.args.items)]}
            at += len(cmd.args.items)
            mine = events if not out else []
            self._after(cmd, now, result, mine)
            out.append((result, mine))
        return out

    def _dispatch(self, cmd: Command[Args], now: int
                  ) -> tuple[bool, dict[str, Any], list[Event]]:
        """Run ``cmd``'s handler at ``now``, after what came due by then:
        ``(replayed, result, events)``; a command id seen before is not run
        again (replayed), its first answer is."""
        remembered = OP_INFO[cmd.op].remembered
        # A settlement final at its append looks up no answer: its client
        # took it as applied then and never asks, and a copy of it run again
        # (its append reported failed and sent again, or read again after a
        # restart) finds its locks spent and changes nothing. The lookup was
        # a RocksDB miss for almost every settlement of a thread settling one
        # by one (4-5 % of the engine's time, py-spy).
        if remembered and not sent_quiet(cmd):
            stored = self.answers.get(cmd.id)
            if stored is not None:
                return True, self._replay(cmd, stored), []
        # ``wake`` is when the first timer is due: before it, nothing is
        events = self._expire(now) if self.wake is not None and self.wake <= now else []
        result = HANDLERS[cmd.op](self, cmd, now, events)
        self._after(cmd, now, result, events)
        return False, result, events

    def _after(self, cmd: Command[Args], now: int, result: dict[str, Any],
               events: list[Event]) -> None:
        """What follows every command's handler: its answer kept (unless
        final and ok), answers old enough forgotten, its events counted."""
        if OP_INFO[cmd.op].remembered and not _final_and_ok(cmd, result):
            self.answers.put(cmd.id, now, self._compact(cmd, result))
            if self.answers_due is None:
                self.answers_due = now + KEEP_MS
        if self.answers_due is not None and self.answers_due <= now:
            self.answers_due = self.answers.purge(now, max(self.answers_due - KEEP_MS, 0))
        for ev in events:
            self.totals[ev.type] = self.totals.get(ev.type, 0) + ev.count

    def _conclude(self, before: dict[str, Any]) -> tuple[dict[bytes, bytes | None], bool]:
        """End the transaction: what it wrote, and whether the window changed
        from its header ``before``."""
        self._advance_start()
        self.sessions.flush()
        self.answers.flush()
        self.entries.flush()
        self.left_out_blocks.flush()
        self.wake = self.due.next_wake(self.wake)
        self.retained = self.retained_from()
        writes = self.txn.writes
        changed = bool(writes) or self.header() != before
        if self._own_store and isinstance(self.store, MemoryStore):
            self.store.apply(writes)
        return writes, changed

    def _stats(self, cmd: Command[StatsArgs], _now: int, events: list[Event]
               ) -> dict[str, Any]:
        self.see_log_end(cmd.args.hw, events)
        return self.stats()

    def _peek_command(self, cmd: Command[PeekArgs], _now: int, events: list[Event]
                      ) -> dict[str, Any]:
        args = cmd.args
        self.see_log_end(args.hw, events)
        return self._peek(args.sub, args.first, args.max, args.session)

    def _expire_command(self, cmd: Command[ExpireArgs], _now: int, _events: list[Event]
                        ) -> dict[str, Any]:
        return {}  # what came due before dispatching is all it asks for

    def _announce(self, cmd: Command[AnnounceArgs], _now: int, events: list[Event]
                  ) -> dict[str, Any]:
        """What a sender says of messages it sent: when they are due, when they
        expire (so the timer expires them even with no receiver)."""
        items = cmd.args.items
        self.see_log_end(max(item[0] for item in items) + 1, events)  # the sender saw them
        self.expire_later([[offset, expires] for offset, _due, expires in items if expires])
        scheduled = [[offset, due] for offset, due, _ in items if due]
        if not scheduled:
            return {"results": [["ok", 0] for _ in items]}
        answers = iter(scheduling.schedule(self, scheduled, events)["results"])
        return {"results": [next(answers) if due else ["ok", 0] for _, due, _ in items]}

    def _adopt(self, version: int, policy: Policy) -> None:
        """Take the queue's policy, unless the window has a newer one."""
        if version <= self.policy_version:
            return
        if self.policy_version < 0 and self.next == 0 and self.partition < len(policy.begin):
            # A new subscription's window: it gets what was published from
            # the subscription's creation on, not the topic's history.
            self.start = self.next = self.hw = self.retained = policy.begin[self.partition]
        self.policy_version = version
        self.lock_ms, self.max_delivery = policy.lock_ms, policy.max_delivery
        self.dead_letter_expired = policy.dead_letter_expired
        self.duplicate_window_ms = policy.duplicate_window_ms
        self.default_ttl_ms = policy.default_ttl_ms
        self.forward_to = policy.forward_to
        self.forward_dead_letters_to = policy.forward_dead_letters_to
        self.requires_session = policy.requires_session
        if policy.scanned and self.scanned is None:
            # From here on the scanner accepts offsets before they are handed out.
            self.scanned = self.next

    # ----------------------------------------------------------------- answers
    @staticmethod
    def _compact(cmd: Command[Args], result: dict[str, Any]) -> Any:
        """What is needed to answer the command again, compactly."""
        if "grants" in result:  # acquires are rebuilt from the entries they locked
            locked: list[int] = []
            deleted: list[list[int]] = []
            # read off the wire form (Grant.to_wire's order): a Grant each
            # cost more than the lock itself for large acquires
            for grant in result["grants"]:
                if isinstance(grant, dict):  # a group (GrantGroup.to_wire): locked
                    locked += grant["offsets"]
                    continue
                offset, token, _until, deliveries, *_ = grant
                if token is None:
                    deleted.append([offset, deliveries])
                else:
                    locked.append(offset)
            compact = {"locked": locked, "deleted": deleted,
                       "batch": result.get("batch", batch_id(cmd.id))}
            besides = {k: v for k, v in result.items() if k not in _ACQUIRE_KEYS}
            if besides:  # a session's lock that granted its first messages
                compact["with"] = besides
            return compact
        if "results" not in result:  # session operations: small answers, kept whole
            return {"whole": result}
        answers = result["results"]  # settlements: only the answers that are not "ok"
        return {"n": len(answers),
                "x": [[i, *a] for i, a in enumerate(answers) if a != ["ok", 0]]}

    def _replay(self, cmd: Command[Args], stored: dict[str, Any]) -> dict[str, Any]:
        if "whole" in stored:
            whole: dict[str, Any] = stored["whole"]
            return whole
        if "n" in stored:
            answers: list[list[Any]] = [["ok", 0] for _ in range(stored["n"])]
            for index, status, until in stored["x"]:
                answers[index] = [status, until]
            return {"results": answers}
        batch = stored.get("batch", batch_id(cmd.id))
        grants = []
        for offset in stored["locked"]:  # those this acquire still holds
            entry = self.entries.get(offset)
            if entry is not None and entry.batch == batch and (
                    entry.state == LOCKED or entry.state in PARKED_LOCKED):
                grants.append(self.grant(offset, entry))
        grants += [Grant(o, None, 0, dc) for o, dc in stored["deleted"]]
        besides: dict[str, Any] = stored.get("with", {})
        return acquire_result(grants, self.next) | besides

    # ------------------------------------------------------------------ store
    def put(self, offset: int, entry: Entry | None, old: Entry | None | Unread = UNREAD
            ) -> None:
        """Set the entry of an offset, counting those not yet reached, and
        keeping the sessions' pending offsets in step; ``old``: its entry
        until now, if the caller has just read it."""
        if offset >= self.next or self.requires_session:  # plain settlements skip the read
            if isinstance(old, Unread):
                old = self.entries.get(offset)
            if offset >= self.next:
                self.ahead += (entry is not None) - (old is not None)
            if (old is not None and old.session) or (entry is not None and entry.session):
                entry = sessions.on_put(self, offset, old, entry)
        self.entries.put(offset, entry, old)

    def settled(self, offset: int, old: Entry | None | Unread = UNREAD) -> None:
        """Gone for good: below ``next`` that is no entry at all; an offset not
        yet reached stays as cancelled, so it is never handed out. ``old``
        as :meth:`put` takes it."""
        self.put(offset, None if offset < self.next else Entry(CANCELLED), old)

    def expire_later(self, items: list[list[int]]) -> None:
        """Time-to-live expiries ``[offset, expires]``, for the timer."""
        if items:
            self.due.add(min(e for _, e in items), EXPIRY, f"{items[0][0]:016x}", items)

    # ------------------------------------------------------------------- lapse
    def _expire(self, now: int) -> list[Event]:
        """Whatever is due: lapse locks (a lapse counts as a delivery), make
        scheduled messages available, expire messages past their time to live."""
        events: list[Event] = []
        lapsed: list[int] = []
        unparked: list[int] = []
        came_due: list[int] = []
        handled = 0
        for key, kind, items in self.due.due(now):
            if handled >= MAX_DUE_PER_COMMAND:
                break
            handled += len(items)
            self.due.remove(key)
            if kind == LOCK:
                for offset in items:
                    entry = self.entries.get(offset)
                    if entry is None or entry.until > now:
                        continue
                    if entry.state == LOCKED:
                        lapsed.append(offset)
                    elif entry.state in PARKED_LOCKED:
                        unparked.append(offset)
            elif kind == SCHEDULE:
                came_due += [o for o in items if self._is_due(o, now)]
            elif kind == SESSION:
                sessions.lapse(self, items, now, events)
            else:
                acceptance.expire_due(self, now, items, events)
        lapsed, unparked = list(dict.fromkeys(lapsed)), list(dict.fromkeys(unparked))
        self.release(lapsed, events, "lock_expired")
        for offset in unparked:
            entry = self.entries.get(offset)
            assert entry is not None
            self.put(offset, Entry(UNLOCKED[entry.state], entry.deliveries, reason=entry.reason,
                                   description=entry.description, source=entry.source))
        if unparked:
            events.append(Event("lock_expired", unparked))
        scheduling.activate(self, list(dict.fromkeys(came_due)), events)
        return events

    def _is_due(self, offset: int, now: int) -> bool:
        entry = self.entries.get(offset)
        return entry is not None and entry.state == SCHEDULED and entry.until <= now

    def release(self, offsets: list[int], events: list[Event], kind: str | None) -> None:
        """Make locked offsets available again, or dead-letter the ones that
        have used up their deliveries."""
        back, dead = [], []
        for offset in offsets:
            entry = self.entries.get(offset)
            assert entry is not None
            if entry.deliveries >= self.max_delivery:
                dead.append(offset)
            else:
                self.put(offset, Entry(AVAILABLE, entry.deliveries))
                back.append(offset)
        if back and kind:
            events.append(Event(kind, back))
        if dead:
            description = (f"message was delivered {self.max_delivery} times "
                           f"(max_delivery_count {self.max_delivery}) without being settled")
            self._dead_letter(dead, MAX_DELIVERY_REASON, description, events)

    def _dead_letter(self, offsets: list[int], reason: str | None, description: str | None,
                     events: list[Event]) -> None:
        for offset in offsets:
            entry = self.entries.get(offset)
            self.put(offset, Entry(DEAD, entry.deliveries if entry else 0, reason=reason,
                                   description=description, source=self.entity))
        events.append(Event("dead_lettered", offsets,
                            {"reason": reason, "description": description}))

    # ----------------------------------------------------------------- acquire
    def see_log_end(self, hw: int, events: list[Event]) -> None:
        """Offsets below ``hw`` exist in the log (a receiver or sender saw them)."""
        first = max(self.hw, self.next)
        if hw > first:
            events.append(Event("enqueued", [], {"first": first, "count": hw - first}))
        self.hw = max(self.hw, hw)

    def _token(self, entry: Entry, offset: int) -> str:
        return lock_token(self.secret, entry.batch, offset)

    def grant(self, offset: int, entry: Entry) -> Grant:
        return Grant(offset, self._token(entry, offset), entry.until, entry.deliveries,
                     entry.reason, entry.description, entry.source,
                     _GRANT_STATE.get(entry.state, "active"))

    def _lock(self, offsets: list[int], state: str, batch: int, until: int, *,
              fresh: int = 0) -> list[Grant | GrantGroup]:
        """Lock offsets for one acquire; their lock ends share one timer.
        Active messages locked alike in a row are granted as one group, its
        one token derived for its first offset (:class:`GrantGroup`). The
        last ``fresh`` offsets have no entry (:meth:`_take_fresh` read them)."""
        grants: list[Grant | GrantGroup] = []
        alike: list[int] = []
        deliveries: list[int] = []
        entered = len(offsets) - fresh
        for at, offset in enumerate(offsets):
            old = self.entries.get(offset) if at < entered else None
            entry = old or _NEVER_LOCKED
            locked = Entry(state, entry.deliveries + 1, batch, until, reason=entry.reason,
                           description=entry.description, source=entry.source)
            self.put(offset, locked, old)
            if state == LOCKED and entry.reason is entry.description is entry.source is None:
                alike.append(offset)
                deliveries.append(locked.deliveries)
                continue
            if alike:
                grants.append(self.grant_group(alike, deliveries, batch, until))
                alike, deliveries = [], []
            grants.append(self.grant(offset, locked))
        if alike:
            grants.append(self.grant_group(alike, deliveries, batch, until))
        self.due.add(until, LOCK, f"{batch:016x}", offsets)
        return grants

    def grant_group(self, offsets: list[int], deliveries: list[int], batch: int, until: int
                    ) -> GrantGroup:
        """Active messages of one acquire locked alike, granted together."""
        return GrantGroup(offsets, lock_token(self.secret, batch, offsets[0]), until, deliveries)

    def _acquire(self, cmd: Command[AcquireArgs], now: int, events: list[Event]
                 ) -> dict[str, Any]:
        args = cmd.args
        self.see_log_end(args.hw, events)
        want, batch = args.max, batch_id(cmd.id)
        until = now + self.lock_ms
        sub = args.sub
        if sub == "active" and args.session is not None:
            return sessions.acquire(self, args, events)
        if sub in SUB_QUEUE_STATES:
            free, locked = SUB_QUEUE_STATES[sub]
            picked = self._first_in(FAMILIES[sub], free, want)
            grants = self._lock(picked, locked, batch, until)
            if picked:
                events.append(Event("locked", picked, {"sub": sub, "until": until}))
            return acquire_result(grants, self.next)
        picked = (self._first_in(FAMILIES["available"], AVAILABLE, want)
                  if self.counts.get(AVAILABLE) else [])
        fresh = self._take_fresh(want - len(picked))
        picked += fresh
        if args.mode == "receive_and_delete":
            return acquire_result(self.delete_on_receipt(picked, events), self.next)
        grants = self._lock(picked, LOCKED, batch, until, fresh=len(fresh))
        if picked:
            events.append(Event("locked", picked, {"until": until}))
        return acquire_result(grants, self.next)

    def delete_on_receipt(self, picked: list[int], events: list[Event]) -> list[Grant]:
        """Hand ``picked`` out settled (receive-and-delete): grants without a
        lock token, each with the delivery it counts."""
        grants = []
        for offset in picked:
            entry = self.entries.get(offset)
            deliveries = (entry.deliveries if entry else 0) + 1
            grants.append(Grant(offset, None, 0, deliveries))
            self.settled(offset)
        if picked:
            events.append(Event("received_and_deleted", picked))
        return grants

    def _first_in(self, family: str, state: str, want: int) -> list[int]:
        """The first ``want`` offsets of a sub-queue index that are in ``state``."""
        found = (o for o, e in self.entries.in_family(family) if e.state == state)
        return list(itertools.islice(found, max(want, 0)))

    def _take_fresh(self, want: int) -> list[int]:
        """Offsets never handed out, up to the log end; scheduled and cancelled
        ones are passed over (a cancelled one is then gone for good), and so
        are the ranges left out."""
        taken: list[int] = []
        end = self.hw if self.scanned is None else min(self.hw, self.scanned)
        reached = end
        for offset in self._not_left_out(self.next, end):
            if len(taken) >= want:
                reached = offset
                break
            entry = self.entries.get(offset)
            if entry is None:
                taken.append(offset)
            else:  # parked before it was reached: no longer ahead
                self.ahead -= 1
                if entry.state == CANCELLED:
                    self.entries.put(offset, None)
        before, self.next = self.next, max(self.next, reached)
        if self.left_out and self.left_out[0][1] <= self.next:
            self.left_out = [r for r in self.left_out if r[1] > self.next]
        if self.spilled and self.next > before:
            self.spilled -= self.left_out_blocks.pass_to(before, self.next)
            if not self.spilled:
                self.spill_tail = -1
        return taken

    def _not_left_out(self, start: int, stop: int) -> Iterator[int]:
        """The offsets of ``[start, stop)`` outside the left-out ranges, in order."""
        offset = start
        spilled = self.left_out_blocks.ranges() if self.spilled else iter(())
        for first, end in itertools.chain(self.left_out, spilled):
            if end <= offset:
                continue
            yield from range(offset, min(first, stop))
            offset = max(offset, end)
            if offset >= stop:
                return
        yield from range(offset, stop)

    def fit_chunks(self, read: int, selected: int) -> None:
        """Spread the entries' chunks as the log scanner found ``selected``
        of ``read`` records kept (the rest left out): over :data:`CHUNK`
        times the largest power of two up to :data:`MAX_SPREAD` that is at
        most ``read / selected`` offsets, so that a chunk holds about as many
        entries as a queue's. Only while the window holds no entry (no chunk
        is stored then, under either span), and from a read large enough to
        tell. Not for rules that select more than one message in four: a
        one-by-one settlement rewrites its chunk, and a topic's subscriptions
        selecting half each drained slower in chunks of 256 (a harness of
        bench-topics' 3 subscriptions: 2,396-2,683 settled msg/s against
        2,780-3,215 in chunks of 128, alternating)."""
        if self.counts or read < CHUNK:
            return
        spread = 1
        while spread < MAX_SPREAD and 2 * spread * selected <= read:
            spread *= 2
        spread = spread if spread >= 4 else 1
        if CHUNK * spread != self.chunk_span:
            self.chunk_span = CHUNK * spread
            self.entries = Entries(self.txn, self.prefix, self.counts, self.chunk_span)

    def leave_out(self, runs: list[int]) -> None:
        """The offsets of ``runs`` (flat ``[first, end)`` runs in order, after
        every offset left out before) are never to be handed out. Those at
        or after ``next`` become ranges of :attr:`left_out` (at most
        :data:`MAX_LEFT_OUT_RANGES`; beyond, ranges in blocks of their own);
        one that has an entry already gets a cancelled entry, and those
        before ``next`` are settled."""
        runs = self._unreached(runs)
        ranges = [list(r) for r in self.left_out]  # new lists: the header before must not change
        kept = 0
        while kept < len(runs) and not self.spilled:
            first, end = runs[kept], runs[kept + 1]
            if ranges and ranges[-1][1] == first:
                ranges[-1][1] = end
            elif len(ranges) < MAX_LEFT_OUT_RANGES:
                ranges.append([first, end])
            else:
                break
            kept += 2
        if kept < len(runs):
            spilled = runs[kept:]
            self.spill_tail = self.left_out_blocks.extend(spilled, self.spill_tail)
            self.spilled += run_total(spilled)
        self.left_out = ranges

    def _unreached(self, runs: list[int]) -> list[int]:
        """The runs of ``runs`` to keep as left out: an offset reached
        already, or with an entry, is settled instead (looked at one by one
        only where that may be: before ``next``, or while entries are parked
        ahead of it)."""
        if not runs or (runs[0] >= self.next and not self.ahead):
            return runs
        kept: list[int] = []
        for first, end in run_pairs(runs):
            start = -1
            for offset in range(first, end):
                if offset < self.next or (self.ahead and self.entries.get(offset) is not None):
                    if offset >= self.next or self.entries.get(offset) is not None:
                        self.settled(offset)
                    if start >= 0:
                        kept += (start, offset)
                    start = -1
                elif start < 0:
                    start = offset
            if start >= 0:
                kept += (start, end)
        return kept

    def _acquire_deferred(self, cmd: Command[AcquireDeferredArgs], now: int,
                          events: list[Event]) -> dict[str, Any]:
        batch, until = batch_id(cmd.id), now + self.lock_ms
        picked = [o for o in sorted(set(cmd.args.offsets))
                  if (entry := self.entries.get(o)) is not None and entry.state == DEFERRED]
        grants = self._lock(picked, DEFERRED_LOCKED, batch, until)
        if picked:
            events.append(Event("locked", picked, {"sub": "deferred", "until": until}))
        return acquire_result(grants, self.next)

    # ------------------------------------------------------------------ settle
    def _held(self, item: SettleItem, proven: dict[tuple[int, int, str], bool]
              ) -> Entry | None:
        """The locked entry the item's token still holds, None when the lock
        is lost. A token of a group (``item.token_offset``) was granted for
        another offset of the same acquire: it holds every offset its batch
        still locks, and is checked once per batch (``proven``, kept by the
        caller for one settlement pass; deriving a token per item was a
        tenth of the engine's time settling batches of 1,000)."""
        offset, token = item.offset, item.lock_token
        entry = self.entries.get(offset)
        if entry is None or (entry.state != LOCKED and entry.state not in PARKED_LOCKED):
            return None
        if not isinstance(token, str):
            return None
        granted_for = offset if item.token_offset is None else item.token_offset
        key = (entry.batch, granted_for, token)
        held = proven.get(key)
        if held is None:
            held = hmac.compare_digest(token, lock_token(self.secret, entry.batch, granted_for))
            if item.token_offset is not None:  # one offset's own token is checked once anyway
                proven[key] = held
        return entry if held else None

    def _settle(self, cmd: Command[SettleArgs], now: int, events: list[Event]
                ) -> dict[str, Any]:
        """Settle each item; answer each with ok, lock_lost or invalid."""
        return {"results": self._settle_items([(item, now) for item in cmd.args.items],
                                              events)}

    def _settle_items(self, items: Sequence[tuple[SettleItem, int]], events: list[Event]
                      ) -> list[list[Any]]:
        """Settle each item at its time; the status of each: ok, lock_lost
        or invalid, and a renewal's new lock end."""
        done: dict[str, list[int]] = {}
        details: dict[int, list[Any]] = {}  # offset -> [held_ms, deliveries, enqueued_ms]
        statuses: list[list[Any]] = []
        first_event = len(events)
        unlocked: dict[tuple[int, int], list[int]] = {}  # (lock end, batch) -> offsets
        renewed: dict[tuple[int, int], list[int]] = {}  # (new lock end, batch) -> offsets
        proven: dict[tuple[int, int, str], bool] = {}
        for item, now in items:
            offset, action = item.offset, item.action
            entry = self._held(item, proven)
            if entry is None:
                statuses.append(["lock_lost", 0])
                continue
            if entry.state in (DEAD_LOCKED, TRANSFER_DEAD_LOCKED) and action in (
                    Action.DEAD_LETTER, Action.DEFER):
                statuses.append(["invalid", 0])
                continue
            unlocked.setdefault((entry.until, entry.batch), []).append(offset)
            if action == Action.RENEW:
                renewed_until = now + self.lock_ms
                self.put(offset, replace(entry, until=renewed_until,
                                         locked_at=self.locked_at(entry)))
                statuses.append(["ok", renewed_until])
                done.setdefault("renewed", []).append(offset)
                renewed.setdefault((renewed_until, entry.batch), []).append(offset)
                continue
            details[offset] = [now - self.locked_at(entry), entry.deliveries, item.enqueued_ms]
            done_as: str = action
            if action == Action.SCHEDULE:
                assert item.at_ms is not None  # the decoder asks a schedule for its time
                scheduling.park(self, offset, entry, item.at_ms)
                done_as = "scheduled"
            elif action == Action.EXPIRE:
                self.expire_message(offset, events)
            else:
                self._apply_action(offset, entry, action, item.reason, item.description, events)
            statuses.append(["ok", 0])
            done.setdefault(done_as, []).append(offset)
        for (until, batch), offsets in unlocked.items():
            self.due.discard(until, LOCK, f"{batch:016x}", offsets)
        for (until, batch), offsets in renewed.items():  # a lock's key names its batch and end
            self.due.add(until, LOCK, f"{batch:016x}", offsets)
        events.extend(Event(_SETTLED[k], v) for k, v in done.items() if k in _SETTLED)
        events[first_event:] = _coalesced(events[first_event:])
        for ev in events[first_event:]:
            if ev.offsets and all(o in details for o in ev.offsets):
                held, deliveries, enqueued_at = zip(*(details[o] for o in ev.offsets),
                                                    strict=True)
                ev.extra.update(held=list(held), deliveries=list(deliveries),
                                enqueued=list(enqueued_at))
        return statuses

    def locked_at(self, entry: Entry) -> int:
        return entry.locked_at if entry.locked_at is not None else entry.until - self.lock_ms

    def _apply_action(self, offset: int, entry: Entry, action: Action, reason: str | None,
                      description: str | None, events: list[Event]) -> None:
        if action == Action.COMPLETE:
            self.settled(offset, entry)
        elif action in (Action.ABANDON, Action.RELEASE):
            if action == Action.RELEASE:  # locked but never handed to the application
                entry = replace(entry, deliveries=max(entry.deliveries - 1, 0))
                self.put(offset, entry)
            if entry.state == LOCKED:
                self.release([offset], events, None)
            else:
                self.put(offset, Entry(UNLOCKED[entry.state], entry.deliveries,
                                       reason=entry.reason, description=entry.description,
                                       source=entry.source))
        elif action == Action.DEAD_LETTER:
            self._dead_letter([offset], reason, description, events)
        elif action == Action.DEFER:
            self.put(offset, Entry(DEFERRED, entry.deliveries))

    def expire_message(self, offset: int, events: list[Event]) -> None:
        """Its time to live has passed: dead-letter it if the queue says so,
        otherwise drop it; either way it is never delivered again."""
        if self.dead_letter_expired:
            self._dead_letter([offset], TTL_EXPIRED_REASON,
                              "the message's time to live passed before it was completed",
                              events)
            return
        self.settled(offset)
        events.append(Event("expired", [offset]))

    def _advance_start(self) -> None:
        """Move ``start`` to the first offset still in play (locked or waiting
        for redelivery): parked and settled offsets are passed over."""
        at_start = self.entries.get(self.start)
        if self.start >= self.next or (at_start is not None
                                       and at_start.state in _IN_PLAY):
            return
        for offset, entry in self.entries.between(self.start, self.next):
            if entry.state in _IN_PLAY:
                self.start = offset
                return
        self.start = self.next

    # -------------------------------------------------------------------- peek
    def _peek(self, sub: str, first: int, want: int, session: str | None = None
              ) -> dict[str, Any]:
        """Messages still in the (sub-)queue from offset ``first`` on, without
        locking them: ``[offset, state, delivery_count, reason, description, source]``;
        with ``session``, only that session's active and deferred messages."""
        def shown(family: str, name: str) -> Iterator[tuple[int, list[Any]]]:
            return ((o, [o, name, e.deliveries, e.reason, e.description, e.source])
                    for o, e in self.entries.in_family(family, first))

        if sub in SUB_QUEUE_STATES:
            streams = [shown(FAMILIES[sub], sub)]
        elif session is not None:
            pending = ((o, [o, "active", e.deliveries, None, None, None])
                       for o in self.sessions.offsets(session)
                       if o >= first and (e := self.entries.get(o)) is not None)
            deferred = ((o, [o, "deferred", e.deliveries, None, None, None])
                        for o, e in self.entries.in_family(FAMILIES["deferred"], first)
                        if e.session == session)
            streams = [deferred, pending]
        else:
            early = ((o, [o, "active", e.deliveries, None, None, None])
                     for o, e in self.entries.in_family(FAMILIES["available"], first)
                     if o < self.start)  # scheduled messages that came due late
            streams = [shown(FAMILIES["deferred"], "deferred"),
                       shown(FAMILIES["scheduled"], "scheduled"), early, self._active(first)]
        found = [entry for _, entry in itertools.islice(
            heapq.merge(*streams, key=lambda pair: pair[0]), want)]
        return {"messages": found}

    def _active(self, first: int) -> Iterator[tuple[int, list[Any]]]:
        """Active messages (locked or not) from ``max(first, start)`` to the log end."""
        for offset in self._not_left_out(max(first, self.start), self.hw):
            entry = self.entries.get(offset)
            if entry is None and offset >= self.next:
                yield offset, [offset, "active", 0, None, None, None]
            elif entry is not None and entry.state in _IN_PLAY:
                yield offset, [offset, "active", entry.deliveries, None, None, None]

    def dead_letters(self, limit: int) -> list[tuple[int, str | None, str | None]]:
        """The first dead letters not held by a receiver: ``(offset, reason, description)``."""
        found = ((o, e.reason, e.description) for o, e in self.entries.in_family(
            FAMILIES["deadletter"]) if e.state == DEAD)
        return list(itertools.islice(found, limit))

    def retained_from(self) -> int:
        """The oldest offset the log must keep: everything below it is settled
        for good, so the log's start may advance to it (DeleteRecords)."""
        # No entry is ever made below the last value (entries are made at or
        # after ``next``), so the scan starts there: RocksDB would otherwise
        # step over the deletion of every chunk settled since its last compaction.
        first = self.entries.first_offset(self.retained)
        return self.start if first is None else min(self.start, first)

    # ------------------------------------------------------------------- stats
    def stats(self) -> dict[str, int | None]:
        """Counts for runtime properties; ``active`` includes locked messages."""
        count = self.entries.count
        unseen = max(0, self.hw - self.next - self.ahead
                     - sum(end - first for first, end in self.left_out) - self.spilled)
        return {
            "active": count(AVAILABLE, LOCKED, QUEUED) + unseen,
            "locked": count(LOCKED),
            "deferred": count(DEFERRED, DEFERRED_LOCKED),
            "dead_letter": count(DEAD, DEAD_LOCKED),
            "transfer_dead_letter": count(TRANSFER_DEAD, TRANSFER_DEAD_LOCKED),
            "scheduled": count(SCHEDULED),
            "start": self.start, "next": self.next, "hw": self.hw,
            # how far the log scanner has read (None: not scanned): counts of
            # a filtered subscription are final up to here
            "scanned": self.scanned,
        }

    def summary(self) -> dict[str, Any]:
        """The compacted state record of this window."""
        return {"entity": self.entity, "partition": self.partition, **self.stats(),
                "totals": dict(self.totals)}


def _final_and_ok(cmd: Command[Args], result: dict[str, Any]) -> bool:
    """A settlement final once appended (the intake keeps ``quiet`` only
    then) whose every item applied: its client took it as ok at the append
    and never asks again, so its answer is not kept. That is most
    settlements of a thread settling one message at a time, and each kept
    answer is a key: a RocksDB write and a changelog record. Were it read
    again (the engine restarted before committing its offset), its locks
    are gone and it changes nothing (``lock_lost``)."""
    return sent_quiet(cmd) and all(status == "ok" for status, _ in result["results"])


def _coalesced(events: list[Event]) -> list[Event]:
    """One event per kind and detail: a batch dead-lettered with one reason
    is one event naming all of its offsets, not one event per message."""
    if len(events) < 2:  # a one-message settlement's: nothing to merge it with
        return [Event(ev.type, list(ev.offsets), dict(ev.extra)) for ev in events]
    merged: dict[tuple[str, str], Event] = {}
    out: list[Event] = []
    for ev in events:
        key = (ev.type, json.dumps(ev.extra, sort_keys=True))
        mergeable = bool(ev.offsets) and "count" not in ev.extra
        if mergeable and key in merged:
            merged[key].offsets.extend(ev.offsets)
            continue
        copy = Event(ev.type, list(ev.offsets), dict(ev.extra))
        if mergeable:
            merged[key] = copy
        out.append(copy)
    return out


#: an operation's handler: ``(window, command, now, events) -> result``
Handler = Callable[[InflightWindow, Command[Any], int, list[Event]], dict[str, Any]]
#: what the window runs for each operation (administrative ones never reach it)
HANDLERS: Mapping[Op, Handler] = {
    Op.ACQUIRE: InflightWindow._acquire,
    Op.ACQUIRE_DEFERRED: InflightWindow._acquire_deferred,
    Op.SETTLE: InflightWindow._settle,
    Op.STATS: InflightWindow._stats,
    Op.PEEK: InflightWindow._peek_command,
    Op.ANNOUNCE: InflightWindow._announce,
    Op.CANCEL: scheduling.cancel,
    Op.LOCK_SESSION: sessions.lock,
    Op.RENEW_SESSION: sessions.renew,
    Op.RELEASE_SESSION: sessions.release,
    Op.SESSION_STATE: sessions.get_state,
    Op.SET_SESSION_STATE: sessions.set_state,
    Op.LIST_SESSIONS: sessions.listing,
    Op.EXPIRE: InflightWindow._expire_command,
    Op.ACCEPT: acceptance.accept,
    Op.DEAD_FORWARDED: acceptance.dead_forwarded,
}
