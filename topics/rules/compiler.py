"""Compiling SQL rules into closures, and the semantics of their operators.

A rule is parsed once and each node of its tree becomes a closure over its
children's closures, so evaluating a rule against a message is a few nested
Python calls -- no tree walk, no dispatch on node types, no string handling.
Parts made only of constants are evaluated once, at compile time.

Values follow SQL's three-valued logic: a condition is ``True``, ``False`` or
``None`` (UNKNOWN), and any value may be ``None`` (NULL: a missing property,
or a property set to null). Where Microsoft's documentation says operators
follow C#, this module does; where it is silent, the choices are:

- ``/`` of two integers is integer division truncated toward zero and ``%``
  takes the sign of the dividend (C#'s ``long`` operators); any float operand
  makes ``/`` a float division. Division or remainder by zero is an error
  (also for floats, where C# would give infinity or NaN).
- Strings compare ordinally: ``=``, ``<``... and ``LIKE`` are case-sensitive.
- ``+`` of two strings concatenates them; ``+`` of a string and a number is
  an error (no implicit conversion to string).
- ``+`` and ``-`` also work on date/times and time spans (``sys.EnqueuedTimeUtc
  + sys.TimeToLive``), as on C#'s DateTime and TimeSpan.
- Comparing values of different kinds (a string with a number, a boolean with
  a number) is an error, not FALSE; booleans take only ``=`` and ``<>``.
- ``AND`` and ``OR`` stop at the first operand that decides the result, so an
  error in the second operand goes unnoticed when the first decides.
- ``x IN (a, b)`` is ``x = a OR x = b``: the same kind rules, and UNKNOWN when
  nothing matches but the list holds a NULL.
- Application properties of the types JSON lacks (``docs/wire-format.md``)
  compare as C# would: a date/time with a date/time (``=``, ``<``...), a
  UUID or binary with one of its kind (``=`` and ``<>`` only); a UUID also
  equals a string that spells it (``user.id = '3f2a...'``, also in ``IN``).
  Anything else is the usual error, never a crash.
- ``property(name)`` / ``p(name)`` look ``name`` up among the application
  properties (the user scope); ``newid()`` returns a new UUID as a string.
"""

from __future__ import annotations

import datetime as dt
import math
import operator
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lark import ParseTree, Token, Tree

from topics.rules.sql import (
    SYSTEM_ALIASES,
    SYSTEM_PROPERTIES,
    FilterEvaluationError,
    MessageView,
    SqlSyntaxError,
    parse,
)

Evaluate = Callable[[MessageView], Any]
Statement = Callable[[MessageView, dict[str, Any]], None]
# A child in the parse tree: a token or a subtree as lark's types say, or None
# where the rule leaves out an optional part of the grammar ([NOT], [ESCAPE
# pattern], a property's scope), as the parser runs with maybe_placeholders.
_Child = Token | ParseTree | None

# Static kinds of a node; UNKNOWN means only a message can tell (a property).
BOOLEAN, NUMBER, STRING, NULL, UNKNOWN = "boolean", "number", "string", "null", "unknown"
DATETIME, TIMESPAN, UUID, BINARY = "date/time", "time span", "uuid", "binary"
_ORDERED = frozenset({NUMBER, STRING, DATETIME, TIMESPAN})
_KINDS: dict[type, str] = {bool: BOOLEAN, int: NUMBER, float: NUMBER, str: STRING}
# Types whose values an operator may take without further checks.
_NUMBERS = frozenset({int, float})
_EQUATABLE = frozenset({int, float, str, bool})
_ORDERABLE = frozenset({int, float, str})
_PARAMETER_TYPES = (str, int, float, bool, type(None))

_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, "!=": operator.ne,
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
}


def _divide(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        quotient = abs(a) // abs(b)
        return quotient if (a < 0) == (b < 0) else -quotient
    return a / b


def _remainder(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return a - b * _divide(a, b)
    if b == 0:
        raise ZeroDivisionError
    return math.fmod(a, b)


_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": _divide, "%": _remainder,
}


def _kind_of(value: Any) -> str:
    kind = _KINDS.get(type(value))
    if kind is not None:
        return kind
    if isinstance(value, bool):
        return BOOLEAN
    if isinstance(value, int | float):
        return NUMBER
    if isinstance(value, str):
        return STRING
    if isinstance(value, dt.datetime):
        return DATETIME
    if isinstance(value, dt.timedelta):
        return TIMESPAN
    if isinstance(value, uuid.UUID):
        return UUID
    if isinstance(value, bytes):
        return BINARY
    return type(value).__name__


def _as_uuid(value: Any) -> Any:
    """A string that spells a UUID as that UUID (in any case, with or
    without braces or dashes), so that ``user.id = '...'`` matches a UUID
    property; any other value as it is."""
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            return value
    return value


def _describe(value: Any) -> str:
    """A value as error messages show it: its kind, then SQL-style literal."""
    if value is None:
        return "NULL"
    if isinstance(value, str):  # the values _kind_of calls STRING
        return "string '" + value.replace("'", "''") + "'"
    kind = _kind_of(value)
    if kind == BOOLEAN:
        return f"boolean {'TRUE' if value else 'FALSE'}"
    return f"{kind} {value}"


@dataclass(frozen=True, slots=True)
class _Node:
    """A compiled part of a rule: its closure, its source text and where it
    starts (for messages), and its static kind. ``constant`` nodes ignore the
    message, and their value is ``value``."""

    evaluate: Evaluate
    text: str
    position: int
    kind: str
    constant: bool = False
    value: Any = None


# What constant parts are evaluated against, once, at compile time.
_NO_MESSAGE = MessageView({}, {})


class CompiledFilter:
    """A SQL filter compiled once; :meth:`matches` runs it on a message."""

    __slots__ = ("expression", "_evaluate", "reads")

    def __init__(self, expression: str, evaluate: Evaluate,
                 reads: frozenset[tuple[str, str]] | None) -> None:
        self.expression = expression
        self._evaluate = evaluate
        #: the properties whose values alone decide the filter, ``(scope,
        #: key)`` as a view indexes them (``"sys"`` or ``"user"``, the key
        #: lower-cased); None when it also reads one named only when it runs
        #: (``property(name)``) or calls ``newid()``
        self.reads = reads

    def matches(self, view: MessageView) -> bool:
        """Whether the filter is TRUE for this message: FALSE and UNKNOWN
        (a NULL somewhere decided it) both mean the message is not selected.
        Raises :class:`FilterEvaluationError` when the message makes the
        filter fail (a type mismatch, a division by zero...)."""
        return self._evaluate(view) is True

    def __repr__(self) -> str:
        return f"CompiledFilter({self.expression!r})"


class CompiledAction:
    """A SQL rule action compiled once; :meth:`apply` runs it on a message."""

    __slots__ = ("expression", "_statements")

    def __init__(self, expression: str, statements: list[Statement]) -> None:
        self.expression = expression
        self._statements = statements

    def apply(self, view: MessageView) -> dict[str, Any]:
        """The message's application properties after the action, as a new
        dict (``view`` is not changed). Statements run in order and each sees
        what the ones before it set. A key that existed keeps its case."""
        properties = dict(view.user)
        current = MessageView(view.system, properties)
        for statement in self._statements:
            statement(current, properties)
        return properties

    def __repr__(self) -> str:
        return f"CompiledAction({self.expression!r})"


def compile_filter(expression: str, parameters: Mapping[str, Any] | None = None
                   ) -> CompiledFilter:
    """Compile a SqlRuleFilter expression, e.g. ``"user.region = 'eu' AND
    amount > 100"``. ``parameters`` gives the values of ``@name`` parameters
    (keys with or without the ``@``). Raises :class:`SqlSyntaxError`."""
    tree = parse(expression, "filter")
    compiler = _Compiler(expression, parameters)
    node = compiler.condition(compiler.node(tree.children[0]), "a filter")
    reads = None if compiler.reads is None else frozenset(compiler.reads)
    return CompiledFilter(expression, node.evaluate, reads)


def compile_action(expression: str, parameters: Mapping[str, Any] | None = None
                   ) -> CompiledAction:
    """Compile a SqlRuleAction, e.g. ``"SET user.tier = 'gold'; REMOVE tmp"``.
    Actions change application properties only. Raises :class:`SqlSyntaxError`."""
    tree = parse(expression, "actions")
    compiler = _Compiler(expression, parameters)
    return CompiledAction(expression,
                          [compiler.statement(_subtree(child)) for child in tree.children])


def _subtree(child: _Child) -> ParseTree:
    """``child`` where the grammar puts a rule (a subtree), not a token."""
    assert isinstance(child, Tree), f"the grammar has a subtree here, not {child!r}"
    return child


def _token(child: _Child) -> Token:
    """``child`` where the grammar puts a token that the rule cannot leave out."""
    assert isinstance(child, Token), f"the grammar has a token here, not {child!r}"
    return child


def _constant(value: Any, text: str, position: int) -> _Node:
    def constant(view: MessageView) -> Any:
        return value

    kind = NULL if value is None else _kind_of(value)
    return _Node(constant, text, position, kind, constant=True, value=value)


class _Compiler:
    """Turns the parse tree of one rule into closures; one per compilation,
    as it holds the rule's text and parameters."""

    def __init__(self, source: str, parameters: Mapping[str, Any] | None) -> None:
        self.source = source
        self.parameters = {name.removeprefix("@").lower(): value
                           for name, value in (parameters or {}).items()}
        #: what the rule reads (:attr:`CompiledFilter.reads`)
        self.reads: set[tuple[str, str]] | None = set()

    # -- helpers ---------------------------------------------------------------

    def error(self, position: int, reason: str) -> SqlSyntaxError:
        return SqlSyntaxError(self.source, position, reason)

    def span(self, tree: ParseTree) -> tuple[str, int]:
        """The source text of a tree and where it starts."""
        return self.source[tree.meta.start_pos:tree.meta.end_pos], tree.meta.start_pos

    def built(self, tree: ParseTree, evaluate: Evaluate, kind: str, operands: list[_Node]) -> _Node:
        """The node for ``evaluate``; folded into a constant when it has
        operands, they are all constants and it succeeds on them (a failure,
        such as ``1/0``, is left to happen when a message is evaluated, as
        every other failure)."""
        text, position = self.span(tree)
        if operands and all(operand.constant for operand in operands):
            try:
                return _constant(evaluate(_NO_MESSAGE), text, position)
            except FilterEvaluationError:
                pass
        return _Node(evaluate, text, position, kind)

    def read(self, scope: str, key: str) -> None:
        """Note that the rule reads property ``key`` of ``scope``."""
        if self.reads is not None:
            self.reads.add((scope, SYSTEM_ALIASES.get(key, key) if scope == "sys" else key))

    def node(self, child: _Child) -> _Node:
        """The node of a subtree, compiled by the method named after its rule."""
        tree = _subtree(child)
        compile_rule: Callable[[ParseTree], _Node] = getattr(self, f"_{tree.data}")
        return compile_rule(tree)

    def condition(self, node: _Node, role: str) -> _Node:
        """``node`` as an operand that must be TRUE, FALSE or UNKNOWN."""
        if node.kind in (BOOLEAN, NULL):
            return node
        if node.kind != UNKNOWN:
            raise self.error(node.position, f"{role} needs a condition, but {node.text!r} "
                                            f"is a {node.kind}; compare it with a value")
        value_of, text = node.evaluate, node.text

        def condition(view: MessageView) -> bool | None:
            value = value_of(view)
            if value is None or value is True or value is False:
                return value
            raise FilterEvaluationError(
                f"{text} is {_describe(value)}, but {role} needs TRUE, FALSE or NULL; "
                f"compare it with a value (e.g. {text} = ...)")

        return _Node(condition, node.text, node.position, BOOLEAN)

    def operand(self, tree: _Child, operator_text: str) -> _Node:
        """An operand of arithmetic, which cannot be a condition."""
        node = self.node(tree)
        if node.kind == BOOLEAN:
            raise self.error(node.position, f"cannot apply {operator_text} to the condition "
                                            f"{node.text!r}; arithmetic needs numbers")
        return node

    # -- statements ------------------------------------------------------------

    def statement(self, tree: ParseTree) -> Statement:
        verb, target = _token(tree.children[0]), _subtree(tree.children[1])
        scope, name, _ = self.property_name(target)
        if scope == "sys":
            raise self.error(target.meta.start_pos, f"{verb.upper()} {self.span(target)[0]} is "
                             "not supported: actions change application properties only "
                             f"(user.{name})")
        key = name.lower()
        if tree.data == "remove_action":
            def remove(current: MessageView, properties: dict[str, Any]) -> None:
                for written in [k for k in properties if k.lower() == key]:
                    del properties[written]
                current.user_index.pop(key, None)

            return remove
        value_of = self.node(tree.children[2]).evaluate

        def set_(current: MessageView, properties: dict[str, Any]) -> None:
            result = value_of(current)
            written = next((k for k in properties if k.lower() == key), name)
            properties[written] = result
            current.user_index[key] = result

        return set_

    # -- conditions ------------------------------------------------------------

    def _parenthesized(self, tree: ParseTree) -> _Node:
        return self.node(tree.children[1])

    def _or_(self, tree: ParseTree) -> _Node:
        left, right = (self.condition(self.node(tree.children[i]), "OR") for i in (0, 2))
        first, second = left.evaluate, right.evaluate

        def or_(view: MessageView) -> bool | None:
            a = first(view)
            if a is True:
                return True
            b = second(view)
            if b is True:
                return True
            return None if a is None or b is None else False

        return self.built(tree, or_, BOOLEAN, [left, right])

    def _and_(self, tree: ParseTree) -> _Node:
        left, right = (self.condition(self.node(tree.children[i]), "AND") for i in (0, 2))
        first, second = left.evaluate, right.evaluate

        def and_(view: MessageView) -> bool | None:
            a = first(view)
            if a is False:
                return False
            b = second(view)
            if b is False:
                return False
            return None if a is None or b is None else True

        return self.built(tree, and_, BOOLEAN, [left, right])

    def _not_(self, tree: ParseTree) -> _Node:
        operand = self.condition(self.node(tree.children[1]), "NOT")
        value_of = operand.evaluate

        def not_(view: MessageView) -> bool | None:
            value = value_of(view)
            return None if value is None else not value

        return self.built(tree, not_, BOOLEAN, [operand])

    def _comparison(self, tree: ParseTree) -> _Node:
        left, right = self.node(tree.children[0]), self.node(tree.children[2])
        symbol = str(_subtree(tree.children[1]).children[0])
        compare = _comparer(symbol, self.span(tree)[0])
        first, second = left.evaluate, right.evaluate
        if right.constant and not left.constant and right.value is not None:
            return self.built(tree, _against_constant(first, symbol, right.value, compare),
                              BOOLEAN, [left, right])

        def comparison(view: MessageView) -> bool | None:
            a = first(view)
            if a is None:
                return None
            b = second(view)
            if b is None:
                return None
            return compare(a, b)

        return self.built(tree, comparison, BOOLEAN, [left, right])

    def _is_null(self, tree: ParseTree) -> _Node:
        operand = self.node(tree.children[0])
        value_of, negated = operand.evaluate, tree.children[2] is not None

        def is_null(view: MessageView) -> bool:
            return (value_of(view) is None) is not negated

        return self.built(tree, is_null, BOOLEAN, [operand])

    def _in_list(self, tree: ParseTree) -> _Node:
        operand = self.node(tree.children[0])
        items = [self.node(child) for child in tree.children[4:-1]]
        text = self.span(tree)[0]
        found = tree.children[1] is None
        value_of = operand.evaluate
        equal = _comparer("=", text)
        members = [item.value for item in items if item.value is not None]
        kinds = {_kind_of(member) for member in members}
        if all(item.constant for item in items) and len(kinds) == 1:
            # The usual case, a list of literals of one kind: one set lookup.
            (kind,) = kinds
            member_set = frozenset(members)
            missing = None if len(members) < len(items) else not found

            def in_set(view: MessageView) -> bool | None:
                value = value_of(view)
                if value is None:
                    return None
                if type(value) is uuid.UUID and kind == STRING:
                    hit = any(equal(value, member) for member in members)
                    return found if hit else missing
                if (_KINDS.get(type(value)) or _kind_of(value)) != kind:
                    raise FilterEvaluationError(
                        f"cannot compare {_describe(value)} with the {kind} values of the "
                        f"list in {text}; use a list of {_kind_of(value)} values")
                return found if value in member_set else missing

            return self.built(tree, in_set, BOOLEAN, [operand])
        item_values = [item.evaluate for item in items]

        def in_items(view: MessageView) -> bool | None:
            value = value_of(view)
            if value is None:
                return None
            saw_null = False
            for item_value in item_values:
                candidate = item_value(view)
                if candidate is None:
                    saw_null = True
                elif equal(value, candidate):
                    return found
            return None if saw_null else not found

        return self.built(tree, in_items, BOOLEAN, [operand, *items])

    def _like(self, tree: ParseTree) -> _Node:
        subject, negation, _, pattern_tree, _, escape_tree = tree.children
        operand = self.node(subject)
        pattern = self.like_text(pattern_tree, "LIKE pattern")
        escape = None if escape_tree is None else self.like_text(escape_tree, "ESCAPE")
        if escape is not None and len(escape) != 1:
            raise self.error(_subtree(escape_tree).meta.start_pos,
                             f"ESCAPE takes one character, not {len(escape)}: {escape!r}")
        pattern_position = _subtree(pattern_tree).meta.start_pos
        fullmatch = self.like_regex(pattern, escape, pattern_position).fullmatch
        value_of, negated, text = operand.evaluate, negation is not None, self.span(tree)[0]

        def like(view: MessageView) -> bool | None:
            value = value_of(view)
            if value is None:
                return None
            if not isinstance(value, str):
                raise FilterEvaluationError(f"LIKE needs a string, but {operand.text} is "
                                            f"{_describe(value)} in {text}")
            return (fullmatch(value) is None) is negated

        return self.built(tree, like, BOOLEAN, [operand])

    def like_text(self, tree: _Child, role: str) -> str:
        node = self.node(tree)
        if not isinstance(node.value, str):
            raise self.error(node.position, f"{role} must be a string, but {node.text} is "
                                            f"{_describe(node.value)}")
        return node.value

    def like_regex(self, pattern: str, escape: str | None, position: int) -> re.Pattern[str]:
        """``%`` is any run of characters, ``_`` any one; the escape character
        makes the character after it literal."""
        parts, chars = [], iter(pattern)
        for char in chars:
            if char == escape:
                literal = next(chars, None)
                if literal is None:
                    raise self.error(position, f"the LIKE pattern {pattern!r} ends with its "
                                               f"escape character {escape!r}; escape something "
                                               "or double it to match it")
                parts.append(re.escape(literal))
            elif char == "%":
                parts.append(".*")
            elif char == "_":
                parts.append(".")
            else:
                parts.append(re.escape(char))
        return re.compile("".join(parts), re.DOTALL)

    def _exists(self, tree: ParseTree) -> _Node:
        target = _subtree(tree.children[2])
        scope, _, key = self.property_name(target)
        self.read(scope, key)
        _, present = _accessors(scope, key, self.span(target)[0])
        return self.built(tree, present, BOOLEAN, [])

    # -- expressions -----------------------------------------------------------

    def _arithmetic(self, tree: ParseTree) -> _Node:
        symbol = str(_subtree(tree.children[1]).children[0])
        left = self.operand(tree.children[0], symbol)
        right = self.operand(tree.children[2], symbol)
        text = self.span(tree)[0]
        apply, checked = _ARITHMETIC[symbol], _arithmetic_checker(symbol, text)
        first, second = left.evaluate, right.evaluate

        def arithmetic(view: MessageView) -> Any:
            a = first(view)
            if a is None:
                return None
            b = second(view)
            if b is None:
                return None
            if type(a) in _NUMBERS and type(b) in _NUMBERS:
                try:
                    return apply(a, b)
                except ZeroDivisionError:
                    raise FilterEvaluationError(f"division by zero in {text}") from None
            return checked(a, b)

        # Sound, if not exact: a number operand makes the result a number or
        # an error, as a string operand of + makes it a string or an error.
        kinds = {left.kind, right.kind}
        kind = (NUMBER if NUMBER in kinds else
                STRING if STRING in kinds and symbol == "+" else UNKNOWN)
        return self.built(tree, arithmetic, kind, [left, right])

    def _signed(self, tree: ParseTree) -> _Node:
        symbol = str(_subtree(tree.children[0]).children[0])
        operand = self.operand(tree.children[1], f"unary {symbol}")
        value_of, text = operand.evaluate, self.span(tree)[0]
        negate = symbol == "-"

        def signed(view: MessageView) -> Any:
            value = value_of(view)
            if value is None:
                return None
            if _kind_of(value) not in (NUMBER, TIMESPAN):
                raise FilterEvaluationError(f"cannot apply unary {symbol} to "
                                            f"{_describe(value)} in {text}; it needs a number")
            return -value if negate else value

        return self.built(tree, signed, operand.kind, [operand])

    def _number(self, tree: ParseTree) -> _Node:
        text, position = self.span(tree)
        value = float(text) if any(c in text for c in ".eE") else int(text)
        return _constant(value, text, position)

    def _string(self, tree: ParseTree) -> _Node:
        text, position = self.span(tree)
        return _constant(text[1:-1].replace("''", "'"), text, position)

    def _true(self, tree: ParseTree) -> _Node:
        return _constant(True, *self.span(tree))

    def _false(self, tree: ParseTree) -> _Node:
        return _constant(False, *self.span(tree))

    def _null(self, tree: ParseTree) -> _Node:
        return _constant(None, *self.span(tree))

    def _parameter(self, tree: ParseTree) -> _Node:
        text, position = self.span(tree)
        name = text[1:].lower()
        if name not in self.parameters:
            given = ", ".join(f"@{n}" for n in sorted(self.parameters)) or "none"
            raise self.error(position, f"parameter {text} is not defined (parameters given: "
                                       f"{given}); pass it in parameters={{{text!r}: ...}}")
        value = self.parameters[name]
        if not isinstance(value, _PARAMETER_TYPES):
            raise self.error(position, f"parameter {text} is a {type(value).__name__}; "
                                       "a parameter must be a str, int, float, bool or None")
        return _constant(value, text, position)

    def _property(self, tree: ParseTree) -> _Node:
        scope, _, key = self.property_name(tree)
        self.read(scope, key)
        text, position = self.span(tree)
        value, _ = _accessors(scope, key, text)
        return _Node(value, text, position, UNKNOWN)

    def property_name(self, tree: ParseTree) -> tuple[str, str, str]:
        """``(scope, name as written, lower-cased name)`` of a property tree."""
        scope_token, name_token = tree.children[0], _token(tree.children[1])
        scope = "user"
        if scope_token is not None:
            scope_token = _token(scope_token)
            scope = scope_token.lower()
            if scope not in ("sys", "user"):
                raise self.error(scope_token.start_pos or 0,
                                 f"unknown scope {str(scope_token)!r} in {self.span(tree)[0]}; "
                                 "a property is sys.<name>, user.<name> or <name> (user)")
        name = str(name_token)
        if name_token.type == "DELIMITED_IDENTIFIER":
            name = name[1:-1].replace("]]", "]")
        elif name_token.type == "QUOTED_IDENTIFIER":
            name = name[1:-1].replace('""', '"')
        return scope, name, name.lower()

    def _function(self, tree: ParseTree) -> _Node:
        name_token = _token(tree.children[0])
        arguments = [self.node(child) for child in tree.children[1:] if isinstance(child, Tree)]
        name, text = name_token.lower(), self.span(tree)[0]
        arity = {"newid": 0, "property": 1, "p": 1}.get(name)
        if arity is None:
            raise self.error(name_token.start_pos or 0,
                             f"unknown function {str(name_token)}(); the functions are "
                             "newid(), property(name) and p(name)")
        if len(arguments) != arity:
            raise self.error(name_token.start_pos or 0,
                             f"{name}() takes {arity} argument{'s' if arity != 1 else ''}, "
                             f"not {len(arguments)}")
        self.reads = None  # a new id each time, or a property known only when it runs
        if name == "newid":
            def newid(view: MessageView) -> str:
                return str(uuid.uuid4())

            return _Node(newid, text, name_token.start_pos or 0, STRING)
        name_of = arguments[0].evaluate

        def property_(view: MessageView) -> Any:
            property_name = name_of(view)
            if property_name is None:
                return None
            if not isinstance(property_name, str):
                raise FilterEvaluationError(f"{name}() needs a property name, but got "
                                            f"{_describe(property_name)} in {text}")
            return view.user_index.get(property_name.lower())

        return _Node(property_, text, name_token.start_pos or 0, UNKNOWN)


def _accessors(scope: str, key: str, text: str) -> tuple[Evaluate, Evaluate]:
    """How to read the property ``key`` (lower-cased) of ``scope``, and how to
    tell whether a message has it. A system property that does not exist is
    an error when a message is evaluated, as in Service Bus."""
    if scope == "sys" and key not in SYSTEM_PROPERTIES:
        name = text.split(".", 1)[1]

        def unknown(view: MessageView) -> Any:
            raise FilterEvaluationError(
                f"{text} is not a system property; they are "
                f"{', '.join(sorted(SYSTEM_PROPERTIES))} (write user.{name} for an "
                "application property)")

        return unknown, unknown
    if scope == "sys":
        key = SYSTEM_ALIASES.get(key, key)

        def system_value(view: MessageView) -> Any:
            return view.system_index.get(key)

        def system_present(view: MessageView) -> bool:
            return key in view.system_index

        return system_value, system_present

    def user_value(view: MessageView) -> Any:
        return view.user_index.get(key)

    def user_present(view: MessageView) -> bool:
        return key in view.user_index

    return user_value, user_present


_EQUALITIES = ("=", "<>", "!=")


def _direct(symbol: str) -> frozenset[type]:
    """The types a comparison ``symbol`` applies to directly, when both
    values are of the same one (numbers of either kind compare too)."""
    return _EQUATABLE if symbol in _EQUALITIES else _ORDERABLE


def _against_constant(first: Evaluate, symbol: str, b: Any,
                      compare: Callable[[Any, Any], bool]) -> Evaluate:
    """A comparison of a message's value with the constant ``b`` (most
    filters: ``region = 'eu'``, ``amount > 100``): a value of a type that
    compares with ``b`` directly is compared in place, anything else goes
    through ``compare``'s checks (the scanner evaluates a subscription's
    rules on every record of its topic, so each call saved counts)."""
    apply = _COMPARISONS[symbol]
    fast = (_NUMBERS if type(b) in _NUMBERS else frozenset({type(b)})) & _direct(symbol)

    def comparison(view: MessageView) -> bool | None:
        a = first(view)
        if a is None:
            return None
        if type(a) in fast:
            return apply(a, b)
        return compare(a, b)

    return comparison


def _comparer(symbol: str, text: str) -> Callable[[Any, Any], bool]:
    """The comparison ``symbol`` of two non-NULL values, with the kind checks;
    ``text`` is the comparison's source, for error messages."""
    apply = _COMPARISONS[symbol]
    equality = symbol in _EQUALITIES
    direct = _direct(symbol)

    def compare(a: Any, b: Any) -> bool:
        type_a, type_b = type(a), type(b)
        if (type_a is type_b and type_a in direct) or (type_a in _NUMBERS and type_b in _NUMBERS):
            return apply(a, b)
        kind_a, kind_b = _kind_of(a), _kind_of(b)
        if equality and {kind_a, kind_b} == {UUID, STRING}:
            return apply(*map(_as_uuid, (a, b)))
        if kind_a != kind_b:
            raise FilterEvaluationError(
                f"cannot compare {_describe(a)} with {_describe(b)} in {text}; compare "
                "numbers with numbers, strings with strings")
        if not equality and kind_a not in _ORDERED:
            raise FilterEvaluationError(f"{kind_a} values can only be compared with = or <>, "
                                        f"not {symbol}, in {text}")
        try:
            return apply(a, b)
        except TypeError as exc:  # e.g. a naive with a time-zone aware date/time
            raise FilterEvaluationError(f"cannot compare {_describe(a)} with {_describe(b)} "
                                        f"in {text}: {exc}") from None

    return compare


def _arithmetic_checker(symbol: str, text: str) -> Callable[[Any, Any], Any]:
    """Arithmetic ``symbol`` on two non-NULL values that are not both plain
    ints or floats: numeric subclasses, strings, date/times and time spans."""
    apply = _ARITHMETIC[symbol]
    allowed = "numbers, or two strings" if symbol == "+" else "numbers"

    def checked(a: Any, b: Any) -> Any:
        kinds = {_kind_of(a), _kind_of(b)}
        try:
            if kinds == {NUMBER}:
                return apply(a, b)
            if kinds == {STRING} and symbol == "+":
                return a + b
            if kinds <= {DATETIME, TIMESPAN} and symbol in "+-":
                return apply(a, b)
        except ZeroDivisionError:
            raise FilterEvaluationError(f"division by zero in {text}") from None
        except TypeError:  # e.g. time span - date/time
            pass
        raise FilterEvaluationError(f"cannot apply {symbol} to {_describe(a)} and "
                                    f"{_describe(b)} in {text}; {symbol} needs {allowed}")

    return checked
