"""Administration of queues, topics, subscriptions and rules, as
``azure.servicebus.management``."""

from settlement._namespace import NamespaceProperties
from settlement._properties import QueueProperties, QueueRuntimeProperties
from settlement._rules import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from settlement._session_listing import SessionRuntimeProperties
from settlement._topic_properties import (
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
)
from settlement.management._admin import ServiceBusAdministrationClient

__all__ = [
    "ServiceBusAdministrationClient", "QueueProperties", "QueueRuntimeProperties",
    "TopicProperties", "TopicRuntimeProperties", "SubscriptionProperties",
    "SubscriptionRuntimeProperties", "RuleProperties", "SqlRuleFilter", "CorrelationRuleFilter",
    "TrueRuleFilter", "FalseRuleFilter", "SqlRuleAction", "SessionRuntimeProperties",
    "NamespaceProperties",
]
