"""Test settings: Hypothesis runs derandomized in CI (CI=true), so a run is repeatable."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
