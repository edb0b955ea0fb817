"""The namespace's limit of client commands per second, as one worker applies it.

Service Bus answers a namespace that sends more than its share with
``ServerBusy`` instead of queueing without bound: a queue of commands that
grows faster than the engine serves it delays every answer until clients
time out and send their commands again, which makes it grow faster still.

Each worker serves the share of the commands topic's partitions it is
assigned, so it admits that share of the namespace's limit, from a token
bucket that holds one second's worth (at least one command) for bursts.
Pure logic over the (monotonic) times it is given, so it is tested without
a clock.
"""

from __future__ import annotations

#: seconds between two log lines about busy answers (one per command would
#: flood the log exactly when the engine is loaded)
REPORT_EVERY_S = 5.0


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved; starts full."""

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self._tokens = self.burst
        self._at = now

    def take(self, now: float) -> bool:
        """Spend a token if one is there."""
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class CommandThrottle:
    """Admits client commands under the namespace's limit and counts the
    refused ones for an occasional log line."""

    def __init__(self) -> None:
        self._bucket: TokenBucket | None = None
        self._refused = 0
        self._reported_at = 0.0

    def admit(self, limit: int | None, share: float, now: float) -> bool:
        """Whether a command may run now, given the namespace's ``limit``
        (None: none) and this worker's ``share`` of the commands partitions."""
        if limit is None:
            self._bucket = None
            return True
        rate = limit * share
        if self._bucket is None or self._bucket.rate != rate:
            self._bucket = TokenBucket(rate, now)
        if self._bucket.take(now):
            return True
        self._refused += 1
        return False

    def refused_to_report(self, now: float) -> int:
        """How many commands were refused since the last report, once every
        :data:`REPORT_EVERY_S` (0 in between, or when there is none)."""
        if not self._refused or now - self._reported_at < REPORT_EVERY_S:
            return 0
        refused, self._refused, self._reported_at = self._refused, 0, now
        return refused
