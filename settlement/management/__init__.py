"""Administration of queues, as ``azure.servicebus.management``."""

from settlement._properties import QueueProperties, QueueRuntimeProperties
from settlement.management._admin import ServiceBusAdministrationClient

__all__ = ["ServiceBusAdministrationClient", "QueueProperties", "QueueRuntimeProperties"]
