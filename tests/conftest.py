"""Test settings. Hypothesis runs derandomized in CI (CI=true), so a run is repeatable."""

import os

from hypothesis import settings

# pytester's in-process runs unload the modules first imported during them, and numpy cannot
# be imported twice in one process: load the simulator (and numpy) before any inline run.
import simulator  # noqa: F401

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
