"""Asyncio administration of queues, topics, subscriptions and rules, as
``azure.servicebus.aio.management``. The property and rule types
(``QueueProperties``, ``SqlRuleFilter``, ...) are :mod:`settlement.management`'s
own, under the same names."""

from typing import Any

from settlement import management as _sync
from settlement.aio.management._admin import (
    ServiceBusAdministrationClient as ServiceBusAdministrationClient,
)

__all__ = _sync.__all__


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(_sync, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
