"""The Service Bus SQL rule language: what a rule sees of a message, its errors,
and its parser.

A rule reads a message through a :class:`MessageView` (system properties under
``sys.``, application properties under ``user.``, both case-insensitive). The
grammar lives in ``grammar.lark`` next to this module and is parsed with lark's
LALR parser, built once per process; :mod:`topics.rules.compiler` turns the
parse tree into closures. Every error a rule's author can make while writing it
is a :class:`SqlSyntaxError` pointing at the line and column to fix; every error
a message can trigger while a rule runs is a :class:`FilterEvaluationError`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from typing import Any

from lark import Lark, ParseTree, UnexpectedCharacters, UnexpectedToken

# The properties of a Service Bus message a rule may name as ``sys.<name>``
# (the BrokeredMessage properties, lower-cased). ``label`` and ``subject`` are
# one property: the SQL language calls it Label, the current SDKs Subject.
SYSTEM_PROPERTIES: frozenset[str] = frozenset({
    "messageid", "correlationid", "to", "replyto", "label", "subject", "sessionid",
    "replytosessionid", "contenttype", "sequencenumber", "enqueuedsequencenumber",
    "enqueuedtimeutc", "scheduledenqueuetimeutc", "expiresatutc", "timetolive",
    "deliverycount", "size", "partitionkey", "viapartitionkey", "deadlettersource",
    "lockeduntilutc", "locktoken", "state",
})
# Names of one system property: a view indexes it under the name on the right.
SYSTEM_ALIASES = {"subject": "label"}


class SqlSyntaxError(ValueError):
    """A rule that cannot be compiled: bad syntax, or a construct that can
    never be valid (SET on a system property, an undefined parameter...).

    ``position`` is the 0-based offset in the rule's text, ``line`` and
    ``column`` its 1-based line and column.
    """

    def __init__(self, source: str, position: int, reason: str) -> None:
        self.source = source
        self.position = position
        self.line = source.count("\n", 0, position) + 1
        self.column = position - (source.rfind("\n", 0, position) + 1) + 1
        self.reason = reason
        super().__init__(f"syntax error at line {self.line}, column {self.column} "
                         f"(position {position}): {reason}")


class FilterEvaluationError(Exception):
    """A rule failed on one message: a type mismatch, a division by zero, an
    unknown system property. The message names the part of the rule that
    failed and the values it met."""


class MessageView:
    """What a rule sees of one message.

    ``system`` holds system properties under lower-case names (``messageid``,
    ``label``...); ``user`` the application properties as the sender wrote
    them. Both are indexed by lower-cased name once, here, because property
    names in rules are case-insensitive and a view is read by many rules;
    ``subject`` is indexed as ``label`` too (see ``SYSTEM_ALIASES``).
    """

    __slots__ = ("system", "user", "system_index", "user_index")

    def __init__(self, system: Mapping[str, Any], user: Mapping[str, Any]) -> None:
        self.system = system
        self.user = user
        self.system_index: dict[str, Any] = {k.lower(): v for k, v in system.items()}
        for alias, name in SYSTEM_ALIASES.items():
            if self.system_index.get(name) is None and alias in self.system_index:
                self.system_index[name] = self.system_index[alias]
        self.user_index: dict[str, Any] = {k.lower(): v for k, v in user.items()}

    @classmethod
    def indexed(cls, system: dict[str, Any], user: Mapping[str, Any]) -> MessageView:
        """A view whose ``system`` properties are under their lower-case
        names already, each alias beside its name (as
        ``topics.message_record.filter_properties`` gives them): used as its
        own index. The engine's log scanner makes a view of every record of
        a filtered topic; indexing them again was a third of that."""
        view = cls.__new__(cls)
        view.system = view.system_index = system
        view.user = user
        view.user_index = {k.lower(): v for k, v in user.items()}
        return view

    def __repr__(self) -> str:
        return f"MessageView(system={dict(self.system)!r}, user={dict(self.user)!r})"


# How a terminal of the grammar is named in "expected ..." messages; keywords
# and punctuation are shown as written.
_TERMINAL_NAMES = {
    "IDENTIFIER": "a property name",
    "DELIMITED_IDENTIFIER": "a [delimited name]",
    "QUOTED_IDENTIFIER": 'a "quoted name"',
    "STRING": "a 'string'",
    "NUMBER": "a number",
    "PARAMETER": "an @parameter",
    "$END": "the end of the rule",
}


@functools.cache
def _parser() -> Lark:
    # The basic lexer rather than lark's contextual one: it reads a keyword as
    # a keyword wherever it stands, so "AND AND x" is an error at the second
    # AND rather than a property named AND.
    grammar = resources.files(__package__).joinpath("grammar.lark").read_text("utf-8")
    return Lark(grammar, parser="lalr", lexer="basic", start=["filter", "actions"],
                propagate_positions=True, maybe_placeholders=True)


def parse(source: str, start: str) -> ParseTree:
    """Parse ``source`` as a ``filter`` or as ``actions`` (the grammar's two
    start symbols); lark's errors become :class:`SqlSyntaxError`."""
    try:
        return _parser().parse(source, start=start)
    except UnexpectedToken as exc:
        if exc.token.type == "$END":
            position, found = len(source.rstrip()), "end of the rule"
        else:
            position, found = exc.token.start_pos, repr(str(exc.token))
        expected = exc.accepts or exc.expected
        reason = f"unexpected {found}; expected " + ", ".join(
            sorted({_terminal_name(t) for t in expected}))
    except UnexpectedCharacters as exc:
        # lark declares pos_in_stream as `= None` on UnexpectedInput, but the
        # lexer's UnexpectedCharacters always sets it to the offset (an int).
        position = exc.pos_in_stream  # type: ignore[assignment]
        reason = (f"unexpected character {source[position]!r}: no token starts with it "
                  "(strings are in 'single quotes', names with spaces in [brackets])")
    raise SqlSyntaxError(source, position, reason) from None


def _terminal_name(name: str) -> str:
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    # Every other terminal is a keyword or a punctuation mark.
    text = _parser().get_terminal(name).pattern.value
    return text.upper() if text.isalpha() else repr(text)
