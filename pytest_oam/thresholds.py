"""Moved to :mod:`pytest_oam.judge.thresholds`; this import path keeps working (the same module object)."""

import sys

from .judge import thresholds as _moved

sys.modules[__name__] = _moved
