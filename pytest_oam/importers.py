"""Moved to :mod:`pytest_oam.files.importers`; this import path keeps working (the same module object)."""

import sys

from .files import importers as _moved

sys.modules[__name__] = _moved
