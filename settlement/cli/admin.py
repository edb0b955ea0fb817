"""The administration commands of the ``settlement`` CLI: ``queue``, ``topic``,
``subscription`` and ``rule`` (each with ``create``, ``list``, ``show``,
``delete``; queues and topics with ``update``)::

    settlement topic create sales --partitions 2
    settlement queue update orders --max-size-in-megabytes 2048
    settlement subscription create sales eu --lock-duration 30
    settlement rule create sales eu in-eu --sql "region = 'eu'"
    settlement rule delete sales eu '$Default'
    settlement subscription show sales eu

Registered by :mod:`settlement.cli.app`; the plumbing they use (connection
string, usage errors, command groups) is :mod:`settlement.cli.base`.
One table, :data:`ENTITY_OPTIONS`, serves the three ``create`` commands, so a
setting is spelled and behaves the same wherever Service Bus has it; every
``show`` prints ``name  value`` lines and every ``list`` a table (or JSON, with
``--output json``), through the printers of :mod:`settlement.cli.output`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from settlement.cli.base import (
    UsageError,
    add_command,
    add_group,
    admin_client,
    property_value,
    split_pair,
)
from settlement.cli.output import Column, print_fields, print_listing, show_value
from settlement.management import (
    CorrelationRuleFilter,
    FalseRuleFilter,
    RuleProperties,
    SqlRuleAction,
    SqlRuleFilter,
    TrueRuleFilter,
)
from settlement.management._validation import as_timedeltas
from settlement.message import PropertyValue
from topics import names
from topics.entities.queue import DEFAULT_DUPLICATE_WINDOW
from topics.rule_set import CORRELATION_FIELDS, DEFAULT_RULE
from topics.rules import SqlSyntaxError

#: The options of ``queue create``, ``topic create`` and ``subscription
#: create``, by argparse dest: (flag, administration keyword, argparse keywords).
#: Each entity takes the subset Service Bus gives it (:data:`QUEUE_OPTIONS`...).
ENTITY_OPTIONS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "lock_duration": ("--lock-duration", "lock_duration", dict(
        type=float, metavar="SECONDS", help="peek-lock duration, 1..300 s (default: 60)")),
    "max_delivery_count": ("--max-delivery-count", "max_delivery_count", dict(
        type=int, metavar="N", help="deliveries before dead-lettering (default: 10)")),
    "partitions": ("--partitions", "partition_count", dict(
        type=int, metavar="N", help="partitions of the log, 1..64 (default: 1)")),
    "default_ttl": ("--default-ttl", "default_message_time_to_live", dict(
        type=float, metavar="SECONDS",
        help="default_message_time_to_live (default: never expire)")),
    "dead_letter_on_expiration": (
        "--dead-letter-on-expiration", "dead_lettering_on_message_expiration", dict(
            action="store_const", const=True,
            help="expired messages go to the dead-letter sub-queue")),
    "dead_letter_on_filter_errors": (
        "--no-dead-letter-on-filter-errors", "dead_lettering_on_filter_evaluation_exceptions",
        dict(action="store_const", const=False,
             help="a rule that fails on a message (e.g. comparing text with a number) "
                  "counts as not selecting it, instead of dead-lettering the message")),
    "duplicate_detection": (
        "--duplicate-detection", "duplicate_detection_history_time_window", dict(
            type=float, nargs="?", const=DEFAULT_DUPLICATE_WINDOW.total_seconds(),
            metavar="SECONDS",
            help="turn duplicate detection on, with a history window of SECONDS (20 s to "
                 f"7 days; default {DEFAULT_DUPLICATE_WINDOW.total_seconds():g})")),
    "requires_session": ("--requires-session", "requires_session", dict(
        action="store_const", const=True,
        help="deliver messages session by session (each needs a session_id); receive with "
             "a session receiver")),
    "forward_to": ("--forward-to", "forward_to", dict(
        metavar="ENTITY", help="forward every message to this queue or topic")),
    "forward_dead_letters_to": (
        "--forward-dead-letters-to", "forward_dead_lettered_messages_to", dict(
            metavar="ENTITY", help="forward dead letters to this queue or topic")),
    "auto_delete_on_idle": ("--auto-delete-on-idle", "auto_delete_on_idle", dict(
        type=float, metavar="SECONDS",
        help="the engine deletes the entity once nothing used it for this long (no sends, "
             "receives, settlements or changes); at least 300 s (default: never)")),
    "max_size": ("--max-size-in-megabytes", "max_size_in_megabytes", dict(
        type=int, metavar="MB",
        help="what the entity may hold; a send that would pass it fails with "
             "QuotaExceeded (default: 1024)")),
}
QUEUE_OPTIONS = ("lock_duration", "max_delivery_count", "partitions", "default_ttl",
                 "dead_letter_on_expiration", "duplicate_detection", "requires_session",
                 "forward_to", "forward_dead_letters_to", "max_size", "auto_delete_on_idle")
TOPIC_OPTIONS = ("partitions", "default_ttl", "duplicate_detection", "max_size",
                 "auto_delete_on_idle")
#: what cannot change once the entity exists (``update`` does not offer it)
FIXED_OPTIONS = ("partitions", "requires_session")
SUBSCRIPTION_OPTIONS = ("lock_duration", "max_delivery_count", "default_ttl",
                        "dead_letter_on_expiration", "dead_letter_on_filter_errors",
                        "requires_session", "forward_to", "forward_dead_letters_to",
                        "auto_delete_on_idle")

#: What each ``show`` prints, in order.
QUEUE_FIELDS = ("name", "lock_duration", "max_delivery_count", "partition_count",
                "max_message_size_in_kilobytes", "max_size_in_megabytes",
                "default_message_time_to_live",
                "dead_lettering_on_message_expiration", "requires_duplicate_detection",
                "duplicate_detection_history_time_window", "requires_session", "forward_to",
                "forward_dead_lettered_messages_to", "auto_delete_on_idle", "created_at_utc",
                "updated_at_utc")
TOPIC_FIELDS = ("name", "partition_count", "max_message_size_in_kilobytes",
                "max_size_in_megabytes", "default_message_time_to_live",
                "requires_duplicate_detection", "duplicate_detection_history_time_window",
                "auto_delete_on_idle", "created_at_utc", "updated_at_utc")
SUBSCRIPTION_FIELDS = ("name", "topic_name", "lock_duration", "max_delivery_count",
                       "default_message_time_to_live", "dead_lettering_on_message_expiration",
                       "dead_lettering_on_filter_evaluation_exceptions", "requires_session",
                       "forward_to",
                       "forward_dead_lettered_messages_to", "partition_count",
                       "auto_delete_on_idle", "created_at_utc", "updated_at_utc")
COUNT_FIELDS = ("active_message_count", "dead_letter_message_count", "deferred_message_count",
                "locked_message_count", "scheduled_message_count",
                "transfer_dead_letter_message_count", "total_message_count")

#: What ``queue sessions`` and ``subscription sessions`` print per session.
SESSION_COLUMNS: list[Column] = [
    ("SESSION", "session_id"), ("ACTIVE", "active_message_count"),
    ("LOCKED UNTIL (UTC)", lambda s: s.locked_until_utc or "-"),
    ("STATE BYTES", "state_size_in_bytes"),
    ("STATE SET (UTC)", lambda s: s.state_updated_at_utc or "-")]


# --------------------------------------------------------------------------- parser
def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``queue``, ``topic``, ``subscription`` and ``rule``."""
    _add_queue_commands(commands, common)
    _add_topic_commands(commands, common)
    _add_subscription_commands(commands, common)
    _add_rule_commands(commands, common)


def add_entity_options(parser: argparse.ArgumentParser, options: Sequence[str]) -> None:
    """The :data:`ENTITY_OPTIONS` named in ``options``; unset ones stay None."""
    for dest in options:
        flag, _, kwargs = ENTITY_OPTIONS[dest]
        parser.add_argument(flag, dest=dest, default=None, **kwargs)


def entity_options(args: argparse.Namespace) -> dict[str, Any]:
    """The administration keywords of the :data:`ENTITY_OPTIONS` given: what
    is not given is left to the service's defaults."""
    options = {keyword: getattr(args, dest) for dest, (_, keyword, _) in ENTITY_OPTIONS.items()
               if getattr(args, dest, None) is not None}
    if "duplicate_detection_history_time_window" in options:
        options["requires_duplicate_detection"] = True
    return options


def _add_queue_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = add_group(commands, common, "queue", "create, update, list, show, delete, sessions",
                    "Manage the queues of a namespace.")
    create = add_command(sub, common, "create", cmd_queue_create, "create a queue",
                         "Create a queue; fails if a queue or topic of that name exists.",
                         "NAME")
    add_entity_options(create, QUEUE_OPTIONS)
    update = add_command(sub, common, "update", cmd_queue_update, "change a queue's settings",
                         "Change the settings given; the others stay. New locks follow a "
                         "new lock duration at once.", "NAME")
    add_entity_options(update, _changeable(QUEUE_OPTIONS))
    add_command(sub, common, "list", cmd_queue_list, "list queues",
                "List the queues of the namespace.")
    add_command(sub, common, "show", cmd_queue_show, "show properties and counts",
                "Show a queue's properties and runtime counts.", "NAME")
    add_command(sub, common, "delete", cmd_queue_delete, "delete a queue",
                "Delete a queue, its log and its messages.", "NAME")
    add_command(sub, common, "sessions", cmd_queue_sessions, "list sessions",
                "List the sessions of a session-enabled queue: active messages, lock, "
                "state size.", "NAME")


def _add_topic_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = add_group(commands, common, "topic", "create, update, list, show, delete",
                    "Manage the topics of a namespace. A topic stores each message once and "
                    "delivers it to every subscription whose rules select it.")
    create = add_command(sub, common, "create", cmd_topic_create, "create a topic",
                         "Create a topic; fails if a queue or topic of that name exists. It "
                         "has no subscriptions yet: add them with 'settlement subscription "
                         "create'.", "NAME")
    add_entity_options(create, TOPIC_OPTIONS)
    update = add_command(sub, common, "update", cmd_topic_update, "change a topic's settings",
                         "Change the settings given; the others stay.", "NAME")
    add_entity_options(update, _changeable(TOPIC_OPTIONS))
    add_command(sub, common, "list", cmd_topic_list, "list topics",
                "List the topics of the namespace.")
    add_command(sub, common, "show", cmd_topic_show, "show properties and counts",
                "Show a topic's properties, its subscriptions and its runtime counts.",
                "NAME")
    add_command(sub, common, "delete", cmd_topic_delete, "delete a topic",
                "Delete a topic, its subscriptions (with their messages and rules) and its "
                "log.", "NAME")


def _changeable(options: Sequence[str]) -> tuple[str, ...]:
    return tuple(o for o in options if o not in FIXED_OPTIONS)


def _add_subscription_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = add_group(commands, common, "subscription", "create, list, show, delete, sessions",
                    "Manage the subscriptions of a topic. Receive from one as "
                    "TOPIC/subscriptions/NAME, as from a queue.")
    create = add_command(
        sub, common, "create", cmd_subscription_create, "create a subscription",
        f"Create a subscription of TOPIC with the {DEFAULT_RULE!r} rule, which selects every "
        "message; it gets what is published from now on. To select fewer, add rules with "
        f"'settlement rule create' and delete {DEFAULT_RULE!r}.", "TOPIC", "NAME")
    add_entity_options(create, SUBSCRIPTION_OPTIONS)
    add_command(sub, common, "list", cmd_subscription_list, "list subscriptions",
                "List the subscriptions of TOPIC.", "TOPIC")
    add_command(sub, common, "show", cmd_subscription_show, "show properties and counts",
                "Show a subscription's properties, its rules and its runtime counts.",
                "TOPIC", "NAME")
    add_command(sub, common, "delete", cmd_subscription_delete, "delete a subscription",
                "Delete a subscription, its messages and its rules.", "TOPIC", "NAME")
    add_command(sub, common, "sessions", cmd_subscription_sessions, "list sessions",
                "List the sessions of a session-enabled subscription: active messages, "
                "lock, state size.", "TOPIC", "NAME")


def _add_rule_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = add_group(commands, common, "rule", "create, list, show, delete",
                    "Manage the rules of a subscription. A message is delivered to the "
                    "subscription once if any of its rules selects it; the action of each "
                    "rule that selects it then sets its application properties.")
    create = add_command(
        sub, common, "create", cmd_rule_create, "create a rule",
        "Add rule RULE to subscription SUB of TOPIC: a filter (exactly one of --sql, "
        "--correlation, --true, --false) and an optional --action. Invalid SQL is refused "
        "with the position of the error.", "TOPIC", "SUB", "RULE")
    selects = create.add_mutually_exclusive_group(required=True)
    selects.add_argument("--sql", metavar="EXPR",
                         help="SQL filter over application properties (region, user.region) "
                              "and system ones (sys.label...), e.g. "
                              "\"region = 'eu' AND amount >= 100\"")
    selects.add_argument("--correlation", action="append", metavar="KEY=VALUE",
                         help="correlation filter, repeatable, all must match: KEY is a "
                              f"system property ({', '.join(CORRELATION_FIELDS)}) or else an "
                              "application property (user.KEY forces one); VALUE is read "
                              "as in 'send --property'")
    selects.add_argument("--true", action="store_true", help="select every message")
    selects.add_argument("--false", action="store_true", help="select no message")
    create.add_argument("--action", metavar="SQL", default=None,
                        help="SQL action on what the rule selects, e.g. "
                             "\"SET priority = 'high'\"")
    add_command(sub, common, "list", cmd_rule_list, "list rules",
                "List the rules of subscription SUB of TOPIC.", "TOPIC", "SUB")
    add_command(sub, common, "show", cmd_rule_show, "show a rule",
                "Show a rule's filter and action.", "TOPIC", "SUB", "RULE")
    add_command(sub, common, "delete", cmd_rule_delete, "delete a rule",
                "Delete a rule; messages published from now on are selected by the "
                "subscription's other rules.", "TOPIC", "SUB", "RULE")


# ----------------------------------------------------------------------- queues
def cmd_queue_create(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        props = admin.create_queue(args.name, **entity_options(args))
    print(f"created queue {props.name!r}: "
          + settings_text(props, "lock_duration", "max_delivery_count", "partition_count"))
    return 0


def cmd_queue_update(args: argparse.Namespace) -> int:
    return _update(args, "queue")


def _update(args: argparse.Namespace, kind: str) -> int:
    """``queue update`` and ``topic update``: the definition as it is, with
    the options given, through ``update_queue`` or ``update_topic``."""
    options = entity_options(args)
    if not options:
        raise UsageError(f"nothing to change: give the settings to change (settlement {kind} "
                         "update --help lists them)")
    with admin_client(args) as admin:
        get, update = getattr(admin, f"get_{kind}"), getattr(admin, f"update_{kind}")
        update(dataclasses.replace(get(args.name), **as_timedeltas(options)))
        props = get(args.name)
    print(f"updated {kind} {props.name!r}: " + settings_text(props, *options))
    return 0


def cmd_queue_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        queues = admin.list_queues()
    print_listing("queues", queues, [
        ("NAME", "name"), ("PARTITIONS", "partition_count"), ("LOCK", "lock_duration"),
        ("MAX DELIVERIES", "max_delivery_count"), ("CREATED (UTC)", "created_at_utc")],
                  args.output)
    return 0


def cmd_queue_show(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        props = admin.get_queue(args.name)
        runtime = admin.get_queue_runtime_properties(args.name)
    print_fields(fields_of(props, QUEUE_FIELDS)
                 + fields_of(runtime, [*COUNT_FIELDS, "size_in_bytes"]), args.output)
    return 0


def cmd_queue_delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.delete_queue(args.name)
    print(f"deleted queue {args.name!r}")
    return 0


def cmd_queue_sessions(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        sessions = admin.list_queue_sessions_runtime_properties(args.name)
    print_listing(f"sessions in queue {args.name!r}", sessions, SESSION_COLUMNS, args.output)
    return 0


# ----------------------------------------------------------------------- topics
def cmd_topic_create(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        props = admin.create_topic(args.name, **entity_options(args))
    print(f"created topic {props.name!r}: "
          + settings_text(props, "partition_count", "default_message_time_to_live",
                          "requires_duplicate_detection"))
    return 0


def cmd_topic_update(args: argparse.Namespace) -> int:
    return _update(args, "topic")


def cmd_topic_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        topics = admin.list_topics()
    print_listing("topics", topics, [
        ("NAME", "name"), ("PARTITIONS", "partition_count"),
        ("DEFAULT TTL", "default_message_time_to_live"),
        ("DUPLICATE DETECTION", "requires_duplicate_detection"),
        ("CREATED (UTC)", "created_at_utc")], args.output)
    return 0


def cmd_topic_show(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        props = admin.get_topic(args.name)
        subscriptions = admin.list_subscriptions(args.name)
        runtime = admin.get_topic_runtime_properties(args.name)
    print_fields(fields_of(props, TOPIC_FIELDS)
                 + [("subscriptions", [s.name for s in subscriptions])]
                 + fields_of(runtime, ["subscription_count", "scheduled_message_count"]),
                 args.output)
    return 0


def cmd_topic_delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.delete_topic(args.name)
    print(f"deleted topic {args.name!r} with its subscriptions")
    return 0


# ---------------------------------------------------------------- subscriptions
def cmd_subscription_create(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        props = admin.create_subscription(args.topic, args.name, **entity_options(args))
    print(f"created subscription {props.path!r}: "
          + settings_text(props, "lock_duration", "max_delivery_count")
          + f"; rule {DEFAULT_RULE!r} selects every message")
    return 0


def cmd_subscription_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        subscriptions = admin.list_subscriptions(args.topic)
    print_listing(f"subscriptions of topic {args.topic!r}", subscriptions, [
        ("NAME", "name"), ("LOCK", "lock_duration"), ("MAX DELIVERIES", "max_delivery_count"),
        ("FORWARD TO", "forward_to"), ("CREATED (UTC)", "created_at_utc")], args.output)
    return 0


def cmd_subscription_show(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        props = admin.get_subscription(args.topic, args.name)
        rules = admin.list_rules(args.topic, args.name)
        runtime = admin.get_subscription_runtime_properties(args.topic, args.name)
    print_fields([("path", props.path), *fields_of(props, SUBSCRIPTION_FIELDS),
                  ("rules", [r.name for r in rules]), *fields_of(runtime, COUNT_FIELDS)],
                 args.output)
    return 0


def cmd_subscription_delete(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        admin.delete_subscription(args.topic, args.name)
    print(f"deleted subscription {names.subscription_path(args.topic, args.name)!r} "
          "with its rules")
    return 0


def cmd_subscription_sessions(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        sessions = admin.list_subscription_sessions_runtime_properties(args.topic, args.name)
    print_listing(f"sessions in subscription "
                  f"{names.subscription_path(args.topic, args.name)!r}", sessions,
                  SESSION_COLUMNS, args.output)
    return 0


# ------------------------------------------------------------------------ rules
def cmd_rule_create(args: argparse.Namespace) -> int:
    rule_filter = _rule_filter(args)
    action = None if args.action is None else SqlRuleAction(args.action)
    path = names.subscription_path(args.topic, args.sub)
    with admin_client(args) as admin:
        try:
            rule = admin.create_rule(args.topic, args.sub, args.rule, filter=rule_filter,
                                     action=action)
        except SqlSyntaxError as exc:
            raise UsageError(sql_error_text(exc, args.rule, args.action)) from None
        rules = admin.list_rules(args.topic, args.sub)
    print(f"created rule {rule.name!r} of {path!r}: {rule_text(rule)}")
    selects_all = [r.name for r in rules
                   if isinstance(r.filter, TrueRuleFilter) and r.name != rule.name]
    if selects_all and not isinstance(rule.filter, TrueRuleFilter):
        print(f"note: rule {selects_all[0]!r} still selects every message, and a message is "
              f"delivered when any rule selects it: delete it with \"settlement rule delete "
              f"{args.topic} {args.sub} '{selects_all[0]}'\" to deliver only what "
              f"{rule.name!r} selects", file=sys.stderr)
    return 0


def cmd_rule_list(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        rules = admin.list_rules(args.topic, args.sub)
    print_listing(f"rules: {names.subscription_path(args.topic, args.sub)!r} receives nothing",
                  rules, [("NAME", "name"), ("FILTER", lambda r: filter_text(r.filter)),
                          ("ACTION", lambda r: r.action and r.action.sql_expression)],
                  args.output)
    return 0


def cmd_rule_show(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        rule = admin.get_rule(args.topic, args.sub, args.rule)
    print_fields([("name", rule.name),
                  ("subscription", names.subscription_path(args.topic, args.sub)),
                  ("filter", filter_text(rule.filter)),
                  ("action", rule.action and rule.action.sql_expression),
                  ("created_at_utc", rule.created_at_utc)], args.output)
    return 0


def cmd_rule_delete(args: argparse.Namespace) -> int:
    path = names.subscription_path(args.topic, args.sub)
    with admin_client(args) as admin:
        admin.delete_rule(args.topic, args.sub, args.rule)
        left = admin.list_rules(args.topic, args.sub)
    print(f"deleted rule {args.rule!r} of {path!r}")
    if not left:
        print(f"note: {path!r} has no rules left, so it receives nothing until one is "
              "created", file=sys.stderr)
    return 0


def _rule_filter(args: argparse.Namespace) -> SqlRuleFilter | CorrelationRuleFilter:
    if args.sql is not None:
        return SqlRuleFilter(args.sql)
    if args.correlation:
        return correlation_filter(args.correlation)
    return TrueRuleFilter() if args.true else FalseRuleFilter()


def correlation_filter(pairs: list[str]) -> CorrelationRuleFilter:
    """``--correlation KEY=VALUE`` pairs as a filter: a KEY naming a system
    property (or ``sys.KEY``) matches it as text; any other KEY (or
    ``user.KEY``) matches an application property, typed as ``send
    --property`` types it so that the two compare equal."""
    system: dict[str, str] = {}
    user: dict[str, PropertyValue] = {}
    for pair in pairs:
        key, raw = split_pair(pair, "--correlation")
        if key.startswith("user."):
            user[key.removeprefix("user.")] = property_value(raw)
        elif key.startswith("sys.") or key in CORRELATION_FIELDS:
            field = key.removeprefix("sys.")
            if field not in CORRELATION_FIELDS:
                raise UsageError(f"--correlation {pair!r}: {field!r} is not a system property "
                                 f"a correlation filter matches; use one of "
                                 f"{', '.join(CORRELATION_FIELDS)}, or user.{field} for an "
                                 "application property")
            system[field] = raw
        else:
            user[key] = property_value(raw)
    return CorrelationRuleFilter(**system, properties=user)


# ---------------------------------------------------------------------- printing
def filter_text(rule_filter: SqlRuleFilter | CorrelationRuleFilter) -> str:
    """A filter in one line, in the syntax ``rule create`` takes it."""
    if isinstance(rule_filter, TrueRuleFilter):
        return "true (every message)"
    if isinstance(rule_filter, FalseRuleFilter):
        return "false (no message)"
    if isinstance(rule_filter, SqlRuleFilter):
        parameters = ", ".join(f"{k}={v!r}" for k, v in rule_filter.parameters.items())
        return f"sql: {rule_filter.sql_expression}" + (
            f" (parameters: {parameters})" if parameters else "")
    matched = [f"{name}={getattr(rule_filter, name)!r}" for name in CORRELATION_FIELDS
               if getattr(rule_filter, name) is not None]
    matched += [f"{'user.' if k in CORRELATION_FIELDS or '.' in k else ''}{k}={v!r}"
                for k, v in rule_filter.properties.items()]
    return "correlation: " + ", ".join(matched)


def rule_text(rule: RuleProperties) -> str:
    return f"filter {filter_text(rule.filter)}; action " + (
        rule.action.sql_expression if rule.action else "none")


def sql_error_text(exc: SqlSyntaxError, rule: str, action: str | None) -> str:
    """The error with the offending line and a caret under its position, and
    whether the filter or the action is at fault."""
    part = "action" if action is not None and exc.source == action else "filter"
    lines = exc.source.splitlines() or [""]
    line = lines[min(exc.line, len(lines)) - 1]
    return (f"the SQL {part} of rule {rule!r} is invalid: {exc}\n"
            f"    {line}\n    {' ' * (exc.column - 1)}^")


def settings_text(props: object, *fields: str) -> str:
    """``name=value, ...`` of ``props``, for the line a ``create`` prints."""
    return ", ".join(f"{name}={show_value(getattr(props, name))}" for name in fields)


def fields_of(obj: object, fields: Sequence[str]) -> list[tuple[str, object]]:
    return [(name, getattr(obj, name)) for name in fields]
