"""``settlement namespace show|set``: the namespace's own settings, today its
limit of engine commands per second::

    settlement namespace set --max-commands-per-second 500
    settlement namespace show
    settlement namespace set --max-commands-per-second none

Apart from :mod:`settlement.cli.admin` (entities).
"""

from __future__ import annotations

import argparse
from typing import Any

from settlement.cli.base import add_command, add_group, admin_client
from settlement.cli.output import add_output_option, print_fields
from settlement.management import NamespaceProperties


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``namespace show`` and ``namespace set``."""
    sub = add_group(commands, common, "namespace", "show, set",
                    "The namespace's own settings: its limit of engine commands per second.")
    add_command(sub, common, "show", cmd_namespace_show, "show the namespace's settings",
                "Show the namespace's settings.")
    change = add_command(
        sub, common, "set", cmd_namespace_set, "change the namespace's settings",
        "Limit the engine commands (receives, settlements, peeks, counts...) that all the "
        "namespace's clients together may send per second. Commands over it are answered "
        "ServerBusy, and clients try that entity again 10 s later. In effect when this "
        "returns.")
    change.add_argument("--max-commands-per-second", dest="max_commands_per_second",
                        type=_limit, required=True, metavar="N|none",
                        help="commands per second, or 'none' for no limit")
    add_output_option(change)


def _limit(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'none', got {text!r}"
                                         ) from None


def cmd_namespace_show(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        _print(admin.get_namespace_properties(), args.output)
    return 0


def cmd_namespace_set(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        _print(admin.update_namespace_properties(
            max_commands_per_second=args.max_commands_per_second), args.output)
    return 0


def _print(props: NamespaceProperties, output: str) -> None:
    print_fields([("name", props.name),
                  ("max_commands_per_second", props.max_commands_per_second or "none"),
                  ("updated_at_utc", props.updated_at_utc)], output)
