"""Test settings. Hypothesis runs derandomized in CI (CI=true), so a run is repeatable."""

import os

import pytest
from hypothesis import settings

# pytester's in-process runs unload the modules first imported during them, and numpy cannot
# be imported twice in one process: load the simulator (and numpy) before any inline run.
import simulator  # noqa: F401

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _forget_hardware_files():
    """Each test starts with no hardware file read: specs read from files are found by name for
    the rest of a process (simulator.hardware), and two tests' files may share a name."""
    import simulator.hardware

    simulator.hardware._FILE_SPECS.clear()
    simulator.hardware._FILE_SPEC_PATHS.clear()
    yield
