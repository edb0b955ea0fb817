"""What every module of the ``settlement`` command shares: the usage error,
the connection string lookup and the helpers that register sub-commands.

Kept apart from :mod:`settlement.cli.app`, which builds the parser from the
command modules, so that those modules need nothing of it.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

from settlement.cli.output import add_output_option
from settlement.management import ServiceBusAdministrationClient
from settlement.message import PropertyValue

ENV_CONNECTION_STRING = "SETTLEMENT_CONNECTION_STRING"
#: Sub-commands that print what they found, so take ``--output table|json``.
OUTPUT_COMMANDS = ("list", "show", "sessions")


class UsageError(ValueError):
    """A command line that parses but cannot be carried out as given."""


def add_group(commands: Any, common: argparse.ArgumentParser, name: str, summary: str,
              description: str) -> Any:
    """A command with sub-commands (``queue``, ``topic``...); alone, it prints its help."""
    group = commands.add_parser(name, parents=[common], help=summary, description=description)
    group.set_defaults(handler=None, parser=group)
    return group.add_subparsers(title=f"{name} commands", metavar=f"{name.upper()}_COMMAND")


def add_command(sub: Any, common: argparse.ArgumentParser, name: str,
                handler: Callable[[argparse.Namespace], int], summary: str, description: str,
                *positionals: str) -> argparse.ArgumentParser:
    """A sub-command of a group; each positional's dest is its metavar in lower case.
    Those of :data:`OUTPUT_COMMANDS` take ``--output``."""
    parser = sub.add_parser(name, parents=[common], help=summary, description=description)
    for metavar in positionals:
        parser.add_argument(metavar.lower(), metavar=metavar)
    if name in OUTPUT_COMMANDS:
        add_output_option(parser)
    parser.set_defaults(handler=handler)
    return parser


def connection_string(args: argparse.Namespace) -> str:
    conn = getattr(args, "connection_string", None) or os.environ.get(ENV_CONNECTION_STRING)
    if not conn:
        raise UsageError(f"no connection string: pass --connection-string or set "
                         f"{ENV_CONNECTION_STRING} ('Endpoint=kafka://HOST:PORT;Namespace=NAME')")
    return conn


def admin_client(args: argparse.Namespace) -> ServiceBusAdministrationClient:
    return ServiceBusAdministrationClient.from_connection_string(connection_string(args))


def split_pair(pair: str, option: str) -> tuple[str, str]:
    """``"KEY=VALUE"`` -> ``("KEY", "VALUE")``; ``option`` names the flag in the error."""
    key, sep, raw = pair.partition("=")
    if not sep or not key:
        raise UsageError(f"{option} takes KEY=VALUE, got {pair!r}")
    return key, raw


def property_value(raw: str) -> PropertyValue:
    """A JSON number, true, false or null as such; anything else as text,
    so that rules compare ``amount >= 100`` as numbers."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, int | float | bool | None) else raw
