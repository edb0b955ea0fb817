"""``python -m settlement.demo``: run the tour, exit with its code."""

import sys

from settlement.demo.tour import main

sys.exit(main())
