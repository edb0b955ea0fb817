"""A subscription's rules, as the engine and the receiver evaluate them.

A rule is a filter (SQL, correlation, true or false) and an optional SQL
action. Its definition travels on the entities topic as a plain dict
(:class:`RuleSpec`); this module compiles a subscription's rules once and
evaluates them against the headers of a record, so the engine's log scanner
(which decides what a subscription gets) and a subscription receiver (which
applies the actions of the rules that matched) agree on every message.

A message is delivered to a subscription once when any of its rules matches,
however many match; the actions of every matching rule apply, in rule-name
order. A filter that fails on a message (a type mismatch, a division by zero,
an unknown ``sys.`` property) does not match it, and the failure is reported
so that the subscription can dead-letter the message or log why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from topics.rules import (
    FilterEvaluationError,
    MessageView,
    compile_action,
    compile_filter,
)

#: correlation filter fields -> the system property each compares
CORRELATION_FIELDS = {
    "correlation_id": "correlationid", "message_id": "messageid", "to": "to",
    "reply_to": "replyto", "subject": "label", "session_id": "sessionid",
    "reply_to_session_id": "replytosessionid", "content_type": "contenttype",
}
DEFAULT_RULE = "$Default"
#: the reason a subscription's dead letters carry when a filter failed on them
FILTER_FAILED_REASON = "FilterEvaluationException"


@dataclass(frozen=True)
class RuleSpec:
    """One rule as stored: ``filter`` is ``{"type": "sql", "expression",
    "parameters"}``, ``{"type": "correlation", <field>: value...,
    "properties": {...}}``, ``{"type": "true"}`` or ``{"type": "false"}``;
    ``action`` is ``{"expression", "parameters"}`` or None."""

    name: str
    filter: dict[str, Any]
    action: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "filter": self.filter, "action": self.action}

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> RuleSpec:
        return cls(str(body["name"]), dict(body["filter"]),
                   None if body.get("action") is None else dict(body["action"]))


@dataclass
class Verdict:
    """What a subscription's rules say of one message."""

    matched: bool
    #: rules whose filter failed on the message, with why
    failures: list[tuple[str, str]] = field(default_factory=list)
    #: names of the matching rules that carry an action
    actions: list[str] = field(default_factory=list)


class _Correlation:
    """A correlation filter: every field it names equals the message's."""

    #: it reads application properties by their exact names, not as a view
    #: indexes them (:attr:`topics.rules.compiler.CompiledFilter.reads`)
    reads = None

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.system = [(CORRELATION_FIELDS[k], v) for k, v in spec.items()
                       if k in CORRELATION_FIELDS and v is not None]
        self.user = list((spec.get("properties") or {}).items())

    def matches(self, view: MessageView) -> bool:
        return (all(view.system.get(name) == value for name, value in self.system)
                and all(view.user.get(name) == value for name, value in self.user))


class _Constant:
    reads: frozenset[tuple[str, str]] = frozenset()

    def __init__(self, value: bool) -> None:
        self.value = value

    def matches(self, view: MessageView) -> bool:
        return self.value


def selects_everything(specs: tuple[RuleSpec, ...] | list[RuleSpec]) -> bool:
    """A single true filter without an action: the subscription gets every
    message unchanged, so nobody needs to read the headers for it."""
    return (len(specs) == 1 and specs[0].filter.get("type") == "true"
            and specs[0].action is None)


class Filter(Protocol):
    """A compiled filter of any type."""

    @property
    def reads(self) -> frozenset[tuple[str, str]] | None: ...

    def matches(self, view: MessageView) -> bool: ...


def compile_filter_spec(spec: Mapping[str, Any]) -> Filter:
    """An object with ``matches(view) -> bool`` for a stored filter; raises
    :class:`topics.rules.SqlSyntaxError` for invalid SQL."""
    kind = spec.get("type")
    if kind in ("true", "false"):
        return _Constant(kind == "true")
    if kind == "correlation":
        return _Correlation(spec)
    if kind == "sql":
        return compile_filter(spec["expression"], parameters=spec.get("parameters") or None)
    raise ValueError(f"unknown filter type {kind!r}: expected sql, correlation, true or false")


def _one_read(filters: list[Filter]) -> tuple[str, str] | None:
    """The one property ``filters`` read, if they read exactly one."""
    read: set[tuple[str, str]] = set()
    for compiled in filters:
        if compiled.reads is None:
            return None
        read |= compiled.reads
    return read.pop() if len(read) == 1 else None


class RuleSet:
    """A subscription's rules, compiled once."""

    def __init__(self, specs: tuple[RuleSpec, ...] | list[RuleSpec]) -> None:
        ordered = sorted(specs, key=lambda s: s.name)
        self._filters = [(s.name, compile_filter_spec(s.filter)) for s in ordered]
        self._actions = {s.name: compile_action(s.action["expression"],
                                                parameters=s.action.get("parameters") or None)
                         for s in ordered if s.action is not None}
        self.has_actions = bool(self._actions)
        #: the one filter's ``matches``, for :meth:`selects` (most subscriptions have one rule)
        self._only = self._filters[0][1].matches if len(self._filters) == 1 else None
        #: ``(scope, key)`` of the one property whose value alone decides
        #: :meth:`selects` (``bucket = 3``, ``sys.label IN ('a', 'b')``), if
        #: there is one: the engine's scanner then asks once per value it
        #: meets in a batch of records, not once per record
        self.decided_by = _one_read([compiled for _, compiled in self._filters])

    def evaluate(self, view: MessageView) -> Verdict:
        verdict = Verdict(False)
        for name, compiled in self._filters:
            try:
                hit = compiled.matches(view)
            except FilterEvaluationError as exc:
                verdict.failures.append((name, str(exc)))
                continue
            if hit:
                verdict.matched = True
                if name in self._actions:
                    verdict.actions.append(name)
        return verdict

    def selects(self, view: MessageView) -> bool | None:
        """Whether a rule selects the message, every filter evaluated as
        :meth:`evaluate` does, without its verdict (the engine's scanner asks
        this of every message for every subscription); None when a filter
        failed on it: :meth:`evaluate` then says which and why."""
        try:
            if self._only is not None:
                return self._only(view)
            return any([compiled.matches(view) for _, compiled in self._filters])
        except FilterEvaluationError:
            return None

    def apply_actions(self, view: MessageView, rules: list[str]) -> dict[str, Any]:
        """The application properties after the actions of ``rules``; an
        action that fails leaves the properties as they were before it."""
        user = dict(view.user)
        for name in rules:
            try:
                user = self._actions[name].apply(MessageView(view.system, user))
            except FilterEvaluationError:
                continue
        return user
