"""Moved to :mod:`pytest_oam.gate.evaluate`; this import path keeps working (the same module object)."""

import sys

from .gate import evaluate as _moved

sys.modules[__name__] = _moved
