"""Moved to :mod:`pytest_oam.tuning.search`; this import path keeps working (the same module object)."""

import sys

from .tuning import search as _moved

sys.modules[__name__] = _moved
