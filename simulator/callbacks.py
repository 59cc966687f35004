"""Op callbacks: user code watches the operators of a run without changing the workload.

:func:`register_op_callback` adds a function that receives the
:class:`~simulator.profile.OpRecord` of every op whose type or name matches a pattern. How
records reach it depends on the run's collection mode (``simulator.run(collection=...)``):

- ``"offline"`` (the default): the whole trace is recorded and the callbacks are called after
  the run, in issue order. Timing is not perturbed.
- ``"online"``: each record is delivered while the run goes (once the op is final, i.e. when
  the next op is issued or the step ends), and the run is charged the hardware's
  ``profiler.online_callback_overhead_s`` per op, as host time after the op: it delays the host's
  next kernel issue, so it shows in the step when the run is host-bound (kernels shorter than
  ``launch.host_dispatch_s`` plus the overhead) and is hidden while the device is the busier.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .profile import OpRecord

COLLECTION_MODES = ("offline", "online")

_lock = threading.Lock()
_callbacks: list[tuple[str, Callable[[OpRecord], object]]] = []


class OpCallbackHandle:
    """What :func:`register_op_callback` returns: ``remove()`` it, or use it as a context manager."""

    def __init__(self, entry: tuple[str, Callable]) -> None:
        self._entry = entry

    def remove(self) -> None:
        """Stop calling the callback (removing twice is harmless)."""
        with _lock:
            for i, entry in enumerate(_callbacks):
                if entry is self._entry:
                    del _callbacks[i]
                    return

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def register_op_callback(op_name_or_type: str, fn: Callable[[OpRecord], object]) -> OpCallbackHandle:
    """Call ``fn(record)`` for every op whose type or name matches ``op_name_or_type``.

    Args:
        op_name_or_type: an op type (``"FlashAttention"``), an op name (``"layers.0.attn"``)
            or a glob over either (``"FlashAttention*"``, ``"*"``); case-sensitive.
        fn: called with the op's :class:`~simulator.profile.OpRecord`; its return value is
            ignored and an exception it raises propagates out of the run.

    Returns:
        A handle whose ``remove()`` unregisters the callback.

    Raises:
        TypeError: ``op_name_or_type`` is not a non-empty string, or ``fn`` is not callable.
    """
    if not isinstance(op_name_or_type, str) or not op_name_or_type:
        raise TypeError(f"register_op_callback: op_name_or_type must be a non-empty string, got {op_name_or_type!r}")
    if not callable(fn):
        raise TypeError(f"register_op_callback: fn must be callable, got {fn!r}")
    entry = (op_name_or_type, fn)
    with _lock:
        _callbacks.append(entry)
    return OpCallbackHandle(entry)


def registered() -> tuple[tuple[str, Callable], ...]:
    """The registrations in force, oldest first (for :func:`remove_all_but`)."""
    with _lock:
        return tuple(_callbacks)


def remove_all_but(keep: tuple[tuple[str, Callable], ...]) -> None:
    """Remove every registration not in ``keep`` (what :func:`registered` returned earlier):
    the pytest plugin drops what a test registered and left behind."""
    with _lock:
        _callbacks[:] = [entry for entry in _callbacks if any(entry is k for k in keep)]


def has_callbacks() -> bool:
    """Is any callback registered?"""
    return bool(_callbacks)


def deliver(record: OpRecord) -> None:
    """Call every callback whose pattern matches the record's op type or name."""
    with _lock:
        entries = list(_callbacks)
    for pattern, fn in entries:
        if fnmatchcase(record.op_type, pattern) or fnmatchcase(record.name, pattern):
            fn(record)


def check_collection(collection: str) -> str:
    """``collection`` if it is a known mode.

    Raises:
        ValueError: another value (the message lists the modes).
    """
    if collection not in COLLECTION_MODES:
        raise ValueError(f"collection must be one of {', '.join(COLLECTION_MODES)}, got {collection!r}")
    return collection
