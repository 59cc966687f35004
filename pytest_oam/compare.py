"""Moved to :mod:`pytest_oam.judge.compare`; this import path keeps working (the same module object)."""

import sys

from .judge import compare as _moved

sys.modules[__name__] = _moved
