"""The ``settlement`` command line, an app built on the client library.

:mod:`settlement.cli.app` builds the parser and runs a command; the command
groups live beside it (:mod:`~settlement.cli.admin` for entities,
:mod:`~settlement.cli.namespace`, :mod:`~settlement.cli.pair`,
:mod:`~settlement.cli.broker`), :mod:`~settlement.cli.base` holds what
they all share and :mod:`~settlement.cli.output` how they print (tables or
``--output json``). The client library imports none of them.
"""

from settlement.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
