"""The asyncio twin of :mod:`settlement`, as ``azure.servicebus.aio``.

Port asyncio code from ``azure.servicebus.aio`` by changing the import and
the connection string. Senders and receivers wrap the sync ones (which own
the wire format and the lock state), running their blocking calls on worker
threads; concurrent settlements are grouped into one engine command per
window (:mod:`settlement.aio._settle_groups`).
"""

from settlement.aio._client import ServiceBusClient
from settlement.aio._lock_renewer import AutoLockRenewer
from settlement.aio._receiver import ServiceBusReceiver, ServiceBusSession
from settlement.aio._sender import ServiceBusSender

__all__ = [
    "AutoLockRenewer",
    "ServiceBusClient",
    "ServiceBusReceiver",
    "ServiceBusSender",
    "ServiceBusSession",
]
