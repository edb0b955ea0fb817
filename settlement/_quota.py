"""A queue's or a topic's ``max_size_in_megabytes``, enforced where sends start.

Kafka has no quota per log that would refuse a produce with a reason, so
the sender checks before it produces: a send that would take the entity past
its quota fails with ``QuotaExceeded`` (not retryable: the same send fails
until messages leave or the quota is raised). The size is what
``get_queue_runtime_properties().size_in_bytes`` reports, the messages still
in play; a topic stores each message once, in its log, so its size is that
of its fullest subscription (a topic without subscriptions holds nothing).

Measuring costs a few engine round trips and log reads, too much for every
send, so the guard measures once, then adds what this sender sent, and
measures again only when that estimate would pass the quota, or when the
measurement is older than :data:`STALE_S` while the estimate is above
:data:`NEAR` of the quota (other senders and receivers move the size too).
Several senders to one entity may pass its quota together by what each sent
since its last measurement, at most.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaException

from settlement._engine_link import EngineLink
from settlement._entities import EntityRegistry
from settlement.exceptions import ServiceBusError, ServiceBusQuotaExceededError
from settlement.management._queue_size import entity_size_in_bytes
from topics.connection import ConnectionSettings

log = logging.getLogger(__name__)
#: seconds after which a measurement near the quota is taken again
STALE_S = 5.0
#: the share of the quota above which a stale measurement is taken again
NEAR = 0.8
#: messages read per partition to measure (the size beyond is extrapolated)
SAMPLE = 1_000
_MB = 1024 * 1024


class QuotaGuard:
    """Refuses sends that would take one queue or topic past its quota."""

    def __init__(self, settings: ConnectionSettings, registry: EntityRegistry,
                 engine: Callable[[], EngineLink], entity_name: str, *, topic: bool) -> None:
        self._settings = settings
        self._registry = registry
        self._engine = engine
        self._name = entity_name
        self._kind = "topic" if topic else "queue"
        self._lock = threading.Lock()
        self._measured = 0
        #: when the size was last measured (monotonic), None before the first send
        self._measured_at: float | None = None
        self._quota_mb = 0
        #: bytes this guard let through since the last measurement
        self._sent = 0
        #: time.monotonic() before which a size that could not be read is not asked again
        self._unreadable_until = 0.0

    def check(self, nbytes: int) -> None:
        """Raise ``ServiceBusQuotaExceededError`` if sending ``nbytes`` more
        would take the entity past its quota; otherwise count them as sent.
        A size that cannot be read (no right to describe the log, an entity
        that is gone) does not stop the send: its produce reports what is
        wrong, as it did before quotas; the size is asked again later."""
        with self._lock:
            if time.monotonic() < self._unreadable_until:
                return
            if self._measured_at is None or self._worth_measuring(nbytes, self._measured_at):
                try:
                    self._measure()
                except (KafkaException, ServiceBusError) as exc:
                    log.warning("the size of %s %r cannot be read for its quota (%s); sends "
                                "are not checked for %.0f s", self._kind, self._name, exc,
                                STALE_S)
                    self._unreadable_until = time.monotonic() + STALE_S
                    return
            size = self._measured + self._sent
            if size + nbytes > self._quota_mb * _MB:
                raise self._exceeded(size, nbytes)
            self._sent += nbytes

    def _worth_measuring(self, nbytes: int, measured_at: float) -> bool:
        estimate = self._measured + self._sent
        quota = self._quota_mb * _MB
        return estimate + nbytes > quota or (
            estimate > NEAR * quota and time.monotonic() - measured_at > STALE_S)

    def _measure(self) -> None:
        """The entity's size and quota now. The quota is read again from the
        entities topic (so that update_queue and update_topic take effect),
        except on the first send: the sender has just read it."""
        link = self._engine()
        fresh = self._measured_at is not None
        if self._kind == "queue":
            props = self._registry.get(self._name, fresh=fresh)
            self._quota_mb = props.max_size_in_megabytes
            size = entity_size_in_bytes(self._settings, link, props, sample=SAMPLE)
        else:
            self._quota_mb = self._registry.get_topic(self._name, fresh=fresh
                                                      ).max_size_in_megabytes
            size = max((entity_size_in_bytes(self._settings, link, sub, sample=SAMPLE)
                        for sub in self._registry.subscriptions_of(self._name, fresh=fresh)),
                       default=0)
        self._measured, self._measured_at, self._sent = size, time.monotonic(), 0

    def _exceeded(self, size: int, nbytes: int) -> ServiceBusQuotaExceededError:
        return ServiceBusQuotaExceededError(
            f"{self._kind} {self._name!r} holds {size} bytes and its quota is "
            f"max_size_in_megabytes={self._quota_mb} ({self._quota_mb * _MB} bytes): this send "
            f"of {nbytes} bytes would pass it. Receive or delete messages"
            + (" from its subscriptions" if self._kind == "topic" else "")
            + f", or raise max_size_in_megabytes with update_{self._kind} ('settlement "
            f"{self._kind} update {self._name} --max-size-in-megabytes N')",
            error_code="QuotaExceeded")
