"""How much HBM one card of a Llama training step needs: :func:`memory_estimates`.

The estimate counts the tensors :func:`simulator.models.training_step` allocates, at the
moments the caching allocator sees its peak, so that it agrees with the memory model
(``memory=True``, :mod:`simulator.allocator`) and the builder refuses a layout only when its
simulation would run out of memory (``tests/test_layouts.py`` holds the two within a stated
tolerance over recompute, sequence parallelism, the ZeRO stages and pipeline layouts).

**Job-long state** (Rajbhandari et al., "ZeRO", SC 2020): per parameter of the card's stage (its
layers divided over tensor parallelism, the embedding on the first stage, the final norm and
LM head on the last), 2 bytes of 16-bit weights, 2 of gradients and 12 of fp32 optimizer state
(master weight, Adam's momentum and variance); ZeRO-1 divides the optimizer state by the
data-parallel size, ZeRO-2 the gradients too, ZeRO-3 the weights too.

**Activations** follow Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (MLSys 2023), Table 2 and section 4: a transformer layer saves, for its
backward, every tensor that a backward op reads. For a GPT layer they count
``s b h (34 + 5 a s / h)`` bytes with 16-bit activations (``s`` sequence, ``b`` micro-batch,
``h`` hidden, ``a`` heads): ``s b h (10 + 24 / t + 5 a s / (h t))`` with tensor parallelism
``t``, the ``10 s b h`` of the norms, dropouts and residuals divided by ``t`` too with sequence
parallelism, the ``5 a s / h`` term of the attention scores gone with selective recompute (and
with FlashAttention, which never stores them), and ``2 s b h`` (``/ t`` with sequence
parallelism) left with full recompute, the layer's input. The same count over a Llama layer
(RMSNorm, rotary embedding, SwiGLU, no dropout, FlashAttention, grouped-query attention) as the
builder keeps it, per token and in elements of 2 bytes::

    4 h / t_s                        layer input, input norm output, attention residual sum,
                                     post-attention norm output (t_s = t with sequence
                                     parallelism, else 1)
    + (n + 2 n_kv) d / t             QKV projection
    + (n + n_kv) d / t               rotated Q and K
    + n d / t                        attention output
    + 4 f / t                        gate and up projections, SiLU, gated product

with ``n``, ``n_kv`` the query and KV heads, ``d`` the head size and ``f`` the FFN size: for
Llama-2-7B ``(4 / t_s + 8.19 / t) s b h`` against GPT's ``(10 + 24 / t)``. A stage holds the
activations of as many micro-batch chunks as its schedule runs forwards ahead of their
backwards (:func:`simulator.models.pipeline.max_in_flight`: ``pp - stage`` in 1F1B, Korthikanti
et al. section 4.2.3 for the interleaved schedule); the last stage also the logits.

**Working set** at the peak, on top: the first backward's transients (the loss gradient of the
logits; in a layer's backward the output gradient, three FFN-wide gradients, or the attention
gradients with FlashAttentionGrad's workspace; with full recompute the layer's recomputed
activations; with ZeRO-3 two modules' gathered parameters), or, at the end of the step, the
gradient collectives' outputs and the gathered parameters (new tensors here, where Megatron
reduces and gathers in place in its buffers). **HCCL** takes ``interconnect.hccl_buffer_bytes``
outside the allocator for each group it communicates in (tensor-parallel, data-parallel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..costs import OpSpec, op_workspace_bytes
from ..units import DTYPE_BYTES
from .layout import ParallelLayout
from .pipeline import max_in_flight

if TYPE_CHECKING:
    from ..hardware import HardwareSpec
    from .llama_config import LlamaConfig

#: fp32 values of optimizer state per parameter: master weight, Adam's m and v.
MASTER_STATES_PER_PARAM = 3
#: What ``training_step(recompute=...)`` takes (Korthikanti et al.; Megatron's ``--recompute-granularity``).
RECOMPUTE_MODES = (None, "selective", "full")


def stage_params(config: LlamaConfig, layout: ParallelLayout, stage: int) -> int:
    """Parameters one card of pipeline stage ``stage`` holds: its layers, the embedding on the
    first stage, the final norm and LM head on the last, divided over tensor parallelism."""
    h, v = config.hidden_size, config.vocab_size
    per_layer = (config.param_count - 2 * v * h - h) // config.num_layers
    layers = -(-config.num_layers // layout.pipeline_parallel)
    params = layers * per_layer + (v * h if stage == 0 else 0)
    if stage == layout.pipeline_parallel - 1:
        params += v * h + h
    return -(-params // layout.tensor_parallel)


@dataclass(frozen=True)
class MemoryEstimate:
    """The HBM one card of pipeline stage ``stage`` needs for a training step, in bytes, by part
    (see the module docstring). ``working_bytes`` is what the peak adds on top of the
    activations (or, at the end of the step, in their place)."""

    stage: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    working_bytes: int
    hccl_buffer_bytes: int

    @property
    def state_bytes(self) -> int:
        """Weights, gradients and optimizer state: what lives for the whole job."""
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def tensor_bytes(self) -> int:
        """What the caching allocator holds at the peak (the HCCL buffers are outside it)."""
        return self.state_bytes + self.activations_bytes + self.working_bytes

    @property
    def total_bytes(self) -> int:
        """Everything the card must hold: :attr:`tensor_bytes` and the HCCL buffers."""
        return self.tensor_bytes + self.hccl_buffer_bytes


def memory_estimates(
    config: LlamaConfig,
    layout: ParallelLayout,
    batch_size: int,
    seq_len: int,
    *,
    recompute: str | None = None,
    dtype: str = "fp16",
    hardware: HardwareSpec | None = None,
    fusion: bool = True,
    framework: str = "ideal",
) -> list[MemoryEstimate]:
    """The estimate of every pipeline stage (one item without pipelining), see the module
    docstring. ``hardware`` adds FlashAttentionGrad's workspace (of the fused kernel, with
    ``fusion`` as :func:`simulator.models.training_step` takes it) and the HCCL buffers (both 0
    without it). With ``framework="megatron"`` the fused SwiGLU keeps its output only: ``3 f / t``
    per token for the FFN instead of ``4 f / t`` (gate/up projection and SwiGLU output).

    Raises:
        ValueError: ``recompute`` is not one of :data:`RECOMPUTE_MODES`, ``dtype`` is unknown, or
            the layout does not split the model (:meth:`ParallelLayout.check_model`).
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute={recompute!r} is not one of {', '.join(map(repr, RECOMPUTE_MODES))}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is unknown; known: {', '.join(DTYPE_BYTES)}")
    layout.check_model(config, batch_size, seq_len)
    e = DTYPE_BYTES[dtype]
    t, dp, pp = layout.tensor_parallel, layout.data_parallel, layout.pipeline_parallel
    zero = layout.zero_stage
    h, d = config.hidden_size, config.head_dim
    heads, kv_heads = config.num_heads // t, config.num_kv_heads // t
    ffn, vocab = config.ffn_hidden_size // t, config.vocab_size // t
    tokens = batch_size * seq_len
    split = tokens // t if layout.sequence_sharded else tokens  # rows outside the tensor-parallel regions
    layer_input = split * h * e
    layer_all = e * (4 * split * h + tokens * ((heads + 2 * kv_heads) * d + (heads + kv_heads) * d + heads * d
                                                  + (3 if framework == "megatron" else 4) * ffn))
    layer_saved = layer_input if recompute == "full" else layer_all
    per_chunk = config.num_layers // layout.virtual_stages
    layer_params = h * (heads + 2 * kv_heads) * d + heads * d * h + 3 * h * ffn + 2 * h

    workspace = 0
    if hardware is not None:
        q = (batch_size, heads, seq_len, d)
        kv = (batch_size, kv_heads, seq_len, d)
        attrs = (("block_size", 128), ("causal", True), ("fusion", bool(fusion)), ("pipeline_stages", 2))
        workspace = op_workspace_bytes(OpSpec("FlashAttentionGrad", (q, kv, kv, q), dtype, attrs), hardware)
    # a layer's backward: the output gradient, then three FFN-wide gradients (with SP the output
    # gradient gathered too), or the attention gradients beside FlashAttentionGrad's workspace
    ffn_part = 3 * tokens * ffn * e + (tokens * h * e if layout.sequence_sharded else 0)
    attention_part = (tokens * heads * d * e * (2 if recompute == "selective" else 1)
                      + tokens * (heads + 2 * kv_heads) * d * e + workspace)
    layer_working = layer_input + max(ffn_part, attention_part)
    if recompute == "full":
        layer_working += layer_all - layer_input  # the recomputed layer's activations
    if zero == 3 and dp > 1:
        layer_working += 2 * layer_params * e  # this module's and the next one's gathered parameters
    hccl = 0
    if hardware is not None:
        hccl = hardware.interconnect.hccl_buffer_bytes * ((t > 1) + (dp > 1))

    estimates = []
    for stage in range(pp):
        params = stage_params(config, layout, stage)
        sharded = -(-params // dp)
        in_flight = max_in_flight(stage, pp, layout.virtual_pipeline, layout.micro_batches) if pp > 1 else 1
        activations = in_flight * per_chunk * layer_saved
        working = layer_working
        if stage == pp - 1:  # the last chunk's micro-batch: final norm input and output, the logits
            # (Megatron's cross entropy keeps them as its fp32 softmax, the compute-dtype logits
            # living beside it while it is cast, and the gradient cast back beside it: the working)
            saved_logit_bytes = DTYPE_BYTES["fp32"] if framework == "megatron" else e
            activations += 2 * split * h * e + tokens * vocab * saved_logit_bytes
            head_working = tokens * vocab * e + (tokens * h * e if layout.sequence_sharded else 0)
            if zero == 3 and dp > 1:
                head_working += 2 * max(vocab * h, layer_params) * e
            working = max(working, head_working)
        # the end of the step: the gradient collectives' outputs, then the gathered parameters
        end = 0
        if dp > 1:  # ZeRO-0: all-reduced gradients; 1: reduce-scattered ones, then the gathered
            # parameters; 2: the gathered parameters (the shards are added in place); 3: nothing
            end = {0: params * e, 1: sharded * e + params * e, 2: params * e, 3: 0}[zero]
        working = max(working, end - activations)
        estimates.append(MemoryEstimate(
            stage=stage,
            weights_bytes=(sharded if zero == 3 else params) * e,
            grads_bytes=(sharded if zero >= 2 else params) * e,
            optimizer_bytes=(sharded if zero >= 1 else params) * MASTER_STATES_PER_PARAM * DTYPE_BYTES["fp32"],
            activations_bytes=activations,
            working_bytes=working,
            hccl_buffer_bytes=hccl,
        ))
    return estimates


def memory_per_card_bytes(
    config: LlamaConfig,
    layout: ParallelLayout,
    batch_size: int,
    seq_len: int,
    *,
    recompute: str | None = None,
    dtype: str = "fp16",
    hardware: HardwareSpec | None = None,
) -> int:
    """Estimated bytes the caching allocator holds at the peak on the card of the stage that
    needs most (:attr:`MemoryEstimate.tensor_bytes`, the HCCL buffers not included), see
    :func:`memory_estimates`.

    Raises:
        ValueError: as :func:`memory_estimates`.
    """
    return max(e.tensor_bytes for e in memory_estimates(
        config, layout, batch_size, seq_len, recompute=recompute, dtype=dtype, hardware=hardware))
