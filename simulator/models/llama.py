"""Llama-2 training steps from the published architecture, Megatron-style parallel layouts.

Architectures from Touvron et al., "Llama 2: Open Foundation and Fine-Tuned Chat Models"
(2023), Table 1 and the released model configs (hidden size, FFN size, heads, layers,
vocabulary 32000; grouped-query attention with 8 KV heads for 70B).

Memory per card follows Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (MLSys 2023), over the tensors a Llama layer saves for its backward (see
:mod:`simulator.models.llama_memory`); mixed-precision Adam keeps fp16 weights and gradients
plus fp32 master weights, momentum and variance (12 bytes per parameter), sharded over data
parallelism by the layout's ZeRO stage (Rajbhandari et al., SC 2020).

Gradient reduction over data parallelism overlaps backward as in Megatron-Core's
``DistributedDataParallel`` with ``overlap_grad_reduce``: gradients fill buckets of
``max(40_000_000, 1_000_000 * dp)`` parameters (Megatron-Core's default ``bucket_size``,
``megatron/core/distributed/distributed_data_parallel_config.py``) in backward order, and each
full bucket is reduce-scattered (ZeRO-1 to 3) or all-reduced (ZeRO-0) asynchronously on the HCCL
stream while backward goes on; the optimizer waits for them.

Device memory (modelled by the caching allocator with ``memory=True``; without it the NPU still
counts the live tensors' bytes against the card's HBM) follows a Megatron training loop: the
fp16 weights, a contiguous gradient buffer (Megatron-Core's ``ParamAndGradBuffer``) and the fp32
optimizer state (master weights, Adam's two moments) are allocated once, at the job's first
step, and live for the whole job, each sharded over data parallelism as the ZeRO stage says.
Each op's output lives as long as autograd would keep it: the tensors a layer saves for its
backward (its input, the norm outputs, the QKV projection, the rotated Q/K, the attention
output, the residual sum, the gate/up projection, the SiLU and the gated product) live until
that layer's backward, the logits until the loss backward, and every other output is freed as
soon as the next op has consumed it. With full recompute a layer saves its input only and runs
its forward again right before its backward. Weight gradients are accumulated into the
gradient buffer by the GEMM itself (Megatron's ``gradient_accumulation_fusion``), but the op's
output here is still a temporary; with ``framework="megatron"`` (Megatron's
``--no-gradient-accumulation-fusion``) a separate fp32 ``Add`` per weight accumulates it, in place.
"""

from __future__ import annotations

import weakref

from ..hardware import HardwareSpec
from ..runtime import NPU, Tensor
from ..units import DTYPE_BYTES
from . import pipeline
from .layout import ParallelLayout
from .llama_config import LLAMA2_7B, LLAMA2_13B, LLAMA2_70B, QWEN3_0_6B, LlamaConfig
from .llama_memory import (
    MASTER_STATES_PER_PARAM,
    RECOMPUTE_MODES,
    MemoryEstimate,
    memory_estimates,
    memory_per_card_bytes,
    stage_params,
)

__all__ = [
    "FRAMEWORKS",
    "LLAMA2_7B",
    "LLAMA2_13B",
    "LLAMA2_70B",
    "QWEN3_0_6B",
    "RECOMPUTE_MODES",
    "TRAINING_DTYPES",
    "LlamaConfig",
    "MemoryEstimate",
    "ParallelLayout",
    "memory_estimates",
    "memory_per_card_bytes",
    "pipeline_plan",
    "training_step",
]


#: Compute dtypes :func:`training_step` trains in (bf16 needs a Cube unit with a bf16 rate: the 910B).
TRAINING_DTYPES = ("fp16", "bf16")

#: What :func:`training_step` takes as ``framework``: the model's math only, or with the kernels
#: Megatron-LM / MindSpeed-LLM on torch_npu add around it.
FRAMEWORKS = ("ideal", "megatron")


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
    recompute: str | None = None,
    grad_dtype: str | None = None,
    framework: str = "ideal",
) -> None:
    """One training step (forward, backward, AdamW) of ``config`` on rank 0 of ``npu.devices``.

    ``batch_size`` is the micro-batch per data-parallel replica; ``seq_len`` tokens per sample.
    FlashAttention options pass through to every attention layer. With data parallelism,
    ``overlap_grad_reduce`` reduces gradients in buckets of ``grad_bucket_params`` parameters
    (default: Megatron-Core's ``max(40M, 1M x dp)``) on the HCCL stream during the last
    micro-batch's backward (every micro-batch's with ZeRO-2 and 3, which keep no full gradient);
    without it, one blocking collective after backward reduces them all.

    ``recompute`` (Korthikanti et al., MLSys 2023; Megatron's ``--recompute-granularity``):
    ``None`` saves every activation a layer's backward reads. ``"full"`` saves each layer's
    input only and runs the layer's forward again (its ops named ``layers.N.recompute.*``,
    tensor-parallel collectives included) right before the layer's backward: activations of
    ``2 s b h`` bytes per layer (``/ t`` with sequence parallelism) instead of the whole set,
    for one more forward per layer. ``"selective"`` recomputes the attention core only
    (Megatron-Core's ``checkpoint_core_attention``): its softmax, dropout and ``QK^T``/``V``
    products, whose ``5 a s^2 b`` bytes Korthikanti's selective recompute saves. FlashAttention
    never stores them (it keeps Q, K, V, the output and row statistics, which the checkpoint
    keeps too, the output being the next projection's input), so here selective recompute saves
    no memory and costs one FlashAttention forward per layer (``layers.N.recompute.attn.core``)
    before the FlashAttentionGrad.

    Pipeline parallelism runs the 1F1B schedule, interleaved over ``layout.virtual_pipeline``
    model chunks per stage (:mod:`simulator.models.pipeline`). Every stage is simulated: each
    stage's chunks (the first with the embedding, the last with the final norm, the LM head
    and the loss, the others with layers only) run one micro-batch's forward and backward on
    scratch cards to time them, the schedule places every pass of every stage, and ``npu`` runs
    stage 0's ops in stage 0's order, each ``Receive`` waiting (``attrs["wait_time_s"]``) until
    the schedule says its sender sends (measured from stage 0's own send that began the chain,
    so a stall of stage 0 delays its neighbours too). The profile holds stage 0's ops: it starts
    the step and, its last backward closing the chain of every micro-batch, ends it; a slower
    stage (the last one's LM head and loss) shows as longer waits in stage 0's receives. After
    the pipeline every stage reduces its gradients and steps its optimizer over parameter counts
    that differ by the final norm only, so stage 0 finishes last and its step is the job's.

    ``grad_dtype`` (default ``dtype``): the dtype the data-parallel gradient collectives carry;
    Megatron-LM with ``--bf16`` accumulates and reduces gradients in fp32
    (``accumulate_allreduce_grads_in_fp32``, set by its ``arguments.py`` for bf16). A config with
    ``tie_word_embeddings`` under pipeline parallelism all-reduces the embedding's gradient between
    the first and last stages after the data-parallel reduction (Megatron's
    ``_allreduce_word_embedding_grads``), blocking. Each pipeline transfer is followed by a device
    synchronisation (Megatron's ``batch_p2p_sync``, on by default): the host waits for it, so the
    kernels after it start at the host's pace.

    ``framework`` (one of :data:`FRAMEWORKS`): ``"ideal"`` emits the model's math only (fused
    QKV split and RoPE, weight gradients accumulated by the GEMM). ``"megatron"`` adds the
    framework kernels Megatron-LM / MindSpeed-LLM on torch_npu run around them, each seen in the
    real profile ``tests/data/realdata/ascend-msinsight-llm-pp2dp2-level2-rank0`` (rows of
    ``kernel_details.csv``) with shapes from the model's sizes: per layer forward, the q/k/v split
    of the QKV projection (3 ``Slice`` copies, op type ``StridedSlice`` here), RoPE's cos and sin
    recomputed in fp32 for q and for k on every call (``Cos``, ``Sin``, ``Mul`` by the attention
    scaling, ``Cast`` to the compute dtype, ``(tokens, head_dim)`` each) and the rotated q and k
    made contiguous (``TensorMove``, costed as a ``StridedSlice`` copy); backward, RoPE's grad
    for q and k each with a ``ZerosLike`` (``Fill``) and an ``Add``, the q/k/v gradients
    concatenated (``ConcatD``), and after every weight gradient its fp32 main-gradient
    accumulation (``Add`` fp32 + compute dtype -> fp32 of the weight's size, norm weights' grads
    ``Cast`` first): Megatron's ``--no-gradient-accumulation-fusion``, which the MindSpeed-LLM /
    ModelLink launch scripts of ``simulator/data/published_layouts.json`` set. Per step: the fp32
    gradient buffer zeroed (``ZerosLike`` of the stage's parameters), and around AdamW the
    gradient-norm clipping (``--clip-grad``: an L2 norm, ``LpNormV2``, costed as a fp32
    ``ReduceSum``, and a ``Mul`` over the card's fp32 gradient shard) and the fp32 master
    weights cast back to the compute dtype (``Cast`` over the shard). On the last stage the loss
    runs as Megatron-Core's ``VocabParallelCrossEntropy`` does in eager PyTorch, kernel by kernel
    over the ``(tokens, vocab / tp)`` logits, in fp32 but for the first read and the last write
    (not in the LLM profile, which is stage 0; from Megatron-Core's
    ``megatron/core/tensor_parallel/cross_entropy.py``): ``Cast``, ``ReduceMax``, ``Sub``,
    ``Exp``, ``ReduceSum``, ``RealDiv``, and backward ``Mul`` and ``Cast``, with three
    tensor-parallel all-reduces of ``(tokens,)`` fp32.

    Raises:
        ValueError: ``framework`` is not one of :data:`FRAMEWORKS`; ``dtype`` is not one of :data:`TRAINING_DTYPES`, ``recompute`` is not one of
            :data:`RECOMPUTE_MODES`, the layout does not match ``npu.devices``, does not divide
            the heads, the layers (over ``pipeline_parallel x virtual_pipeline`` chunks) or, with
            sequence parallelism, the sequence; or the step does not fit in one card's HBM
            (:func:`memory_estimates`, the HCCL buffers included; the message gives both sizes).
        OutOfMemoryError: the step's tensors do not fit in the card's HBM after all (with
            ``memory=True`` as the caching allocator finds; without, their bytes alone).
    """
    hw = npu.hardware
    if framework not in FRAMEWORKS:
        raise ValueError(f"{config.name}: framework={framework!r} is not one of {', '.join(map(repr, FRAMEWORKS))}")
    if dtype not in TRAINING_DTYPES:
        raise ValueError(f"{config.name}: dtype {dtype!r} is not a training dtype; use one of {', '.join(TRAINING_DTYPES)}")
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"{config.name}: recompute={recompute!r} is not one of "
                         f"{', '.join(map(repr, RECOMPUTE_MODES))}")
    if layout is None:
        layout = ParallelLayout.default_for(config, npu.devices, hw.interconnect.hccs_group_size)
    if layout.devices != npu.devices:
        raise ValueError(
            f"{config.name}: layout tp={layout.tensor_parallel} x dp={layout.data_parallel} x "
            f"pp={layout.pipeline_parallel} needs {layout.devices} cards, the job has {npu.devices}"
        )
    t, pp, micro = layout.tensor_parallel, layout.pipeline_parallel, layout.micro_batches
    layout.check_model(config, batch_size, seq_len)
    estimates = memory_estimates(config, layout, batch_size, seq_len, recompute=recompute, dtype=dtype, hardware=hw,
                                 fusion=fusion, framework=framework)
    worst = max(estimates, key=lambda e: e.total_bytes)
    if worst.total_bytes > hw.memory.hbm_capacity_bytes:
        where = f" (pipeline stage {worst.stage})" if pp > 1 else ""
        raise ValueError(
            f"{config.name}: batch_size={batch_size}, seq_len={seq_len} with tp={t}, "
            f"dp={layout.data_parallel}, pp={pp} needs about {worst.total_bytes / 2**30:.1f} GiB per card{where}; "
            f"{hw.name} has {hw.memory.hbm_capacity_bytes / 2**30:.1f} GiB"
        )
    npu.set_tokens_per_step(batch_size * seq_len * layout.data_parallel * micro)
    dp = layout.data_parallel
    if grad_bucket_params is None:
        grad_bucket_params = max(40_000_000, 1_000_000 * dp)
    if not isinstance(grad_bucket_params, int) or grad_bucket_params < 1:
        raise ValueError(f"grad_bucket_params must be a positive integer, got {grad_bucket_params!r}")
    if npu not in _PERSISTENT:  # without memory modelling too: they count in the NPU's live bytes
        _PERSISTENT[npu] = _Persistent(npu, stage_params(config, layout, 0), dtype, layout)
    grads = _GradReducer(npu, layout, grad_dtype or dtype, grad_bucket_params if overlap_grad_reduce else None)
    # the framework rides along with the FlashAttention options; _Stage takes it out
    fa = {"block_size": block_size, "pipeline_stages": pipeline_stages, "fusion": fusion, "causal": True,
          "framework": framework}
    megatron = framework == "megatron"
    if megatron:  # Megatron's zero_grad_buffer: the fp32 main-gradient buffer zeroed every step
        npu.emit("Fill", (Tensor((stage_params(config, layout, 0),), "fp32"),), "fp32", "grads.zero_grad_buffer")

    if pp == 1:
        model = _Stage(config, layout, batch_size, seq_len, dtype, fa, range(config.num_layers), recompute)
        every_micro_batch = layout.zero_stage >= 2  # no full gradient is kept: each micro-batch's is reduced
        for mb in range(micro):  # gradient accumulation: gradients are reduced in the last one
            model.forward(npu)
            model.backward(npu, grads if every_micro_batch or mb == micro - 1 else None)
            if every_micro_batch and mb < micro - 1:
                grads.flush()
    else:
        _run_pipeline(npu, config, layout, batch_size, seq_len, dtype, fa, recompute, grads)

    # ---- optimizer: over the shard ZeRO gives this card, once every gradient bucket is reduced
    grads.finish()
    if config.tie_word_embeddings and pp > 1:  # the first and last stages' copies of the embedding
        npu.all_reduce(Tensor((config.vocab_size // t * config.hidden_size,), grad_dtype or dtype),
                       ranks=(0, layout.stage_rank(pp - 1)), name="embed_tokens.grad.tied_allreduce")
    params_local = grads.total_params
    shard = -(-params_local // dp) if dp > 1 and layout.zero_stage >= 1 else params_local
    if megatron:  # --clip-grad: the gradient norm, then the scale, over the card's whole fp32 gradient
        # (the real profile's LpNormV2 and Mul read the stage's full main-gradient buffers, not the shard)
        npu.emit("ReduceSum", (Tensor((params_local,), "fp32"),), "fp32", "optimizer.grad_norm")
        # in place (Megatron scales the main gradients where they are): no new tensor, as _main_grad
        npu.emit("Mul", (Tensor((params_local,), "fp32"), Tensor((1,), "fp32")), "fp32", "optimizer.clip_grad")
    if dp > 1 and layout.zero_stage >= 1:
        padded = -(-params_local // dp) * dp
        npu.adamw(padded // dp, name="optimizer.adamw")
        if layout.zero_stage < 3:  # ZeRO-3 keeps its parameters sharded: they are gathered where used
            npu.all_gather(Tensor((padded // dp,), dtype), ranks=layout.dp_ranks(), name="params.dp_all_gather")
    else:
        npu.adamw(params_local, name="optimizer.adamw")
    if megatron:  # the fp32 master weights copied back into the compute-dtype parameters
        npu.cast(Tensor((shard,), "fp32"), dtype, name="optimizer.params_cast")


class _Persistent:
    """What lives for the whole job on a card: weights, gradient buffer, optimizer state (see the
    module docstring), each sharded over data parallelism as the ZeRO stage says. Held per
    :class:`NPU` in :data:`_PERSISTENT`."""

    def __init__(self, npu: NPU, stage_params: int, dtype: str, layout: ParallelLayout) -> None:
        dp, zero = layout.data_parallel, layout.zero_stage

        def shard(stage: int) -> int:  # ZeRO stage ``stage`` and above shard this one
            return -(-stage_params // dp) if zero >= stage else stage_params

        self.weights = npu.tensor((shard(3),), dtype)
        self.grad_buffer = npu.tensor((shard(2),), dtype)
        self.optimizer_state = npu.tensor((shard(1) * MASTER_STATES_PER_PARAM,), "fp32")


#: Job-long tensors of each card, created at its first training step.
_PERSISTENT: weakref.WeakKeyDictionary[NPU, _Persistent] = weakref.WeakKeyDictionary()


def pipeline_plan(
    config: LlamaConfig,
    layout: ParallelLayout,
    *,
    hardware: HardwareSpec | str,
    batch_size: int = 1,
    seq_len: int = 2048,
    dtype: str = "fp16",
    recompute: str | None = None,
    block_size: int = 128,
    pipeline_stages: int = 2,
    fusion: bool = True,
) -> list[dict[pipeline.Pass, pipeline.PassTime]]:
    """Every pipeline stage's passes of one :func:`training_step`, placed on the step's time line
    as the builder schedules them (:func:`simulator.models.pipeline.simulate`, seconds from the
    step's start): each stage's chunks timed by simulating one micro-batch on a scratch card (the
    first stage's with the embedding, the last one's with the final norm, LM head and loss), each
    transfer costed over the link between the two stages' first ranks. The arguments are
    :func:`training_step`'s.

    Raises:
        ValueError: unknown hardware, a layout that does not split the model, or as
            :func:`training_step` for the dtype and ``recompute``.
    """
    from ..hardware import load_hardware

    hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware)
    if dtype not in TRAINING_DTYPES or recompute not in RECOMPUTE_MODES:
        raise ValueError(f"{config.name}: dtype {dtype!r} must be one of {', '.join(TRAINING_DTYPES)} and recompute "
                         f"{recompute!r} one of {', '.join(map(repr, RECOMPUTE_MODES))}")
    layout.check_model(config, batch_size, seq_len)
    fa = {"block_size": block_size, "pipeline_stages": pipeline_stages, "fusion": fusion, "causal": True}
    return _plan(hw, config, layout, batch_size, seq_len, dtype, fa, recompute)


def _chunk_model(config: LlamaConfig, layout: ParallelLayout, batch_size: int, seq_len: int, dtype: str, fa: dict,
                 recompute: str | None, stage: int, chunk: int) -> _Stage:
    """Model chunk ``chunk`` of pipeline stage ``stage``: virtual stage ``chunk * pp + stage``."""
    per_chunk = config.num_layers // layout.virtual_stages
    virtual = chunk * layout.pipeline_parallel + stage
    layers = range(virtual * per_chunk, (virtual + 1) * per_chunk)
    return _Stage(config, layout, batch_size, seq_len, dtype, fa, layers, recompute,
                  embedding=virtual == 0, head=virtual == layout.virtual_stages - 1)


def _plan(hw: HardwareSpec, config: LlamaConfig, layout: ParallelLayout, batch_size: int, seq_len: int, dtype: str,
          fa: dict, recompute: str | None) -> list[dict[pipeline.Pass, pipeline.PassTime]]:
    """See :func:`pipeline_plan` (arguments checked)."""
    from ..costs import OpSpec, op_cost
    from ..runtime import NPU as _NPU

    pp, chunks = layout.pipeline_parallel, layout.virtual_pipeline
    last_virtual = layout.virtual_stages - 1
    # time one micro-batch of each kind of chunk (with the embedding, with the head, neither)
    timed: dict[tuple[bool, bool], tuple[float, float]] = {}

    def pass_s(stage: int, p: pipeline.Pass) -> float:
        virtual = p.chunk * pp + stage
        kind = (virtual == 0, virtual == last_virtual)
        if kind not in timed:
            scratch = _NPU(hw, layout.devices)
            model = _chunk_model(config, layout, batch_size, seq_len, dtype, fa, recompute, stage, p.chunk)
            scratch.device_synchronize()  # each pass follows a transfer and its synchronisation
            model.forward(scratch)
            forward_s = scratch.clock_s
            scratch.device_synchronize()
            model.backward(scratch, None)
            timed[kind] = (forward_s, scratch.clock_s - forward_s)
        return timed[kind][0 if p.kind == pipeline.FORWARD else 1]

    boundary = _chunk_model(config, layout, batch_size, seq_len, dtype, fa, recompute, 0, 0).boundary
    hops: dict[tuple[int, int], float] = {}

    def hop_s(src: int, dst: int) -> float:
        key = (layout.stage_rank(src), layout.stage_rank(dst))
        if key not in hops:
            spec = OpSpec("Send", (boundary.shape,), boundary.dtype, (("peer", key[1]), ("rank", key[0])))
            hops[key] = op_cost(spec, hw).duration_s
        return hops[key]

    return pipeline.simulate(pp, chunks, layout.micro_batches, pass_s, hop_s)


def _run_pipeline(npu: NPU, config: LlamaConfig, layout: ParallelLayout, batch_size: int, seq_len: int,
                  dtype: str, fa: dict, recompute: str | None, grads: _GradReducer) -> None:
    """Stage 0 of the pipeline, every stage scheduled (see :func:`training_step`)."""
    pp, chunks, micro = layout.pipeline_parallel, layout.virtual_pipeline, layout.micro_batches
    planned = _plan(npu.hardware, config, layout, batch_size, seq_len, dtype, fa, recompute)[0]
    models = [_chunk_model(config, layout, batch_size, seq_len, dtype, fa, recompute, 0, c) for c in range(chunks)]
    boundary = models[0].boundary  # what crosses between stages: the hidden states
    next_rank, prev_rank = layout.stage_rank(1), layout.stage_rank(pp - 1)
    done_s: dict[pipeline.Pass, float] = {}  # stage 0's passes: when their send was done, on npu's clock

    def label(kind: str, p: pipeline.Pass) -> str:
        return f"mb{p.micro_batch}.{kind}" if chunks == 1 else f"mb{p.micro_batch}.chunk{p.chunk}.{kind}"

    def ready_s(p: pipeline.Pass, origin: pipeline.Pass) -> float:
        """When the sender of ``p``'s input sends, from stage 0's ``origin`` that began its chain."""
        return done_s[origin] + planned[p].ready_s - planned[origin].end_s

    npu.device_synchronize()  # every pass starts synchronised, as the plan times them (the first too)
    order = pipeline.stage_order(0, pp, chunks, micro)
    for i, p in enumerate(order):
        # a send followed by the next pass's receive is one batched transfer, one synchronisation
        receives_next = i + 1 < len(order) and (order[i + 1].kind == pipeline.BACKWARD or order[i + 1].chunk > 0)
        c, mb = p.chunk, p.micro_batch
        model, tag, virtual = models[c], f"mb{mb}.", c * pp
        if p.kind == pipeline.FORWARD:
            received = None
            if virtual > 0:  # the activations of the previous chunk, from the last stage
                origin = pipeline.Pass(pipeline.FORWARD, c - 1, mb)
                received = npu.recv(boundary, prev_rank, ready_s=ready_s(p, origin), name=label("recv_activation", p))
                npu.device_synchronize()  # Megatron's batch_p2p_sync
            model.forward(npu, tag=tag, hidden=received)
            del received
            npu.send(boundary, next_rank, name=label("send_activation", p))
            if not receives_next:
                npu.device_synchronize()
        else:
            origin = (pipeline.Pass(pipeline.FORWARD, c, mb) if c == chunks - 1
                      else pipeline.Pass(pipeline.BACKWARD, c + 1, mb))
            dy = npu.recv(boundary, next_rank, ready_s=ready_s(p, origin), name=label("recv_grad", p))
            npu.device_synchronize()
            model.backward(npu, grads if mb == micro - 1 else None, tag=tag, dy=dy)
            del dy
            if virtual > 0:
                npu.send(boundary, prev_rank, name=label("send_grad", p))
                if not receives_next:
                    npu.device_synchronize()
        done_s[p] = npu.clock_s


class _Stage:
    """One model chunk a card runs: ``layers`` (global indices), with the embedding in front when
    ``embedding`` and the final norm, LM head and loss behind when ``head`` (without pipelining
    one chunk holds them all)."""

    def __init__(self, config: LlamaConfig, layout: ParallelLayout, batch_size: int, seq_len: int, dtype: str,
                 fa: dict, layers: range, recompute: str | None, *, embedding: bool = True,
                 head: bool = True) -> None:
        t = layout.tensor_parallel
        fa = dict(fa)
        self.megatron = fa.pop("framework", "ideal") == "megatron"
        self.config, self.dtype, self.fa, self.recompute = config, dtype, fa, recompute
        self.layers = layers
        self.has_embedding, self.has_head = embedding, head
        self.tp_ranks = layout.tp_ranks()
        self.tp_reduce = t > 1
        self.sp = layout.sequence_sharded
        h, d = config.hidden_size, config.head_dim
        self.h, self.d = h, d
        self.heads, self.kv_heads = config.num_heads // t, config.num_kv_heads // t
        self.ffn, self.vocab = config.ffn_hidden_size // t, config.vocab_size // t
        self.tokens = batch_size * seq_len
        self.qkv_width = (self.heads + 2 * self.kv_heads) * d
        w = self.w
        self.x = Tensor((self.tokens, h), dtype)
        # the hidden states outside the tensor-parallel regions: split along the sequence with SP
        self.xs = Tensor((self.tokens // t, h), dtype) if self.sp else self.x
        self.boundary = self.xs  # what crosses to the next stage: the hidden states
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
        self.qk_norm = config.qk_norm
        self.layer_params = (h * self.qkv_width + self.heads * d * h + 3 * h * self.ffn + 2 * h
                             + (2 * d if self.qk_norm else 0))
        self.zero3 = _Zero3(layout, dtype, self) if layout.zero_stage == 3 and layout.data_parallel > 1 else None

    def w(self, *shape: int) -> Tensor:
        return Tensor(shape, self.dtype)

    # -- forward ---------------------------------------------------------------------------------

    def forward(self, npu: NPU, tag: str = "", hidden: Tensor | None = None) -> None:
        """Forward of one micro-batch (``tag`` names it); what backward needs is kept in
        ``self.saved[tag]``, every other output is dropped at once (freed, with memory).
        ``hidden``: a chunk without the embedding starts from these received hidden states."""
        x, xs, norm_w, tp_ranks, tp_reduce = self.x, self.xs, self.norm_w, self.tp_ranks, self.tp_reduce
        h, tokens, zero3 = self.h, self.tokens, self.zero3
        saved: list[list[Tensor]] = []
        self.saved[tag] = saved
        if zero3 is not None:
            zero3.start(forward=True)
        if self.has_embedding:
            params = zero3.gather(npu, tag) if zero3 is not None else None
            hidden = npu.embedding(self.ids, self.table, name=f"{tag}embed_tokens")
            if self.sp:
                hidden = npu.reduce_scatter(x, ranks=tp_ranks, name=f"{tag}embed_tokens.sp_reduce_scatter")
            elif tp_reduce:
                hidden = npu.all_reduce(x, ranks=tp_ranks, name=f"{tag}embed_tokens.tp_allreduce")
            del params
        elif hidden is None:
            hidden = xs  # timed alone: the received hidden states are not on this card
        for layer in self.layers:
            p = f"{tag}layers.{layer}"
            params = zero3.gather(npu, tag) if zero3 is not None else None
            keep = [hidden]  # the layer's input: the first norm's backward reads it
            hidden = self._layer(npu, p, keep if self.recompute != "full" else None)
            del params
            saved.append(keep)
        if not self.has_head:
            return
        params = zero3.gather(npu, tag) if zero3 is not None else None
        saved.append([hidden, npu.rms_norm(xs, norm_w, name=f"{tag}final_norm")])
        del hidden
        gathered = npu.all_gather(xs, ranks=tp_ranks, name=f"{tag}lm_head.sp_all_gather") if self.sp else None
        logits = npu.matmul(x, self.w(h, self.vocab), name=f"{tag}lm_head")
        del gathered, params
        if self.megatron:
            self.logits[tag] = self._vocab_parallel_cross_entropy(npu, logits, tag)
            del logits
            return
        self.logits[tag] = logits
        npu.cross_entropy(logits, name=f"{tag}loss")
        if tp_reduce:
            row_stats = Tensor((tokens,), "fp32")
            npu.all_reduce(row_stats, ranks=tp_ranks, name=f"{tag}loss.tp_allreduce_max")
            npu.all_reduce(row_stats, ranks=tp_ranks, name=f"{tag}loss.tp_allreduce_sum")

    def _layer(self, npu: NPU, p: str, keep: list[Tensor] | None) -> Tensor:
        """One layer's forward ops, named ``p.*``; returns its output. The tensors its backward
        reads go to ``keep``; with ``keep`` ``None`` (full recompute) none is saved and each
        output is freed once the next op has run."""
        x, xs, norm_w, tp_ranks, tp_reduce, fa = self.x, self.xs, self.norm_w, self.tp_ranks, self.tp_reduce, self.fa
        d, heads, kv_heads, tokens, dtype, sp = self.d, self.heads, self.kv_heads, self.tokens, self.dtype, self.sp
        held: list[Tensor] = []

        def hold(out: Tensor) -> None:
            held[:] = [out]  # the previous output goes once this one exists

        save = keep.append if keep is not None else hold
        save(npu.rms_norm(xs, norm_w, name=f"{p}.input_layernorm"))
        gathered = npu.all_gather(xs, ranks=tp_ranks, name=f"{p}.attn.sp_all_gather") if sp else None
        save(npu.matmul(x, self.w_qkv, name=f"{p}.attn.qkv_proj"))
        del gathered
        if self.megatron:  # the q, k, v views of the projection copied out (Slice)
            for part, width in (("q", heads * d), ("k", kv_heads * d), ("v", kv_heads * d)):
                self._copy(npu, "StridedSlice", (tokens, width), f"{p}.attn.split_{part}")
        if self.qk_norm:  # Qwen3: RMSNorm over each query and key head
            save(npu.rms_norm(Tensor((tokens * heads, d), dtype), self.w(d), name=f"{p}.attn.q_norm"))
            save(npu.rms_norm(Tensor((tokens * kv_heads, d), dtype), self.w(d), name=f"{p}.attn.k_norm"))
        if self.megatron:
            self._split_rope(npu, p, save)
        else:
            save(npu.rotary_embedding(Tensor((tokens, (heads + kv_heads) * d), dtype), name=f"{p}.attn.rotary"))
        save(npu.flash_attention(self.q, self.kv, self.kv, name=f"{p}.attn.core", **fa))
        out = npu.matmul(Tensor((tokens, heads * d), dtype), self.w_o, name=f"{p}.attn.o_proj")
        if sp:
            out = npu.reduce_scatter(x, ranks=tp_ranks, name=f"{p}.attn.sp_reduce_scatter")
        elif tp_reduce:
            out = npu.all_reduce(x, ranks=tp_ranks, name=f"{p}.attn.tp_allreduce")
        save(npu.add(xs, xs, name=f"{p}.attn.residual"))
        del out
        save(npu.rms_norm(xs, norm_w, name=f"{p}.post_attention_layernorm"))
        act = self.act
        gathered = npu.all_gather(xs, ranks=tp_ranks, name=f"{p}.mlp.sp_all_gather") if sp else None
        save(npu.matmul(x, self.w_gate_up, name=f"{p}.mlp.gate_up_proj"))
        del gathered
        if self.megatron:  # --use-fused-swiglu: one kernel over the gate/up projection
            save(self._fused(npu, "SwiGlu", Tensor((tokens, 2 * self.ffn), dtype), act, f"{p}.mlp.swiglu"))
        else:
            save(npu.silu(act, name=f"{p}.mlp.act"))
            save(npu.mul(act, act, name=f"{p}.mlp.gate_mul"))
        out = npu.matmul(act, self.w_down, name=f"{p}.mlp.down_proj")
        if sp:
            out = npu.reduce_scatter(x, ranks=tp_ranks, name=f"{p}.mlp.sp_reduce_scatter")
        elif tp_reduce:
            out = npu.all_reduce(x, ranks=tp_ranks, name=f"{p}.mlp.tp_allreduce")
        hidden = npu.add(xs, xs, name=f"{p}.mlp.residual")
        del out
        return hidden

    # -- backward --------------------------------------------------------------------------------

    def backward(self, npu: NPU, grads: _GradReducer | None, tag: str = "", dy: Tensor | None = None) -> None:
        """Backward of one micro-batch; ``grads`` collects the gradients for the data-parallel
        reduction (the last micro-batch), ``None`` accumulates them locally. Each layer's saved
        tensors are freed once its backward is done; each gradient once the next op used it.
        ``dy``: a chunk without the head starts from this received gradient."""
        x, xs, norm_w, tp_ranks, tp_reduce, fa = self.x, self.xs, self.norm_w, self.tp_ranks, self.tp_reduce, self.fa
        h, d, heads, kv_heads, tokens, dtype = self.h, self.d, self.heads, self.kv_heads, self.tokens, self.dtype
        ffn, vocab, qkv_width, act, sp, zero3 = self.ffn, self.vocab, self.qkv_width, self.act, self.sp, self.zero3
        saved = self.saved.pop(tag, [])
        if zero3 is not None:
            zero3.start(forward=False)
        if self.has_head:
            params = zero3.gather(npu, tag) if zero3 is not None else None
            logits = self.logits.pop(tag)
            if self.megatron:
                dlogits = self._vocab_parallel_cross_entropy_grad(npu, logits, tag)
            else:
                dlogits = npu.cross_entropy_grad(logits, name=f"{tag}loss.grad")
            del logits
            # with SP the head's input is gathered again for its weight gradient (Megatron's
            # LinearWithGradAccumulationAndAsyncCommunication), beside the input-gradient GEMM,
            # whose reduce-scatter then runs beside the weight-gradient GEMM
            regather = npu.all_gather(xs, ranks=tp_ranks, async_op=True,
                                      name=f"{tag}lm_head.sp_all_gather.grad") if sp else None
            dy = npu.matmul(dlogits, self.w(h, vocab), transpose_b=True, name=f"{tag}lm_head.grad_input")
            scatter = self._scatter(npu, regather, dy, f"{tag}lm_head.grad_input.sp_reduce_scatter")
            npu.matmul(x, dlogits, transpose_a=True, name=f"{tag}lm_head.grad_weight")
            self._main_grad(npu, (h, vocab), f"{tag}lm_head")
            del dlogits, params
            if grads is not None:
                grads.add(h * vocab + h, "lm_head")  # LM head and final norm
            if sp:
                dy = scatter.wait()
                del regather
            elif tp_reduce:
                dy = npu.all_reduce(x, ranks=tp_ranks, name=f"{tag}lm_head.grad_input.tp_allreduce")
            dy = npu.rms_norm_grad(xs, xs, norm_w, name=f"{tag}final_norm.grad")
            self._main_grad(npu, (h,), f"{tag}final_norm", cast=True)
            if saved:
                saved.pop()  # the final norm's input and output
        qkv_grad = Tensor((tokens, qkv_width), dtype)
        gate_up_grad = Tensor((tokens, 2 * ffn), dtype)
        attn_out = Tensor((tokens, heads * d), dtype)
        for layer in reversed(self.layers):
            p = f"{tag}layers.{layer}"
            params = zero3.gather(npu, tag) if zero3 is not None else None
            recomputed = None
            if self.recompute == "full":  # the layer's forward again, from its saved input
                recomputed = []
                self._layer(npu, f"{p}.recompute", recomputed)
            # with SP the output gradient arrives split along the sequence: gathered first
            full = npu.all_gather(xs, ranks=tp_ranks, name=f"{p}.mlp.grad_sp_all_gather") if sp else None
            g = npu.matmul(x, self.w_down, transpose_b=True, name=f"{p}.mlp.down_proj.grad_input")
            npu.matmul(act, x, transpose_a=True, name=f"{p}.mlp.down_proj.grad_weight")
            self._main_grad(npu, (ffn, h), f"{p}.mlp.down_proj")
            del full
            if self.megatron:
                g_gate = g_up = self._fused(npu, "SwiGluGrad", act, gate_up_grad, f"{p}.mlp.swiglu.grad")
            else:
                g_gate = npu.mul(act, act, name=f"{p}.mlp.gate_mul.grad_gate")
                g_up = npu.mul(act, act, name=f"{p}.mlp.gate_mul.grad_up")
                del g
                g_gate = npu.silu_grad(act, act, name=f"{p}.mlp.act.grad")
            regather = npu.all_gather(xs, ranks=tp_ranks, async_op=True,
                                      name=f"{p}.mlp.gate_up_proj.sp_all_gather.grad") if sp else None
            g = npu.matmul(gate_up_grad, self.w_gate_up, transpose_b=True, name=f"{p}.mlp.gate_up_proj.grad_input")
            scatter = self._scatter(npu, regather, g, f"{p}.mlp.grad_sp_reduce_scatter")
            npu.matmul(x, gate_up_grad, transpose_a=True, name=f"{p}.mlp.gate_up_proj.grad_weight")
            self._main_grad(npu, (h, 2 * ffn), f"{p}.mlp.gate_up_proj")
            del g_gate, g_up
            if sp:
                g = scatter.wait()
                del regather, scatter
            elif tp_reduce:
                g = npu.all_reduce(x, ranks=tp_ranks, name=f"{p}.mlp.grad_tp_allreduce")
            g = npu.rms_norm_grad(xs, xs, norm_w, name=f"{p}.post_attention_layernorm.grad")
            self._main_grad(npu, (h,), f"{p}.post_attention_layernorm", cast=True)
            dy = npu.add(xs, xs, name=f"{p}.mlp.residual.grad")
            full = npu.all_gather(xs, ranks=tp_ranks, name=f"{p}.attn.grad_sp_all_gather") if sp else None
            g = npu.matmul(x, self.w_o, transpose_b=True, name=f"{p}.attn.o_proj.grad_input")
            npu.matmul(attn_out, x, transpose_a=True, name=f"{p}.attn.o_proj.grad_weight")
            self._main_grad(npu, (heads * d, h), f"{p}.attn.o_proj")
            del full
            core_out = (npu.flash_attention(self.q, self.kv, self.kv, name=f"{p}.recompute.attn.core", **fa)
                        if self.recompute == "selective" else None)
            dq_dk_dv = npu.flash_attention_grad(self.q, self.kv, self.kv, self.q, name=f"{p}.attn.core.grad", **fa)
            del g, core_out
            if self.megatron:
                self._rope_grad(npu, p)
            else:
                g = npu.rotary_embedding(Tensor((tokens, (heads + kv_heads) * d), dtype), name=f"{p}.attn.rotary.grad")
            del dq_dk_dv
            if self.qk_norm:
                for rows, norm in ((tokens * heads, "q_norm"), (tokens * kv_heads, "k_norm")):
                    head = Tensor((rows, d), dtype)
                    npu.rms_norm_grad(head, head, self.w(d), name=f"{p}.attn.{norm}.grad")
                    self._main_grad(npu, (d,), f"{p}.attn.{norm}", cast=True)
            if self.megatron:  # the q, k, v gradients back into one QKV gradient
                self._copy(npu, "ConcatD", (tokens, qkv_width), f"{p}.attn.qkv_grad_concat")
            regather = npu.all_gather(xs, ranks=tp_ranks, async_op=True,
                                      name=f"{p}.attn.qkv_proj.sp_all_gather.grad") if sp else None
            g = npu.matmul(qkv_grad, self.w_qkv, transpose_b=True, name=f"{p}.attn.qkv_proj.grad_input")
            scatter = self._scatter(npu, regather, g, f"{p}.attn.grad_sp_reduce_scatter")
            npu.matmul(x, qkv_grad, transpose_a=True, name=f"{p}.attn.qkv_proj.grad_weight")
            self._main_grad(npu, (h, qkv_width), f"{p}.attn.qkv_proj")
            if sp:
                g = scatter.wait()
                del regather, scatter
            elif tp_reduce:
                g = npu.all_reduce(x, ranks=tp_ranks, name=f"{p}.attn.grad_tp_allreduce")
            g = npu.rms_norm_grad(xs, xs, norm_w, name=f"{p}.input_layernorm.grad")
            self._main_grad(npu, (h,), f"{p}.input_layernorm", cast=True)
            dy = npu.add(xs, xs, name=f"{p}.attn.residual.grad")
            del g, recomputed, params
            if saved:
                saved.pop()  # this layer's activations go back to the allocator
            if grads is not None:
                grads.add(self.layer_params, p)
        if not self.has_embedding:
            return
        params = zero3.gather(npu, tag) if zero3 is not None else None
        gathered = npu.all_gather(xs, ranks=tp_ranks, name=f"{tag}embed_tokens.grad_sp_all_gather") if sp else None
        npu.embedding_grad(x, self.ids, self.table, name=f"{tag}embed_tokens.grad")
        self._main_grad(npu, (vocab, h), f"{tag}embed_tokens")
        del dy, gathered, params
        if grads is not None:
            grads.add(vocab * h, "embed_tokens")

    # -- framework kernels (framework="megatron"; see training_step) ------------------------------

    def _copy(self, npu: NPU, op_type: str, shape: tuple[int, ...], name: str, dtype: str | None = None) -> Tensor:
        """A data-movement or fill kernel writing a new ``shape`` tensor (op type ``op_type``)."""
        out = Tensor(shape, dtype or self.dtype)
        npu.emit(op_type, (out,), out.dtype, name, outputs=(out,))
        return out

    def _fused(self, npu: NPU, op_type: str, x: Tensor, like: Tensor, name: str) -> Tensor:
        """A fused kernel of torch_npu read from ``x`` (its cost's element count) writing a new
        tensor shaped as ``like``."""
        out = Tensor(like.shape, self.dtype)
        npu.emit(op_type, (x,), self.dtype, name, outputs=(out,))
        return out

    def _split_rope(self, npu: NPU, p: str, save) -> None:
        """RoPE as Megatron-Core's ``apply_rotary_pos_emb`` on torch_npu runs it, for q then k:
        the cos and sin of the position table recomputed in fp32 (``(tokens, head_dim)``), each
        multiplied by the attention scaling and cast to the compute dtype, the fused rotation
        (``npu_rotary_position_embedding``), and its output made contiguous (``TensorMove``)."""
        tokens, d = self.tokens, self.d
        for part, heads in (("q", self.heads), ("k", self.kv_heads)):
            for fn in ("Cos", "Sin"):
                table = self._copy(npu, fn, (tokens, d), f"{p}.attn.rotary_{part}.{fn.lower()}", "fp32")
                table = npu.mul(table, Tensor((1,), "fp32"), name=f"{p}.attn.rotary_{part}.{fn.lower()}_scale")
                npu.cast(table, self.dtype, name=f"{p}.attn.rotary_{part}.{fn.lower()}_cast")
            rotated = npu.rotary_embedding(Tensor((tokens, heads * d), self.dtype), name=f"{p}.attn.rotary_{part}")
            del rotated
            save(self._copy(npu, "StridedSlice", (tokens, heads * d), f"{p}.attn.rotary_{part}.contiguous"))

    def _rope_grad(self, npu: NPU, p: str) -> None:
        """Backward of :meth:`_split_rope`, k then q: the rotation's grad, a zero tensor for the
        input gradient (``ZerosLike``) and the add into it."""
        tokens, d = self.tokens, self.d
        for part, heads in (("k", self.kv_heads), ("q", self.heads)):
            shape = (tokens, heads * d)
            g = npu.rotary_embedding(Tensor(shape, self.dtype), name=f"{p}.attn.rotary_{part}.grad")
            zeros = self._copy(npu, "Fill", shape, f"{p}.attn.rotary_{part}.grad_zeros")
            npu.add(zeros, g, name=f"{p}.attn.rotary_{part}.grad_add")

    def _in_place(self, npu: NPU, op_type: str, x: Tensor, name: str, row_operand: bool = True) -> None:
        """An element-wise fp32 kernel over ``x`` written back into ``x`` (no new tensor), with a
        per-row operand of ``(rows, 1)`` broadcast along the last axis when ``row_operand``: reads
        ``x`` and the row operand, writes ``x``."""
        rows = x.shape[0]
        nbytes = x.numel * DTYPE_BYTES[x.dtype]
        operand = rows * DTYPE_BYTES["fp32"] if row_operand else 0
        inputs = (x, Tensor((rows, 1), "fp32")) if row_operand else (x,)
        npu.emit(op_type, inputs, x.dtype, name, {"read_bytes": nbytes + operand, "write_bytes": nbytes})

    def _reduce_rows(self, npu: NPU, op_type: str, x: Tensor, name: str) -> None:
        """A reduction of ``x`` along its last axis into a ``(rows,)`` fp32 tensor."""
        out = Tensor((x.shape[0],), "fp32")
        npu.emit(op_type, (x,), x.dtype, name,
                 {"read_bytes": x.numel * DTYPE_BYTES[x.dtype], "write_bytes": out.numel * DTYPE_BYTES["fp32"]},
                 outputs=(out,))

    def _vocab_parallel_cross_entropy(self, npu: NPU, logits: Tensor, tag: str) -> Tensor:
        """The loss as Megatron-Core's ``VocabParallelCrossEntropy`` runs it in eager PyTorch
        (``megatron/core/tensor_parallel/cross_entropy.py``: ``calculate_logits_max``,
        ``calculate_predicted_logits``, ``calculate_cross_entropy_loss``), one kernel per tensor
        op over the ``(tokens, vocab / tp)`` logits: ``logits.float()`` (``Cast`` to a new fp32
        tensor), the row max (``ReduceMax``), ``-= max`` in place (``Sub``), ``exp`` in place
        (``Exp``), the row sum (``ReduceSum``), the softmax ``div_`` in place (``RealDiv``); with
        tensor parallelism the max, the target's logit and the sum are all-reduced. The per-row
        work on ``(tokens,)`` tensors (the target's logit, the log) is left out. Returns the fp32 softmax, which the
        backward reads (:meth:`_vocab_parallel_cross_entropy_grad`)."""
        tokens, tp_ranks, tp_reduce = self.tokens, self.tp_ranks, self.tp_reduce
        probs = npu.cast(logits, "fp32", name=f"{tag}loss.float")
        self._reduce_rows(npu, "ReduceMax", probs, f"{tag}loss.max")
        if tp_reduce:
            npu.all_reduce(Tensor((tokens,), "fp32"), ranks=tp_ranks, name=f"{tag}loss.tp_allreduce_max")
        self._in_place(npu, "Sub", probs, f"{tag}loss.sub_max")
        self._in_place(npu, "Exp", probs, f"{tag}loss.exp", row_operand=False)
        self._reduce_rows(npu, "ReduceSum", probs, f"{tag}loss.sum_exp")
        if tp_reduce:  # the target's logit (zero on the ranks whose shard lacks it), then the sum
            npu.all_reduce(Tensor((tokens,), "fp32"), ranks=tp_ranks, name=f"{tag}loss.tp_allreduce_predicted")
            npu.all_reduce(Tensor((tokens,), "fp32"), ranks=tp_ranks, name=f"{tag}loss.tp_allreduce_sum")
        self._in_place(npu, "RealDiv", probs, f"{tag}loss.softmax")
        return probs

    def _vocab_parallel_cross_entropy_grad(self, npu: NPU, probs: Tensor, tag: str) -> Tensor:
        """Backward of :meth:`_vocab_parallel_cross_entropy` (``VocabParallelCrossEntropy.backward``:
        the target's entries decremented, a ``(tokens,)`` scatter left out, then ``mul_`` by the
        loss's gradient in place, ``Mul``) and of ``logits.float()`` (``Cast`` back to the compute
        dtype, a new tensor): the logits' gradient."""
        self._in_place(npu, "Mul", probs, f"{tag}loss.grad")
        return npu.cast(probs, self.dtype, name=f"{tag}loss.float.grad")

    def _main_grad(self, npu: NPU, shape: tuple[int, ...], name: str, cast: bool = False) -> None:
        """Megatron without gradient-accumulation fusion: the weight's gradient (compute dtype;
        a norm weight's comes out of RmsNormGrad in fp32 and is ``Cast`` first) added into its
        fp32 main gradient (``Add`` fp32 + compute dtype -> fp32, the weight's size)."""
        if not self.megatron:
            return
        grad = Tensor(shape, self.dtype)
        if cast:
            grad = npu.cast(Tensor(shape, "fp32"), self.dtype, name=f"{name}.grad_cast")
        # in place into the job-long gradient buffer: no new tensor (an Add's cost, read both, write fp32;
        # the kernel casts the compute-dtype gradient to fp32 first, one cast per element)
        attrs = {"cast_elements": 1.0} if self.dtype != "fp32" else None
        npu.emit("Add", (Tensor(shape, "fp32"), grad), "fp32", f"{name}.main_grad_add", attrs)

    def _scatter(self, npu: NPU, regather, g: Tensor, name: str):
        """With SP, once the input is gathered again for the weight gradient: reduce-scatter the
        input gradient ``g`` beside that GEMM (the pending work); without SP, ``None``."""
        if regather is None:
            return None
        regather.wait()
        return npu.reduce_scatter(g, ranks=self.tp_ranks, async_op=True, name=name)


class _Zero3:
    """ZeRO-3's parameter gathers for one chunk: before each module's forward and again before
    its backward, the module's parameters are all-gathered over data parallelism, the next
    module's gather issued as soon as this one's is done (DeepSpeed's prefetch, FSDP's forward
    and backward prefetch), so one gather runs beside each module's compute and two modules'
    full parameters are on the card at a time."""

    def __init__(self, layout: ParallelLayout, dtype: str, stage: _Stage) -> None:
        self.dp_ranks, self.dp, self.dtype = layout.dp_ranks(), layout.data_parallel, dtype
        modules = ([("embed_tokens", stage.vocab * stage.h)] if stage.has_embedding else []) + [
            (f"layers.{layer}", stage.layer_params) for layer in stage.layers]
        if stage.has_head:
            modules.append(("lm_head", stage.h * stage.vocab + stage.h))
        self.modules = modules
        self.order: list[tuple[str, int]] = []
        self.next = 0
        self.pending = None

    def start(self, forward: bool) -> None:
        """A forward (modules in order) or a backward (in reverse) begins."""
        self.order = self.modules if forward else self.modules[::-1]
        self.next, self.pending = 0, None

    def _issue(self, npu: NPU, tag: str, async_op: bool):
        name, params = self.order[self.next]
        self.next += 1
        shard = Tensor((-(-params // self.dp),), self.dtype)
        return npu.all_gather(shard, ranks=self.dp_ranks, async_op=async_op, name=f"{tag}{name}.params.dp_all_gather")

    def gather(self, npu: NPU, tag: str) -> Tensor:
        """The next module's full parameters (held while it runs); the one after is prefetched."""
        if self.pending is None:
            full = self._issue(npu, tag, async_op=False)
        else:
            full = self.pending.wait()
        self.pending = self._issue(npu, tag, async_op=True) if self.next < len(self.order) else None
        return full


class _GradReducer:
    """Data-parallel gradient reduction in buckets (see the module docstring)."""

    def __init__(self, npu: NPU, layout: ParallelLayout, dtype: str, bucket_params: int | None) -> None:
        self.npu, self.layout, self.dtype, self.bucket_params = npu, layout, dtype, bucket_params
        self.pending = 0
        self.total_params = 0
        self.works: list = []
        self.names: list[str] = []
        self.counted: set[str] = set()  # parameters counted once, whatever the micro-batches

    def add(self, params: int, name: str) -> None:
        """Gradients of ``params`` local parameters are ready (backward order)."""
        self.pending += params
        if name not in self.counted:
            self.counted.add(name)
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
            if self.layout.zero_stage >= 2:  # added into the card's gradient shard in place: no new tensor
                self.npu.free(work.result)
            self.works.append(work)
        self.pending, self.names = 0, []

    def flush(self) -> None:
        """A micro-batch's backward is done and its gradients cannot wait (ZeRO-2 and 3 keep no
        full gradient): reduce what is left of them, beside the next micro-batch when buckets
        overlap backward, else at once."""
        self._reduce(async_op=self.bucket_params is not None)

    def finish(self) -> None:
        """Reduce what is left, then wait for every bucket (the optimizer needs them all)."""
        self._reduce(async_op=False)
        for work in self.works:
            work.wait()
