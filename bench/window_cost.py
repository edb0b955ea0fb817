"""CPU cost of the engine's window state machine per command, without Kafka.

``python -m bench.window_cost [--messages N] [--batch B]``

Replays what a peek-lock receiver does -- ``acquire(B)`` then ``settle(B)``
until N messages are completed -- against :class:`streams.window.InflightWindow`
the way ``streams.command_agent`` does per command (decode the command, load
the window from its header, apply, encode the header with the command's
writes), over an in-memory store, and reports the time of each step and how
big a command's commit record gets (what it writes to the changelog at once).

``--each G``: settle one message per command instead, as a thread calling
``complete_message`` does, the commands sent quiet (final at their append)
and applied G at a time as the engine applies the commands it read together
(``InflightWindow.apply_settlements``); the costs are then per settle command.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from typing import ParamSpec, TypeVar, cast

from streams.store import MemoryStore
from streams.window import InflightWindow
from topics.commands import (
    AcquireArgs,
    Action,
    ClientArgs,
    Command,
    Grant,
    Policy,
    ReplyAddress,
    SettleArgs,
    SettleItem,
    decode_command,
    encode_command,
    grants_from_wire,
)

P = ParamSpec("P")
R = TypeVar("R")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.window_cost")
    p.add_argument("--messages", "-n", type=int, default=20_000)
    p.add_argument("--batch", "-b", type=int, default=500)
    p.add_argument("--each", type=int, default=0, metavar="G",
                   help="settle one message per command, G commands applied together")
    args = p.parse_args(argv)
    n, b = args.messages, args.batch
    if args.each:
        return _each(n, b, args.each)
    policy, reply = Policy(300_000, 10), ReplyAddress(0, "bench")
    store = MemoryStore()
    raw: bytes | None = None
    cost = {"decode_command": 0.0, "load": 0.0, "apply": 0.0, "commit_record": 0.0}
    sizes: list[int] = []
    grants: list[Grant] = []
    now = int(time.time() * 1000)
    commands = 0

    def step(name: str, fn: Callable[P, R], *a: P.args, **kw: P.kwargs) -> R:
        t0 = time.perf_counter()
        out = fn(*a, **kw)
        cost[name] += time.perf_counter() - t0
        return out

    for _ in range(n // b):
        for op in ("acquire", "settle"):
            args_: ClientArgs
            if op == "acquire":
                args_ = AcquireArgs("active", "peek_lock", b, n)
            else:
                args_ = SettleArgs(tuple(SettleItem(g.offset, g.lock_token, Action.COMPLETE)
                                         for g in grants))
            wire = encode_command(Command(uuid.uuid4().hex, "q", 0, args_, reply))
            cmd = step("decode_command", decode_command, wire)
            window = step("load", InflightWindow.load, raw, "q", 0, store)
            outcome = step("apply", window.apply, cmd, now, (0, policy))
            raw = step("commit_record", window.commit_record, outcome.writes)
            store.apply(outcome.writes)
            sizes.append(len(raw))
            commands += 1
            if op == "acquire":
                grants = grants_from_wire(outcome.result["grants"])
    total = sum(cost.values())
    print(f"{commands} commands (acquire {b} + settle {b}) for {n:,} messages")
    for name, seconds in cost.items():
        print(f"  {name:<15} {seconds * 1000 / commands:7.2f} ms/command "
              f"({seconds / total:4.0%})")
    print(f"  all             {total * 1000 / commands:7.2f} ms/command -> this alone caps one "
          f"engine at {n / total:,.0f} msg/s")
    print(f"commit record: max {max(sizes):,} B, last {sizes[-1]:,} B; "
          f"{len(store):,} keys stored at the end")
    return 0


def _each(n: int, b: int, together: int) -> int:
    """``acquire(b)``, then a quiet one-item settle command per message,
    applied ``together`` at a time, until ``n`` messages are completed."""
    policy, reply = Policy(300_000, 10), ReplyAddress(0, "bench")
    store = MemoryStore()
    raw: bytes | None = None
    now = int(time.time() * 1000)
    decoding = applying = 0.0
    commands = 0
    for _ in range(n // b):
        window = InflightWindow.load(raw, "q", 0, store)
        outcome = window.apply(Command(uuid.uuid4().hex, "q", 0,
                                       AcquireArgs("active", "peek_lock", b, n), reply),
                               now, (0, policy))
        raw = window.commit_record(outcome.writes)
        store.apply(outcome.writes)
        wires = [encode_command(Command(uuid.uuid4().hex, "q", 0, SettleArgs(
            (SettleItem(g.offset, g.lock_token, Action.COMPLETE),), quiet=True,
            until=g.locked_until_ms), reply))
            for g in grants_from_wire(outcome.result["grants"])]
        for first in range(0, len(wires), together):
            t0 = time.perf_counter()
            cmds = [decode_command(wire) for wire in wires[first:first + together]]
            t1 = time.perf_counter()
            window = InflightWindow.load(raw, "q", 0, store)
            done = window.apply_settlements([(cast("Command[SettleArgs]", cmd), now)
                                             for cmd in cmds], (0, policy))
            raw = window.commit_record(done.writes)
            store.apply(done.writes)
            decoding += t1 - t0
            applying += time.perf_counter() - t1
            commands += len(cmds)
    print(f"{commands:,} settle commands of one message, {together} applied together")
    print(f"  decode_command  {decoding * 1e6 / commands:7.1f} us/command")
    print(f"  load + apply_settlements + commit_record "
          f"{applying * 1e6 / commands:7.1f} us/command")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
