"""Moved to :mod:`pytest_oam.files.fileio`; this import path keeps working (the same module object)."""

import sys

from .files import fileio as _moved

sys.modules[__name__] = _moved
