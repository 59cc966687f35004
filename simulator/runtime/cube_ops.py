"""Operators on the Cube unit: matrix products, fused attention, convolutions.

A mixin of :class:`~simulator.runtime.NPU`: each method checks its arguments, computes the
result when the inputs carry data, and hands the op to :meth:`~simulator.runtime.NPU.emit`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..hardware import HardwareSpec
from .tensor import ShapeError, Tensor, check_tensors, check_window, compute

#: The fused attention kernel's tiling when the caller gives none (NPU.flash_attention's
#: defaults, and a captured PyTorch attention's): query blocks of 128 rows, 2 blocks in flight.
FLASH_ATTENTION_DEFAULTS = {"block_size": 128, "pipeline_stages": 2}


class CubeOps:
    """The Cube unit's operators of :class:`~simulator.runtime.NPU`."""

    __slots__ = ()
    hardware: HardwareSpec
    emit: Callable[..., int]

    def matmul(
        self,
        a: Tensor,
        b: Tensor,
        *,
        transpose_a: bool = False,
        transpose_b: bool = False,
        name: str | None = None,
    ) -> Tensor:
        """Matrix product on the Cube unit; batched over leading dimensions.

        Shapes: ``a`` (..., M, K), ``b`` (..., K, N) or (K, N) (broadcast); with the transpose
        flags, the last two axes of that operand are swapped first. Returns (..., M, N).
        2-D products are op type ``MatMul``, batched ones ``BatchMatMul``.

        Raises:
            ShapeError: fewer than 2 dimensions, inner dimensions differ, batch mismatch,
                or dtypes differ.
        """
        check_tensors("matmul", a=a, b=b)
        for t, label in ((a, "a"), (b, "b")):
            if len(t.shape) < 2:
                raise ShapeError(f"matmul: {label} must have at least 2 dimensions, got {list(t.shape)}")
        if a.dtype != b.dtype:
            raise ShapeError(f"matmul: dtypes differ: a is {a.dtype}, b is {b.dtype}")
        m, k = (a.shape[-1], a.shape[-2]) if transpose_a else (a.shape[-2], a.shape[-1])
        kb, n = (b.shape[-1], b.shape[-2]) if transpose_b else (b.shape[-2], b.shape[-1])
        if k != kb:
            raise ShapeError(
                f"matmul: inner dimensions differ: a {list(a.shape)} and b {list(b.shape)} "
                f"(K={k} vs {kb})"
            )
        batch_a, batch_b = a.shape[:-2], b.shape[:-2]
        if batch_b and batch_b != batch_a:
            raise ShapeError(
                f"matmul: batch dimensions differ: a {list(a.shape)} and b {list(b.shape)}"
            )
        batch = math.prod(batch_a)
        op_type = "BatchMatMul" if batch_a else "MatMul"
        spec_a = Tensor((batch, m, k), a.dtype)
        spec_b = Tensor((batch, k, n), b.dtype)
        out_shape = (*batch_a, m, n)
        values = checks = None
        if a.data is not None:
            values, checks = compute(op_type, (a, b), a.dtype, out_shape,
                                     {"transpose_a": transpose_a, "transpose_b": transpose_b})
        out = Tensor(out_shape, a.dtype, None if values is None else values.data)
        self.emit(op_type, (spec_a, spec_b), a.dtype, name, outputs=(out,), checks=checks)
        return out

    def flash_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        block_size: int = FLASH_ATTENTION_DEFAULTS["block_size"],
        pipeline_stages: int = FLASH_ATTENTION_DEFAULTS["pipeline_stages"],
        fusion: bool = True,
        causal: bool = False,
        name: str | None = None,
    ) -> Tensor:
        """Fused attention (op type ``FlashAttention``): softmax(Q Kᵀ / sqrt(D)) V.

        Shapes: q (B, H, S_q, D); k and v (B, H_kv, S_kv, D) with H divisible by H_kv
        (grouped-query attention). Returns (B, H, S_q, D). The kernel's workspace
        (:func:`simulator.costs.op_workspace_bytes`) is taken after the output and given back.

        Raises:
            ShapeError: wrong ranks or mismatched dimensions, a ``block_size`` that is not a
                positive multiple of the Cube fractal (``cube_unit.fractal_*`` of the hardware:
                16), or a non-positive ``pipeline_stages``.
            ValueError: the blocks in flight do not fit in an AI Core's L1.
        """
        self._check_attention("flash_attention", q, k, v, block_size, pipeline_stages)
        attrs = {"block_size": block_size, "pipeline_stages": pipeline_stages, "fusion": bool(fusion), "causal": bool(causal)}
        values = checks = None
        if q.data is not None:
            values, checks = compute("FlashAttention", (q, k, v), q.dtype, q.shape, attrs)
        out = Tensor(tuple(q.shape), q.dtype, None if values is None else values.data)
        self.emit("FlashAttention", (q, k, v), q.dtype, name, attrs, outputs=(out,), checks=checks)
        return out

    def flash_attention_grad(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        dout: Tensor,
        *,
        block_size: int = FLASH_ATTENTION_DEFAULTS["block_size"],
        pipeline_stages: int = FLASH_ATTENTION_DEFAULTS["pipeline_stages"],
        fusion: bool = True,
        causal: bool = False,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Backward of :meth:`flash_attention` (op type ``FlashAttentionGrad``).

        Shapes as the forward; ``dout`` has q's shape. Returns (dq, dk, dv).
        """
        self._check_attention("flash_attention_grad", q, k, v, block_size, pipeline_stages)
        check_tensors("flash_attention_grad", dout=dout)
        if dout.shape != q.shape:
            raise ShapeError(f"flash_attention_grad: dout {list(dout.shape)} must match q {list(q.shape)}")
        attrs = {"block_size": block_size, "pipeline_stages": pipeline_stages, "fusion": bool(fusion), "causal": bool(causal)}
        grads = Tensor(tuple(q.shape), q.dtype), Tensor(tuple(k.shape), k.dtype), Tensor(tuple(v.shape), v.dtype)
        self.emit("FlashAttentionGrad", (q, k, v, dout), q.dtype, name, attrs, outputs=grads)
        return grads

    def _check_attention(self, op: str, q: Tensor, k: Tensor, v: Tensor, block_size: int, stages: int) -> None:
        check_tensors(op, q=q, k=k, v=v)
        for t, label in ((q, "q"), (k, "k"), (v, "v")):
            if len(t.shape) != 4:
                raise ShapeError(f"{op}: {label} must be (B, H, S, D), got {list(t.shape)}")
        if k.shape != v.shape:
            raise ShapeError(f"{op}: k {list(k.shape)} and v {list(v.shape)} must match")
        if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
            raise ShapeError(f"{op}: batch and head_dim of q {list(q.shape)} and k {list(k.shape)} must match")
        if q.shape[1] % k.shape[1]:
            raise ShapeError(f"{op}: q heads ({q.shape[1]}) must be a multiple of k/v heads ({k.shape[1]})")
        if len({q.dtype, k.dtype, v.dtype}) != 1:
            raise ShapeError(f"{op}: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
        # a block is the rows of Q K^T (M), its columns (N) and the depth of P V (K): a whole
        # number of Cube fractals along each
        cube = self.hardware.cube_unit
        fractal = math.lcm(cube.fractal_m, cube.fractal_n, cube.fractal_k)
        if not isinstance(block_size, int) or block_size < fractal or block_size % fractal:
            raise ShapeError(f"{op}: block_size must be a positive multiple of {fractal}, got {block_size!r}")
        if not isinstance(stages, int) or stages < 1:
            raise ShapeError(f"{op}: pipeline_stages must be a positive integer, got {stages!r}")

    def conv2d(self, x: Tensor, weight: Tensor, *, stride: int = 1, padding: int = 0,
               name: str | None = None) -> Tensor:
        """2-D convolution (op type ``Conv2D``), NCHW. x (N, Cin, H, W), weight (Cout, Cin, kh, kw).

        Returns (N, Cout, Ho, Wo) with ``Ho = (H + 2 padding - kh) // stride + 1``.

        Raises:
            ShapeError: not 4-D, channel mismatch, bad stride or padding, or a window larger
                than the padded input.
        """
        check_tensors("Conv2D", x=x, weight=weight)
        ho, wo = check_window("Conv2D", x, weight.shape, stride, padding)
        out = Tensor((x.shape[0], weight.shape[0], ho, wo), x.dtype)
        self.emit("Conv2D", (x, weight), x.dtype, name, {"stride": stride, "padding": padding}, outputs=(out,))
        return out

    def conv2d_backward(self, dy: Tensor, x: Tensor, weight: Tensor, *, stride: int = 1, padding: int = 0,
                        input_grad: bool = True, name: str | None = None) -> Tensor | None:
        """Gradients of :meth:`conv2d`: ``Conv2DBackpropFilter`` (dW), then, with
        ``input_grad``, ``Conv2DBackpropInput`` (dx, returned). dy is (N, Cout, Ho, Wo).

        Raises:
            ShapeError: as :meth:`conv2d`, or dy not the convolution's output shape.
        """
        check_tensors("Conv2DBackpropFilter", dy=dy, x=x, weight=weight)
        ho, wo = check_window("Conv2DBackpropFilter", x, weight.shape, stride, padding)
        expected = (x.shape[0], weight.shape[0], ho, wo)
        if dy.shape != expected:
            raise ShapeError(f"Conv2DBackpropFilter: dy {list(dy.shape)} must be {list(expected)}")
        attrs = {"stride": stride, "padding": padding}
        self.emit("Conv2DBackpropFilter", (x, dy), x.dtype, name, {**attrs, "kernel_hw": weight.shape[2:]})
        if not input_grad:
            return None
        dx = Tensor(tuple(x.shape), x.dtype)
        self.emit("Conv2DBackpropInput", (dy, weight), x.dtype, name, {**attrs, "input_hw": x.shape[2:]}, outputs=(dx,))
        return dx
