"""Moved to :mod:`pytest_oam.properties.sweep`; this import path keeps working (the same module object)."""

import sys

from .properties import sweep as _moved

sys.modules[__name__] = _moved
