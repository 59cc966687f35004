"""Moved to :mod:`pytest_oam.report.trace`; this import path keeps working (the same module object)."""

import sys

from .report import trace as _moved

sys.modules[__name__] = _moved
