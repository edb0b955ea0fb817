"""Evaluations per second of compiled Service Bus SQL filters, on one core.

``python -m bench.filters [--seconds S]``

Each filter is compiled once (:func:`topics.rules.compile_filter`) and run
against a pool of distinct messages whose views are built beforehand: a topic
builds one :class:`~topics.rules.MessageView` per message and runs every
subscription's rule on it, so the view's cost is printed on its own line. The
target is 100,000 evaluations/s per filter.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from topics.rules import MessageView, compile_filter

TARGET = 100_000

FILTERS = {
    "simple equality": "region = 'eu'",
    "AND of comparisons": "user.region = 'eu' AND user.amount > 100",
    "IN list": "user.region IN ('eu', 'us', 'apac', 'latam')",
    "LIKE": "sys.Label LIKE 'order-%'",
    "arithmetic": "user.amount * 1.2 + 5 > 100",
    "correlation (sys)": ("sys.CorrelationId = 'c-7' AND sys.ContentType = 'application/json'"
                          " AND sys.Label = 'order-eu'"),
}

REGIONS = ("eu", "us", "apac", "latam", "mea")


def message(n: int) -> tuple[dict[str, object], dict[str, object]]:
    """System and application properties of the n-th message of the pool."""
    region = REGIONS[n % len(REGIONS)]
    system = {"messageid": f"m{n}", "correlationid": f"c-{n % 10}", "label": f"order-{region}",
              "contenttype": "application/json", "sequencenumber": n, "deliverycount": 1}
    return system, {"Region": region, "amount": n % 250, "Customer": f"cust-{n % 97}"}


def rate(seconds: float, step: int, run: Callable[[], object]) -> float:
    """Operations per second of ``run`` (``step`` operations a call), over about ``seconds``."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        run()
        done += step
    return done / elapsed


def evaluating(matches: Callable[[MessageView], bool], views: list[MessageView]
               ) -> Callable[[], None]:
    """One pass of a compiled filter over the pool."""

    def evaluate() -> None:
        for view in views:
            matches(view)

    return evaluate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.filters")
    p.add_argument("--seconds", type=float, default=0.5, help="measuring time per filter")
    p.add_argument("--messages", type=int, default=1_000, help="distinct messages in the pool")
    args = p.parse_args(argv)
    pool = [message(n) for n in range(args.messages)]
    views = [MessageView(system, user) for system, user in pool]

    def build_views() -> None:
        for system, user in pool:
            MessageView(system, user)

    print(f"one core, {len(views):,} distinct messages, target {TARGET:,} evaluations/s")
    worst = float("inf")
    for label, expression in FILTERS.items():
        evaluate = evaluating(compile_filter(expression).matches, views)
        per_second = rate(args.seconds, len(views), evaluate)
        worst = min(worst, per_second)
        verdict = ("met" if per_second >= TARGET
                   else f"MISSED: {per_second / TARGET:.0%} of it")
        print(f"  {label:<20} {per_second:>12,.0f}/s  {verdict:<22} {expression}")
    print(f"  {'MessageView build':<20} {rate(args.seconds, len(pool), build_views):>12,.0f}/s"
          "  (once per message, shared by all rules)")
    print(f"slowest filter: {worst:,.0f}/s, {worst / TARGET:.1f}x the target")
    return 0 if worst >= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
