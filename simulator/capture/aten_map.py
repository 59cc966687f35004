"""From a PyTorch (aten) operator to the simulator's op vocabulary: one table.

Each mapped operator becomes one simulated op of a :data:`simulator.costs.COST_MODELS` type,
with the shapes, dtype and attributes its cost model reads: ``aten.mm`` is a ``MatMul``,
scaled-dot-product attention a ``FlashAttention``, a norm, an activation or an element-wise
operator its CANN op type (``RmsNorm``, ``SiLU``, ``RealDiv``...). Element-wise and row-wise
operators give the bytes they read and write (``read_bytes``, ``write_bytes``), so
broadcasting and reductions cost what they move. An operator the table does not know is
costed by :func:`simulator.costs.generic_cost` under its own name (``aten::<name>``), never
dropped. Views, metadata and host-side operators run no kernel and emit nothing.

Nothing here imports torch at import time of :mod:`simulator`: this module is loaded only
when a torch workload runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..costs import GENERIC_OP_PREFIX
from ..runtime.cube_ops import FLASH_ATTENTION_DEFAULTS

#: torch dtype -> the dtype name a cost model computes in (bytes moved are given explicitly
#: where they differ: an int64 or float64 tensor moves 8 bytes per element).
COST_DTYPES: dict[torch.dtype, str] = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.float64: "fp32",  # no fp64 on the AI Core's Vector unit: costed at its fp32 rate
    torch.int32: "int32",
    torch.int64: "int32",
    torch.int16: "int32",
    torch.int8: "int8",
    torch.uint8: "int8",
    torch.bool: "int8",
}


def cost_dtype(dtype: torch.dtype) -> str:
    """The simulator's dtype name for ``dtype`` (see :data:`COST_DTYPES`); others as fp32."""
    return COST_DTYPES.get(dtype, "fp32")


@dataclass(frozen=True)
class Emission:
    """One simulated op of a captured operator: ``op_type``, the shapes its cost model reads
    (in its order), the dtype it computes in, its attributes."""

    op_type: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    attrs: dict[str, object] = field(default_factory=dict)


def tensors_in(values: object) -> list[torch.Tensor]:
    """Every tensor in ``values`` (nested tuples, lists and dict values), in order."""
    found: list[torch.Tensor] = []
    _collect(values, found)
    return found


def _collect(value: object, found: list[torch.Tensor]) -> None:
    # a module function, not a closure that calls itself: such a closure is a reference cycle,
    # which kept every tensor it found alive until Python's garbage collector ran
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _collect(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _collect(item, found)


def nbytes(tensor: torch.Tensor) -> int:
    """Bytes an operator moves reading or writing ``tensor``: its elements, but no more than
    its storage holds (a broadcast view, stride 0, is read once)."""
    logical = tensor.numel() * tensor.element_size()
    try:
        return min(logical, tensor.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return logical


def _largest(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return max(tensors, key=lambda t: t.numel())


def _moving(op_type: str, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
            dtype_from: torch.Tensor | None = None) -> Emission | None:
    """A Vector unit op over the largest tensor's elements, moving the inputs' and outputs' bytes."""
    every = [*inputs, *outputs]
    if not every:
        return None
    main = _largest(every)
    if main.numel() == 0:
        return None
    read_bytes = sum(nbytes(t) for t in inputs)
    write_bytes = sum(nbytes(t) for t in outputs)
    if read_bytes + write_bytes == 0:
        return None
    source = dtype_from if dtype_from is not None else _largest(inputs) if inputs else main
    return Emission(op_type, (tuple(main.shape),), cost_dtype(source.dtype),
                    {"read_bytes": read_bytes, "write_bytes": write_bytes})


def _written(args: tuple, outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors an op writes: its outputs, or for an in-place op returning nothing (a
    ``_foreach_*_`` op) its first argument."""
    if outputs:
        return outputs
    first = args[0] if args else None
    return tensors_in(first)


Handler = Callable[[tuple, dict, list[torch.Tensor]], "Emission | None"]


def _elementwise(op_type: str) -> Handler:
    def handle(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
        inputs = tensors_in((args, kwargs))
        return _moving(op_type, inputs, _written(args, outputs))

    return handle


def _pow(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
    exponent = args[1] if len(args) > 1 else kwargs.get("exponent")
    square = isinstance(exponent, (int, float)) and not isinstance(exponent, bool) and exponent == 2
    return _elementwise("Square" if square else "Pow")(args, kwargs, outputs)


def _cast_or_copy(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
    """``_to_copy``, ``clone``, ``copy_``: a Cast when the dtype changes, a Memcpy of a
    contiguous copy, a Transpose of a strided one."""
    inputs = tensors_in((args, kwargs))
    if not outputs or not inputs:
        return None
    out = outputs[0]
    src = inputs[-1] if len(inputs) > 1 else inputs[0]  # copy_(dst, src): the source is last
    if out.numel() == 0:
        return None
    if src.dtype != out.dtype:
        return _moving("Cast", [src], [out], dtype_from=out)
    if src.is_contiguous() and out.is_contiguous() and nbytes(src) == nbytes(out):
        # whole elements of the cost dtype too: its element is never wider than the tensor's
        return Emission("Memcpy", (tuple(out.shape), tuple(src.shape)), cost_dtype(out.dtype),
                        {"nbytes": out.numel() * out.element_size()})
    return _moving("Transpose", [src], [out])


def _matmul(batched: bool) -> Handler:
    def handle(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
        a, b = (args[1], args[2]) if len(args) >= 3 and isinstance(args[2], torch.Tensor) else (args[0], args[1])
        if batched:
            batch, m, k = a.shape
            n = b.shape[-1]
        else:
            batch, (m, k), n = 1, a.shape, b.shape[-1]
        if 0 in (batch, m, k, n):
            return None
        op_type = "BatchMatMul" if batched else "MatMul"
        return Emission(op_type, ((batch, m, k), (batch, k, n)), cost_dtype(a.dtype))

    return handle


def _attention_attrs(causal: bool) -> dict[str, object]:
    # the fused kernel's defaults, those of NPU.flash_attention
    return {**FLASH_ATTENTION_DEFAULTS, "fusion": True, "causal": bool(causal)}


def _is_causal(args: tuple, kwargs: dict, position: int) -> bool:
    if "is_causal" in kwargs:
        return bool(kwargs["is_causal"])
    return bool(args[position]) if len(args) > position else False


def _flash_forward(causal_position: int) -> Handler:
    def handle(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
        q, k, v = args[:3]
        return Emission("FlashAttention", (tuple(q.shape), tuple(k.shape), tuple(v.shape)), cost_dtype(q.dtype),
                        _attention_attrs(_is_causal(args, kwargs, causal_position)))

    return handle


def _flash_backward(causal_position: int) -> Handler:
    def handle(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
        dout, q, k, v = args[:4]
        return Emission("FlashAttentionGrad", (tuple(q.shape), tuple(k.shape), tuple(v.shape), tuple(dout.shape)),
                        cost_dtype(q.dtype), _attention_attrs(_is_causal(args, kwargs, causal_position)))

    return handle


def _embedding(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
    weight, indices = args[0], args[1]
    tokens = indices.numel()
    if tokens == 0:
        return None
    return Emission("Embedding", ((tokens,), tuple(weight.shape)), cost_dtype(weight.dtype))


def _embedding_backward(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
    grad, indices, num_weights = args[0], args[1], args[2]
    tokens = indices.numel()
    if tokens == 0:
        return None
    return Emission("EmbeddingDenseGrad", ((tokens,), (int(num_weights), grad.shape[-1])), cost_dtype(grad.dtype))


def _fused_adamw(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
    params, grads, exp_avgs, exp_avg_sqs = (tensors_in(a) for a in args[:4])
    elements = sum(p.numel() for p in params)
    if elements == 0:
        return None
    read_bytes = sum(nbytes(t) for t in (*params, *grads, *exp_avgs, *exp_avg_sqs))
    write_bytes = sum(nbytes(t) for t in (*params, *exp_avgs, *exp_avg_sqs))
    return Emission("ApplyAdamW", ((elements,),), cost_dtype(params[0].dtype),
                    {"read_bytes": read_bytes, "write_bytes": write_bytes})


def _foreach(op_type: str) -> Handler:
    def handle(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
        inputs = tensors_in((args, kwargs))
        written = _written(args, outputs)
        # the elements the kernel streams: its first list's (a _foreach_norm reads whole tensors
        # and writes one number for each)
        elements = max(sum(t.numel() for t in tensors_in(args[:1])), sum(t.numel() for t in written))
        if elements == 0:
            return None
        read_bytes = sum(nbytes(t) for t in inputs)
        write_bytes = sum(nbytes(t) for t in written)
        return Emission(op_type, ((elements,),), cost_dtype(written[0].dtype),
                        {"read_bytes": read_bytes, "write_bytes": write_bytes, "tensors": len(written)})

    return handle


def _row_wise(op_type: str) -> Handler:
    """Norms, softmax, losses: over their first input's elements, with the bytes moved."""
    def handle(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
        inputs = tensors_in((args, kwargs))
        if not inputs:
            return None
        first = inputs[0]
        read_bytes = sum(nbytes(t) for t in inputs)
        write_bytes = sum(nbytes(t) for t in outputs)
        main = max([first, *outputs], key=lambda t: t.numel())
        if main.numel() == 0 or read_bytes + write_bytes == 0:
            return None
        return Emission(op_type, (tuple(main.shape),), cost_dtype(first.dtype),
                        {"read_bytes": read_bytes, "write_bytes": write_bytes})

    return handle


def _pair(value: object) -> tuple[int, int] | None:
    """A 2-D window argument (an int or two equal ints) as one int twice; ``None`` otherwise."""
    values = [value] * 2 if isinstance(value, int) else list(value)
    if len(values) == 1:
        values *= 2
    return (values[0], values[1]) if len(values) == 2 else None


def _square_conv(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, transposed, groups) -> dict | None:
    """The Conv2D attributes of a 2-D convolution the Cube cost model covers (NCHW, square
    stride and padding, no dilation, groups 1, not transposed); ``None`` for any other."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    if (x.dim() != 4 or weight.dim() != 4 or transposed or groups != 1 or None in (stride, padding, dilation)
            or stride[0] != stride[1] or padding[0] != padding[1] or dilation != (1, 1)):
        return None
    return {"stride": stride[0], "padding": padding[0]}


def _convolution(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
    x, weight = args[0], args[1]
    attrs = _square_conv(x, weight, *args[3:6], args[6], args[8])
    if attrs is None:
        return generic_emission("convolution", tensors_in(args), outputs)
    return Emission("Conv2D", (tuple(x.shape), tuple(weight.shape)), cost_dtype(x.dtype), attrs)


def _convolution_backward(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> list[Emission] | Emission | None:
    dy, x, weight = args[0], args[1], args[2]
    stride, padding, dilation, transposed, _, groups, mask = args[4:11]
    attrs = _square_conv(x, weight, stride, padding, dilation, transposed, groups)
    if attrs is None:
        return generic_emission("convolution_backward", tensors_in(args[:3]), outputs)
    dtype = cost_dtype(x.dtype)
    made = []
    if mask[1]:  # dW, as NPU.conv2d_backward issues it first
        made.append(Emission("Conv2DBackpropFilter", (tuple(x.shape), tuple(dy.shape)), dtype,
                             {**attrs, "kernel_hw": tuple(weight.shape[2:])}))
    if mask[0]:
        made.append(Emission("Conv2DBackpropInput", (tuple(dy.shape), tuple(weight.shape)), dtype,
                             {**attrs, "input_hw": tuple(x.shape[2:])}))
    if len(mask) > 2 and mask[2]:  # the bias gradient: dy summed over N, H, W
        made.append(Emission("ReduceSum", (tuple(dy.shape),), dtype,
                             {"read_bytes": nbytes(dy), "write_bytes": weight.shape[0] * dy.element_size()}))
    return made or None


def _fill(args: tuple, kwargs: dict, outputs: list[torch.Tensor]) -> Emission | None:
    return _moving("Fill", [], _written(args, outputs))


_ELEMENTWISE = {
    "add": "Add", "sub": "Sub", "rsub": "Sub", "mul": "Mul", "div": "RealDiv", "neg": "Neg", "abs": "Abs",
    "sqrt": "Sqrt", "rsqrt": "Rsqrt", "reciprocal": "Reciprocal", "exp": "Exp", "log": "Log",
    "sin": "Sin", "cos": "Cos", "tanh": "Tanh", "sigmoid": "Sigmoid",
    "maximum": "Maximum", "clamp_min": "Maximum", "minimum": "Minimum", "clamp_max": "Minimum",
    "lt": "Less", "gt": "Less", "le": "Less", "ge": "Less", "eq": "Less", "ne": "Less",
    "where": "SelectV2", "masked_fill": "SelectV2",
    "silu": "SiLU", "silu_backward": "SiLUGrad", "gelu": "GeLU", "gelu_backward": "GeLUGrad",
    "relu": "Relu", "threshold_backward": "ReluGrad",
    "sum": "ReduceSum", "mean": "ReduceMean", "amax": "ReduceMax",
    "max_pool2d_with_indices": "MaxPool", "max_pool2d_with_indices_backward": "MaxPoolGrad",
    "_adaptive_avg_pool2d": "GlobalAvgPool", "_adaptive_avg_pool2d_backward": "GlobalAvgPoolGrad",
    "avg_pool2d": "AvgPool", "avg_pool2d_backward": "AvgPoolGrad",
    "normal": "RandomNormal", "randn": "RandomNormal", "randn_like": "RandomNormal",
    "rand": "RandomUniform", "rand_like": "RandomUniform", "uniform": "RandomUniform",
    "randint": "RandomUniform", "bernoulli": "DropOutGenMask", "native_dropout": "DropOutDoMask",
    "native_dropout_backward": "DropOutDoMask",
    "cat": "ConcatD", "stack": "ConcatD", "chunk_cat": "ConcatD",
    "split_with_sizes_copy": "SplitV", "split_copy": "SplitV",
    # the gradient of a slice: zeros around the copied slice, as a pad writes them
    "slice_backward": "PadV3", "select_backward": "PadV3",
    "arange": "Range", "constant_pad_nd": "PadV3", "repeat": "BroadcastTo", "expand_copy": "BroadcastTo",
}
_ROW_WISE = {
    "_softmax": "Softmax", "_softmax_backward_data": "SoftmaxGrad",
    "_log_softmax": "LogSoftmax", "_log_softmax_backward_data": "LogSoftmaxGrad",
    "native_layer_norm": "LayerNorm", "native_layer_norm_backward": "LayerNormGrad",
    "_fused_rms_norm": "RmsNorm", "_fused_rms_norm_backward": "RmsNormGrad",
    "native_batch_norm": "BatchNorm", "_native_batch_norm_legit": "BatchNorm",
    "_native_batch_norm_legit_functional": "BatchNorm", "native_batch_norm_backward": "BatchNormGrad",
    "nll_loss_forward": "NLLLoss", "nll_loss_backward": "NLLLossGrad",
}
_FOREACH = {
    "_foreach_add": "ForeachAdd", "_foreach_sub": "ForeachSub", "_foreach_mul": "ForeachMul",
    "_foreach_div": "ForeachDiv", "_foreach_lerp": "ForeachLerp", "_foreach_addcmul": "ForeachAddcmul",
    "_foreach_addcdiv": "ForeachAddcdiv", "_foreach_sqrt": "ForeachSqrt", "_foreach_neg": "ForeachNeg",
    "_foreach_maximum": "ForeachMaximum", "_foreach_norm": "ForeachNorm", "_foreach_zero": "ForeachZero",
    "_foreach_copy": "ForeachCopy",
}
_FILL = ("zeros", "ones", "full", "fill", "zero", "zeros_like", "ones_like", "full_like", "new_zeros",
         "new_ones", "new_full", "scalar_tensor")

#: aten operator name (without overload and in-place ``_``) -> how it becomes a simulated op.
HANDLERS: dict[str, Handler] = {
    "mm": _matmul(False), "addmm": _matmul(False), "bmm": _matmul(True), "baddbmm": _matmul(True),
    "_scaled_dot_product_flash_attention_for_cpu": _flash_forward(4),
    "_scaled_dot_product_flash_attention_for_cpu_backward": _flash_backward(7),
    "_scaled_dot_product_flash_attention": _flash_forward(4),
    "_scaled_dot_product_flash_attention_backward": _flash_backward(11),
    "_scaled_dot_product_efficient_attention": _flash_forward(6),
    "_scaled_dot_product_efficient_attention_backward": _flash_backward(11),
    "embedding": _embedding, "embedding_dense_backward": _embedding_backward,
    "_fused_adamw": _fused_adamw, "_fused_adam": _fused_adamw,
    "_to_copy": _cast_or_copy, "clone": _cast_or_copy, "copy": _cast_or_copy,
    "pow": _pow,
    "convolution": _convolution, "convolution_backward": _convolution_backward,
    **{name: _elementwise(op_type) for name, op_type in _ELEMENTWISE.items()},
    **{name: _row_wise(op_type) for name, op_type in _ROW_WISE.items()},
    **{name: _foreach(op_type) for name, op_type in _FOREACH.items()},
    **{name: _fill for name in _FILL},
}

#: Operators that run no device kernel: allocation without a kernel, host-side bookkeeping.
NO_KERNEL = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh_copy", "_local_scalar_dense", "resize", "set", "_has_compatible_shallow_copy_type",
    "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_record_function_enter_new",
    "_record_function_exit", "record_stream", "_version",
})
#: Operators whose output aliases their input but whose schema does not say so (``is_view``).
VIEW_OPS = frozenset({"_unsafe_view", "_reshape_alias", "alias", "detach", "lift_fresh",
                      # in-place views (unsqueeze_, t_, ...): their schema says they write, not that they alias
                      "unsqueeze", "squeeze", "t", "transpose", "as_strided", "swapdims", "swapaxes"})
#: Namespaces of operators that are never kernels (tensor metadata, the profiler's markers).
NO_KERNEL_NAMESPACES = frozenset({"prim", "profiler"})


def base_name(func: torch._ops.OpOverload) -> str:
    """``aten.add_.Tensor`` -> ``add``: the operator without overload and in-place suffix."""
    name = func._schema.name.split("::")[-1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def generic_emission(name: str, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> Emission | None:
    """An operator no mapping knows: ``aten::<name>`` over its largest tensor, moving its bytes."""
    return _moving(f"{GENERIC_OP_PREFIX}{name}", list(inputs), list(outputs))


def emission(func: torch._ops.OpOverload, args: tuple, kwargs: dict,
             outputs: list[torch.Tensor]) -> Emission | list[Emission] | None:
    """The simulated op of one captured call (``None``: no kernel; a list: several kernels, a
    convolution's gradients). ``outputs`` are the tensors it returned (none for an in-place
    ``_foreach_*_`` op: it writes its first argument)."""
    name = base_name(func)
    handler = HANDLERS.get(name)
    if handler is not None:
        return handler(args, kwargs, outputs)
    return generic_emission(name, tensors_in((args, kwargs)), _written(args, outputs))
