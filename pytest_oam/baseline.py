"""Moved to :mod:`pytest_oam.files.baseline`; this import path keeps working (the same module object)."""

import sys

from .files import baseline as _moved

sys.modules[__name__] = _moved
