"""``python -m loadlab.selftest``: the fixed-schedule server on its own (``--help``)."""

import os
import sys

from loadlab.selftest._fixed_server import main

os.environ.setdefault("PYTHONUNBUFFERED", "1")
sys.exit(main())
