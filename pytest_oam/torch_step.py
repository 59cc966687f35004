"""``oam collect --torch MODULE:FUNCTION``: the user's torch step, found by name and captured
on the simulator (:func:`simulator.capture.run_torch`), so the rest of the CLI works on it."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.profile import Profile


def load_function(target: str, option: str = "--torch") -> Callable:
    """``path/to/file.py:name`` or ``package.module:name`` -> that function. The current folder
    is importable, as with ``python -m``.

    Raises:
        ValueError: not ``MODULE:FUNCTION``, no such file or module, or no such callable in it
            (naming ``option`` and what was given).
    """
    module_name, sep, name = target.rpartition(":")
    if not sep or not module_name or not name.isidentifier():
        raise ValueError(f"{option} {target!r}: expected MODULE:FUNCTION, e.g. train.py:train_step "
                         "or mypkg.train:train_step")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise ValueError(f"{option} {target!r}: {path}: no such file")
        spec = importlib.util.spec_from_file_location(f"oam_torch_step_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.resolve().parent))  # the file's own imports of its neighbours
        try:
            spec.loader.exec_module(module)
        except Exception as error:  # noqa: BLE001 -- the user's module failed to import: say so in one line
            raise ValueError(f"{option} {target!r}: importing {path} failed: {type(error).__name__}: {error}") from None
        finally:
            sys.path.remove(str(path.resolve().parent))
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, "")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            raise ValueError(f"{option} {target!r}: no module {error.name!r} (run from the folder that "
                             "holds it, or give the file's path: path/to/train.py:train_step)") from None
        except Exception as error:  # noqa: BLE001 -- the user's module failed to import: say so in one line
            raise ValueError(f"{option} {target!r}: importing {module_name} failed: "
                             f"{type(error).__name__}: {error}") from None
    function = getattr(module, name, None)
    if not callable(function):
        found = "nothing" if function is None else type(function).__name__
        raise ValueError(  # noqa: TRY004 -- a usage error of the option, reported as the CLI reports them
            f"{option} {target!r}: {module_name} has {found} named {name!r}, not a function")
    return function


def collect_torch(step: str, setup: str | None, *, hardware: str, steps: int, given: list[str]) -> Profile:
    """The profile of ``step`` (``MODULE:FUNCTION``) after ``setup``, on ``hardware``
    (``"ascend910b x 8"``: card and count).

    Raises:
        ValueError: a bad target (:func:`load_function`), zoo-model options given with it
            (``given``), unknown hardware, or the capture's errors (``CaptureError``).
        ImportError: PyTorch is not installed.
    """
    if given:
        raise ValueError(f"{', '.join(given)} describe a zoo model (--model), not a torch step: pass your step's "
                         "arguments from its --setup function")
    import simulator

    from .api import parse_hardware

    name, devices = parse_hardware(hardware)
    step_function = load_function(step)
    setup_function = None if setup is None else load_function(setup, "--setup")
    return simulator.run_torch(step_function, setup=setup_function, steps=steps, hardware=name, devices=devices)
