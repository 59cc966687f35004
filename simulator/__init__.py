"""A simulator of the Huawei Ascend 910 NPU and its 8-card servers.

``SIMULATOR_VERSION`` (``__version__``, kept in :mod:`simulator.version`) is bumped whenever a
cost model changes the numbers it produces, so that baselines made by another version are
recognised as such.
"""

from .allocator import OutOfMemoryError
from .callbacks import register_op_callback
from .hardware import HardwareSpec, list_hardware, load_hardware
from .profile import OpRecord, Profile
from .runtime import NPU, ShapeError, Tensor, run
from .version import SIMULATOR_VERSION
from .version import __version__ as __version__


def run_torch(step, *args, **kwargs) -> Profile:
    """Capture the user's torch ``step`` on a simulated card: :func:`simulator.capture.run_torch`
    (PyTorch is imported only when this is called)."""
    from .capture import run_torch as capture

    return capture(step, *args, **kwargs)


__all__ = [
    "NPU",
    "SIMULATOR_VERSION",
    "HardwareSpec",
    "OpRecord",
    "OutOfMemoryError",
    "Profile",
    "ShapeError",
    "Tensor",
    "list_hardware",
    "load_hardware",
    "register_op_callback",
    "run",
    "run_torch",
]
