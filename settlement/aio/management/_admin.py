"""The asyncio ServiceBusAdministrationClient, as ``azure.servicebus.aio.management``'s.

Every method is the sync client's (:mod:`settlement.management`), run on a
worker thread: the same validation, the same Kafka topics and engine
commands, the same azure-core errors. ``list_*`` methods return azure-core's
``AsyncItemPaged`` (``async for queue in admin.list_queues()``), as the SDK's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any

from azure.core.async_paging import AsyncItemPaged, AsyncList

from settlement.aio._offload import Offloader
from settlement.management import ServiceBusAdministrationClient as SyncAdmin

#: worker threads of one administration client
_WORKERS = 8


def _awaitable(name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
    """An async method running the sync client's method ``name`` on a worker thread."""

    async def method(self: ServiceBusAdministrationClient, *args: Any, **kwargs: Any) -> Any:
        return await self._offload.run(getattr(self._sync, name), *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = getattr(SyncAdmin, name).__doc__
    return method


def _paged(name: str) -> Callable[..., AsyncItemPaged[Any]]:
    """A method returning an ``AsyncItemPaged`` of the sync method ``name``'s
    list, fetched on a worker thread when iteration starts."""

    def method(self: ServiceBusAdministrationClient, *args: Any, **kwargs: Any
               ) -> AsyncItemPaged[Any]:
        fetch = functools.partial(getattr(self._sync, name), *args, **kwargs)

        async def get_next(_continuation: str | None) -> list[Any]:
            return await self._offload.run(fetch)

        async def extract_data(items: list[Any]) -> tuple[None, AsyncList[Any]]:
            return None, AsyncList(items)  # one page: no continuation

        return AsyncItemPaged(get_next, extract_data)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = getattr(SyncAdmin, name).__doc__
    return method


class ServiceBusAdministrationClient:
    """Administration of queues, topics, subscriptions and rules, awaitable.

    ``ServiceBusAdministrationClient(fully_qualified_namespace, credential)``
    or :meth:`from_connection_string`, with the sync client's arguments."""

    def __init__(self, fully_qualified_namespace: str, credential: Any, **kwargs: Any) -> None:
        self._wrap(SyncAdmin(fully_qualified_namespace, credential, **kwargs))

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any
                               ) -> ServiceBusAdministrationClient:
        client = cls.__new__(cls)
        client._wrap(SyncAdmin.from_connection_string(conn_str, **kwargs))
        return client

    def _wrap(self, sync: SyncAdmin) -> None:
        self._sync = sync
        self._offload = Offloader(_WORKERS)

    create_namespace = _awaitable("create_namespace")
    get_namespace_properties = _awaitable("get_namespace_properties")
    update_namespace_properties = _awaitable("update_namespace_properties")

    create_queue = _awaitable("create_queue")
    get_queue = _awaitable("get_queue")
    get_queue_runtime_properties = _awaitable("get_queue_runtime_properties")
    update_queue = _awaitable("update_queue")
    delete_queue = _awaitable("delete_queue")
    list_queues = _paged("list_queues")
    list_queues_runtime_properties = _paged("list_queues_runtime_properties")
    list_queue_sessions_runtime_properties = _paged("list_queue_sessions_runtime_properties")

    create_topic = _awaitable("create_topic")
    get_topic = _awaitable("get_topic")
    get_topic_runtime_properties = _awaitable("get_topic_runtime_properties")
    update_topic = _awaitable("update_topic")
    delete_topic = _awaitable("delete_topic")
    list_topics = _paged("list_topics")
    list_topics_runtime_properties = _paged("list_topics_runtime_properties")

    create_subscription = _awaitable("create_subscription")
    get_subscription = _awaitable("get_subscription")
    get_subscription_runtime_properties = _awaitable("get_subscription_runtime_properties")
    update_subscription = _awaitable("update_subscription")
    delete_subscription = _awaitable("delete_subscription")
    list_subscriptions = _paged("list_subscriptions")
    list_subscriptions_runtime_properties = _paged("list_subscriptions_runtime_properties")
    list_subscription_sessions_runtime_properties = _paged(
        "list_subscription_sessions_runtime_properties")

    create_rule = _awaitable("create_rule")
    get_rule = _awaitable("get_rule")
    update_rule = _awaitable("update_rule")
    delete_rule = _awaitable("delete_rule")
    list_rules = _paged("list_rules")

    async def close(self) -> None:
        await self._offload.run(self._sync.close)
        self._offload.close()

    async def __aenter__(self) -> ServiceBusAdministrationClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
