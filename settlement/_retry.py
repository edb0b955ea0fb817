"""Client retries, with the azure-servicebus options and their defaults.

``ServiceBusClient.from_connection_string(conn, retry_total=3,
retry_backoff_factor=0.8, retry_backoff_max=120, retry_mode="exponential")``.
A failure is retried when its error says ``retryable`` (timeouts, a broker
that cannot be reached, an engine that does not answer, a busy namespace);
every other error raises at once. Waits carry +-20 % jitter, so clients that
failed together do not come back together. After a
:class:`~settlement.exceptions.ServiceBusServerBusyError` the wait is at
least 10 seconds, as the seed on throttling says.
"""

from __future__ import annotations

import enum
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from settlement.exceptions import ServiceBusError, ServiceBusServerBusyError

log = logging.getLogger(__name__)
T = TypeVar("T")
#: how long a throttled entity is left alone (the seed's "at least 10 seconds")
SERVER_BUSY_WAIT_S = 10.0
_JITTER = 0.2


class RetryMode(enum.StrEnum):
    """How the wait between attempts grows: ``fixed`` waits
    ``retry_backoff_factor`` each time, ``exponential`` doubles it."""

    FIXED = "fixed"
    EXPONENTIAL = "exponential"


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how far apart a failed operation is tried again."""

    total: int = 3
    backoff_factor: float = 0.8
    backoff_max: float = 120.0
    mode: RetryMode = RetryMode.EXPONENTIAL

    @classmethod
    def from_options(cls, *, retry_total: int = 3, retry_backoff_factor: float = 0.8,
                     retry_backoff_max: float = 120.0,
                     retry_mode: RetryMode | str = RetryMode.EXPONENTIAL) -> RetryPolicy:
        """The policy of the SDK's keyword options; bad values raise ValueError
        naming the option."""
        if isinstance(retry_total, bool) or not isinstance(retry_total, int) or retry_total < 0:
            raise ValueError(f"retry_total must be a whole number >= 0, not {retry_total!r}")
        for name, value in (("retry_backoff_factor", retry_backoff_factor),
                            ("retry_backoff_max", retry_backoff_max)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
        try:
            mode = RetryMode(str(getattr(retry_mode, "value", retry_mode)).lower())
        except ValueError:
            raise ValueError(f"retry_mode must be 'fixed' or 'exponential', not {retry_mode!r}"
                             ) from None
        return cls(retry_total, float(retry_backoff_factor), float(retry_backoff_max), mode)

    def backoff(self, retried: int, error: BaseException | None = None) -> float:
        """Seconds to wait before retry number ``retried + 1`` (0-based
        ``retried``): the mode's base, capped at ``backoff_max``, with jitter;
        at least :data:`SERVER_BUSY_WAIT_S` after a busy answer."""
        base = self.backoff_factor
        if self.mode is RetryMode.EXPONENTIAL:
            base *= 2 ** retried
        wait = min(self.backoff_max, base * random.uniform(1 - _JITTER, 1 + _JITTER))
        if isinstance(error, ServiceBusServerBusyError):
            wait = max(wait, SERVER_BUSY_WAIT_S)
        return wait

    def call(self, attempt: Callable[[], T], what: str, *,
             deadline: float | None = None) -> T:
        """Run ``attempt`` until it succeeds, raises an error that is not
        retryable, or the retries (or the ``deadline``, a ``time.monotonic``
        value) run out; then the last error is raised."""
        retried = 0
        while True:
            try:
                return attempt()
            except ServiceBusError as exc:
                wait = self.next_wait(retried, exc, deadline)
                if wait is None:
                    raise
                log.info("%s failed (%s); retry %d of %d in %.2f s", what, exc.message,
                         retried + 1, self.total, wait)
                time.sleep(wait)
                retried += 1

    def next_wait(self, retried: int, error: ServiceBusError, deadline: float | None = None
                  ) -> float | None:
        """The wait before the next attempt after ``error``, or None when it
        must not be retried: not retryable, retries used up, or the wait
        would pass the deadline."""
        if not error.retryable or retried >= self.total:
            return None
        wait = self.backoff(retried, error)
        if deadline is not None and time.monotonic() + wait > deadline:
            return None
        return wait

