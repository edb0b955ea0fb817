"""The asyncio ServiceBusClient, as ``azure.servicebus.aio``'s."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from settlement.aio._lock_renewer import AutoLockRenewer
from settlement.aio._offload import Offloader
from settlement.aio._receiver import ServiceBusReceiver, SyncRenewal
from settlement.aio._sender import ServiceBusSender
from settlement.aio._settle_groups import SettleGroups
from settlement.client import ServiceBusClient as SyncClient
from settlement.receiver import LockRenewer
from settlement.receiver import ServiceBusReceiver as SyncReceiver


class ServiceBusClient:
    """Creates asyncio senders and receivers for one namespace.

    Takes exactly what :class:`settlement.ServiceBusClient` takes:
    ``ServiceBusClient(fully_qualified_namespace, credential, **kwargs)``
    or ``ServiceBusClient.from_connection_string(conn_str, **kwargs)``.
    Its senders and receivers wrap the sync ones of one sync client; their
    blocking calls run on this client's worker threads, and its receivers'
    settlements are grouped per engine window, across receivers."""

    def __init__(self, fully_qualified_namespace: str, credential: Any, **kwargs: Any) -> None:
        self._wrap(SyncClient(fully_qualified_namespace, credential, **kwargs))

    @classmethod
    def from_connection_string(cls, conn_str: str, **kwargs: Any) -> ServiceBusClient:
        """A client of the namespace the connection string names; the
        keywords are :meth:`settlement.ServiceBusClient.from_connection_string`'s."""
        client = cls.__new__(cls)
        client._wrap(SyncClient.from_connection_string(conn_str, **kwargs))
        return client

    def _wrap(self, sync: SyncClient) -> None:
        self._sync = sync
        self._offload = Offloader()
        self._settles = SettleGroups(sync._settle_batcher, self._offload)

    @property
    def fully_qualified_namespace(self) -> str:
        return self._sync.fully_qualified_namespace

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> ServiceBusSender:
        self._sync._check_entity_path(queue_name, "queue")  # at once, as the SDK's
        return ServiceBusSender(
            functools.partial(self._sync.get_queue_sender, queue_name, **kwargs), self._offload)

    def get_topic_sender(self, topic_name: str, **kwargs: Any) -> ServiceBusSender:
        self._sync._check_entity_path(topic_name, "topic")
        return ServiceBusSender(
            functools.partial(self._sync.get_topic_sender, topic_name, **kwargs), self._offload)

    def get_queue_receiver(self, queue_name: str, **kwargs: Any) -> ServiceBusReceiver:
        """An asyncio receiver; the keywords are
        :meth:`settlement.ServiceBusClient.get_queue_receiver`'s."""
        self._sync._check_receiver_path(queue_name)
        return self._receiver(functools.partial(self._sync.get_queue_receiver, queue_name),
                              kwargs)

    def get_subscription_receiver(self, topic_name: str, subscription_name: str,
                                  **kwargs: Any) -> ServiceBusReceiver:
        self._sync._check_entity_path(topic_name, "topic")
        return self._receiver(functools.partial(self._sync.get_subscription_receiver,
                                                topic_name, subscription_name), kwargs)

    def _receiver(self, make: Callable[..., SyncReceiver], kwargs: dict[str, Any]
                  ) -> ServiceBusReceiver:
        renewal = _renewal(kwargs.pop("auto_lock_renewer", None))
        return ServiceBusReceiver(functools.partial(make, **kwargs), self._offload,
                                  self._settles, session=kwargs.get("session_id") is not None,
                                  renewal=renewal)

    async def list_queue_sessions(self, queue_name: str, **kwargs: Any) -> list[str]:
        return await self._offload.run(self._sync.list_queue_sessions, queue_name, **kwargs)

    async def list_subscription_sessions(self, topic_name: str, subscription_name: str,
                                         **kwargs: Any) -> list[str]:
        return await self._offload.run(self._sync.list_subscription_sessions, topic_name,
                                       subscription_name, **kwargs)

    async def close(self) -> None:
        """Wait for the settlements in flight and the release of what cancelled
        receives locked, then close every sender and receiver."""
        await self._settles.close()
        await self._offload.wait_abandoned()  # what cancelled receives locked goes back first
        await self._offload.run(self._sync.close)
        self._offload.close()

    async def __aenter__(self) -> ServiceBusClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _renewal(renewer: AutoLockRenewer | LockRenewer | None) -> SyncRenewal | None:
    """How a receiver's ``auto_lock_renewer`` reaches its sync receiver: an
    asyncio renewer is adapted to report its failures to the receiver's event
    loop; a sync one is taken as it is."""
    if renewer is None:
        return None
    if isinstance(renewer, AutoLockRenewer):
        return renewer._for_receiver
    sync_renewer = renewer
    return lambda _receiver, _loop: sync_renewer
