"""Moved to :mod:`pytest_oam.properties.strategies`; this import path keeps working (the same module object)."""

import sys

from .properties import strategies as _moved

sys.modules[__name__] = _moved
