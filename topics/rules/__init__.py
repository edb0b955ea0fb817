"""Service Bus SQL rules: subscription filters (SqlRuleFilter) and actions
(SqlRuleAction), compiled once into closures and run against each message.

    view = MessageView(system={"label": "order"}, user={"Region": "eu", "amount": 120})
    compile_filter("user.region = 'eu' AND amount > 100").matches(view)   # True
    compile_action("SET tier = 'gold'; REMOVE tmp").apply(view)          # new user properties

The grammar is ``grammar.lark``; :mod:`topics.rules.sql` parses it and
:mod:`topics.rules.compiler` documents the semantics where Microsoft's
documentation leaves a choice.
"""

from topics.rules.compiler import CompiledAction, CompiledFilter, compile_action, compile_filter
from topics.rules.sql import (
    SYSTEM_PROPERTIES,
    FilterEvaluationError,
    MessageView,
    SqlSyntaxError,
)

__all__ = [
    "SYSTEM_PROPERTIES",
    "CompiledAction",
    "CompiledFilter",
    "FilterEvaluationError",
    "MessageView",
    "SqlSyntaxError",
    "compile_action",
    "compile_filter",
]
