"""CPU cost of the engine's window state machine per command, without Kafka.

``python -m bench.window_cost [--messages N] [--batch B]``

Replays what a peek-lock receiver does -- ``acquire(B)`` then ``settle(B)``
until N messages are completed -- against :class:`streams.window.InflightWindow`
the way ``streams.command_agent`` does per command (decode the command, load
the window from bytes, apply, store it as bytes), and reports the time of each
step and how big the stored window gets (that is also what every command
writes to RocksDB and the changelog topic).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from streams.window import InflightWindow
from topics.commands import Command, Policy, ReplyAddress, decode_command, encode_command


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.window_cost")
    p.add_argument("--messages", "-n", type=int, default=20_000)
    p.add_argument("--batch", "-b", type=int, default=500)
    args = p.parse_args(argv)
    n, b = args.messages, args.batch
    policy, reply = Policy(300_000, 10), ReplyAddress(0, "bench")
    raw = InflightWindow("q", 0).to_bytes()
    cost = {"decode_command": 0.0, "from_bytes": 0.0, "apply": 0.0, "to_bytes": 0.0}
    sizes: list[int] = []
    grants: list[list[object]] = []
    now = int(time.time() * 1000)
    commands = 0

    def step(name: str, fn, *a):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = fn(*a)
        cost[name] += time.perf_counter() - t0
        return out

    for _ in range(n // b):
        for op in ("acquire", "settle"):
            if op == "acquire":
                args_ = {"sub": "active", "mode": "peek_lock", "max": b, "hw": n}
            else:
                args_ = {"items": [[g[0], g[1], "complete", None, None] for g in grants]}
            wire = encode_command(Command(uuid.uuid4().hex, op, "q", 0, reply, policy, args_))
            cmd = step("decode_command", decode_command, wire)
            window = step("from_bytes", InflightWindow.from_bytes, raw)
            outcome = step("apply", window.apply, cmd, now)
            raw = step("to_bytes", window.to_bytes)
            sizes.append(len(raw))
            commands += 1
            if op == "acquire":
                grants = outcome.result["grants"]
    total = sum(cost.values())
    print(f"{commands} commands (acquire {b} + settle {b}) for {n:,} messages")
    for name, seconds in cost.items():
        print(f"  {name:<15} {seconds * 1000 / commands:7.2f} ms/command "
              f"({seconds / total:4.0%})")
    print(f"  all             {total * 1000 / commands:7.2f} ms/command -> this alone caps one "
          f"engine at {n / total:,.0f} msg/s")
    body = json.loads(raw.partition(b"\n")[2])
    recent = len(json.dumps(body["recent"], separators=(",", ":")))
    print(f"stored window: max {max(sizes):,} B, last {sizes[-1]:,} B, of which 'recent' "
          f"(remembered answers of the last {len(body['recent'])} commands) {recent:,} B")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
