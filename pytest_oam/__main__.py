"""``python -m pytest_oam``: the ``oam`` command."""

import sys

from .cli import main

sys.exit(main())
