"""Service Bus settlement semantics on Apache Kafka, with the azure-servicebus names.

Port code from ``azure.servicebus`` by changing the import and the connection
string (``Endpoint=kafka://HOST:PORT;Namespace=NAME``).
"""

from settlement._retry import RetryMode
from settlement._session import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusSession,
    ServiceBusSessionFilter,
)
from settlement.batch import ServiceBusMessageBatch
from settlement.client import ServiceBusClient
from settlement.lock_renewer import AutoLockRenewer
from settlement.message import ServiceBusMessage, ServiceBusMessageState, ServiceBusReceivedMessage
from settlement.pairing import SendAvailabilityPairedNamespaceOptions
from settlement.receiver import (
    ServiceBusReceiveMode,
    ServiceBusReceiver,
    ServiceBusSubQueue,
    SettlementResult,
)
from settlement.sender import ServiceBusSender

__all__ = [
    "NEXT_AVAILABLE_SESSION",
    "AutoLockRenewer",
    "RetryMode",
    "SendAvailabilityPairedNamespaceOptions",
    "ServiceBusClient",
    "ServiceBusMessage",
    "ServiceBusMessageBatch",
    "ServiceBusMessageState",
    "ServiceBusReceiveMode",
    "ServiceBusReceivedMessage",
    "ServiceBusReceiver",
    "ServiceBusSender",
    "ServiceBusSession",
    "ServiceBusSessionFilter",
    "ServiceBusSubQueue",
    "SettlementResult",
]
