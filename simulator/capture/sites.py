"""Where a captured PyTorch operator came from: the ``file:line`` of the user's code.

The frames between the user's step and the dispatcher belong to PyTorch (``torch``), to
libraries the user calls (``transformers``, anything installed in the environment) and to the
simulator; the record's ``source`` is the innermost frame of the user's own code, with the
innermost library line after it when a library issued the op for the user's call
(``train.py:12 (in .../modeling_llama.py:345)``), the form the native runtime uses for the
bundled builders (:func:`simulator.runtime.callsite.call_site`).
"""

from __future__ import annotations

import functools
import os
import sys

from ..runtime.callsite import frame_kind


def _folder(module: object) -> str:
    return os.path.normcase(os.path.dirname(os.path.abspath(module.__file__))) + os.sep


@functools.cache
def _torch_dir() -> str:
    import torch

    return _folder(torch)


@functools.cache
def frame_owner(filename: str) -> str:
    """``"skip"`` (PyTorch, the simulator, the plugin), ``"library"`` (installed packages and the
    standard library) or ``"user"``."""
    if os.path.normcase(filename).startswith(_torch_dir()):
        return "skip"
    kind = frame_kind(filename)
    if kind in ("runtime", "library"):
        return "skip"
    return "library" if kind == "interpreter" else "user"


def torch_call_site() -> str | None:
    """The ``file:line`` of the innermost frame of user code on the stack (see the module
    docstring); ``None`` when no frame is the user's or a library's."""
    frame = sys._getframe(1)
    library = None
    while frame is not None:
        kind = frame_owner(frame.f_code.co_filename)
        if kind == "user":
            site = f"{frame.f_code.co_filename}:{frame.f_lineno}"
            return site if library is None else f"{site} (in {library})"
        if kind == "library" and library is None:
            library = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return library
