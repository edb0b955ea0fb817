"""Rule filters and actions, as ``azure.servicebus.management`` names them.

They are descriptions: the filter language itself is in :mod:`topics.rules`,
and what the engine stores and evaluates is a :class:`topics.rule_set.RuleSpec`.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from topics.rule_set import CORRELATION_FIELDS, RuleSpec


class SqlRuleFilter:
    """A SQL filter expression over ``sys.`` and ``user.`` properties."""

    def __init__(self, sql_expression: str, parameters: dict[str, Any] | None = None) -> None:
        if not isinstance(sql_expression, str) or not sql_expression.strip():
            raise ValueError("sql_expression must be a non-empty SQL filter expression")
        self.sql_expression = sql_expression
        self.parameters = dict(parameters or {})

    def _spec(self) -> dict[str, Any]:
        return {"type": "sql", "expression": self.sql_expression, "parameters": self.parameters}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sql_expression!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SqlRuleFilter) and self._spec() == other._spec()


class TrueRuleFilter(SqlRuleFilter):
    """Matches every message (the ``$Default`` rule's filter)."""

    def __init__(self) -> None:
        super().__init__("1=1")

    def _spec(self) -> dict[str, Any]:
        return {"type": "true"}


class FalseRuleFilter(SqlRuleFilter):
    """Matches no message."""

    def __init__(self) -> None:
        super().__init__("1=0")

    def _spec(self) -> dict[str, Any]:
        return {"type": "false"}


class CorrelationRuleFilter:
    """Matches messages whose named system properties and application
    ``properties`` all equal the given values."""

    def __init__(self, *, correlation_id: str | None = None, message_id: str | None = None,
                 to: str | None = None, reply_to: str | None = None, subject: str | None = None,
                 session_id: str | None = None, reply_to_session_id: str | None = None,
                 content_type: str | None = None, properties: dict[str, Any] | None = None,
                 label: str | None = None) -> None:
        self.correlation_id = correlation_id
        self.message_id = message_id
        self.to = to
        self.reply_to = reply_to
        self.subject = subject if subject is not None else label
        self.session_id = session_id
        self.reply_to_session_id = reply_to_session_id
        self.content_type = content_type
        self.properties = dict(properties or {})

    @property
    def label(self) -> str | None:
        """The SDK's older name of ``subject``."""
        return self.subject

    def _spec(self) -> dict[str, Any]:
        fields = {name: getattr(self, name) for name in CORRELATION_FIELDS
                  if getattr(self, name) is not None}
        if not fields and not self.properties:
            raise ValueError("a CorrelationRuleFilter needs at least one property to match")
        return {"type": "correlation", **fields, "properties": self.properties}

    def __repr__(self) -> str:
        return f"CorrelationRuleFilter({self._spec()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CorrelationRuleFilter) and self._spec() == other._spec()


class SqlRuleAction:
    """``SET``/``REMOVE`` statements applied to the copy a subscription delivers."""

    def __init__(self, sql_expression: str, parameters: dict[str, Any] | None = None) -> None:
        if not isinstance(sql_expression, str) or not sql_expression.strip():
            raise ValueError("sql_expression must be a non-empty SQL action")
        self.sql_expression = sql_expression
        self.parameters = dict(parameters or {})

    def __repr__(self) -> str:
        return f"SqlRuleAction({self.sql_expression!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SqlRuleAction) and (
            self.sql_expression, self.parameters) == (other.sql_expression, other.parameters)


RuleFilter = SqlRuleFilter | CorrelationRuleFilter


def filter_from_spec(spec: dict[str, Any]) -> RuleFilter:
    kind = spec.get("type")
    if kind == "true":
        return TrueRuleFilter()
    if kind == "false":
        return FalseRuleFilter()
    if kind == "correlation":
        return CorrelationRuleFilter(**{k: v for k, v in spec.items() if k != "type"})
    return SqlRuleFilter(spec["expression"], spec.get("parameters"))


@dataclass
class RuleProperties:
    """A subscription's rule: a filter and an optional action."""

    name: str
    filter: RuleFilter = field(default_factory=TrueRuleFilter)
    action: SqlRuleAction | None = None
    created_at_utc: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    def spec(self) -> RuleSpec:
        action = None if self.action is None else {
            "expression": self.action.sql_expression, "parameters": self.action.parameters}
        return RuleSpec(self.name, self.filter._spec(), action)

    def to_json(self) -> bytes:
        return json.dumps({"kind": "rule", **self.spec().to_dict(),
                           "created_at_utc": self.created_at_utc.isoformat()}).encode()

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> RuleProperties:
        """A stored rule; ValueError for anything malformed."""
        try:
            spec = RuleSpec.from_dict(body)
            action = None if spec.action is None else SqlRuleAction(
                spec.action["expression"], spec.action.get("parameters"))
            created = body.get("created_at_utc")
            return cls(spec.name, filter_from_spec(spec.filter), action,
                       dt.datetime.fromisoformat(created) if created else dt.datetime.now(dt.UTC))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a rule: {exc!r}") from None
