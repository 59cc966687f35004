"""pytest-oam: a performance regression gate for AI workloads on a simulated Ascend 910.

Importing this package is cheap: the pytest plugin (``pytest_oam.plugin``) autoloads in every
pytest run, so numpy, pydantic models and the simulator load only when a test profiles.
"""

__version__ = "0.1.0"
