"""Llama-2 training steps from the published architecture, Megatron-style parallel layouts.

Architectures from Touvron et al., "Llama 2: Open Foundation and Fine-Tuned Chat Models"
(2023), Table 1 and the released model configs (hidden size, FFN size, heads, layers,
vocabulary 32000; grouped-query attention with 8 KV heads for 70B).

Memory per card follows Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (MLSys 2023): activations of ``s * b * h * (10 + 24 / t)`` bytes per
layer with tensor parallelism ``t`` when FlashAttention removes the ``5 a s / h`` term;
mixed-precision Adam keeps fp16 weights and gradients plus fp32 master weights, momentum and
variance (12 bytes per parameter), sharded over data parallelism with ZeRO stage 1
(Rajbhandari et al., SC 2020).

Gradient reduction over data parallelism overlaps backward as in Megatron-Core's
``DistributedDataParallel`` with ``overlap_grad_reduce``: gradients fill buckets of
``max(40_000_000, 1_000_000 * dp)`` parameters (Megatron-Core's default ``bucket_size``,
``megatron/core/distributed/distributed_data_parallel_config.py``) in backward order, and each
full bucket is reduce-scattered (ZeRO-1) or all-reduced asynchronously on the HCCL stream
while backward goes on; the optimizer waits for them.

Device memory (modelled by the caching allocator with ``memory=True``; without it the NPU still
counts the live tensors' bytes against the card's HBM) follows a Megatron training loop: the
fp16 weights, a contiguous gradient buffer (Megatron-Core's ``ParamAndGradBuffer``) and the fp32
optimizer state (master weights, Adam's two moments; sharded over data parallelism with ZeRO-1)
are allocated once, at the job's first step, and live for the whole job. Each op's output lives
as long as autograd would keep it: the tensors a layer saves for its backward (its input, the
norm outputs, the QKV projection, the rotated Q/K, the attention output, the residual sum, the
gate/up projection, the SiLU and the gated product) live until that layer's backward, the
logits until the loss backward, and every other output is freed as soon as the next op has
consumed it. Weight gradients are accumulated into the gradient buffer by the GEMM itself
(Megatron's ``gradient_accumulation_fusion``), but the op's output here is still a temporary.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from ..runtime import NPU, Tensor
from ..units import DTYPE_BYTES

_MASTER_STATES_PER_PARAM = 3  # fp32 master weight, m, v
_MASTER_STATE_BYTES_PER_PARAM = _MASTER_STATES_PER_PARAM * DTYPE_BYTES["fp32"]


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-family decoder. Sizes are element counts."""

    name: str
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    num_layers: int
    vocab_size: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def param_count(self) -> int:
        """Parameters: embedding, LM head, per layer attention + SwiGLU MLP + 2 norms, final norm."""
        h, d = self.hidden_size, self.head_dim
        attn = h * h * 2 + 2 * h * self.num_kv_heads * d
        mlp = 3 * h * self.ffn_hidden_size
        return 2 * self.vocab_size * h + self.num_layers * (attn + mlp + 2 * h) + h


LLAMA2_7B = LlamaConfig("llama-2-7b", 4096, 11008, 32, 32, 32, 32000)
LLAMA2_13B = LlamaConfig("llama-2-13b", 5120, 13824, 40, 40, 40, 32000)
LLAMA2_70B = LlamaConfig("llama-2-70b", 8192, 28672, 64, 8, 80, 32000)


@dataclass(frozen=True)
class ParallelLayout:
    """Megatron-style layout: ``tensor_parallel`` x ``data_parallel`` x ``pipeline_parallel`` cards.

    Ranks are ordered as Megatron's default ``tp-dp-pp``: tensor-parallel groups are
    consecutive ranks (inside one HCCS group when they fit), data-parallel groups take every
    ``tensor_parallel``-th rank within a pipeline stage, and stage ``k`` starts at rank
    ``k * tensor_parallel * data_parallel``. ``zero_stage`` 1 shards the optimizer state over
    data parallelism. ``micro_batches`` per step run in the 1F1B pipeline schedule (Narayanan
    et al., SC 2021), or one after the other with gradient accumulation without pipelining.
    """

    tensor_parallel: int = 1
    data_parallel: int = 1
    zero_stage: int = 1
    pipeline_parallel: int = 1
    micro_batches: int = 1

    def __post_init__(self) -> None:
        for field_name in ("tensor_parallel", "data_parallel", "pipeline_parallel", "micro_batches"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ParallelLayout.{field_name} must be a positive integer, got {value!r}")
        if self.zero_stage not in (0, 1):
            raise ValueError(f"ParallelLayout.zero_stage must be 0 or 1, got {self.zero_stage!r}")

    @property
    def devices(self) -> int:
        return self.tensor_parallel * self.data_parallel * self.pipeline_parallel

    def tp_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.tensor_parallel))

    def dp_ranks(self) -> tuple[int, ...]:
        return tuple(range(0, self.tensor_parallel * self.data_parallel, self.tensor_parallel))

    def next_stage_rank(self) -> int:
        """Rank 0's peer in pipeline stage 1."""
        return self.tensor_parallel * self.data_parallel

    @classmethod
    def default_for(cls, config: LlamaConfig, devices: int, hccs_group_size: int) -> ParallelLayout:
        """Tensor parallelism over one HCCS group (or fewer cards), data parallelism across."""
        tp = 1
        while (
            tp * 2 <= min(devices, hccs_group_size)
            and devices % (tp * 2) == 0
            and config.num_kv_heads % (tp * 2) == 0
        ):
            tp *= 2
        return cls(tensor_parallel=tp, data_parallel=devices // tp)


def _stage_params(config: LlamaConfig, layout: ParallelLayout) -> int:
    """Parameters rank 0 holds: its stage's layers (and the embedding, plus the final norm and
    LM head without pipelining), divided over tensor parallelism."""
    h, v = config.hidden_size, config.vocab_size
    per_layer = (config.param_count - 2 * v * h - h) // config.num_layers
    layers = -(-config.num_layers // layout.pipeline_parallel)
    params = layers * per_layer + v * h + (v * h + h if layout.pipeline_parallel == 1 else 0)
    return -(-params // layout.tensor_parallel)


def memory_per_card_bytes(config: LlamaConfig, layout: ParallelLayout, batch_size: int, seq_len: int) -> int:
    """Estimated HBM bytes one card of pipeline stage 0 needs for a training step (see the
    module docstring): its 1/pp of the layers, and in 1F1B the activations of up to ``pp``
    micro-batches in flight."""
    t, dp, pp = layout.tensor_parallel, layout.data_parallel, layout.pipeline_parallel
    layers = -(-config.num_layers // pp)
    h = config.hidden_size
    params = _stage_params(config, layout)
    weights_and_grads = params * 2 * DTYPE_BYTES["fp16"]
    shard = dp if layout.zero_stage >= 1 else 1
    optimizer = params * _MASTER_STATE_BYTES_PER_PARAM / shard
    in_flight = min(pp, layout.micro_batches) if pp > 1 else 1
    activations = layers * seq_len * batch_size * h * (10 + 24 / t) * in_flight
    logits = seq_len * batch_size * config.vocab_size / t * (DTYPE_BYTES["fp16"] + DTYPE_BYTES["fp32"]) if pp == 1 else 0
    return int(weights_and_grads + optimizer + activations + logits)


#: Compute dtypes :func:`training_step` trains in (bf16 needs a Cube unit with a bf16 rate: the 910B).
TRAINING_DTYPES = ("fp16", "bf16")


def training_step(
    npu: NPU,
    config: LlamaConfig = LLAMA2_7B,
    *,
    batch_size: int = 1,
    seq_len: int = 2048,
    layout: ParallelLayout | None = None,
    block_size: int = 128,
    pipeline_stages: int = 2,
    fusion: bool = True,
    dtype: str = "fp16",
    overlap_grad_reduce: bool = True,
    grad_bucket_params: int | None = None,
) -> None:
    """One training step (forward, backward, AdamW) of ``config`` on rank 0 of ``npu.devices``.

    ``batch_size`` is the micro-batch per data-parallel replica; ``seq_len`` tokens per sample.
    FlashAttention options pass through to every attention layer. With data parallelism,
    ``overlap_grad_reduce`` reduces gradients in buckets of ``grad_bucket_params`` parameters
    (default: Megatron-Core's ``max(40M, 1M x dp)``) on the HCCL stream during the last
    micro-batch's backward; without it, one blocking collective after backward reduces them all.

    With pipeline parallelism rank 0 runs stage 0 (the embedding and the first layers) in the
    1F1B schedule: ``pp - 1`` warm-up forwards, then one forward and one backward per
    micro-batch, then the cool-down backwards. Stages are alike (all ranks behave alike), so the
    gradient of a micro-batch comes back ``(pp - 1)`` stage forwards and backwards after its
    forward left, plus the activation and gradient transfers; a ``Receive`` posted earlier waits
    for it (the pipeline bubble, ``attrs["wait_time_s"]``). Stage times are measured by
    simulating one micro-batch of the stage on a scratch card first.

    Raises:
        ValueError: ``dtype`` is not one of :data:`TRAINING_DTYPES`, the layout does not match
            ``npu.devices``, does not divide the heads or the
            layers, or the step does not fit in one card's HBM (the message gives both sizes).
        OutOfMemoryError: the step's tensors do not fit in the card's HBM after all (with
            ``memory=True`` as the caching allocator finds; without, their bytes alone).
    """
    hw = npu.hardware
    if dtype not in TRAINING_DTYPES:
        raise ValueError(f"{config.name}: dtype {dtype!r} is not a training dtype; use one of {', '.join(TRAINING_DTYPES)}")
    if layout is None:
        layout = ParallelLayout.default_for(config, npu.devices, hw.interconnect.hccs_group_size)
    if layout.devices != npu.devices:
        raise ValueError(
            f"{config.name}: layout tp={layout.tensor_parallel} x dp={layout.data_parallel} x "
            f"pp={layout.pipeline_parallel} needs {layout.devices} cards, the job has {npu.devices}"
        )
    t, pp, micro = layout.tensor_parallel, layout.pipeline_parallel, layout.micro_batches
    if config.num_kv_heads % t or config.ffn_hidden_size % t or config.vocab_size % t:
        raise ValueError(f"{config.name}: tensor_parallel={t} must divide kv heads, FFN size and vocabulary")
    if config.num_layers % pp:
        raise ValueError(f"{config.name}: pipeline_parallel={pp} must divide the {config.num_layers} layers")
    need = memory_per_card_bytes(config, layout, batch_size, seq_len)
    if need > hw.memory.hbm_capacity_bytes:
        raise ValueError(
            f"{config.name}: batch_size={batch_size}, seq_len={seq_len} with tp={t}, "
            f"dp={layout.data_parallel}, pp={pp} needs about {need / 2**30:.1f} GiB per card; "
            f"{hw.name} has {hw.memory.hbm_capacity_bytes / 2**30:.1f} GiB"
        )
    npu.set_tokens_per_step(batch_size * seq_len * layout.data_parallel * micro)
    dp = layout.data_parallel
    if grad_bucket_params is None:
        grad_bucket_params = max(40_000_000, 1_000_000 * dp)
    if not isinstance(grad_bucket_params, int) or grad_bucket_params < 1:
        raise ValueError(f"grad_bucket_params must be a positive integer, got {grad_bucket_params!r}")
    if npu not in _PERSISTENT:  # without memory modelling too: they count in the NPU's live bytes
        shard = dp if layout.zero_stage >= 1 else 1
        _PERSISTENT[npu] = _Persistent(npu, _stage_params(config, layout), dtype, shard)
    grads = _GradReducer(npu, layout, dtype, grad_bucket_params if overlap_grad_reduce else None)
    model = _Stage(config, layout, batch_size, seq_len, dtype,
                   {"block_size": block_size, "pipeline_stages": pipeline_stages, "fusion": fusion, "causal": True})

    if pp == 1:
        for mb in range(micro):  # gradient accumulation: gradients are reduced in the last one
            model.forward(npu)
            model.backward(npu, grads if mb == micro - 1 else None)
    else:
        _one_f_one_b(npu, model, grads, layout)

    # ---- optimizer: ZeRO-1 over data parallelism, once every gradient bucket is reduced
    grads.finish()
    params_local = grads.total_params
    if dp > 1 and layout.zero_stage >= 1:
        padded = -(-params_local // dp) * dp
        npu.adamw(padded // dp, name="optimizer.adamw")
        npu.all_gather(Tensor((padded // dp,), dtype), ranks=layout.dp_ranks(), name="params.dp_all_gather")
    else:
        npu.adamw(params_local, name="optimizer.adamw")


class _Persistent:
    """What lives for the whole job on a card: weights, gradient buffer, optimizer state (see the
    module docstring). Held per :class:`NPU` in :data:`_PERSISTENT`."""

    def __init__(self, npu: NPU, stage_params: int, dtype: str, shard: int) -> None:
        self.weights = npu.tensor((stage_params,), dtype)
        self.grad_buffer = npu.tensor((stage_params,), dtype)
        self.optimizer_state = npu.tensor((-(-stage_params // shard) * _MASTER_STATES_PER_PARAM,), "fp32")


#: Job-long tensors of each card, created at its first training step.
_PERSISTENT: weakref.WeakKeyDictionary[NPU, _Persistent] = weakref.WeakKeyDictionary()


def _one_f_one_b(npu: NPU, model: _Stage, grads: _GradReducer, layout: ParallelLayout) -> None:
    """Stage 0 of a ``pp``-stage pipeline in the 1F1B schedule."""
    from ..runtime import NPU as _NPU

    pp, micro = layout.pipeline_parallel, layout.micro_batches
    peer = layout.next_stage_rank()
    scratch = _NPU(npu.hardware, npu.devices)  # one micro-batch of this stage, to time the others
    model.forward(scratch)
    forward_s = scratch.clock_s
    model.backward(scratch, None)
    backward_s = scratch.clock_s - forward_s
    hop = _NPU(npu.hardware, npu.devices)
    hop.send(model.boundary, peer)
    hop_s = hop.clock_s  # one activation (or gradient) transfer between neighbouring stages
    round_trip_s = (pp - 1) * (forward_s + backward_s) + 2 * (pp - 1) * hop_s
    sent_s: list[float] = []

    def forward(mb: int) -> None:
        model.forward(npu, tag=f"mb{mb}.")
        npu.send(model.boundary, peer, name=f"mb{mb}.send_activation")
        sent_s.append(npu.clock_s)

    def backward(mb: int) -> None:
        npu.recv(model.boundary, peer, ready_s=sent_s[mb] + round_trip_s - hop_s, name=f"mb{mb}.recv_grad")
        model.backward(npu, grads if mb == micro - 1 else None, tag=f"mb{mb}.")

    warmup = min(pp - 1, micro)
    for mb in range(warmup):
        forward(mb)
    for i in range(micro - warmup):
        forward(warmup + i)
        backward(i)
    for mb in range(micro - warmup, micro):
        backward(mb)


class _Stage:
    """The layers rank 0 runs: all of them without pipelining, else pipeline stage 0."""

    def __init__(self, config: LlamaConfig, layout: ParallelLayout, batch_size: int, seq_len: int, dtype: str,
                 fa: dict) -> None:
        t, pp = layout.tensor_parallel, layout.pipeline_parallel
        self.config, self.dtype, self.fa = config, dtype, fa
        self.layers = range(config.num_layers // pp)
        self.has_head = pp == 1
        self.tp_ranks = layout.tp_ranks()
        self.tp_reduce = t > 1
        h, d = config.hidden_size, config.head_dim
        self.h, self.d = h, d
        self.heads, self.kv_heads = config.num_heads // t, config.num_kv_heads // t
        self.ffn, self.vocab = config.ffn_hidden_size // t, config.vocab_size // t
        self.tokens = batch_size * seq_len
        self.qkv_width = (self.heads + 2 * self.kv_heads) * d
        w = self.w
        self.x = Tensor((self.tokens, h), dtype)
        self.boundary = self.x  # what crosses to the next stage: the hidden states
        self.norm_w = w(h)
        self.w_qkv, self.w_o = w(h, self.qkv_width), w(self.heads * d, h)
        self.w_gate_up, self.w_down = w(h, 2 * self.ffn), w(self.ffn, h)
        self.q = Tensor((batch_size, self.heads, seq_len, d), dtype)
        self.kv = Tensor((batch_size, self.kv_heads, seq_len, d), dtype)
        self.table = w(self.vocab, h)
        self.ids = Tensor((self.tokens,), "int32")
        self.act = Tensor((self.tokens, self.ffn), dtype)
        self.saved: dict[str, list[list[Tensor]]] = {}  # per micro-batch: each layer's saved tensors
        self.logits: dict[str, Tensor] = {}  # per micro-batch

    def w(self, *shape: int) -> Tensor:
        return Tensor(shape, self.dtype)

    def forward(self, npu: NPU, tag: str = "") -> None:
        """Forward of one micro-batch (``tag`` names it); what backward needs is kept in
        ``self.saved[tag]``, every other output is dropped at once (freed, with memory)."""
        x, norm_w, tp_ranks, tp_reduce, fa = self.x, self.norm_w, self.tp_ranks, self.tp_reduce, self.fa
        h, d, heads, kv_heads, tokens, dtype = self.h, self.d, self.heads, self.kv_heads, self.tokens, self.dtype
        saved: list[list[Tensor]] = []
        self.saved[tag] = saved
        hidden = npu.embedding(self.ids, self.table, name=f"{tag}embed_tokens")
        if tp_reduce:
            hidden = npu.all_reduce(x, ranks=tp_ranks, name=f"{tag}embed_tokens.tp_allreduce")
        for layer in self.layers:
            p = f"{tag}layers.{layer}"
            keep = [hidden]  # the layer's input: the first norm's backward reads it
            keep.append(npu.rms_norm(x, norm_w, name=f"{p}.input_layernorm"))
            keep.append(npu.matmul(x, self.w_qkv, name=f"{p}.attn.qkv_proj"))
            keep.append(npu.rotary_embedding(Tensor((tokens, (heads + kv_heads) * d), dtype), name=f"{p}.attn.rotary"))
            keep.append(npu.flash_attention(self.q, self.kv, self.kv, name=f"{p}.attn.core", **fa))
            out = npu.matmul(Tensor((tokens, heads * d), dtype), self.w_o, name=f"{p}.attn.o_proj")
            if tp_reduce:
                out = npu.all_reduce(x, ranks=tp_ranks, name=f"{p}.attn.tp_allreduce")
            keep.append(npu.add(x, x, name=f"{p}.attn.residual"))
            del out
            keep.append(npu.rms_norm(x, norm_w, name=f"{p}.post_attention_layernorm"))
            act = self.act
            keep.append(npu.matmul(x, self.w_gate_up, name=f"{p}.mlp.gate_up_proj"))
            keep.append(npu.silu(act, name=f"{p}.mlp.act"))
            keep.append(npu.mul(act, act, name=f"{p}.mlp.gate_mul"))
            out = npu.matmul(act, self.w_down, name=f"{p}.mlp.down_proj")
            if tp_reduce:
                out = npu.all_reduce(x, ranks=tp_ranks, name=f"{p}.mlp.tp_allreduce")
            hidden = npu.add(x, x, name=f"{p}.mlp.residual")
            del out
            saved.append(keep)
        if not self.has_head:
            return
        saved.append([hidden, npu.rms_norm(x, norm_w, name=f"{tag}final_norm")])
        del hidden
        logits = npu.matmul(x, self.w(h, self.vocab), name=f"{tag}lm_head")
        self.logits[tag] = logits
        npu.cross_entropy(logits, name=f"{tag}loss")
        if tp_reduce:
            row_stats = Tensor((tokens,), "fp32")
            npu.all_reduce(row_stats, ranks=tp_ranks, name=f"{tag}loss.tp_allreduce_max")
            npu.all_reduce(row_stats, ranks=tp_ranks, name=f"{tag}loss.tp_allreduce_sum")

    def backward(self, npu: NPU, grads: _GradReducer | None, tag: str = "") -> None:
        """Backward of one micro-batch; ``grads`` collects the gradients for the data-parallel
        reduction (the last micro-batch), ``None`` accumulates them locally. Each layer's saved
        tensors are freed once its backward is done; each gradient once the next op used it."""
        x, norm_w, tp_ranks, tp_reduce, fa = self.x, self.norm_w, self.tp_ranks, self.tp_reduce, self.fa
        h, d, heads, kv_heads, tokens, dtype = self.h, self.d, self.heads, self.kv_heads, self.tokens, self.dtype
        ffn, vocab, qkv_width, act = self.ffn, self.vocab, self.qkv_width, self.act
        saved = self.saved.pop(tag, [])
        if self.has_head:
            logits = self.logits.pop(tag)
            dlogits = npu.cross_entropy_grad(logits, name=f"{tag}loss.grad")
            del logits
            dy = npu.matmul(dlogits, self.w(h, vocab), transpose_b=True, name=f"{tag}lm_head.grad_input")
            npu.matmul(x, dlogits, transpose_a=True, name=f"{tag}lm_head.grad_weight")
            del dlogits
            if grads is not None:
                grads.add(h * vocab + h, "lm_head")  # LM head and final norm
            if tp_reduce:
                dy = npu.all_reduce(x, ranks=tp_ranks, name=f"{tag}lm_head.grad_input.tp_allreduce")
            dy = npu.rms_norm_grad(x, x, norm_w, name=f"{tag}final_norm.grad")
            if saved:
                saved.pop()  # the final norm's input and output
        qkv_grad = Tensor((tokens, qkv_width), dtype)
        gate_up_grad = Tensor((tokens, 2 * ffn), dtype)
        attn_out = Tensor((tokens, heads * d), dtype)
        for layer in reversed(self.layers):
            p = f"{tag}layers.{layer}"
            g = npu.matmul(x, self.w_down, transpose_b=True, name=f"{p}.mlp.down_proj.grad_input")
            npu.matmul(act, x, transpose_a=True, name=f"{p}.mlp.down_proj.grad_weight")
            g_gate = npu.mul(act, act, name=f"{p}.mlp.gate_mul.grad_gate")
            g_up = npu.mul(act, act, name=f"{p}.mlp.gate_mul.grad_up")
            del g
            g_gate = npu.silu_grad(act, act, name=f"{p}.mlp.act.grad")
            g = npu.matmul(gate_up_grad, self.w_gate_up, transpose_b=True, name=f"{p}.mlp.gate_up_proj.grad_input")
            npu.matmul(x, gate_up_grad, transpose_a=True, name=f"{p}.mlp.gate_up_proj.grad_weight")
            del g_gate, g_up
            if tp_reduce:
                g = npu.all_reduce(x, ranks=tp_ranks, name=f"{p}.mlp.grad_tp_allreduce")
            g = npu.rms_norm_grad(x, x, norm_w, name=f"{p}.post_attention_layernorm.grad")
            dy = npu.add(x, x, name=f"{p}.mlp.residual.grad")
            g = npu.matmul(x, self.w_o, transpose_b=True, name=f"{p}.attn.o_proj.grad_input")
            npu.matmul(attn_out, x, transpose_a=True, name=f"{p}.attn.o_proj.grad_weight")
            dq_dk_dv = npu.flash_attention_grad(self.q, self.kv, self.kv, self.q, name=f"{p}.attn.core.grad", **fa)
            del g
            g = npu.rotary_embedding(Tensor((tokens, (heads + kv_heads) * d), dtype), name=f"{p}.attn.rotary.grad")
            del dq_dk_dv
            g = npu.matmul(qkv_grad, self.w_qkv, transpose_b=True, name=f"{p}.attn.qkv_proj.grad_input")
            npu.matmul(x, qkv_grad, transpose_a=True, name=f"{p}.attn.qkv_proj.grad_weight")
            if tp_reduce:
                g = npu.all_reduce(x, ranks=tp_ranks, name=f"{p}.attn.grad_tp_allreduce")
            g = npu.rms_norm_grad(x, x, norm_w, name=f"{p}.input_layernorm.grad")
            dy = npu.add(x, x, name=f"{p}.attn.residual.grad")
            del g
            if saved:
                saved.pop()  # this layer's activations go back to the allocator
            if grads is not None:
                grads.add(h * qkv_width + heads * d * h + 3 * h * ffn + 2 * h, p)
        npu.embedding_grad(x, self.ids, self.table, name=f"{tag}embed_tokens.grad")
        del dy
        if grads is not None:
            grads.add(vocab * h, "embed_tokens")


class _GradReducer:
    """Data-parallel gradient reduction in buckets (see the module docstring)."""

    def __init__(self, npu: NPU, layout: ParallelLayout, dtype: str, bucket_params: int | None) -> None:
        self.npu, self.layout, self.dtype, self.bucket_params = npu, layout, dtype, bucket_params
        self.pending = 0
        self.total_params = 0
        self.works: list = []
        self.names: list[str] = []

    def add(self, params: int, name: str) -> None:
        """Gradients of ``params`` local parameters are ready (backward order)."""
        self.pending += params
        self.total_params += params
        self.names.append(name)
        if self.bucket_params is not None and self.pending >= self.bucket_params:
            self._reduce(async_op=True)

    def _reduce(self, async_op: bool) -> None:
        dp = self.layout.data_parallel
        if dp == 1 or not self.pending:
            self.pending, self.names = 0, []
            return
        label = self.names[0] if len(self.names) == 1 else f"{self.names[0]}..{self.names[-1]}"
        padded = -(-self.pending // dp) * dp
        bucket = Tensor((padded,), self.dtype)
        if self.layout.zero_stage >= 1:
            work = self.npu.reduce_scatter(bucket, ranks=self.layout.dp_ranks(), async_op=async_op,
                                           name=f"grads.dp_reduce_scatter[{label}]")
        else:
            work = self.npu.all_reduce(bucket, ranks=self.layout.dp_ranks(), async_op=async_op,
                                       name=f"grads.dp_allreduce[{label}]")
        if async_op:
            self.works.append(work)
        self.pending, self.names = 0, []

    def finish(self) -> None:
        """Reduce what is left, then wait for every bucket (the optimizer needs them all)."""
        self._reduce(async_op=False)
        for work in self.works:
            work.wait()
