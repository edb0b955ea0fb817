"""Keyword arguments the azure-servicebus SDK accepts that have no meaning here.

Ported code passes the SDK's transport and AMQP options. Dropping them
silently would hide that a setting has no effect, so every public call
names the keywords it honours and hands the rest to :func:`refuse`, which
raises a ``TypeError`` saying why the keyword does not apply, or, for a
keyword the SDK does not know either, the error Python itself would give.
"""

from __future__ import annotations

from typing import Any

#: SDK keyword -> why it does not apply to Kafka
UNSUPPORTED = {
    "http_proxy": "Kafka clients connect to the brokers of the Endpoint directly, not "
                  "through an HTTP proxy",
    "custom_endpoint_address": "the Endpoint of the connection string (or the fully "
                               "qualified namespace) names the brokers to connect to",
    "ssl_context": "TLS trust goes in the connection string (CaFile=PATH) or in "
                   "connection_verify=PATH",
    "transport_type": "the transport is Kafka's protocol, not AMQP over TCP or WebSockets",
    "uamqp_transport": "there is no AMQP transport",
    "socket_timeout": "Kafka clients keep their connections; bound a call with timeout= "
                      "or max_wait_time= instead",
    "user_agent": "Kafka clients do not send a user agent",
    "connection_timeout": "Kafka clients connect in the background; bound a call with "
                          "timeout= or max_wait_time= instead",
}


def refuse(where: str, kwargs: dict[str, Any]) -> None:
    """Raise ``TypeError`` for the first of ``kwargs`` (pass what the call did
    not honour); return when there is none."""
    for name in kwargs:
        reason = UNSUPPORTED.get(name)
        if reason is not None:
            raise TypeError(f"{where}() keyword {name!r} is not supported here: {reason}")
        raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")


def check_timeout(timeout: float | None) -> float | None:
    """A ``timeout=`` keyword, checked as the SDK checks it (None: no bound)."""
    if timeout is not None and timeout <= 0:
        raise ValueError("The timeout must be greater than 0.")
    return timeout
