"""PyTorch in: run the user's own torch step on the simulated card.

    import simulator

    def setup():
        model = torch.nn.Linear(4096, 4096)
        return model, torch.optim.AdamW(model.parameters(), foreach=True), torch.randn(8, 4096)

    def train_step(model, opt, x):
        model(x).square().mean().backward()
        opt.step(); opt.zero_grad()

    profile = simulator.run_torch(train_step, setup=setup, hardware="ascend910b")

The step runs under PyTorch's ``FakeTensorMode`` (tensors with shapes and dtypes, no storage:
a 7B model costs no host memory) with a ``TorchDispatchMode`` recorder on top
(:mod:`simulator.capture.recorder`): every aten operator of the forward, of autograd's
backward and of the optimizer becomes one simulated op (:mod:`simulator.capture.aten_map`)
through :meth:`simulator.runtime.NPU.emit`, with the user's source line. Importing
:mod:`simulator` imports nothing of torch; this package is loaded when a torch step runs.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import inspect
import re
import warnings
from collections.abc import Callable

from ..allocator import AllocatorConfig, OutOfMemoryError
from ..hardware import HardwareSpec, is_hardware_path, list_hardware, load_hardware
from ..profile import Profile
from .errors import CaptureError, translate_error

__all__ = ["CaptureError", "TorchMissingError", "UnmappedOpsWarning", "run_torch", "unmapped_ops"]


class TorchMissingError(ImportError):
    """PyTorch is not installed (``pip install 'pytest-oam[torch]'``)."""


class UnmappedOpsWarning(UserWarning):
    """The captured step ran PyTorch operators no mapping knows, costed generically."""


def unmapped_summary(counts: dict[str, int]) -> str:
    """``12 ops of 3 unmapped types costed generically: aten::a (10), ...``."""
    calls = sum(counts.values())
    listed = ", ".join(f"{name} ({count})" for name, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return (f"{calls} op{'s' if calls != 1 else ''} of {len(counts)} unmapped type{'s' if len(counts) != 1 else ''} "
            f"costed generically (from the bytes they move, simulator.costs.generic_cost): {listed}")


#: A hardware name alone (the card count is ``devices``).
_BARE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _require_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        raise TorchMissingError(
            "run_torch needs PyTorch, which is not installed: pip install 'pytest-oam[torch]' "
            "(a CPU build is enough: nothing runs on a real device)")


def _user_site_of(error: BaseException) -> str | None:
    """The innermost frame of user code in ``error``'s traceback (as a call site)."""
    from .sites import frame_owner

    site = None
    tb = error.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if frame_owner(filename) == "user":
            site = f"{filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return site


def _setup_arguments(setup: Callable[[], object] | None) -> tuple:
    if setup is None:
        return ()
    result = setup()
    if result is None:
        raise CaptureError(
            f"run_torch: setup {getattr(setup, '__qualname__', setup)!r} returned None: return what the step "
            "takes first, e.g. `return model, optimizer, batch` (a single object is passed as one argument)")
    return tuple(result) if isinstance(result, tuple) else (result,)


def _check_call(step: Callable, setup: Callable | None, prefix: tuple, args: tuple, kwargs: dict) -> None:
    """The step can take what it will be given (setup's results, then ``args`` and ``kwargs``),
    or a :class:`CaptureError` says what it got, before anything runs."""
    try:
        signature = inspect.signature(step)
    except (TypeError, ValueError):
        return  # a builtin or C function: its own call will say
    try:
        signature.bind(*prefix, *args, **kwargs)
    except TypeError as error:
        given = (f"setup {getattr(setup, '__qualname__', setup)!r} returned {len(prefix)} value"
                 f"{'s' if len(prefix) != 1 else ''}" if setup is not None else "no setup")
        raise CaptureError(
            f"run_torch: step {getattr(step, '__qualname__', step)}{signature} cannot take what it is given "
            f"({given}, then {len(args)} argument{'s' if len(args) != 1 else ''} and "
            f"{len(kwargs)} keyword argument{'s' if len(kwargs) != 1 else ''}): {error}") from None


def _as_fake(fake) -> Callable:
    from torch._subclasses.fake_tensor import FakeTensor

    def convert(tensor):
        return tensor if isinstance(tensor, FakeTensor) else fake.from_tensor(tensor)

    return convert


class _TorchState:
    """PyTorch's process-wide settings a step may change, restored after the capture (whether
    it ended well or not): default dtype and device, grad mode, deterministic algorithms, fp32
    matmul precision, anomaly detection."""

    def __init__(self, values: dict[str, object]) -> None:
        self.values = values

    @classmethod
    def save(cls, torch) -> _TorchState:
        return cls({
            "dtype": torch.get_default_dtype(),
            "grad": torch.is_grad_enabled(),
            "deterministic": (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled()),
            "precision": torch.get_float32_matmul_precision(),
            "anomaly": torch.is_anomaly_enabled(),
            "device": torch.get_default_device(),
        })

    def restore(self, torch) -> None:
        values = self.values
        torch.set_default_dtype(values["dtype"])
        torch.set_grad_enabled(values["grad"])
        deterministic, warn_only = values["deterministic"]
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.set_float32_matmul_precision(values["precision"])
        torch.set_anomaly_enabled(values["anomaly"])
        torch.set_default_device(values["device"])


def unmapped_ops(profile: Profile) -> dict[str, int]:
    """The PyTorch operators of ``profile`` no mapping knew, costed generically
    (op type ``aten::<name>``): how many calls of each, by op type."""
    from ..costs import GENERIC_OP_PREFIX

    counts: dict[str, int] = {}
    for record in profile.ops:
        if record.op_type.startswith(GENERIC_OP_PREFIX):
            counts[record.op_type] = counts.get(record.op_type, 0) + 1
    return dict(sorted(counts.items()))


def run_torch(
    step: Callable[..., object],
    *args,
    setup: Callable[[], object] | None = None,
    steps: int = 1,
    warmup_steps: int = 1,
    hardware: str | HardwareSpec = "ascend910",
    devices: int = 1,
    op_time_scale: dict[str, float] | None = None,
    allocator: AllocatorConfig | str | None = None,
    memory: bool = False,
    collection: str = "offline",
    **kwargs,
) -> Profile:
    """Capture ``step(*setup(), *args, **kwargs)``, ``steps`` times, on a simulated card.

    Args:
        step: the user's torch function (a training or inference step), unchanged.
        setup: called once, before the first step, under the same fake tensors (model,
            optimizer and batch are made there: no real memory); its result is passed first to
            ``step`` (a tuple is spread, another object passed as one argument).
        steps: how many times ``step`` runs, each one simulated step (>= 1).
        warmup_steps: how many times ``step`` runs first, not simulated (>= 0; default 1): a
            training step's first run differs from the steady state it is gated on (the
            optimizer makes its state, DDP reduces every gradient in one bucket and rebuilds
            its buckets after), as a profiler's warm-up skips it. Device memory of what the
            warm-up leaves (optimizer state) is held from the first simulated step.
        hardware, devices, op_time_scale, allocator, memory, collection: as
            :func:`simulator.run`. Device memory follows the fake tensors' storages (see
            :mod:`simulator.capture.recorder`); Python's garbage collector runs at the end of
            each step only (tensors in reference cycles go then), so a step's profile does not
            depend on what else the process allocated.

    Returns:
        The :class:`~simulator.profile.Profile`; PyTorch operators no mapping knows are in it
        under ``aten::<name>`` (:func:`unmapped_ops`) and named in an :class:`UnmappedOpsWarning`.

    Raises:
        TorchMissingError: PyTorch is not installed.
        TypeError: ``step`` or ``setup`` is not callable.
        CaptureError: ``setup`` returned None, ``step`` cannot take setup's results and the
            arguments given, the step reads tensor values (``.item()``,
            a branch on a tensor), or runs device-specific code (CUDA, torch_npu); the
            message names the user's line.
        ValueError: unknown hardware, bad ``steps`` or ``devices``.
        OutOfMemoryError: the step does not fit in the card's HBM.
    """
    if not callable(step):
        raise TypeError(f"run_torch: step must be a function called as step(*setup(), *args, **kwargs), "
                        f"got {type(step).__name__} {step!r:.80}")
    if setup is not None and not callable(setup):
        raise TypeError(f"run_torch: setup must be a function of no arguments or None, got "
                        f"{type(setup).__name__} {setup!r:.80}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"run_torch: steps must be a positive integer, got {steps!r}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"run_torch: warmup_steps must be an integer >= 0, got {warmup_steps!r}")
    # a hardware file's path (./my-910b.json from oam calibrate) is a card too, as for simulator.run
    if isinstance(hardware, str) and not is_hardware_path(hardware) and not _BARE_NAME.fullmatch(hardware.strip()):
        raise ValueError(f"run_torch: hardware {hardware!r}: give the card's name ({', '.join(list_hardware())}) "
                         "and the card count as devices=N")
    _require_torch()
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_map_only

    from ..runtime import NPU
    from .patches import fused_attention_with_dropout
    from .recorder import Recorder

    spec = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
    npu = NPU(spec, devices, op_time_scale, allocator, memory, collection)
    recorder = Recorder(npu)
    if devices > 1:
        from .distributed import fake_process_group

        group = fake_process_group(devices, recorder.storage_resized, recorder.paused)
    else:
        group = contextlib.nullcontext()
    state = _TorchState.save(torch)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    keep_saved = torch.autograd.graph.saved_tensors_hooks(lambda tensor: tensor, lambda tensor: tensor)
    # Tensors in reference cycles go when the garbage collector runs, at times that depend on
    # everything else the process allocated: collected at the end of each step instead, so the
    # same step gives the same memory profile.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with group, fake, recorder, keep_saved, fused_attention_with_dropout(recorder):
            try:
                prefix = _setup_arguments(setup)
                # the user's own tensors passed in: fake copies (the step may change them in place)
                args, kwargs = tree_map_only(torch.Tensor, _as_fake(fake), (args, kwargs))
                _check_call(step, setup, prefix, args, kwargs)
                for _ in range(warmup_steps):  # not simulated: the optimizer's state, DDP's buckets
                    step(*prefix, *args, **kwargs)
                gc.collect(0)  # the young generation: what setup made (older objects are not the step's)
                recorder.settle(everything=True)
                recorder.emitting = True
                for index in range(steps):
                    if index:
                        npu.next_step()
                    step(*prefix, *args, **kwargs)
                    gc.collect(0)  # the young generation: everything the step made (see above)
                    recorder.settle(everything=True)
            except (RuntimeError, AssertionError, AttributeError, ValueError) as error:
                if isinstance(error, (OutOfMemoryError, CaptureError)):
                    raise
                message = translate_error(error, _user_site_of(error))
                if message is None:
                    raise
                raise CaptureError(message) from None
    finally:
        state.restore(torch)
        if collecting:
            gc.enable()
    profile = npu.profile(steps)
    unmapped = unmapped_ops(profile)
    if unmapped:
        warnings.warn(unmapped_summary(unmapped), UnmappedOpsWarning, stacklevel=2)
    return profile
