"""Moved to :mod:`pytest_oam.properties.perf`; this import path keeps working (the same module object)."""

import sys

from .properties import perf as _moved

sys.modules[__name__] = _moved
