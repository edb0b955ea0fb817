"""Any record of the entities topic: a definition, read back by its ``kind``."""

from __future__ import annotations

import json

from topics.entities.json_form import from_definition
from topics.entities.namespace import NamespaceProperties
from topics.entities.queue import QueueProperties
from topics.entities.rule import RuleProperties
from topics.entities.topic import SubscriptionProperties, TopicProperties

Definition = (QueueProperties | TopicProperties | SubscriptionProperties | RuleProperties
              | NamespaceProperties)


def load_definition(raw: bytes) -> Definition:
    """Any definition of the entities topic, by its ``kind`` (queues written
    before topics existed carry none); the namespace's own record too."""
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise ValueError("a definition must be a JSON object")
    kind = body.get("kind", "queue")
    if kind == "topic":
        return from_definition(TopicProperties, body)
    if kind == "subscription":
        return from_definition(SubscriptionProperties, body)
    if kind == "rule":
        return RuleProperties.from_body(body)
    if kind == "queue":
        return from_definition(QueueProperties, body)
    if kind == "namespace":
        return from_definition(NamespaceProperties, body)
    raise ValueError(f"unknown definition kind {kind!r}")
