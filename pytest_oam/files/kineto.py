"""PyTorch Kineto traces (``torch.profiler``'s Chrome trace, ``{"traceEvents": [...]}``, plain or
gzip) into a profile.

* Operators: the GPU ``kernel`` events. Host-driven copies and memsets (``gpu_memcpy``,
  ``gpu_memset``) move data between operators and are left out, as are host events.
* Steps: a kernel belongs to the ``ProfilerStep#N`` window that holds its *launch*: the
  ``cudaLaunchKernel`` (or any ``cuda_runtime`` / ``cuda_driver`` event) with the kernel's
  ``correlation`` id, else the start of its ``ac2g`` flow. A GPU runs behind its host, so a
  kernel launched in one step often runs while the host is in the next, or after the last step
  ended; its own start time would count it a step late or drop it. A kernel whose launch is not
  in the trace falls in the last step that started before it ran.
* Op type: the aten operator that launched the kernel, the innermost ``cpu_op`` around the
  launch on its thread (``aten::mul``, ``aten::cudnn_convolution``), as ``torch.profiler``'s
  ``key_averages`` groups device time. Without one, the kernel's demangled name keeping its
  operator (:func:`kernel_type`): ``vectorized_elementwise_kernel<MulFunctor>``, not one
  ``vectorized_elementwise_kernel`` type for every elementwise op. NCCL kernels become
  collectives on the ``hccl`` stream (``ncclKernel_AllReduce_RING_LL_Sum_float`` ->
  ``AllReduce``).
* Identity: the trace's ``deviceProperties`` name the GPUs, and they are part of the hardware
  (``real:kineto:NVIDIA A100-SXM4-80GB``); devices are ``distributedInfo.world_size``, else the
  number of devices listed. An A100 x 8 run and a V100 x 2 run are ``incomparable``, never one a
  regression of the other.
"""

from __future__ import annotations

import bisect
import decimal
import json
import re
from collections import defaultdict
from pathlib import Path

from simulator.profile import Profile
from simulator.units import S_PER_US

from .realfile import (
    ImportError_,
    StepWindows,
    duration_us,
    event_args,
    lanes_fingerprint,
    link_time_us,
    op_record,
    step_window,
    timestamp_us,
    trace_profile,
)

#: Event categories (lower case): the kernels, the host calls that launch them, the host ops.
KERNEL_CATEGORIES = frozenset({"kernel"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
HOST_OP_CATEGORIES = frozenset({"cpu_op", "operator"})
#: PyTorch's generic kernel templates: the operator is a template argument, not the name.
_LAUNCHERS = frozenset({
    "elementwise_kernel", "vectorized_elementwise_kernel", "unrolled_elementwise_kernel", "reduce_kernel",
    "multi_tensor_apply_kernel", "index_elementwise_kernel", "_scatter_gather_elementwise_kernel",
    "elementwise_kernel_with_index", "distribution_elementwise_grid_stride_kernel", "vectorized_gather_kernel",
    "Kernel",  # cutlass::Kernel<cutlass_80_tensorop_s1688gemm_...>
})
#: Template arguments that wrap the operator or carry no name of it.
_NOT_OPERATORS = frozenset({
    "gpu_kernel_impl", "gpu_kernel_impl_nocast", "BinaryFunctor", "AUnaryFunctor", "BUnaryFunctor", "ReduceOp",
    "func_wrapper_t", "TensorListMetadata", "Array", "OpaqueType", "gpu_index_kernel", "TrivialOffsetCalculator",
    "OffsetCalculator", "LoadWithCast", "LoadWithoutCast", "StoreWithCast", "StoreWithoutCast",
    "_cuda_scatter_gather_internal_kernel", "operator", "lambda", "const", "unsigned", "signed", "int", "long",
    "short", "char", "bool", "float", "double", "void", "true", "false", "Half", "BFloat16", "float2", "int2",
    "TensorIteratorBase", "TensorIterator", "Scalar", "optional", "PhiloxCudaState", "CUDAGeneratorImpl",
})
_QUALIFIED = re.compile(r"(?:[A-Za-z_]\w*::)*([A-Za-z_]\w*)")
_NCCL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
#: NCCL kernel names -> the simulator's collective op types (``simulator/costs.py``).
NCCL_OP_TYPES = {"AllReduce": "AllReduce", "AllGather": "AllGather", "ReduceScatter": "ReduceScatter",
                 "Broadcast": "Broadcast", "Reduce": "Reduce", "SendRecv": "SendRecv", "Send": "Send",
                 "Recv": "Receive"}


def _function(name: str) -> str:
    """The function of a demangled kernel name, without its return type (``void``,
    ``std::enable_if<...>::type``) and anonymous namespaces."""
    text = name.replace("(anonymous namespace)::", "").strip()
    depth, start = 0, 0
    for k, char in enumerate(text):
        if char == "(" and depth == 0:
            break
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth = max(0, depth - 1)
        elif char == " " and depth == 0:
            start = k + 1
    return text[start:]


def _short_name(name: str) -> str:
    """The kernel's function name without its namespace, or with the innermost namespace when
    the name alone says nothing (cuBLAS's ``internal::gemvx::kernel`` -> ``gemvx::kernel``)."""
    path = re.split(r"[<(]", _function(name), maxsplit=1)[0].strip().split("::")
    return ("::".join(path[-2:]) if path[-1] == "kernel" else path[-1]) or name


def kernel_type(name: str) -> str:
    """A stable type for a GPU kernel from its demangled name: the function's name without
    namespace, template and call arguments (``void cudnn::ops::nchwToNhwcKernel<float>(...)`` ->
    ``nchwToNhwcKernel``), and for PyTorch's generic templates the operator they were
    instantiated with (``void at::native::vectorized_elementwise_kernel<4,
    at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >,
    ...>(...)`` -> ``vectorized_elementwise_kernel<MulFunctor>``; ``reduce_kernel<512, 1,
    ReduceOp<float, MeanOps<...>>>`` -> ``reduce_kernel<MeanOps>``)."""
    base = _short_name(name)
    nccl = _NCCL.match(base)
    if nccl:
        return NCCL_OP_TYPES.get(nccl.group(1), f"nccl:{nccl.group(1)}")
    if base not in _LAUNCHERS:
        return base
    text = _function(name)
    inner = text[text.find("<") + 1:] if "<" in text else ""
    for found in _QUALIFIED.finditer(inner):
        candidate = found.group(1)
        if candidate not in _NOT_OPERATORS and not candidate.startswith("Array"):
            return f"{base}<{candidate}>"
    return base


def devices_of(data: object) -> tuple[str, int]:
    """``(hardware suffix, devices)`` from a trace's ``deviceProperties`` and
    ``distributedInfo``: ``("kineto:NVIDIA A100-PG509-200", 8)``; ``("kineto", 1)`` when the
    trace names neither."""
    if not isinstance(data, dict):
        return "kineto", 1
    props = data.get("deviceProperties")
    names = sorted({str(p["name"]).strip() for p in props if isinstance(p, dict) and str(p.get("name", "")).strip()}) \
        if isinstance(props, list) else []
    listed = sum(1 for p in props if isinstance(p, dict)) if isinstance(props, list) else 0
    info = data.get("distributedInfo")
    world = info.get("world_size") if isinstance(info, dict) else None
    devices = world if isinstance(world, int) and not isinstance(world, bool) and world >= 1 else max(1, listed)
    return ("kineto:" + "+".join(names)) if names else "kineto", devices


def _category(event: dict) -> str:
    return str(event.get("cat", "")).lower()


class _HostOps:
    """The host ops of each thread, to find the innermost one around a time."""

    def __init__(self) -> None:
        self._ops: dict[tuple[str, str], list[tuple[decimal.Decimal, decimal.Decimal, str, str]]] = defaultdict(list)
        self._starts: dict[tuple[str, str], list[decimal.Decimal]] = {}

    def add(self, thread: tuple[str, str], start: decimal.Decimal, end: decimal.Decimal, name: str, dims: str) -> None:
        self._ops[thread].append((start, end, name, dims))

    def freeze(self) -> None:
        for thread, ops in self._ops.items():
            ops.sort(key=lambda op: (op[0], -op[1]))
            self._starts[thread] = [op[0] for op in ops]

    def innermost(self, thread: tuple[str, str], time_us: decimal.Decimal) -> tuple[str, str] | None:
        """``(name, input dims)`` of the last-started op of ``thread`` still running at ``time_us``."""
        ops = self._ops.get(thread)
        if not ops:
            return None
        for k in range(bisect.bisect_right(self._starts[thread], time_us) - 1, -1, -1):
            _, end, name, dims = ops[k]
            if end >= time_us:
                return name, dims
        return None


def _launch_shape(args: dict) -> dict[str, str]:
    """A kernel launch's ``grid`` and ``block`` (``"864,1,1"``), when the trace records them."""
    shape = {}
    for key in ("grid", "block"):
        value = args.get(key)
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            shape[key] = ",".join(map(str, value))
    return shape


def _input_shapes(dims: str) -> list[list[int]]:
    """The aten op's ``Input Dims`` (``record_shapes``), its tensor shapes only."""
    try:
        value = json.loads(dims) if dims else []
    except ValueError:
        return []
    return [d for d in value if isinstance(d, list) and d and all(isinstance(v, int) and not isinstance(v, bool)
                                                                   and v >= 0 for v in d)] \
        if isinstance(value, list) else []


def import_kineto(path: Path, data: object) -> Profile:
    """The profile of a Kineto trace whose parsed JSON is ``data`` (an object with
    ``traceEvents``, or the bare list of events).

    Ops: the GPU kernels (NCCL's on the ``hccl`` stream), ordered by start; times in seconds
    from the first. Hardware ``real:kineto[:<device names>]``.

    Raises:
        ImportError_: no GPU kernel in the trace, none launched inside its ``ProfilerStep``
            windows, or a kernel without a number where ``ts`` or ``dur`` should be (naming
            the file and the event).
    """
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ImportError_(f"{path}: a Kineto trace whose 'traceEvents' is not a list of events")
    steps, kernels = [], []
    launches: dict[str, tuple[decimal.Decimal, tuple[str, str]]] = {}
    flow_starts: dict[str, tuple[decimal.Decimal, tuple[str, str]]] = {}
    flow_ends: dict[tuple[str, str, decimal.Decimal], str] = {}
    host = _HostOps()
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            continue
        phase, category, name = e.get("ph"), _category(e), str(e.get("name", ""))
        thread = (str(e.get("pid")), str(e.get("tid")))
        if phase in ("s", "f") and category == "ac2g":
            ts = link_time_us(e)
            if ts is None:
                continue
            if phase == "s":
                flow_starts[str(e.get("id"))] = (ts, thread)
            else:
                flow_ends[(*thread, ts)] = str(e.get("id"))
            continue
        if phase != "X":
            continue
        if category in KERNEL_CATEGORIES:
            kernels.append((i, e))
            continue
        if name.startswith("ProfilerStep#"):
            steps.append(step_window(e, path, i))
        elif category in LAUNCH_CATEGORIES and "correlation" in event_args(e):
            ts = link_time_us(e)
            if ts is not None:
                launches[str(event_args(e)["correlation"])] = (ts, thread)
        elif category in HOST_OP_CATEGORIES:
            try:
                start = timestamp_us(e.get("ts"), path, f"event {i} ts")
                end = start + decimal.Decimal(repr(duration_us(e.get("dur"), path, f"event {i} dur")))
            except ImportError_:
                continue
            dims = event_args(e).get("Input Dims")
            host.add(thread, start, end, name, json.dumps(dims) if dims is not None else "")
    if not kernels:
        raise ImportError_(f"{path}: a Chrome trace with no device events (no Kineto GPU 'kernel' event, no "
                           "torch_npu 'Ascend Hardware' process): was the device activity profiled "
                           "(ProfilerActivity.CUDA)?")
    host.freeze()
    windows = StepWindows(steps)
    rows = []
    for i, e in kernels:
        name = str(e.get("name", ""))
        ts = timestamp_us(e.get("ts"), path, f"event {i} ts")
        dur = duration_us(e.get("dur"), path, f"event {i} dur")
        correlation = event_args(e).get("correlation")
        launch = launches.get(str(correlation)) if correlation is not None else None
        if launch is None:
            flow = flow_ends.get((str(e.get("pid")), str(e.get("tid")), ts))
            launch = flow_starts.get(flow) if flow is not None else None
        if not windows:
            step = 0
        elif launch is not None:
            step = windows.at(launch[0])
        else:
            step = windows.started_by(ts)
        if step is None:
            continue  # launched outside every profiled step
        operator = host.innermost(launch[1], launch[0]) if launch is not None else None
        rows.append((ts, dur, step, name, str(e.get("tid")), operator, _launch_shape(event_args(e))))
    if not rows:
        raise ImportError_(f"{path}: a Kineto trace whose {len(kernels)} GPU kernels were all launched outside its "
                           f"{len(windows)} ProfilerStep windows")
    used = sorted({row[2] for row in rows})
    renumber = {s: k for k, s in enumerate(used)}
    origin = min(row[0] for row in rows)
    ops, keys = [], defaultdict(list)
    for ts, dur, step, name, lane, operator, shape in sorted(rows, key=lambda row: row[0]):
        kind = kernel_type(name)
        collective = _NCCL.match(_short_name(name)) is not None
        op_type = kind if collective or operator is None else operator[0]
        if renumber[step] == 0:
            keys[lane].append(f"{op_type}|{operator[1] if operator else ''}")
        # the kernel, and its launch's grid and block: calls of one op on other sizes differ
        attrs = {**({"kernel": kind} if kind != op_type else {}), **shape}
        ops.append(op_record(op_type=op_type, name=name[:200], step=renumber[step],
                             stream="hccl" if collective else "compute",
                             input_shapes=_input_shapes(operator[1]) if operator else [],
                             # not display: the trace's microseconds read into seconds
                             start_s=float(ts - origin) * S_PER_US, duration_s=dur * S_PER_US, attrs=attrs))
    suffix, devices = devices_of(data)
    return trace_profile(ops, suffix, len(used) if windows else 0, lanes_fingerprint(keys.values()), devices=devices)
