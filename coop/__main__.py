"""``python -m coop``: the same command as the ``coop`` console script."""

import sys

from coop.cli import main

sys.exit(main())
