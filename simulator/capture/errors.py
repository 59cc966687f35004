"""What the capture says when the user's torch code cannot be simulated: one clear line that
names the user's line and what to change, never a traceback from inside PyTorch."""

from __future__ import annotations

import re


class CaptureError(ValueError):
    """The user's torch step (or its setup) cannot be captured; the message says where and why."""


#: What to change when a step reads a value computed on the device.
DATA_DEPENDENT_ADVICE = (
    "under capture tensors have shapes and dtypes but no values, so control flow and shapes "
    "cannot depend on a tensor's values (.item(), bool(tensor), `if x.sum() > 0`, nonzero, "
    "boolean-mask indexing): compute such values outside the step and pass them in, or use "
    "torch.where / fixed shapes. Hugging Face models check attention masks this way: pass "
    "attention_mask=None (a causal model needs none)"
)


def data_dependent_message(site: str | None, func: object) -> str:
    """The error of an operator whose result depends on tensor values (``func``), at ``site``."""
    where = site or "the step"
    return f"{where}: {func} needs the values of a tensor: {DATA_DEPENDENT_ADVICE}"


#: The errors PyTorch raises for device-specific code on a machine without the device
#: ("Torch not compiled with CUDA enabled", "... support for cuda devices", "... device string: npu",
#: "module 'torch' has no attribute 'npu'").
_DEVICE_ERROR = re.compile(r"CUDA|\bcuda\b|\bnpu\b|torch_npu")


def translate_error(error: BaseException, site: str | None) -> str | None:
    """The capture's one-line message for an error PyTorch raised inside the step, at the
    user's ``site``; ``None``: an error of the user's own code, left as it is."""
    text = str(error)
    where = site or "the step"
    if "Couldn't swap" in text:  # Module._apply on fake parameters (torch 2.13)
        return (f"{where}: {text.splitlines()[0]}: moving or casting a model (model.to(...), .half(), .float(), "
                ".to_empty()) cannot run on the capture's fake parameters: build the model in its training dtype "
                "in setup (torch.set_default_dtype(torch.bfloat16) first) and leave devices out")
    if "default process group twice" in text:
        return (f"{where}: {text.splitlines()[0]}: with devices > 1 the capture initialises torch.distributed "
                "itself (a fake process group of `devices` ranks): leave init_process_group out of the step "
                "and setup")
    if isinstance(error, (RuntimeError, AssertionError, AttributeError)) and _DEVICE_ERROR.search(text):
        return device_message(site, error)
    return None


def device_message(site: str | None, error: BaseException) -> str:
    """The error of a device-specific call (CUDA, a torch_npu device) inside the captured step."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    where = site or "the step"
    return (f"{where}: {first}: the capture runs the step on fake CPU tensors and simulates the NPU, so "
            "device-specific code cannot run: make tensors without a device (or on 'cpu') and leave out "
            "torch.cuda.* / torch.npu.* calls, .cuda() and .npu()")


def cost_message(site: str | None, func: object, made: object, error: BaseException, hardware: str) -> str:
    """The error of a captured operator the simulated hardware cannot run (``made``: its
    :class:`~simulator.capture.aten_map.Emission`), with what to change for the usual case."""
    where = site or "the step"
    text = str(error).strip("'\"")
    shapes = " x ".join(str(list(shape)) for shape in made.shapes)
    advice = ""
    if made.dtype == "bf16" and "Cube unit" in text:
        advice = (": this card's Cube unit computes fp16 (the Ascend 910 has no bf16): run the step in fp16 "
                  "(torch.set_default_dtype(torch.float16) in setup), or simulate a card with bf16 (ascend910b)")
    elif made.dtype == "fp32" and "Cube unit" in text:
        advice = (": the Cube unit computes fp16, bf16 and int8 (an fp32 matmul on an Ascend card runs as HF32 "
                  "or in fp16 as CANN's precision mode decides, which the simulator does not model): run the step "
                  "in bf16 or fp16 (torch.set_default_dtype(torch.bfloat16) in setup, or "
                  "torch.autocast('cpu', dtype=torch.bfloat16) around the forward)")
    return f"{where}: {func} as {made.op_type} {shapes} {made.dtype} on {hardware}: {text}{advice}"


def real_parameter_message(site: str | None, func: object, tensor: object) -> str:
    """The error of a real (not fake) tensor that requires grad in the captured step: a model
    built outside ``setup``, whose gradients the capture would replace with fake tensors."""
    where = site or "the step"
    shape = list(getattr(tensor, "shape", []))
    return (f"{where}: {func} reads a real tensor {shape} that requires grad, made outside the capture (a model "
            "built at import or before run_torch): the capture would give it fake gradients. Build the model in "
            "setup, which runs under the capture's fake tensors")
