"""``settlement namespace create|show|set``: the namespace's own settings,
its engine partitions (fixed when it is made) and its limit of engine
commands per second::

    settlement namespace create --engine-partitions 16
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
from topics.entities import DEFAULT_ENGINE_PARTITIONS, MAX_ENGINE_PARTITIONS


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``namespace create``, ``namespace show`` and ``namespace set``."""
    sub = add_group(commands, common, "namespace", "create, show, set",
                    "The namespace's own settings: its engine partitions and its limit of "
                    "engine commands per second.")
    create = add_command(
        sub, common, "create", cmd_namespace_create, "make the namespace",
        "Make the connection string's namespace: its topics, with N engine partitions. A "
        "namespace can use at most N engine workers (one per partition; more wait as "
        "standbys). N cannot change later. Without this, the first engine worker or "
        f"administration call makes the namespace with {DEFAULT_ENGINE_PARTITIONS}.")
    create.add_argument("--engine-partitions", dest="engine_partitions", type=int,
                        default=DEFAULT_ENGINE_PARTITIONS, metavar="N",
                        help=f"1 to {MAX_ENGINE_PARTITIONS}, the most engine workers the "
                        f"namespace can use (default {DEFAULT_ENGINE_PARTITIONS})")
    add_output_option(create)
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


def cmd_namespace_create(args: argparse.Namespace) -> int:
    with admin_client(args) as admin:
        _print(admin.create_namespace(engine_partitions=args.engine_partitions), args.output)
    return 0


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
                  ("engine_partitions", props.engine_partitions),
                  ("max_commands_per_second", props.max_commands_per_second or "none"),
                  ("updated_at_utc", props.updated_at_utc)], output)
