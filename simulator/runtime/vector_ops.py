"""Operators on the Vector unit: elementwise, normalisation, embedding, loss, optimizer updates,
batch norm and pooling.

A mixin of :class:`~simulator.runtime.NPU`: each method checks its arguments, computes the
result when the inputs carry data, and hands the op to :meth:`~simulator.runtime.NPU.emit`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .tensor import ShapeError, Tensor, check_dtype, check_tensors, check_window, compute


class VectorOps:
    """The Vector unit's operators of :class:`~simulator.runtime.NPU`."""

    __slots__ = ()
    emit: Callable[..., int]

    def _elementwise(self, op_type: str, x: Tensor, *others: Tensor, name: str | None) -> Tensor:
        check_tensors(op_type, x=x, **{f"input {i + 2}": t for i, t in enumerate(others)})
        try:
            if all(t.shape == x.shape for t in others):
                out_shape = x.shape
            else:
                out_shape = np.broadcast_shapes(x.shape, *(t.shape for t in others))
        except ValueError:
            shapes = " and ".join(str(list(t.shape)) for t in (x, *others))
            raise ShapeError(f"{op_type}: shapes {shapes} do not broadcast") from None
        values = checks = None
        if x.data is not None:
            values, checks = compute(op_type, (x, *others), x.dtype, out_shape)
        # the output costs the op (it is the largest operand)
        out = Tensor(tuple(out_shape), x.dtype, None if values is None else values.data)
        self.emit(op_type, (out, *others), x.dtype, name, outputs=(out,), checks=checks)
        return out

    def _norm(self, op_type: str, x: Tensor, params: Sequence[Tensor], name: str | None) -> Tensor:
        check_tensors(op_type, x=x, **{f"parameter {i + 1}": p for i, p in enumerate(params)})
        for p in params:
            if p.shape != (x.shape[-1],):
                raise ShapeError(
                    f"{op_type}: parameter shape {list(p.shape)} must be ({x.shape[-1]},) for input {list(x.shape)}"
                )
        values = checks = None
        if x.data is not None:
            values, checks = compute(op_type, (x, *params), x.dtype, x.shape)
        out = Tensor(tuple(x.shape), x.dtype, None if values is None else values.data)
        self.emit(op_type, (x, *params), x.dtype, name, outputs=(out,), checks=checks)
        return out

    # -- elementwise ---------------------------------------------------------------------------

    def add(self, a: Tensor, b: Tensor, *, name: str | None = None) -> Tensor:
        """a + b (op type ``Add``); b may be a's shape or its last axis."""
        return self._elementwise("Add", a, b, name=name)

    def mul(self, a: Tensor, b: Tensor, *, name: str | None = None) -> Tensor:
        """a * b (op type ``Mul``); b may be a's shape or its last axis."""
        return self._elementwise("Mul", a, b, name=name)

    def silu(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """x * sigmoid(x) (op type ``SiLU``)."""
        return self._elementwise("SiLU", x, name=name)

    def silu_grad(self, dy: Tensor, x: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`silu` (op type ``SiLUGrad``)."""
        return self._elementwise("SiLUGrad", dy, x, name=name)

    def gelu(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """GeLU, tanh approximation (op type ``GeLU``)."""
        return self._elementwise("GeLU", x, name=name)

    def gelu_grad(self, dy: Tensor, x: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`gelu` (op type ``GeLUGrad``)."""
        return self._elementwise("GeLUGrad", dy, x, name=name)

    def softmax(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Softmax over the last axis (op type ``Softmax``)."""
        return self._elementwise("Softmax", x, name=name)

    def softmax_grad(self, dy: Tensor, y: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`softmax` (op type ``SoftmaxGrad``)."""
        return self._elementwise("SoftmaxGrad", dy, y, name=name)

    def rotary_embedding(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Rotary position embedding applied to q or k (op type ``RotaryPositionEmbedding``)."""
        return self._elementwise("RotaryPositionEmbedding", x, name=name)

    def relu(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """max(x, 0) (op type ``Relu``)."""
        return self._elementwise("Relu", x, name=name)

    def relu_grad(self, dy: Tensor, y: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`relu` (op type ``ReluGrad``)."""
        return self._elementwise("ReluGrad", dy, y, name=name)

    def cast(self, x: Tensor, dtype: str, *, name: str | None = None) -> Tensor:
        """Convert to ``dtype`` (op type ``Cast``)."""
        check_tensors("cast", x=x)
        check_dtype("cast", dtype)
        values = checks = None
        if x.data is not None:
            values, checks = compute("Cast", (x,), dtype, x.shape)
        out = Tensor(tuple(x.shape), dtype, None if values is None else values.data)
        self.emit("Cast", (x,), x.dtype, name, {"to": dtype}, outputs=(out,), checks=checks)
        return out

    # -- normalisation -------------------------------------------------------------------------

    def rms_norm(self, x: Tensor, weight: Tensor, *, name: str | None = None) -> Tensor:
        """RMS normalisation over the last axis (op type ``RmsNorm``). weight: (hidden,)."""
        return self._norm("RmsNorm", x, (weight,), name)

    def rms_norm_grad(self, dy: Tensor, x: Tensor, weight: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`rms_norm` (op type ``RmsNormGrad``); returns dx."""
        if dy.shape != x.shape:
            raise ShapeError(f"RmsNormGrad: dy {list(dy.shape)} must match x {list(x.shape)}")
        return self._norm("RmsNormGrad", dy, (weight,), name)

    def layer_norm(self, x: Tensor, weight: Tensor, bias: Tensor, *, name: str | None = None) -> Tensor:
        """Layer normalisation over the last axis (op type ``LayerNorm``)."""
        return self._norm("LayerNorm", x, (weight, bias), name)

    def layer_norm_grad(self, dy: Tensor, x: Tensor, weight: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`layer_norm` (op type ``LayerNormGrad``); returns dx."""
        if dy.shape != x.shape:
            raise ShapeError(f"LayerNormGrad: dy {list(dy.shape)} must match x {list(x.shape)}")
        return self._norm("LayerNormGrad", dy, (weight,), name)

    def batch_norm(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Training batch normalisation over (N, H, W) per channel (op type ``BatchNorm``)."""
        return self._elementwise("BatchNorm", x, name=name)

    def batch_norm_grad(self, dy: Tensor, x: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`batch_norm` (op type ``BatchNormGrad``); returns dx."""
        if dy.shape != x.shape:
            raise ShapeError(f"BatchNormGrad: dy {list(dy.shape)} must match x {list(x.shape)}")
        return self._elementwise("BatchNormGrad", dy, name=name)

    def batch_norm_relu(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Batch norm fused with the ReLU after it, sums taken in the producing convolution's
        epilogue, as graph-mode fusion builds it (op type ``BatchNormRelu``)."""
        return self._elementwise("BatchNormRelu", x, name=name)

    def batch_norm_update(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Batch norm whose sums the producing convolution took (op type ``BatchNormUpdate``)."""
        return self._elementwise("BatchNormUpdate", x, name=name)

    def batch_norm_add_relu(self, x: Tensor, residual: Tensor, *, name: str | None = None) -> Tensor:
        """relu(batch_norm(x) + residual) in one pass (op type ``BatchNormAddRelu``)."""
        if residual.shape != x.shape:
            raise ShapeError(f"BatchNormAddRelu: residual {list(residual.shape)} must match x {list(x.shape)}")
        return self._elementwise("BatchNormAddRelu", x, residual, name=name)

    def batch_norm_relu_grad(self, dy: Tensor, x: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`batch_norm_relu` (op type ``BatchNormReluGrad``); returns dx."""
        if dy.shape != x.shape:
            raise ShapeError(f"BatchNormReluGrad: dy {list(dy.shape)} must match x {list(x.shape)}")
        return self._elementwise("BatchNormReluGrad", dy, name=name)

    # -- pooling -------------------------------------------------------------------------------

    def max_pool(self, x: Tensor, *, kernel: int = 3, stride: int = 2, padding: int = 1,
                 name: str | None = None) -> Tensor:
        """Max pooling over ``kernel x kernel`` windows (op type ``MaxPool``), NCHW."""
        check_tensors("MaxPool", x=x)
        ho, wo = check_window("MaxPool", x, (x.shape[1], x.shape[1], kernel, kernel), stride, padding)
        out = Tensor((*x.shape[:2], ho, wo), x.dtype)
        self.emit("MaxPool", (x,), x.dtype, name, {"kernel": kernel, "stride": stride}, outputs=(out,))
        return out

    def max_pool_grad(self, dy: Tensor, x: Tensor, *, kernel: int = 3, stride: int = 2,
                      name: str | None = None) -> Tensor:
        """Backward of :meth:`max_pool` (op type ``MaxPoolGrad``); returns dx."""
        check_tensors("MaxPoolGrad", dy=dy, x=x)
        dx = Tensor(tuple(x.shape), x.dtype)
        self.emit("MaxPoolGrad", (x, dy), x.dtype, name, {"kernel": kernel, "stride": stride}, outputs=(dx,))
        return dx

    def global_avg_pool(self, x: Tensor, *, name: str | None = None) -> Tensor:
        """Mean over H and W (op type ``GlobalAvgPool``): (N, C, H, W) -> (N, C)."""
        check_tensors("GlobalAvgPool", x=x)
        if len(x.shape) != 4:
            raise ShapeError(f"GlobalAvgPool: x must be (N, C, H, W), got {list(x.shape)}")
        out = Tensor(tuple(x.shape[:2]), x.dtype)
        self.emit("GlobalAvgPool", (x,), x.dtype, name, outputs=(out,))
        return out

    def global_avg_pool_grad(self, dy: Tensor, x: Tensor, *, name: str | None = None) -> Tensor:
        """Backward of :meth:`global_avg_pool` (op type ``GlobalAvgPoolGrad``); returns dx."""
        check_tensors("GlobalAvgPoolGrad", dy=dy, x=x)
        dx = Tensor(tuple(x.shape), x.dtype)
        self.emit("GlobalAvgPoolGrad", (x, dy), x.dtype, name, outputs=(dx,))
        return dx

    # -- embedding, loss, optimizers -----------------------------------------------------------

    def embedding(self, ids: Tensor, table: Tensor, *, name: str | None = None) -> Tensor:
        """Row lookup (op type ``Embedding``). ids: any shape of int; table: (vocab, hidden)."""
        check_tensors("Embedding", ids=ids, table=table)
        if len(table.shape) != 2:
            raise ShapeError(f"Embedding: table must be (vocab, hidden), got {list(table.shape)}")
        if ids.dtype not in ("int32", "int64"):
            raise ShapeError(f"Embedding: ids must be int32 or int64, got {ids.dtype}")
        out = Tensor((*ids.shape, table.shape[1]), table.dtype)
        self.emit("Embedding", (Tensor((ids.numel,), ids.dtype), table), table.dtype, name, outputs=(out,))
        return out

    def embedding_grad(self, dy: Tensor, ids: Tensor, table: Tensor, *, name: str | None = None) -> Tensor:
        """Scatter-add of row gradients into the table (op type ``EmbeddingDenseGrad``)."""
        check_tensors("EmbeddingDenseGrad", dy=dy, ids=ids, table=table)
        if dy.shape != (*ids.shape, table.shape[1]):
            raise ShapeError(f"EmbeddingDenseGrad: dy {list(dy.shape)} must be ids shape + (hidden,)")
        out = Tensor(tuple(table.shape), table.dtype)
        self.emit("EmbeddingDenseGrad", (Tensor((ids.numel,), ids.dtype), table), table.dtype, name, outputs=(out,))
        return out

    def cross_entropy(self, logits: Tensor, *, name: str | None = None) -> Tensor:
        """Softmax cross entropy over the last axis (op type ``CrossEntropy``); returns the loss."""
        check_tensors("CrossEntropy", logits=logits)
        loss = Tensor((1,), "fp32")
        self.emit("CrossEntropy", (logits,), logits.dtype, name, outputs=(loss,))
        return loss

    def cross_entropy_grad(self, logits: Tensor, *, name: str | None = None) -> Tensor:
        """Gradient of :meth:`cross_entropy` with respect to the logits (``CrossEntropyGrad``)."""
        check_tensors("CrossEntropyGrad", logits=logits)
        grad = Tensor(tuple(logits.shape), logits.dtype)
        self.emit("CrossEntropyGrad", (logits,), logits.dtype, name, outputs=(grad,))
        return grad

    def adamw(self, param_numel: int, *, name: str | None = None) -> None:
        """AdamW update of ``param_numel`` fp32 master weights (op type ``ApplyAdamW``)."""
        if not isinstance(param_numel, int) or param_numel < 1:
            raise ShapeError(f"ApplyAdamW: param_numel must be a positive integer, got {param_numel!r}")
        self.emit("ApplyAdamW", (Tensor((param_numel,), "fp32"),), "fp32", name)

    def momentum(self, param_numel: int, *, name: str | None = None) -> None:
        """SGD-with-momentum update of ``param_numel`` fp32 weights (op type ``ApplyMomentum``)."""
        if not isinstance(param_numel, int) or param_numel < 1:
            raise ShapeError(f"ApplyMomentum: param_numel must be a positive integer, got {param_numel!r}")
        self.emit("ApplyMomentum", (Tensor((param_numel,), "fp32"),), "fp32", name)
