"""``python -m sim`` is the ``kvsim`` command."""

import sys

from sim.cli import main

sys.exit(main())
