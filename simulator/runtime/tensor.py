"""Device tensors, the checks every operator makes of its arguments, and the values an operator
computes from tensors that carry data (:mod:`simulator.numerics`)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .. import numerics
from ..costs import conv_output_hw
from ..profile import OpChecks
from ..units import DTYPE_BYTES


class ShapeError(ValueError):
    """An operator was called with shapes or arguments it cannot work with."""


@dataclass(frozen=True, eq=False, init=False)
class Tensor:
    """A device tensor: shape (elements per axis) and dtype name.

    Tensors made by an :class:`~simulator.runtime.NPU` hold device memory from its caching
    allocator until the Python object is garbage-collected (or
    :meth:`~simulator.runtime.NPU.free` is called). Two tensors are equal only if they are the
    same object, as device buffers are.

    ``data`` is ``None`` (shape only, the default and the fast path) unless the tensor was made
    with :meth:`~simulator.runtime.NPU.from_numpy` or computed from such tensors: then it is a
    numpy array of ``shape`` in the storage of :data:`simulator.numerics.DATA_DTYPES` (read it
    with :meth:`~simulator.runtime.NPU.to_numpy`). ``producer_index`` is the index of the op
    record that produced the tensor (``None``: made by :meth:`~simulator.runtime.NPU.tensor` or
    :meth:`~simulator.runtime.NPU.from_numpy`).
    """

    shape: tuple[int, ...]
    dtype: str = "fp16"
    data: np.ndarray | None = field(default=None, repr=False)
    producer_index: int | None = field(default=None, repr=False)

    def __init__(self, shape: tuple[int, ...], dtype: str = "fp16", data: np.ndarray | None = None,
                 producer_index: int | None = None) -> None:
        # Written into __dict__: the generated __init__ of a frozen dataclass pays one
        # object.__setattr__ per field, and every op makes tensors (the simulator's hot path).
        fields = self.__dict__
        fields["shape"] = shape
        fields["dtype"] = dtype
        fields["data"] = data
        fields["producer_index"] = producer_index

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    def __repr__(self) -> str:
        return f"Tensor({list(self.shape)}, {self.dtype})"


def check_shape(op: str, shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as a tuple of ints.

    Raises:
        ShapeError: not a sequence of positive integers (named after ``op``).
    """
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShapeError(f"{op}: shape {shape!r} is not a sequence of integers") from None
    if not dims or any(isinstance(d, bool) or not isinstance(d, numbers.Integral) or d <= 0 for d in dims):
        raise ShapeError(f"{op}: shape {list(dims)} must hold positive integers")
    return tuple(int(d) for d in dims)


def check_tensors(op: str, **tensors: object) -> None:
    """Every value a live :class:`Tensor`.

    Raises:
        ShapeError: a value that is not a Tensor (named by its keyword).
        ValueError: a tensor given back with ``npu.free()`` (a use after free).
    """
    for label, value in tensors.items():
        if not isinstance(value, Tensor):
            raise ShapeError(
                f"{op}: {label} must be a Tensor (made with npu.tensor(shape, dtype)), got {type(value).__name__}"
            )
        if "_freed" in value.__dict__:
            raise ValueError(f"{op}: {label} {list(value.shape)} was given back with npu.free() before this op: "
                             "a use after free")


def check_dtype(op: str, dtype: str) -> str:
    """``dtype`` if it is a dtype name the simulator knows.

    Raises:
        ShapeError: another name (the message lists the known ones).
    """
    if dtype not in DTYPE_BYTES:
        raise ShapeError(f"{op}: unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return dtype


def mark_freed(tensor: Tensor) -> None:
    """Mark ``tensor`` as given back: an op that is later given it raises (a use after free)."""
    tensor.__dict__["_freed"] = True


def check_window(op: str, x: Tensor, weight_shape: tuple[int, ...], stride: int, padding: int) -> tuple[int, int]:
    """The output height and width of a convolution or pooling window over ``x`` (NCHW).

    Raises:
        ShapeError: ``x`` or the weight is not 4-D, their channels differ, a bad stride or
            padding, or a window larger than the padded input.
    """
    if len(x.shape) != 4:
        raise ShapeError(f"{op}: x must be (N, C, H, W), got {list(x.shape)}")
    if len(weight_shape) != 4:
        raise ShapeError(f"{op}: weight must be (Cout, Cin, kh, kw), got {list(weight_shape)}")
    if x.shape[1] != weight_shape[1]:
        raise ShapeError(f"{op}: x has {x.shape[1]} channels, weight {list(weight_shape)} expects {weight_shape[1]}")
    for label, value, low in (("stride", stride, 1), ("padding", padding, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ShapeError(f"{op}: {label} must be an integer >= {low}, got {value!r}")
    ho, wo = conv_output_hw(x.shape[2], x.shape[3], weight_shape[2], weight_shape[3], stride, padding)
    if ho < 1 or wo < 1:
        raise ShapeError(f"{op}: a {weight_shape[2]}x{weight_shape[3]} window does not fit input {list(x.shape)} "
                         f"with padding {padding}")
    return ho, wo


def op_checks(values: numerics.Values, out_shape: Sequence[int]) -> OpChecks:
    """The correctness checks of an op whose result has ``values``."""
    return OpChecks.model_construct(
        output_shape=list(out_shape), nan_count=values.nan_count, inf_count=values.inf_count,
        saturated_count=values.saturated_count, max_abs_value=values.max_abs_value,
        declared_shape=None, out_of_bounds_elements=0)


def compute(op_type: str, inputs: Sequence[Tensor], dtype: str, out_shape: Sequence[int],
            attrs: dict[str, object] | None = None) -> tuple[numerics.Values | None, OpChecks | None]:
    """The op's result when every input carries data and the op type has a reference kernel
    (:data:`simulator.numerics.KERNELS`), with the checks its record gets; ``(None, None)``
    otherwise. Callers test the first input's ``data`` before calling (the shape-only fast
    path pays nothing)."""
    if any(t.data is None for t in inputs):
        return None, None
    values = numerics.evaluate(op_type, [t.data for t in inputs], dtype, attrs)
    if values is None:
        return None, None
    return values, op_checks(values, out_shape)

