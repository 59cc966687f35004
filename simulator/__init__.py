"""A simulator of the Huawei Ascend 910 NPU and its 8-card servers.

``SIMULATOR_VERSION`` (``__version__``) is bumped whenever a cost model changes the numbers it
produces, so that baselines made by another version are recognised as such.
"""

__version__ = "0.6.0"
SIMULATOR_VERSION = __version__

from .allocator import OutOfMemoryError
from .callbacks import register_op_callback
from .hardware import HardwareSpec, list_hardware, load_hardware
from .profile import OpRecord, Profile
from .runtime import NPU, ShapeError, Tensor, run

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
]
