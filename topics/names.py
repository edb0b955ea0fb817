"""The one place that names every Kafka topic of a namespace and an entity.

A namespace prefixes every topic so several namespaces share one cluster:

=============================  =============================================
``NS.queue.ENTITY``            the entity's message log (payloads, read by receivers)
``NS.__commands``              acquire/settle commands to the engine, keyed by window
``NS.__replies``               the engine's answers, one partition per client
``NS.__events``                append-only settlement events (for Spark)
``NS.__state``                 compacted: each in-flight window's summary (for Spark)
``NS.__entities``              compacted: entity definitions (queue properties)
=============================  =============================================

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
    return f"{namespace}.queue.{validate_entity(entity)}"


def entity_of_log(topic: str) -> str:
    """The entity whose message log ``topic`` is (``NS.queue.ENTITY``)."""
    return topic.split(".queue.", 1)[-1]


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
    """``'orders/$deadletterqueue'`` -> ``('orders', True)``."""
    if path.lower().endswith(DEAD_LETTER_SUFFIX):
        return validate_entity(path[: -len(DEAD_LETTER_SUFFIX)]), True
    return validate_entity(path), False
