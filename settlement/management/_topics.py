"""Administration of topics, subscriptions and rules, with the names of
``azure.servicebus.management``.

A topic is a log; a subscription is a definition the engine follows (its
windows over the topic's log start where the topic ended when it was
created); a rule is a definition of its own, so that changing one rule
writes one small record. Each change that reaches the engine's windows waits
until the engine has read it, so it is in effect when the call returns.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from settlement._engine_link import EngineLink
from settlement._entities import EntityRegistry
from settlement._session_listing import SessionRuntimeProperties, list_sessions
from settlement.exceptions import MessagingEntityAlreadyExistsError
from settlement.management._runtime import SubscriptionRuntimeProperties, TopicRuntimeProperties
from settlement.management._validation import (
    as_timedeltas,
    overridden,
    refuse_admin,
    sdk_options,
    validated,
    validated_log,
)
from topics import names, specs
from topics.connection import ConnectionSettings
from topics.entities import (
    DEFAULT_ENGINE_PARTITIONS,
    RuleFilter,
    RuleProperties,
    SqlRuleAction,
    SubscriptionProperties,
    TopicProperties,
    TrueRuleFilter,
)
from topics.offsets import log_end_offsets
from topics.rule_set import DEFAULT_RULE, RuleSet

#: what cannot change once a topic or subscription exists
_FIXED = ("name", "topic_name", "partition_count", "enable_partitioning", "requires_session",
          "begin_offsets", "created_at_utc")


class TopicAdministration:
    """The topic half of :class:`ServiceBusAdministrationClient`."""

    _settings: ConnectionSettings
    _admin: AdminClient

    @property
    def _registry(self) -> EntityRegistry:
        raise NotImplementedError

    def _provision(self, topics: list[specs.TopicSpec]) -> None:
        raise NotImplementedError

    def _provision_namespace(self, engine_partitions: int = DEFAULT_ENGINE_PARTITIONS) -> int:
        raise NotImplementedError

    def _engine_follows(self, name: str, partitions: int, version: int) -> None:
        raise NotImplementedError

    def _engine(self) -> EngineLink:
        raise NotImplementedError

    def _count_into(self, runtime: Any, props: Any) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ topics
    def create_topic(self, topic_name: str, **kwargs: Any) -> TopicProperties:
        """Create the topic's log and definition; raise if a queue or topic
        of that name exists."""
        names.validate_entity(topic_name)
        options = sdk_options("create_topic", TopicProperties, kwargs)
        props = validated_log(TopicProperties(topic_name, **options))
        props.updated_at_utc = props.created_at_utc
        self._provision_namespace()
        self._refuse_existing(topic_name, "get_topic, or delete_topic first")
        self._provision(specs.entity_topics(self._settings.namespace, topic_name,
                                            props.partition_count, topic=True))
        self._registry.put(props, topic_name)
        return props

    def get_topic(self, topic_name: str, **kwargs: Any) -> TopicProperties:
        refuse_admin("get_topic", kwargs)
        return self._registry.get_topic(topic_name, fresh=True)

    def list_topics(self, **kwargs: Any) -> list[TopicProperties]:
        refuse_admin("list_topics", kwargs)
        return sorted(self._registry.topics().values(), key=lambda t: t.name)

    def list_topics_runtime_properties(self, **kwargs: Any) -> list[TopicRuntimeProperties]:
        refuse_admin("list_topics_runtime_properties", kwargs)
        return [self.get_topic_runtime_properties(t.name) for t in self.list_topics()]

    def update_topic(self, topic: TopicProperties | Mapping[str, Any], **kwargs: Any) -> None:
        """Change a topic's time to live, duplicate detection, size limits and
        auto delete on idle (``kwargs`` over ``topic``'s, as in the SDK); its
        subscriptions follow at once."""
        current = self._registry.get_topic(name_of(topic), fresh=True)
        wanted = overridden("update_topic", current, topic, kwargs)
        props = validated_log(updated(current, wanted, "topic"))
        version = self._registry.put(props, props.name)
        for sub in self._registry.subscriptions_of(props.name):
            self._engine_follows(sub.path, sub.partition_count, version)

    def delete_topic(self, topic_name: str, **kwargs: Any) -> None:
        """Delete the topic, its subscriptions and their rules, and its log."""
        refuse_admin("delete_topic", kwargs)
        self._registry.get_topic(topic_name, fresh=True)
        for sub in self._registry.subscriptions_of(topic_name):
            self.delete_subscription(topic_name, sub.name)
        self._registry.put(None, topic_name)
        log_topic = names.topic_log(self._settings.namespace, topic_name)
        for fut in self._admin.delete_topics([log_topic]).values():
            fut.result()

    def get_topic_runtime_properties(self, topic_name: str, **kwargs: Any
                                     ) -> TopicRuntimeProperties:
        """The topic's subscription count; its scheduled messages are those of
        the subscription holding most (each subscription parks its own)."""
        refuse_admin("get_topic_runtime_properties", kwargs)
        props = self._registry.get_topic(topic_name, fresh=True)
        subs = [self.get_subscription_runtime_properties(topic_name, s.name)
                for s in self._registry.subscriptions_of(topic_name)]
        return TopicRuntimeProperties(
            topic_name, subscription_count=len(subs),
            scheduled_message_count=max((s.scheduled_message_count for s in subs), default=0),
            created_at_utc=props.created_at_utc, updated_at_utc=props.updated_at_utc)

    # ----------------------------------------------------------- subscriptions
    def create_subscription(self, topic_name: str, subscription_name: str, **kwargs: Any
                            ) -> SubscriptionProperties:
        """Create a subscription with the ``$Default`` rule (a true filter).
        It gets what is published from now on, not the topic's history."""
        options = sdk_options("create_subscription", SubscriptionProperties, kwargs)
        topic = self._registry.get_topic(topic_name, fresh=True)
        path = names.subscription_path(topic_name, subscription_name)
        if self._registry.exists(path):
            raise MessagingEntityAlreadyExistsError(
                f"subscription {path!r} already exists: use get_subscription, or "
                "delete_subscription first")
        begin = self._log_ends(topic_name, topic.partition_count)
        props = validated(SubscriptionProperties(
            subscription_name, topic_name=topic_name, partition_count=topic.partition_count,
            begin_offsets=begin, **options))
        props.updated_at_utc = props.created_at_utc
        self._registry.put(RuleProperties(DEFAULT_RULE, TrueRuleFilter()),
                           names.rule_key(topic_name, subscription_name, DEFAULT_RULE))
        self._engine_follows(path, props.partition_count, self._registry.put(props, path))
        return props

    def get_subscription(self, topic_name: str, subscription_name: str, **kwargs: Any
                         ) -> SubscriptionProperties:
        refuse_admin("get_subscription", kwargs)
        return self._registry.get_subscription(topic_name, subscription_name, fresh=True)

    def list_subscriptions(self, topic_name: str, **kwargs: Any
                           ) -> list[SubscriptionProperties]:
        refuse_admin("list_subscriptions", kwargs)
        self._registry.get_topic(topic_name, fresh=True)
        return self._registry.subscriptions_of(topic_name)

    def list_subscriptions_runtime_properties(self, topic_name: str, **kwargs: Any
                                              ) -> list[SubscriptionRuntimeProperties]:
        refuse_admin("list_subscriptions_runtime_properties", kwargs)
        return [self.get_subscription_runtime_properties(topic_name, s.name)
                for s in self.list_subscriptions(topic_name)]

    def update_subscription(self, topic_name: str,
                            subscription: SubscriptionProperties | Mapping[str, Any],
                            **kwargs: Any) -> None:
        """Change a subscription's lock duration, delivery count, time to
        live, dead-lettering, forwarding and auto delete on idle (``kwargs``
        over ``subscription``'s, as in the SDK); new locks follow at once."""
        current = self._registry.get_subscription(topic_name, name_of(subscription),
                                                  fresh=True)
        wanted = overridden("update_subscription", current, subscription, kwargs)
        props = validated(updated(current, wanted, "subscription"))
        self._engine_follows(current.path, current.partition_count,
                             self._registry.put(props, current.path))

    def delete_subscription(self, topic_name: str, subscription_name: str, **kwargs: Any
                            ) -> None:
        """Delete a subscription and its rules; the engine forgets its windows."""
        refuse_admin("delete_subscription", kwargs)
        props = self._registry.get_subscription(topic_name, subscription_name, fresh=True)
        for rule in self._registry.rules_of(topic_name, subscription_name):
            self._registry.put(None, names.rule_key(topic_name, subscription_name, rule.name))
        self._engine_follows(props.path, props.partition_count,
                             self._registry.put(None, props.path))

    def list_subscription_sessions_runtime_properties(
            self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> list[SessionRuntimeProperties]:
        """Each session of a session-enabled subscription: its active message
        count, whether it is locked and until when, its state's size."""
        refuse_admin("list_subscription_sessions_runtime_properties", kwargs)
        props = self._registry.get_subscription(topic_name, subscription_name, fresh=True)
        return list(list_sessions(self._engine(), props))

    def get_subscription_runtime_properties(self, topic_name: str, subscription_name: str,
                                            **kwargs: Any) -> SubscriptionRuntimeProperties:
        refuse_admin("get_subscription_runtime_properties", kwargs)
        props = self._registry.get_subscription(topic_name, subscription_name, fresh=True)
        runtime = SubscriptionRuntimeProperties(subscription_name,
                                                created_at_utc=props.created_at_utc,
                                                updated_at_utc=props.updated_at_utc)
        self._count_into(runtime, props)
        return runtime

    # ------------------------------------------------------------------- rules
    def create_rule(self, topic_name: str, subscription_name: str, rule_name: str, *,
                    filter: RuleFilter | None = None,  # noqa: A002 (the SDK's name)
                    action: SqlRuleAction | None = None, **kwargs: Any) -> RuleProperties:
        """Add a rule; a message the subscription's rules match is delivered
        to it once. Invalid SQL is refused with the position of the error."""
        refuse_admin("create_rule", kwargs)
        sub = self._registry.get_subscription(topic_name, subscription_name, fresh=True)
        key = names.rule_key(topic_name, subscription_name, rule_name)
        if self._registry.exists(key):
            raise MessagingEntityAlreadyExistsError(
                f"rule {rule_name!r} of {sub.path!r} already exists: use update_rule")
        rule = _compiled(RuleProperties(rule_name, filter or TrueRuleFilter(), action))
        self._engine_follows(sub.path, sub.partition_count, self._registry.put(rule, key))
        return rule

    def get_rule(self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
                 ) -> RuleProperties:
        refuse_admin("get_rule", kwargs)
        return self._registry.get_rule(topic_name, subscription_name, rule_name, fresh=True)

    def list_rules(self, topic_name: str, subscription_name: str, **kwargs: Any
                   ) -> list[RuleProperties]:
        refuse_admin("list_rules", kwargs)
        self._registry.get_subscription(topic_name, subscription_name, fresh=True)
        return self._registry.rules_of(topic_name, subscription_name)

    def update_rule(self, topic_name: str, subscription_name: str,
                    rule: RuleProperties | Mapping[str, Any], **kwargs: Any) -> None:
        """Replace a rule's filter and action (``filter=``/``action=`` over
        ``rule``'s, as in the SDK): messages not yet evaluated follow the new
        rule."""
        current = self._registry.get_rule(topic_name, subscription_name, name_of(rule),
                                          fresh=True)
        wanted = overridden("update_rule", current, rule, kwargs)
        sub = self._registry.get_subscription(topic_name, subscription_name)
        updated = _compiled(RuleProperties(current.name, wanted.filter, wanted.action,
                                           current.created_at_utc))
        key = names.rule_key(topic_name, subscription_name, current.name)
        self._engine_follows(sub.path, sub.partition_count, self._registry.put(updated, key))

    def delete_rule(self, topic_name: str, subscription_name: str, rule_name: str,
                    **kwargs: Any) -> None:
        refuse_admin("delete_rule", kwargs)
        self._registry.get_rule(topic_name, subscription_name, rule_name, fresh=True)
        sub = self._registry.get_subscription(topic_name, subscription_name)
        key = names.rule_key(topic_name, subscription_name, rule_name)
        self._engine_follows(sub.path, sub.partition_count, self._registry.put(None, key))

    # ---------------------------------------------------------------- helpers
    def _refuse_existing(self, name: str, what_to_do: str) -> None:
        if self._registry.exists(name):
            raise MessagingEntityAlreadyExistsError(
                f"a queue or topic named {name!r} already exists in namespace "
                f"{self._settings.namespace!r} (they share one namespace): use {what_to_do}")

    def _log_ends(self, topic_name: str, partitions: int) -> list[int]:
        """Where the topic's partitions end now (from fetches on the embedded
        broker, whose ListOffsets answers low)."""
        log_topic = names.topic_log(self._settings.namespace, topic_name)
        consumer = Consumer(self._settings.consumer_config(f"admin-{uuid.uuid4().hex[:12]}"))
        try:
            ends = log_end_offsets(consumer, [(log_topic, p) for p in range(partitions)],
                                   exact=self._settings.profile.exact_list_offsets)
        finally:
            consumer.close()
        return [ends[(log_topic, p)] for p in range(partitions)]


def updated(current: Any, wanted: Any, kind: str) -> Any:
    """``wanted``'s settings over ``current``'s; what cannot change is kept,
    and asking to change it is refused."""
    for fixed in ("partition_count", "enable_partitioning", "requires_session"):
        if hasattr(current, fixed) and getattr(wanted, fixed) != getattr(current, fixed):
            raise ValueError(f"the {fixed} of {kind} {current.name!r} cannot change (it is "
                             f"{getattr(current, fixed)!r}): create another {kind}")
    values = {f.name: getattr(wanted, f.name) for f in dataclasses.fields(wanted)}
    values.update({name: getattr(current, name) for name in _FIXED if hasattr(current, name)})
    values["updated_at_utc"] = dt.datetime.now(dt.UTC)
    return type(current)(**as_timedeltas(values))


def name_of(entity: Any) -> str:
    """The name of properties, or of the dict the SDK's update calls also take."""
    return str(entity["name"] if isinstance(entity, Mapping) else entity.name)


def _compiled(rule: RuleProperties) -> RuleProperties:
    """The rule, once its filter and action compile (SqlSyntaxError, a
    ValueError, names the position of an error)."""
    RuleSet([rule.spec()])
    return rule
