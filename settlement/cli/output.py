"""How the ``settlement`` commands print what they found: every ``list``,
``show``, ``peek`` and ``receive`` takes ``--output table`` (aligned text for
people, the default) or ``--output json`` (one JSON document on stdout for
scripts; counts, notes and progress go to stderr either way)::

    settlement queue list --output json | jq -r '.[].name'
    settlement peek orders --max 50 --output json | jq '.[] | select(.state == "DEFERRED")'

In JSON, properties keep the SDK's names; times are ISO 8601, durations are
seconds, enums their names. A message is an object with its fields that are
set (:func:`message_json`); its ``body`` is text when it is UTF-8 and base64
otherwise, as ``body_encoding`` says.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime as dt
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from settlement.message import ServiceBusReceivedMessage
from topics.entities.queue import DEFAULT_TTL

TABLE, JSON = "table", "json"
#: Characters of a body shown in a message's line.
BODY_WIDTH = 60
#: A ``list`` column: its header and the attribute (or function) of its value.
Column = tuple[str, str | Callable[[Any], object]]
#: What a message's JSON object holds besides its body, in order (unset ones are left out).
MESSAGE_FIELDS = (
    "message_id", "sequence_number", "state", "delivery_count", "enqueued_time_utc",
    "session_id", "application_properties", "subject", "correlation_id", "content_type",
    "to", "reply_to", "reply_to_session_id", "partition_key", "time_to_live",
    "scheduled_enqueue_time_utc", "expires_at_utc", "locked_until_utc", "lock_token",
    "dead_letter_reason", "dead_letter_error_description", "dead_letter_source")
#: A message's line in a table: label and field, shown when the field is set.
MESSAGE_LINE = (("seq", "sequence_number"), ("state", "state"),
                ("delivery", "delivery_count"), ("id", "message_id"), ("session", "session_id"),
                ("body", "body"), ("properties", "application_properties"),
                ("reason", "dead_letter_reason"),
                ("description", "dead_letter_error_description"))


def add_output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", choices=[TABLE, JSON], default=TABLE,
                        help="table: aligned text (default); json: one JSON document on "
                             "stdout, for scripts (counts and notes go to stderr)")


def print_json(value: object) -> None:
    print(json.dumps(value, default=_json_value, indent=2, ensure_ascii=False))


def _json_value(value: object) -> object:
    """What ``json`` cannot write by itself, as it is written."""
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if hasattr(value, "__dict__"):  # rule filters and actions
        return {k: v for k, v in vars(value).items() if not k.startswith("_")}
    raise TypeError(f"{type(value).__name__} has no JSON form")


# ------------------------------------------------------------ properties, listings
def show_value(value: object) -> str:
    """One value as ``show`` and ``create`` print it: durations in seconds
    (or ``never``), times in ISO 8601, lists joined, nothing as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, dt.timedelta):
        return "never" if value >= DEFAULT_TTL else f"{value.total_seconds():g}s"
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return ", ".join(map(show_value, value)) or "-"
    return str(value)


def print_fields(fields: list[tuple[str, object]], output: str = TABLE) -> None:
    """``name  value`` lines, values aligned (or one JSON object): what the
    ``show`` commands print."""
    if output == JSON:
        print_json(dict(fields))
        return
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        print(f"{name:<{width}}  {show_value(value)}")


def print_listing(what: str, items: Sequence[Any], columns: Sequence[Column],
                  output: str = TABLE) -> None:
    """A table of ``items`` (times to the second), or ``no WHAT`` on stderr;
    in JSON, the items whole, as a list."""
    if output == JSON:
        print_json(list(items))
        return
    if not items:
        print(f"no {what}", file=sys.stderr)
        return

    def cell(item: Any, source: str | Callable[[Any], object]) -> str:
        value = source(item) if callable(source) else getattr(item, source)
        if isinstance(value, dt.datetime):
            return value.strftime("%Y-%m-%d %H:%M:%S")
        return show_value(value)

    print(format_table([header for header, _ in columns],
                       [[cell(item, source) for _, source in columns] for item in items]))


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """Plain left-aligned columns with a header rule."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in [headers, ["-" * w for w in widths], *rows]]
    return "\n".join(lines)


# ---------------------------------------------------------------------- messages
def message_json(message: ServiceBusReceivedMessage) -> dict[str, object]:
    """A received or peeked message as a JSON object: its fields that are set."""
    body = b"".join(message.body)
    try:
        text, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(body).decode("ascii"), "base64"
    fields = {name: getattr(message, name) for name in MESSAGE_FIELDS}
    fields["state"] = message.state.name  # an IntEnum, which json writes as a number
    return {"body": text, "body_encoding": encoding,
            **{k: v for k, v in fields.items() if v is not None}}


def print_messages(messages: Sequence[ServiceBusReceivedMessage], output: str,
                   settled: Sequence[str] | None = None) -> None:
    """One line per message (``seq=... id=... body=...``), or a JSON list of
    :func:`message_json` objects; ``settled`` adds what ``receive`` did to each."""
    outcomes: Sequence[str | None] = settled if settled is not None else [None] * len(messages)
    if output == JSON:
        print_json([{**message_json(m), **({"settled": s} if s else {})}
                    for m, s in zip(messages, outcomes, strict=True)])
        return
    for message, outcome in zip(messages, outcomes, strict=True):
        shown = {**message_json(message), "body": _short(str(message)),
                 "application_properties": json.dumps(
                     message.application_properties or {}, separators=(",", ":"),
                     sort_keys=True, default=str)}
        parts = [f"{label}={shown[name]}" for label, name in MESSAGE_LINE if name in shown]
        print(" ".join(parts + ([f"settled={outcome}"] if outcome else [])))


def _short(text: str) -> str:
    if len(text) > BODY_WIDTH:
        text = text[:BODY_WIDTH - 3] + "..."
    return repr(text)
