"""Moved to :mod:`pytest_oam.gate.record`; this import path keeps working (the same module object)."""

import sys

from .gate import record as _moved

sys.modules[__name__] = _moved
