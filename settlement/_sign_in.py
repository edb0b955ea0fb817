"""Signing in: credentials the broker refuses are reported at once.

librdkafka retries a refused SASL sign-in forever, and every call then
fails as if the broker were away (``Broker transport failure``) once its own
timeout passes, while the log fills with one error line per attempt. The SDK
raises ``ServiceBusAuthenticationError`` when the service refuses the
credentials, and does not retry it. So a client with credentials signs in
once before its first sender or receiver (as the SDK connects on first use):
a refusal raises that error within about a second, naming the namespace and
the broker's reason.
"""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from settlement.exceptions import denied
from topics.connection import ConnectionSettings

#: how long one metadata request may take before the refusal is looked for
_ATTEMPT_S = 0.5


def check_sign_in(settings: ConnectionSettings, timeout: float = 10.0) -> None:
    """Raise ``ServiceBusAuthenticationError`` if the brokers refuse the
    SASL credentials of ``settings``. Returns when they accept them, when
    there are none, or after ``timeout`` without an answer (the first real
    call then reports the broker as unreachable)."""
    if "sasl.username" not in settings.security:
        return
    refusals: list[KafkaError] = []

    def on_error(error: KafkaError) -> None:
        if error.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            refusals.append(error)

    # log_level 0: the refusal is raised below, not logged once per attempt
    # (confluent-kafka annotates AdminClient's config without the callbacks it takes)
    admin = AdminClient({**settings.kafka_config(),
                         "error_cb": on_error,  # type: ignore[dict-item]
                         "log_level": 0})
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=_ATTEMPT_S)
            return
        except KafkaException:
            admin.poll(0)  # serves error_cb
        if refusals:
            refused = denied(refusals[0].name(), "", f"namespace {settings.namespace!r} on "
                             f"{settings.bootstrap_servers} ({refusals[0].str()})")
            if refused is not None:  # always, for these error names
                raise refused
        if time.monotonic() > deadline:
            return
