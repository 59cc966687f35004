"""``python -m simulator.validation``: the validation table (same options as ``oam validate``)."""

import sys

from . import main

sys.exit(main())
