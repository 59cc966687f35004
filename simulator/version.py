"""The simulator's version, in a module of its own: the package and its runtime both import it
(the runtime once imported it from the package, which imports the runtime: a cycle).

``SIMULATOR_VERSION`` (``__version__``) is bumped whenever a cost model changes the numbers it
produces, so that baselines made by another version are recognised as such.
"""

__version__ = "0.10.0"
SIMULATOR_VERSION = __version__
