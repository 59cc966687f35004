"""Moved to :mod:`pytest_oam.tuning.knowledge_base`; this import path keeps working (the same module object)."""

import sys

from .tuning import knowledge_base as _moved

sys.modules[__name__] = _moved
