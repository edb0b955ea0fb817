"""Administration of queues, topics, subscriptions and rules, as
``azure.servicebus.management``."""

from settlement._session_listing import SessionRuntimeProperties
from settlement.management._admin import ServiceBusAdministrationClient
from settlement.management._runtime import (
    QueueRuntimeProperties,
    SubscriptionRuntimeProperties,
    TopicRuntimeProperties,
)
from topics.entities import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    NamespaceProperties,
    QueueProperties,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    SubscriptionProperties,
    TopicProperties,
    TrueRuleFilter,
)

__all__ = [
    "ServiceBusAdministrationClient", "QueueProperties", "QueueRuntimeProperties",
    "TopicProperties", "TopicRuntimeProperties", "SubscriptionProperties",
    "SubscriptionRuntimeProperties", "RuleProperties", "SqlRuleFilter", "CorrelationRuleFilter",
    "TrueRuleFilter", "FalseRuleFilter", "SqlRuleAction", "SessionRuntimeProperties",
    "NamespaceProperties",
]
