"""Moved to :mod:`pytest_oam.report.html`; this import path keeps working (the same module object)."""

import sys

from .report import html as _moved

sys.modules[__name__] = _moved
