"""The one place that names every Kafka topic of a namespace and an entity.

A namespace prefixes every topic so several namespaces share one cluster:

=============================  =============================================
``NS.queue.QUEUE``             a queue's message log (payloads, read by receivers)
``NS.topic.TOPIC``             a topic's message log, read by every subscription
``NS.__commands``              acquire/settle commands to the engine, keyed by window
``NS.__replies``               the engine's answers, one partition per client
``NS.__events``                append-only settlement events (for Spark)
``NS.__state``                 compacted: each in-flight window's summary (for Spark)
``NS.__entities``              compacted: entity definitions (queue properties)
``NS.__pairing``               compacted: where paired clients of other namespaces
                               send (on a secondary namespace)
=============================  =============================================

A subscription ``TOPIC/subscriptions/SUB`` has no log of its own: it is a
window of the engine over its topic's log, so a message published once is
stored once, and each subscription keeps its own locks, delivery counts and
dead letters. Queue and topic names share one namespace, as in Service Bus.

The dead-letter sub-queue ``ENTITY/$deadletterqueue`` is not a topic of its own:
a dead-lettered message stays at its offset in the entity's log and the engine
records it as dead-lettered. Dead-lettering is then a single state change in
the engine, so a crash can neither lose a message between two topics nor copy
it twice; the sub-queue is read by offset like the entity itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable

DEAD_LETTER_SUFFIX = "/$deadletterqueue"
SUBSCRIPTIONS = "/subscriptions/"
RULES = "/rules/"
TRANSFER_DEAD_LETTER_SUFFIX = "/$Transfer/$deadletterqueue"
_ENTITY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,199}$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9\-]{0,49}$")


class InvalidNameError(ValueError):
    """An entity or namespace name Kafka topics cannot carry."""


def validate_namespace(namespace: str) -> str:
    if not _NAMESPACE.match(namespace or ""):
        raise InvalidNameError(
            f"namespace {namespace!r} is invalid: use 1-50 letters, digits or '-', "
            "starting with a letter or digit"
        )
    return namespace


def validate_entity(entity: str) -> str:
    if not _ENTITY.match(entity or ""):
        raise InvalidNameError(
            f"entity name {entity!r} is invalid: use 1-200 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return entity


def entity_log(namespace: str, entity: str) -> str:
    """The log a queue or a subscription (``TOPIC/subscriptions/SUB``) reads."""
    if SUBSCRIPTIONS in entity:
        return topic_log(namespace, split_subscription_path(entity)[0])
    return f"{namespace}.queue.{validate_entity(entity)}"


def topic_log(namespace: str, topic: str) -> str:
    """A topic's log: every subscription of the topic reads it."""
    return f"{namespace}.topic.{validate_entity(topic)}"


def entity_of_log(topic: str) -> str:
    """The queue or topic whose message log ``topic`` is."""
    for kind in (".queue.", ".topic."):
        if kind in topic:
            return topic.split(kind, 1)[-1]
    return topic


def subscription_path(topic: str, subscription: str) -> str:
    """``TOPIC/subscriptions/SUB``: the subscription's entity path, the
    entity of its windows and commands."""
    return f"{validate_entity(topic)}{SUBSCRIPTIONS}{validate_entity(subscription)}"


def split_subscription_path(path: str) -> tuple[str, str]:
    """``'orders/subscriptions/eu'`` -> ``('orders', 'eu')``."""
    topic, found, subscription = path.partition(SUBSCRIPTIONS)
    if not found:
        raise InvalidNameError(f"{path!r} is not a subscription path: use "
                               "'TOPIC/subscriptions/SUBSCRIPTION'")
    return validate_entity(topic), validate_entity(subscription)


def rule_key(topic: str, subscription: str, rule: str) -> str:
    """Key of a rule's definition on the entities topic."""
    if not rule or len(rule) > 50 or "/" in rule:
        raise InvalidNameError(f"rule name {rule!r} is invalid: use 1-50 characters, no '/'")
    return f"{subscription_path(topic, subscription)}{RULES}{rule}"


def _namespace_topic(suffix: str) -> Callable[[str], str]:
    def name(namespace: str) -> str:
        return f"{namespace}.__{suffix}"

    name.__name__ = suffix
    name.__doc__ = f"``NS.__{suffix}``"
    return name


commands = _namespace_topic("commands")
replies = _namespace_topic("replies")
events = _namespace_topic("events")
state = _namespace_topic("state")
entities = _namespace_topic("entities")
pairing = _namespace_topic("pairing")

#: Backlog queues on a secondary namespace are ``PREFIX<primary namespace>.<i>``.
BACKLOG_QUEUE_PREFIX = "x-servicebus-transfer."


def backlog_queue(primary_namespace: str, index: int) -> str:
    """Backlog queue ``index`` of ``primary_namespace`` on its secondary."""
    return f"{BACKLOG_QUEUE_PREFIX}{primary_namespace}.{index}"


def primary_of_backlog_queue(queue: str) -> str | None:
    """The primary namespace whose backlog queue ``queue`` is (None: not one)."""
    if not queue.startswith(BACKLOG_QUEUE_PREFIX):
        return None
    primary, _, index = queue.removeprefix(BACKLOG_QUEUE_PREFIX).rpartition(".")
    return primary if primary and index.isdigit() else None


def engine_app_id(namespace: str) -> str:
    """Faust app id: names the engine's consumer group and its changelog topics."""
    return f"settlement-{namespace}"


def table_changelog(namespace: str, table: str) -> str:
    """The changelog topic Faust keeps for the engine's table ``table``."""
    return f"{engine_app_id(namespace)}-{table}-changelog"


def window_key(entity: str, partition: int) -> str:
    """Key of one entity partition's in-flight window (commands, state, tables)."""
    return f"{entity}#{partition}"


def split_window_key(key: str) -> tuple[str, int]:
    entity, _, partition = key.rpartition("#")
    return entity, int(partition)


def parse_entity_path(path: str) -> tuple[str, bool]:
    """``'orders/$deadletterqueue'`` -> ``('orders', True)``; a subscription
    path stays whole: ``'t/subscriptions/s/$deadletterqueue'`` ->
    ``('t/subscriptions/s', True)``."""
    dead = path.lower().endswith(DEAD_LETTER_SUFFIX)
    entity = path[: -len(DEAD_LETTER_SUFFIX)] if dead else path
    if SUBSCRIPTIONS in entity:
        return subscription_path(*split_subscription_path(entity)), dead
    return validate_entity(entity), dead
