"""``python -m controller.cli``: the ``heroserve`` command, for processes started without it."""

import sys

from controller.cli import main

sys.exit(main())
