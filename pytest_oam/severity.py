"""Moved to :mod:`pytest_oam.judge.severity`; this import path keeps working (the same module object)."""

import sys

from .judge import severity as _moved

sys.modules[__name__] = _moved
