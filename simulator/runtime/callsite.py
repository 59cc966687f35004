"""Where an op was issued: the ``file:line`` of the user's call, for each op record's ``source``."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

#: This package's folder: a frame in one of its modules is the runtime's own.
_RUNTIME_DIR = os.path.normcase(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: The simulator's folder (the runtime's parent).
_SIMULATOR_DIR = os.path.dirname(_RUNTIME_DIR.rstrip(os.sep)) + os.sep


def _package_dir(name: str) -> str | None:
    """The folder of installed package ``name`` (found without importing it), normalised."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return os.path.normcase(os.path.abspath(locations[0])) + os.sep if locations else None


#: Folders whose frames are library code, not the user's: the simulator and the pytest plugin.
_LIBRARY_DIRS = tuple(d for d in (_SIMULATOR_DIR, _package_dir("pytest_oam")) if d)
#: Folders of the interpreter (standard library, site-packages, the environment's scripts): a
#: frame there is no user's line either (``python -m pytest_oam``, a thread, the ``oam`` script).
_INTERPRETER_DIRS = tuple({os.path.normcase(os.path.abspath(p)) + os.sep for p in (sys.prefix, sys.base_prefix)})


@functools.cache
def frame_kind(filename: str) -> str:
    """Whose code a frame of ``filename`` runs, decided once per file: ``"runtime"`` (a module
    of this package), ``"library"`` (the rest of the simulator, the pytest plugin),
    ``"interpreter"`` (standard library, site-packages, frozen modules) or ``"user"``."""
    path = os.path.normcase(filename)
    if path.startswith(_RUNTIME_DIR):
        return "runtime"
    if path.startswith(_LIBRARY_DIRS):
        return "library"
    if filename.startswith("<frozen") or os.path.normcase(os.path.abspath(filename)).startswith(_INTERPRETER_DIRS):
        return "interpreter"
    return "user"


def call_site() -> str | None:
    """``file:line`` of the first frame outside the runtime (the call that issued the op). When
    that frame is library code (a bundled model builder such as ``training_step``), the first
    frame of the user's code that led to it comes first: ``user.py:12 (in .../llama.py:379)``;
    when the code that led to it is the interpreter's (``python -m pytest_oam``, the ``oam``
    script), the builder's line alone. Only the runtime's own functions call it: the walk
    starts at their caller."""
    frame = sys._getframe(2)
    while frame is not None and frame_kind(frame.f_code.co_filename) == "runtime":
        frame = frame.f_back
    if frame is None:
        return None
    site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    if frame_kind(frame.f_code.co_filename) != "library":
        return site
    user = frame.f_back
    while user is not None and frame_kind(user.f_code.co_filename) in ("library", "runtime"):
        user = user.f_back
    if user is None or frame_kind(user.f_code.co_filename) == "interpreter":
        return site
    return f"{user.f_code.co_filename}:{user.f_lineno} (in {site})"
