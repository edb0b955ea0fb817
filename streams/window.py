"""The in-flight window of one entity partition: the engine's state machine.

Payloads stay in the entity's log; the engine only tracks offsets. For each
entity partition it keeps

* ``start``: every offset below it is settled or parked;
* ``next``: the first offset never handed out;
* ``hw``: the highest log end a receiver has reported;
* ``slots``: offsets in ``[start, next)`` still in play, each
  ``[state, delivery_count, lock_batch, locked_until_ms]``;
* ``parked``: deferred and dead-lettered offsets, which may stay for a long
  time and so live outside the ``start``..``next`` run, each
  ``[state, delivery_count, lock_batch, locked_until_ms, reason, description, source]``.

A renewed lock appends when it was taken (``locked_at_ms``) to its entry;
otherwise that is ``locked_until_ms - lock_ms``, so the common case stores
nothing more. Settlement events carry, per offset, how long the lock was held,
the delivery count and the enqueue time the receiver read from the log: what
the Spark monitor needs for lock-time percentiles and end-to-end latency.

Every operation is deterministic given the command and ``now``, and a command
id seen before returns its first answer, so the engine can re-process
commands after a crash (Kafka delivers them at least once) without granting or
settling anything twice. Nothing here knows Faust or Kafka; the engine's agent
loads a window, applies a command, stores it and sends the answer.
"""

from __future__ import annotations

import heapq
import itertools
import json
from typing import Any

from streams import acceptance, scheduling
from streams.states import (
    AVAILABLE,
    CANCELLED,
    COMPLETED,
    DEAD,
    DEAD_LOCKED,
    DEFERRED,
    DEFERRED_LOCKED,
    LOCKED,
    MAX_DELIVERY_REASON,
    PARKED_LOCKED,
    SCHEDULED,
    SUB_QUEUE_STATES,
    TRANSFER_DEAD,
    TRANSFER_DEAD_LOCKED,
    TTL_EXPIRED_REASON,
    UNLOCKED,
    Event,
    Outcome,
)
from topics.commands import Command, Policy, batch_id, lock_token, parse_lock_token

_RECENT = 64        # command ids remembered per window for idempotent replays
_SLOT_FIELDS = 4    # a slot's fields before an optional locked_at_ms
_PARKED_FIELDS = 7  # a parked entry's fields before an optional locked_at_ms
#: settle actions -> the event they produce
_SETTLED = {"complete": "completed", "abandon": "abandoned", "defer": "deferred",
            "renewed": "renewed", "scheduled": "scheduled"}


class InflightWindow:
    """In-flight offsets of one entity partition, and their state transitions."""

    def __init__(self, entity: str, partition: int) -> None:
        self.entity = entity
        self.partition = partition
        self.start = 0
        self.next = 0
        self.hw = 0
        self.slots: dict[int, list[Any]] = {}
        self.parked: dict[int, list[Any]] = {}
        self.recent: dict[str, Any] = {}
        self.lock_ms = 60_000
        self.max_delivery = 10
        self.dead_letter_expired = False
        self.duplicate_window_ms = 0
        self.default_ttl_ms = 0
        self.forward_to: str | None = None
        self.forward_dead_letters_to: str | None = None
        #: Accepted up to here (queues whose headers the engine scans); None: not scanned.
        self.scanned: int | None = None
        #: offset -> when it expires, for accepted messages with a time to live.
        self.expiries: dict[int, int] = {}
        self.totals: dict[str, int] = {}

    # ----------------------------------------------------------------- storage
    def to_bytes(self) -> bytes:
        """``b"<wake_ms>\\n<json>"``: the timer reads only the first line."""
        body = {
            "entity": self.entity, "partition": self.partition, "start": self.start,
            "next": self.next, "hw": self.hw, "lock_ms": self.lock_ms,
            "max_delivery": self.max_delivery, "dlq_expired": self.dead_letter_expired,
            "dup_ms": self.duplicate_window_ms, "ttl_ms": self.default_ttl_ms,
            "fwd": self.forward_to, "fwd_dlq": self.forward_dead_letters_to,
            "scanned": self.scanned, "expiries": list(self.expiries.items()),
            "totals": self.totals,
            "slots": [[o, *s] for o, s in self.slots.items()],
            "parked": [[o, *s] for o, s in self.parked.items()],
            "recent": list(self.recent.items()),
        }
        wake = self.wake_at()
        head = ("-" if wake is None else str(wake)) + ("" if self.scanned is None else " scan")
        return head.encode() + b"\n" + json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> InflightWindow:
        body = json.loads(raw.partition(b"\n")[2])
        win = cls(body["entity"], body["partition"])
        win.start, win.next, win.hw = body["start"], body["next"], body["hw"]
        win.lock_ms, win.max_delivery = body["lock_ms"], body["max_delivery"]
        win.dead_letter_expired = body.get("dlq_expired", False)
        win.duplicate_window_ms, win.default_ttl_ms = body.get("dup_ms", 0), body.get("ttl_ms", 0)
        win.scanned = body.get("scanned")
        win.forward_to, win.forward_dead_letters_to = body.get("fwd"), body.get("fwd_dlq")
        win.expiries = {o: t for o, t in body.get("expiries", [])}
        win.totals = body["totals"]
        win.slots = {s[0]: s[1:] for s in body["slots"]}
        win.parked = {p[0]: p[1:] for p in body["parked"]}
        win.recent = dict((k, v) for k, v in body["recent"])
        return win

    @staticmethod
    def wake_of(raw: bytes) -> int | None:
        """When the stored window next has work for the timer, without parsing it."""
        head = raw.partition(b"\n")[0].split(b" ")[0]
        return None if head in (b"-", b"") else int(head)

    @staticmethod
    def is_scanned(raw: bytes) -> bool:
        """Whether the engine reads this window's headers, without parsing it."""
        return raw.partition(b"\n")[0].endswith(b" scan")

    def wake_at(self) -> int | None:
        """The next time the timer has work here: a lock to lapse, a message due."""
        untils = [s[3] for s in self.slots.values() if s[0] == LOCKED]
        untils += [p[3] for p in self.parked.values()
                   if p[0] in PARKED_LOCKED or p[0] == SCHEDULED]
        expiry = acceptance.next_expiry(self)
        untils += [expiry] if expiry is not None else []
        return min(untils) if untils else None

    # -------------------------------------------------------------- dispatcher
    def apply(self, cmd: Command, now: int) -> Outcome:
        """Apply one command; a command id seen before returns its first answer."""
        adopted = cmd.policy is not None and self._adopt(cmd.policy)  # timers send none
        if cmd.id in self.recent:
            return Outcome(self._replay(cmd), [], changed=False)
        events = self._expire(now)
        if cmd.op == "acquire":
            result = self._acquire(cmd, now, events)
        elif cmd.op == "acquire_deferred":
            result = self._acquire_deferred(cmd, now, events)
        elif cmd.op == "settle":
            result = self._settle(cmd, now, events)
        elif cmd.op == "stats":
            self.see_log_end(cmd.args["hw"], events)
            result = self.stats()
        elif cmd.op == "peek":
            self.see_log_end(cmd.args["hw"], events)
            result = self._peek(cmd.args["sub"], cmd.args["from"], cmd.args["max"])
        elif cmd.op == "announce":
            result = self._announce(cmd.args["items"], events)
        elif cmd.op == "cancel":
            result = scheduling.cancel(self, cmd.args["offsets"], events)
        elif cmd.op == "accept":
            result = acceptance.accept(self, cmd.args["from"], cmd.args["to"],
                                       cmd.args["items"], events)
        elif cmd.op == "dead_forwarded":
            result = acceptance.dead_forwarded(self, cmd.args["offsets"], events)
        else:  # expire: the lapse above is all it asks for
            result = {}
        if cmd.op in ("acquire", "acquire_deferred", "settle", "announce", "cancel"):
            self._remember(cmd.id, result)
        self._advance_start()
        for ev in events:
            self.totals[ev.type] = self.totals.get(ev.type, 0) + ev.count
        return Outcome(result, events,
                       changed=adopted or bool(events) or cmd.op not in ("stats", "peek"))

    def _announce(self, items: list[list[int]], events: list[Event]) -> dict[str, Any]:
        """What a sender says of messages it sent: when they are due, when they
        expire (so the timer expires them even with no receiver)."""
        self.see_log_end(max(item[0] for item in items) + 1, events)  # the sender saw them
        for offset, _due, expires in items:
            if expires:
                self.expiries[offset] = expires
        scheduled = [[offset, due] for offset, due, _ in items if due]
        if not scheduled:
            return {"results": [["ok", 0] for _ in items]}
        answers = iter(scheduling.schedule(self, scheduled, events)["results"])
        return {"results": [next(answers) if due else ["ok", 0] for _, due, _ in items]}

    def _adopt(self, policy: Policy) -> bool:
        """Take the queue's policy from a command; True when it changed the window."""
        before = self._policy()
        self.lock_ms, self.max_delivery = policy.lock_ms, policy.max_delivery
        self.dead_letter_expired = policy.dead_letter_expired
        self.duplicate_window_ms = policy.duplicate_window_ms
        self.default_ttl_ms = policy.default_ttl_ms
        self.forward_to = policy.forward_to
        self.forward_dead_letters_to = policy.forward_dead_letters_to
        if policy.scanned and self.scanned is None:
            # From here on the scanner accepts offsets before they are handed out.
            self.scanned = self.next
        return self._policy() != before

    def _policy(self) -> tuple[Any, ...]:
        return (self.lock_ms, self.max_delivery, self.dead_letter_expired,
                self.duplicate_window_ms, self.default_ttl_ms, self.scanned, self.forward_to,
                self.forward_dead_letters_to)

    def _remember(self, cmd_id: str, result: dict[str, Any]) -> None:
        """Keep what is needed to answer the command again, compactly: the
        window is rewritten with every command, so its size is its cost."""
        if "grants" in result:  # acquires are rebuilt from their lock batch
            deleted = [g[0] for g in result["grants"] if g[1] is None]
            stored: Any = {"deleted": deleted} if deleted else None
        else:  # settlements: only the answers that are not a plain "ok"
            answers = result["results"]
            stored = {"n": len(answers),
                      "x": [[i, *a] for i, a in enumerate(answers) if a != ["ok", 0]]}
        self.recent[cmd_id] = stored
        while len(self.recent) > _RECENT:
            del self.recent[next(iter(self.recent))]

    def _replay(self, cmd: Command) -> dict[str, Any]:
        stored = self.recent[cmd.id]
        if cmd.op == "settle":
            answers: list[list[Any]] = [["ok", 0] for _ in range(stored["n"])]
            for index, status, until in stored["x"]:
                answers[index] = [status, until]
            return {"results": answers}
        batch = batch_id(cmd.id)
        grants = [self._grant(o, s) for o, s in sorted(self.slots.items())
                  if s[0] == LOCKED and s[2] == batch]
        grants += [self._grant(o, p) for o, p in sorted(self.parked.items())
                   if p[0] in PARKED_LOCKED and p[2] == batch]
        if stored and stored.get("deleted"):
            grants += [[o, None, 0, 0, None, None, None, "active"] for o in stored["deleted"]]
        return {"grants": grants, "next": self.next}

    # ------------------------------------------------------------------- lapse
    def _expire(self, now: int) -> list[Event]:
        """Lapse every lock that ended: a lapse counts as a delivery."""
        lapsed = [o for o, s in self.slots.items() if s[0] == LOCKED and s[3] <= now]
        events: list[Event] = []
        self._release(lapsed, events, "lock_expired")
        unparked = [o for o, p in self.parked.items() if p[0] in UNLOCKED and p[3] <= now]
        for o in unparked:
            self.parked[o][0] = UNLOCKED[self.parked[o][0]]
        if unparked:
            events.append(Event("lock_expired", unparked))
        scheduling.activate_due(self, now, events)
        acceptance.expire_due(self, now, events)
        return events

    def _release(self, offsets: list[int], events: list[Event], kind: str | None) -> None:
        """Make locked offsets available again, or dead-letter the ones that
        have used up their deliveries."""
        back, dead = [], []
        for o in offsets:
            slot = self.slots[o]
            if slot[1] >= self.max_delivery:
                dead.append(o)
            else:
                slot[0] = AVAILABLE
                back.append(o)
        if back and kind:
            events.append(Event(kind, back))
        if dead:
            description = (f"message was delivered {self.max_delivery} times "
                           f"(max_delivery_count {self.max_delivery}) without being settled")
            self._dead_letter(dead, MAX_DELIVERY_REASON, description, events)

    def _dead_letter(self, offsets: list[int], reason: str | None, description: str | None,
                     events: list[Event]) -> None:
        for o in offsets:
            slot = self.slots.pop(o, None) or self.parked.pop(o, None) or [DEAD, 0]
            self.parked[o] = [DEAD, slot[1], 0, 0, reason, description, self.entity]
        events.append(Event("dead_lettered", offsets,
                            {"reason": reason, "description": description}))

    # ----------------------------------------------------------------- acquire
    def see_log_end(self, hw: int, events: list[Event]) -> None:
        """Offsets below ``hw`` exist in the log (a receiver or sender saw them)."""
        first = max(self.hw, self.next)
        if hw > first:
            events.append(Event("enqueued", [], {"first": first, "count": hw - first}))
        self.hw = max(self.hw, hw)

    def _grant(self, offset: int, entry: list[Any]) -> list[Any]:
        state = {DEAD_LOCKED: "deadletter", TRANSFER_DEAD_LOCKED: "transferdeadletter",
                 DEFERRED_LOCKED: "deferred"}.get(entry[0], "active")
        extra = entry[4:7] if len(entry) >= _PARKED_FIELDS else [None, None, None]
        return [offset, lock_token(entry[2], offset), entry[3], entry[1], *extra, state]

    def _acquire(self, cmd: Command, now: int, events: list[Event]) -> dict[str, Any]:
        self.see_log_end(cmd.args["hw"], events)
        want, batch = cmd.args["max"], batch_id(cmd.id)
        until = now + self.lock_ms
        if cmd.args["sub"] in SUB_QUEUE_STATES:
            free, locked = SUB_QUEUE_STATES[cmd.args["sub"]]
            picked = [o for o, p in sorted(self.parked.items()) if p[0] == free][:want]
            for o in picked:
                entry = self.parked[o]
                entry[0], entry[1], entry[2], entry[3] = locked, entry[1] + 1, batch, until
                del entry[_PARKED_FIELDS:]
            if picked:
                events.append(Event("locked", picked, {"sub": cmd.args["sub"], "until": until}))
            return {"grants": [self._grant(o, self.parked[o]) for o in picked], "next": self.next}
        picked = [o for o, s in sorted(self.slots.items()) if s[0] == AVAILABLE][:want]
        picked += self._take_fresh(want - len(picked))
        if cmd.args["mode"] == "receive_and_delete":
            counts = []
            for o in picked:
                self.slots[o][1] += 1
                counts.append(self.slots[o][1])
                self._complete(o)
            if picked:
                events.append(Event("received_and_deleted", picked))
            return {"grants": [[o, None, 0, dc, None, None, None, "active"]
                               for o, dc in zip(picked, counts, strict=True)],
                    "next": self.next}
        for o in picked:
            slot = self.slots[o]
            slot[0], slot[1], slot[2], slot[3] = LOCKED, slot[1] + 1, batch, until
            del slot[_SLOT_FIELDS:]
        if picked:
            events.append(Event("locked", picked, {"until": until}))
        return {"grants": [self._grant(o, self.slots[o]) for o in picked], "next": self.next}

    def _take_fresh(self, want: int) -> list[int]:
        """Offsets never handed out, up to the log end; scheduled and cancelled
        ones are passed over (a cancelled one is then gone for good)."""
        taken: list[int] = []
        o = self.next
        end = self.hw if self.scanned is None else min(self.hw, self.scanned)
        while o < end and len(taken) < want:
            parked = self.parked.get(o)
            if parked is None:
                self.slots[o] = [AVAILABLE, 0, 0, 0]
                taken.append(o)
            elif parked[0] == CANCELLED:
                del self.parked[o]
            o += 1
        self.next = max(self.next, o)
        return taken

    def _complete(self, offset: int) -> None:
        """Settled for good. A slot below ``start`` (a scheduled message that
        became due after ``start`` passed it) is dropped at once."""
        if offset < self.start:
            del self.slots[offset]
        else:
            self.slots[offset][0] = COMPLETED

    def _acquire_deferred(self, cmd: Command, now: int, events: list[Event]) -> dict[str, Any]:
        batch, until = batch_id(cmd.id), now + self.lock_ms
        picked = [o for o in sorted(set(cmd.args["offsets"]))
                  if o in self.parked and self.parked[o][0] == DEFERRED]
        for o in picked:
            entry = self.parked[o]
            entry[0], entry[1], entry[2], entry[3] = DEFERRED_LOCKED, entry[1] + 1, batch, until
            del entry[_PARKED_FIELDS:]
        if picked:
            events.append(Event("locked", picked, {"sub": "deferred", "until": until}))
        return {"grants": [self._grant(o, self.parked[o]) for o in picked], "next": self.next}

    # ------------------------------------------------------------------ settle
    def _held(self, offset: int, token: str) -> list[Any] | None:
        """The locked entry a token still holds, None when the lock is lost."""
        parsed = parse_lock_token(token)
        if parsed is None or parsed[1] != offset:
            return None
        entry = self.slots.get(offset) or self.parked.get(offset)
        if entry is None or (entry[0] != LOCKED and entry[0] not in PARKED_LOCKED):
            return None
        return entry if entry[2] == parsed[0] else None

    def _settle(self, cmd: Command, now: int, events: list[Event]) -> dict[str, Any]:
        """Settle each item; answer each with ok, lock_lost or invalid."""
        done: dict[str, list[int]] = {}
        details: dict[int, list[Any]] = {}  # offset -> [held_ms, deliveries, enqueued_ms]
        statuses: list[list[Any]] = []
        first_event = len(events)
        for offset, token, action, reason, description, at, enqueued in cmd.args["items"]:
            entry = self._held(offset, token)
            if entry is None:
                statuses.append(["lock_lost", 0])
                continue
            if entry[0] in (DEAD_LOCKED, TRANSFER_DEAD_LOCKED) and action in ("dead_letter",
                                                                              "defer"):
                statuses.append(["invalid", 0])
                continue
            if action == "renew":
                self._renew(entry, now)
                statuses.append(["ok", entry[3]])
                done.setdefault("renewed", []).append(offset)
                continue
            details[offset] = [now - self._locked_at(entry), entry[1], enqueued]
            if action == "schedule":
                scheduling.park(self, offset, entry, at)
                action = "scheduled"
            elif action == "expire":
                self.expire_message(offset, events)
            else:
                self._apply_action(offset, entry, action, reason, description, events)
            statuses.append(["ok", 0])
            done.setdefault(action, []).append(offset)
        events.extend(Event(_SETTLED[k], v) for k, v in done.items() if k in _SETTLED)
        for ev in events[first_event:]:
            if ev.offsets and all(o in details for o in ev.offsets):
                held, deliveries, enqueued_at = zip(*(details[o] for o in ev.offsets),
                                                    strict=True)
                ev.extra.update(held=list(held), deliveries=list(deliveries),
                                enqueued=list(enqueued_at))
        return {"results": statuses}

    def _locked_at(self, entry: list[Any]) -> int:
        fields = _SLOT_FIELDS if len(entry) < _PARKED_FIELDS else _PARKED_FIELDS
        return int(entry[fields]) if len(entry) > fields else int(entry[3]) - self.lock_ms

    def _renew(self, entry: list[Any], now: int) -> None:
        """Extend a lock, keeping when it was taken (for the lock-time metrics)."""
        fields = _SLOT_FIELDS if len(entry) < _PARKED_FIELDS else _PARKED_FIELDS
        if len(entry) == fields:
            entry.append(self._locked_at(entry))
        entry[3] = now + self.lock_ms

    def _apply_action(self, offset: int, entry: list[Any], action: str, reason: str | None,
                      description: str | None, events: list[Event]) -> None:
        state = entry[0]
        if action == "complete":
            if state == LOCKED:
                self._complete(offset)
            else:
                del self.parked[offset]
        elif action == "abandon":
            if state == LOCKED:
                self._release([offset], events, None)
            else:
                entry[0] = UNLOCKED[state]
        elif action == "dead_letter":
            self._dead_letter([offset], reason, description, events)
        elif action == "defer":
            self.slots.pop(offset, None)
            self.parked[offset] = [DEFERRED, entry[1], 0, 0, None, None, None]

    def expire_message(self, offset: int, events: list[Event]) -> None:
        """Its time to live has passed: dead-letter it if the queue says so,
        otherwise drop it; either way it is never delivered again."""
        if self.dead_letter_expired:
            self._dead_letter([offset], TTL_EXPIRED_REASON,
                              "the message's time to live passed before it was completed",
                              events)
            return
        if offset in self.slots:
            self._complete(offset)
        elif offset >= self.next:  # never handed out: the grant loop must pass it over
            self.parked[offset] = [CANCELLED, 0, 0, 0, None, None, None]
        else:
            self.parked.pop(offset, None)
        events.append(Event("expired", [offset]))

    def _advance_start(self) -> None:
        while self.start < self.next:
            slot = self.slots.get(self.start)
            if slot is not None and slot[0] != COMPLETED:
                break
            self.slots.pop(self.start, None)
            parked = self.parked.get(self.start)
            if parked is None or parked[0] != SCHEDULED:  # settled, deferred or dead:
                self.expiries.pop(self.start, None)      # it can no longer expire
            self.start += 1

    # -------------------------------------------------------------------- peek
    def _peek(self, sub: str, first: int, want: int) -> dict[str, Any]:
        """Messages still in the (sub-)queue from offset ``first`` on, without
        locking them: ``[offset, state, delivery_count, reason, description, source]``."""
        shown = {state: sub for state in SUB_QUEUE_STATES[sub]} if sub in SUB_QUEUE_STATES else {
            DEFERRED: "deferred", DEFERRED_LOCKED: "deferred", SCHEDULED: "scheduled"}
        parked = ((o, [o, shown[p[0]], p[1], *p[4:7]]) for o, p in sorted(self.parked.items())
                  if o >= first and p[0] in shown)
        early = ((o, [o, "active", s[1], None, None, None]) for o, s in sorted(self.slots.items())
                 if first <= o < self.start)  # scheduled messages that came due late
        active = ((o, [o, "active", self.slots[o][1] if o in self.slots else 0, None, None, None])
                  for o in range(max(first, self.start), self.hw)
                  if o not in self.parked and (o >= self.next or self.slots.get(o, [COMPLETED])[0]
                                               != COMPLETED))
        streams = [parked] if sub in SUB_QUEUE_STATES else [parked, early, active]
        found = [entry for _, entry in itertools.islice(
            heapq.merge(*streams, key=lambda pair: pair[0]), want)]
        return {"messages": found}

    def retained_from(self) -> int:
        """The oldest offset the log must keep: everything below it is settled
        for good, so the log's start may advance to it (DeleteRecords)."""
        return min([self.start, *self.parked, *self.slots])

    # ------------------------------------------------------------------- stats
    def stats(self) -> dict[str, int]:
        """Counts for runtime properties; ``active`` includes locked messages."""
        in_window = sum(1 for s in self.slots.values() if s[0] != COMPLETED)
        parked_states = [p[0] for p in self.parked.values()]
        parked_ahead = sum(1 for o in self.parked if o >= self.next)
        unseen = max(0, self.hw - self.next - parked_ahead)
        return {
            "active": in_window + unseen,
            "locked": sum(1 for s in self.slots.values() if s[0] == LOCKED),
            "deferred": sum(1 for s in parked_states if s in (DEFERRED, DEFERRED_LOCKED)),
            "dead_letter": sum(1 for s in parked_states if s in (DEAD, DEAD_LOCKED)),
            "transfer_dead_letter": sum(1 for s in parked_states
                                        if s in (TRANSFER_DEAD, TRANSFER_DEAD_LOCKED)),
            "scheduled": sum(1 for s in parked_states if s == SCHEDULED),
            "start": self.start, "next": self.next, "hw": self.hw,
        }

    def summary(self) -> dict[str, Any]:
        """The compacted state record of this window."""
        return {"entity": self.entity, "partition": self.partition, **self.stats(),
                "totals": dict(self.totals)}

