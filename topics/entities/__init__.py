"""Entity definitions: queues, topics, subscriptions, rules and the
namespace's own settings, as the client writes them to the namespace's
entities topic and the engine and Spark read them back (JSON, one record per
entity; see :mod:`topics.entities.json_form`)."""

from topics.entities.definition import Definition, load_definition
from topics.entities.namespace import (
    DEFAULT_ENGINE_PARTITIONS,
    MAX_ENGINE_PARTITIONS,
    NAMESPACE_KEY,
    NamespaceProperties,
    validate_engine_partitions,
)
from topics.entities.queue import QueueProperties
from topics.entities.rule import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from topics.entities.topic import SubscriptionProperties, TopicProperties

__all__ = [
    "DEFAULT_ENGINE_PARTITIONS", "MAX_ENGINE_PARTITIONS", "NAMESPACE_KEY", "CorrelationRuleFilter",
    "Definition", "FalseRuleFilter",
    "NamespaceProperties", "QueueProperties", "RuleFilter", "RuleProperties", "SqlRuleAction",
    "SqlRuleFilter", "SubscriptionProperties", "TopicProperties", "TrueRuleFilter",
    "load_definition", "validate_engine_partitions",
]
