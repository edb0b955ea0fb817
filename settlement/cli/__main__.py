"""``python -m settlement.cli``: the ``settlement`` command."""

import sys

from settlement.cli.app import main

sys.exit(main())
