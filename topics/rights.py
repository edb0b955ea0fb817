"""Service Bus rights as Kafka ACLs: the one place that says which topic and
group operations ``Send``, ``Listen`` and ``Manage`` need, and what the engine
needs.

Every topic of a namespace starts with ``NS.`` (see :mod:`topics.names`), and
so does every consumer group its clients use, so a namespace is isolated by
prefixed ACLs alone: a principal given rights on namespace A has no ACL that
names a topic of B.

=========  ==================================================================
Send       write the entity's log (a queue's or a topic's); write commands (scheduled messages and
           time to live are announced to the engine) and read their replies
Listen     read the entity's log (a subscription's is its topic's); write
           commands (acquire, settle...) and
           read their replies
Manage     Send and Listen on every entity, write the namespace's entity
           definitions, create the namespace's topics, configure and delete
           its entity topics
engine     everything under ``NS.`` and its own Faust topics and group
=========  ==================================================================

Each of them reads the entity definitions (partition counts, time to live)
and may describe the broker's configuration (how clients tell Apache Kafka
from the embedded broker). The commands topic is shared by a namespace's
entities: what stops a client from forging the engine's operations is the
engine itself (:mod:`topics.commands`), and what stops a Listen principal of
one entity from reading another's messages is the log's READ ACL.
"""

from __future__ import annotations

from enum import Enum

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from topics import names

RIGHTS = ("Send", "Listen", "Manage")
_LITERAL, _PREFIXED = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
_READ, _WRITE, _DESCRIBE = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE


class RightsError(ValueError):
    """A right or a scope that Kafka ACLs cannot express here."""


def client_group_prefix(namespace: str) -> str:
    """Every consumer group a client of ``namespace`` uses starts with this."""
    return f"{namespace}."


def acl_bindings(namespace: str, principal: str, right: str, entity: str | None = None
                 ) -> list[AclBinding]:
    """The ACLs that give ``principal`` (``User:alice``) ``right`` on one
    ``entity`` of ``namespace``, or on all of its entities."""
    if right not in RIGHTS:
        raise RightsError(f"unknown right {right!r}: use one of {', '.join(RIGHTS)}")
    if right == "Manage" and entity is not None:
        raise RightsError("Manage is a right on a namespace (entity definitions are one topic "
                          "per namespace): leave out the entity")
    names.validate_namespace(namespace)
    logs = _logs(namespace, entity)
    bindings = [
        (ResourceType.TOPIC, names.entities(namespace), _LITERAL, (_READ, _DESCRIBE)),
        (ResourceType.TOPIC, names.commands(namespace), _LITERAL, (_WRITE, _DESCRIBE)),
        (ResourceType.TOPIC, names.replies(namespace), _LITERAL, (_READ, _DESCRIBE)),
        (ResourceType.GROUP, client_group_prefix(namespace), _PREFIXED, (_READ, _DESCRIBE)),
        (ResourceType.BROKER, "kafka-cluster", _LITERAL, (AclOperation.DESCRIBE_CONFIGS,)),
    ]
    for log in logs:
        if right in ("Send", "Manage"):
            bindings.append((ResourceType.TOPIC, *log, (_WRITE, _DESCRIBE)))
        if right in ("Listen", "Manage"):
            bindings.append((ResourceType.TOPIC, *log, (_READ, _DESCRIBE)))
    if right == "Manage":
        bindings += [
            (ResourceType.TOPIC, names.entities(namespace), _LITERAL, (_WRITE,)),
            # the namespace's topics are provisioned by whoever comes first
            (ResourceType.TOPIC, f"{namespace}.", _PREFIXED, (AclOperation.CREATE, _DESCRIBE)),
        ]
        bindings += [(ResourceType.TOPIC, *log, (AclOperation.DELETE, AclOperation.ALTER_CONFIGS,
                                                 AclOperation.DESCRIBE_CONFIGS)) for log in logs]
    return _expand(principal, bindings)


def _logs(namespace: str, entity: str | None) -> list[tuple[str, ResourcePatternType]]:
    """The logs a right on ``entity`` (or on every entity) covers. Queues and
    topics share one namespace of names, so a right on a name covers the log
    of whichever it is; a subscription's log is its topic's."""
    if entity is None:
        return [(f"{namespace}.queue.", _PREFIXED), (f"{namespace}.topic.", _PREFIXED)]
    if names.SUBSCRIPTIONS in entity:
        return [(names.entity_log(namespace, entity), _LITERAL)]
    return [(names.entity_log(namespace, entity), _LITERAL),
            (names.topic_log(namespace, entity), _LITERAL)]


def engine_acl_bindings(namespace: str, principal: str) -> list[AclBinding]:
    """The ACLs of an engine worker's principal: the namespace's topics and
    the engine's own (changelogs, consumer group)."""
    names.validate_namespace(namespace)
    engine = names.engine_app_id(namespace)
    return _expand(principal, [
        (ResourceType.TOPIC, f"{namespace}.", _PREFIXED, (AclOperation.ALL,)),
        (ResourceType.TOPIC, f"{engine}-", _PREFIXED, (AclOperation.ALL,)),
        (ResourceType.GROUP, engine, _LITERAL, (AclOperation.ALL,)),
        (ResourceType.GROUP, client_group_prefix(namespace), _PREFIXED, (AclOperation.ALL,)),
        (ResourceType.BROKER, "kafka-cluster", _LITERAL, (AclOperation.DESCRIBE_CONFIGS,
                                                          AclOperation.DESCRIBE)),
    ])


def _expand(principal: str, bindings: list[tuple[ResourceType, str, ResourcePatternType,
                                                 tuple[AclOperation, ...]]]) -> list[AclBinding]:
    if not principal.startswith("User:") or len(principal) == len("User:"):
        raise RightsError(f"principal {principal!r} must look like 'User:NAME'")
    unique = dict.fromkeys((kind, name, pattern, operation)
                           for kind, name, pattern, operations in bindings
                           for operation in operations)
    return [AclBinding(kind, name, pattern, principal, "*", operation, AclPermissionType.ALLOW)
            for kind, name, pattern, operation in unique]


def describe(binding: AclBinding) -> str:
    """One line per ACL, as ``kafka-acls.sh --list`` would group it."""
    return (f"{binding.principal} {_enum_name(binding.permission_type)} "
            f"{_enum_name(binding.operation)} on {_enum_name(binding.restype)} "
            f"{_enum_name(binding.resource_pattern_type)} {binding.name!r}")


def _enum_name(value: Enum | str | int) -> str:
    # AclBinding turns its str and int arguments into the enums when it is
    # built, but confluent-kafka types its attributes as the arguments' union.
    assert isinstance(value, Enum), f"AclBinding left {value!r} unconverted"
    return value.name
