"""The Vector unit's operators as the cost models see them: how much each reads and writes per
element and which instructions it runs (:data:`VECTOR_PROFILES`), for
:func:`simulator.costs.vector_cost`; and how an operator no mapping knows is charged
(:data:`GENERIC_OP_PREFIX`, :func:`simulator.costs.generic_cost`).

Instruction counts are the operators' arithmetic, not hardware figures: the cycles each
instruction class takes are in the hardware file (``vector_unit.cycles_per_op_class``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VectorProfile:
    """How a Vector unit operator touches memory and which instructions it runs.

    ``read_elements`` / ``write_elements`` are multiples of the first input's element count;
    ``op_classes`` counts instruction classes per element; ``compute_dtype`` is the dtype the
    Vector unit computes in. ``casts_to_fp32``: the kernel computes bf16, or tensors of two
    dtypes, in fp32, with one ``cast`` per element of each tensor it reads or writes in another
    dtype (CANN's TBE kernels: see :func:`simulator.costs.vector_cost`).
    """

    read_elements: float
    write_elements: float
    op_classes: dict[str, float]
    compute_dtype: str | None = None
    casts_to_fp32: bool = False


#: Per-op instruction mixes. Counts of instruction classes per element, from the operators'
#: arithmetic (e.g. RmsNorm: square, reduce, scale by rsqrt, multiply by weight).
VECTOR_PROFILES: dict[str, VectorProfile] = {
    # Add as CANN's TBE kernel computes it on the 910B (add_compute of
    # opp/built-in/op_impl/ai_core/tbe/impl/dynamic/add.py in leideng/CANN-8.1.RC1, commit
    # 4332a0134a96cfea4a4f6673690a81075c1e4dfb): a bf16 input, or inputs of two dtypes (fp32 +
    # bf16 -> fp32, the main-gradient add, which aclnnAdd passes to this kernel as they are:
    # l0op::Add of hicann/ops-math math/add/op_api/add.cpp, commit
    # 7a5e6d620417a5c4064852ffc13473cb9d3e53fd), is cast to fp32 (tbe.cast_to, a no-op on an
    # fp32 tensor: tbe/dsl/compute/cast.py of the same CANN), one vadd in fp32, and a bf16
    # output rounded back (tbe.round): per element one add and a cast per tensor not in fp32,
    # 3 for bf16 + bf16 -> bf16, 1 for fp32 + bf16 -> fp32; fp16 + fp16 adds in fp16
    "Add": VectorProfile(2, 1, {"add": 1}, casts_to_fp32=True),
    "Mul": VectorProfile(2, 1, {"mul": 1}),
    "Cast": VectorProfile(1, 1, {"cast": 1}),
    "SiLU": VectorProfile(1, 1, {"exp": 1, "add": 1, "div": 1, "mul": 1}, "fp32"),
    "SiLUGrad": VectorProfile(2, 1, {"exp": 1, "add": 2, "div": 1, "mul": 3}, "fp32"),
    # torch_npu's fused SwiGLU (npu_swiglu; MindSpeed-LLM's --use-fused-swiglu), counted per element
    # of its (rows, 2 f) input: silu of the gate half times the up half, f outputs; its grad per
    # element of dy (rows, f): reads dy and the (rows, 2 f) input, writes the (rows, 2 f) gradient
    "SwiGlu": VectorProfile(1, 0.5, {"exp": 0.5, "add": 0.5, "div": 0.5, "mul": 1}, "fp32"),
    "SwiGluGrad": VectorProfile(3, 2, {"exp": 1, "add": 2, "div": 1, "mul": 5}, "fp32"),
    "GeLU": VectorProfile(1, 1, {"exp": 1, "add": 2, "div": 1, "mul": 4}, "fp32"),
    "GeLUGrad": VectorProfile(2, 1, {"exp": 1, "add": 3, "div": 1, "mul": 6}, "fp32"),
    "Softmax": VectorProfile(1, 1, {"max": 1, "add": 1, "exp": 1, "reduce": 1, "div": 1}, "fp32"),
    "SoftmaxGrad": VectorProfile(2, 1, {"mul": 2, "reduce": 1, "add": 1}, "fp32"),
    # RmsNorm as CANN's Ascend C kernel runs bf16 rows of up to 2000 elements on the 910B
    # (Tiling4RmsNorm of hicann/ops-nn norm/rms_norm/op_host/rms_norm_tiling.cpp, commit
    # 0919397b1f0a69cf96ec41746175ed5247db63ee, picks MODE_MERGE_N for numColAlign <= 2000 on
    # the 910B: KernelRmsNormMergeN::Compute of norm/rms_norm/op_kernel/rms_norm_merge_n.h,
    # commit 26bb0755db767817742d34050935ee260d05b7f5, several rows a pass, no per-row scalar
    # work), per element: Cast x to fp32, Mul x * x, ReduceSumMultiN's Adds of 64-element
    # slices into a (rows, 64) buffer (reduce_common.h, commit
    # c10cbc20e10dfc688178d501a0870f338aa01c2a of Hayden727/cann-ops, one add), BroadCast of
    # rstd over the row (Brcb, then Copy: a one-cycle move, counted as cast), Mul by it, Mul
    # by gamma (cast to fp32 and broadcast once per kernel), Cast y back (CAST_RINT): 3 cast,
    # 3 mul, 1 add. Per row of D elements a 64-element Duplicate and one RepeatReduceSum (64/D
    # per element: 0.06 each at D = 1024, 0.5 at the q/k norm's D = 128, 1.5 cycles per
    # element more there) and the rstd arithmetic on one value per row are not separated
    # here, as for RmsNormGrad. CANN 8.1.RC1's copy of the kernel (leideng/CANN-8.1.RC1, commit
    # 4332a0134a96cfea4a4f6673690a81075c1e4dfb) casts gamma per pass: one cast more
    # The counts are for a bf16 (or fp16) input; an fp32 one skips the two casts of x and y (5 in
    # all), not separated here (the simulator's RmsNorm runs in the training dtype)
    "RmsNorm": VectorProfile(1, 1, {"cast": 3, "mul": 3, "add": 1}, "fp32"),
    # RmsNormGrad as CANN's Ascend C kernel runs it for bf16 on the 910B (split-N template,
    # rows of D >= SMALLD_THRESHOLD = 640 elements: ComputeMainBf16 of
    # Hayden727/cann-ops src/norm/rms_norm_grad/op_kernel/rms_norm_grad_split_n.h, commit
    # cbc745da75aebd74333b37ecf2314c389f036d8b), per element of dy: 11 Casts (gamma, x and dy
    # up to fp32, then each bf16 rounding of dy * gamma, x * rstd and dgamma's product done as a
    # CAST_RINT down and a cast back up, and dx down), one Duplicate (a one-cycle fill, counted
    # as cast), Muls x rstd, Mul dy * gamma, Mul for the mean, Muls by the mean, Muls by rstd,
    # Mul for dgamma (6 mul), Sub and the dgamma Add (2 add), one ReduceSum. Rows under 640
    # (ComputeMainBf16SmallD, the q/k-norm gradient) run 10 Casts, 4 BroadCasts, 6 mul, 2 add
    # and 1 reduce: 2 cycles more per element, not separated here
    "RmsNormGrad": VectorProfile(2, 1, {"cast": 12, "mul": 6, "add": 2, "reduce": 1}, "fp32"),
    "LayerNorm": VectorProfile(1, 1, {"add": 3, "mul": 3, "reduce": 2}, "fp32"),
    "LayerNormGrad": VectorProfile(2, 1, {"add": 4, "mul": 7, "reduce": 3}, "fp32"),
    # RotaryPositionEmbedding (rotate-half, torch_npu's npu_rotary_mul) as CANN's Ascend C
    # kernel runs bf16 on the 910B: RotateHalfBf16<bfloat16_t, float>::Compute and
    # RotateHalfBase::XNewCopy / ComputeInner (opp/built-in/op_impl/ai_core/tbe/impl/ascendc/
    # rotary_position_embedding/rotate_half_bf16.h and rotate_half_base.h in
    # leideng/CANN-8.1.RC1, commit 4332a0134a96cfea4a4f6673690a81075c1e4dfb), per element of
    # x: Cast x to fp32, the rotate-half as two UB-to-UB DataCopy of half a row each
    # (copy_ubuf_to_ubuf runs on PIPE_V, CANN's intrinsic reference cceapi_0070; a one-cycle
    # move, counted as cast), Mul x * cos, Mul x' * sin, Add, Cast y back (CAST_RINT): 3 cast,
    # 2 mul, 1 add. Cos and sin are cast to fp32 and sin's first half negated (Muls) once per
    # row of positions, shared by the B x N heads of the SBND layout (RotateHalfTiling::
    # ChooseTilingMode of posembedding/rotary_position_embedding/op_host/rope_rotate_half_tiling.cpp,
    # recursion-ascend/ops-transformer, commit a093e954a5a431b19fccf2cd92ef742c0500527c, a
    # copy of hicann/ops-transformer): 2.5 / (B N) per element, not separated here
    # The counts are for bf16; an fp32 input skips the two casts of x and y (4 in all), not
    # separated here
    "RotaryPositionEmbedding": VectorProfile(1, 1, {"cast": 3, "mul": 2, "add": 1}, "fp32"),
    # Cross entropy over logits: softmax then pick the label; grad rewrites the logits.
    "CrossEntropy": VectorProfile(1, 0, {"max": 1, "add": 1, "exp": 1, "reduce": 2}, "fp32"),
    "CrossEntropyGrad": VectorProfile(1, 1, {"exp": 1, "div": 1, "add": 1}, "fp32"),
    # AdamW on fp32 master weights: reads param, grad, m, v; writes param, m, v and the fp16
    # copy. Elements counted in fp32 words.
    "ApplyAdamW": VectorProfile(4, 3.5, {"mul": 7, "add": 4, "sqrt": 1, "div": 1}, "fp32"),
    # SGD with momentum (ApplyMomentum): reads param, accum, grad; writes param, accum.
    "ApplyMomentum": VectorProfile(3, 2, {"mul": 2, "add": 2}, "fp32"),
    # Training batch norm as CANN splits it: BNTrainingReduce reads x for the sum and sum of
    # squares, BNTrainingUpdate reads x again and writes y. The gradient reads dy and x for
    # the two reductions, then dy and x again to write dx.
    "BatchNorm": VectorProfile(2, 1, {"mul": 3, "add": 3, "reduce": 2}, "fp32"),
    "BatchNormGrad": VectorProfile(4, 1, {"mul": 5, "add": 4, "reduce": 2}, "fp32"),
    "Relu": VectorProfile(1, 1, {"max": 1}),
    # Graph-mode fusion as MindSpore's Ascend backend does it (its UB fusion passes
    # ConvBnReduceFusionPass, BnupdateEltwiseFusionPass, BnupdateEltwiseEltwiseFusionPass,
    # DereluFusion): the convolution's epilogue computes the batch-norm sums, so
    # BNTrainingUpdate, fused with the ReLU (and the residual Add) after it, reads y once and
    # writes it once; backward, the ReLU gradient (from a 1-bit mask, ReluGradV2) folds into
    # the batch-norm gradient's two passes over dy and x.
    "BatchNormRelu": VectorProfile(1, 1, {"mul": 2, "add": 2, "max": 1}, "fp32"),
    "BatchNormUpdate": VectorProfile(1, 1, {"mul": 2, "add": 2}, "fp32"),
    "BatchNormAddRelu": VectorProfile(2, 1, {"mul": 2, "add": 3, "max": 1}, "fp32"),
    "BatchNormReluGrad": VectorProfile(4, 1, {"mul": 5, "add": 4, "reduce": 2, "max": 1}, "fp32"),
    "ReluGrad": VectorProfile(2, 1, {"max": 1}),
    # Pooling, counted per input element: a 3x3 stride-2 max pool reads each input about
    # 9/4 times through its overlapping windows and writes a quarter of it.
    "MaxPool": VectorProfile(1, 0.25, {"max": 2.25}),
    "MaxPoolGrad": VectorProfile(1.25, 1, {"max": 2.25, "add": 1}),
    "GlobalAvgPool": VectorProfile(1, 0, {"add": 1}, "fp32"),
    "GlobalAvgPoolGrad": VectorProfile(0, 1, {"mul": 1}, "fp32"),
    # Element-wise and row-wise operators of eager PyTorch code (captured by simulator.capture),
    # under CANN's op type names. Counts per element as above; a captured op gives its bytes
    # read and written explicitly (see vector_cost), so broadcasting and reductions cost the
    # bytes they move, and only the instruction mix comes from here.
    "Sub": VectorProfile(2, 1, {"add": 1}),
    "RealDiv": VectorProfile(2, 1, {"div": 1}),
    "Neg": VectorProfile(1, 1, {"mul": 1}),
    "Abs": VectorProfile(1, 1, {"max": 1}),
    "Pow": VectorProfile(1, 1, {"exp": 1, "mul": 1}, "fp32"),
    "Square": VectorProfile(1, 1, {"mul": 1}),
    "Sqrt": VectorProfile(1, 1, {"sqrt": 1}, "fp32"),
    "Rsqrt": VectorProfile(1, 1, {"sqrt": 1, "div": 1}, "fp32"),
    "Reciprocal": VectorProfile(1, 1, {"div": 1}, "fp32"),
    "Exp": VectorProfile(1, 1, {"exp": 1}, "fp32"),
    "Log": VectorProfile(1, 1, {"exp": 1}, "fp32"),
    # Sin and Cos as CANN's built-in TBE kernels compute them on the 910B (impl/dynamic/sin.py
    # and cos.py of CANN's ops/built-in/tbe; on SoCs with vcopy, after_v200(), the default
    # high-performance mode runs sin_compute_v3 / cos_compute_v3). Read from the public text
    # of those files in the search index (its repository is not recorded there; the older
    # copy in dengguojie/vue-element-admin ops/built-in/tbe/impl/dynamic/sin.py, commit
    # 0fd5feed6b46627fba3685f30027dabbf396fecf, predates the v3 path). Per element, fp32:
    # k = round(x / pi) split into a high and a low part (2 vmuls, 2 rounds, 1 vmuls,
    # 1 vsub), x - k pi in eight vmuls + vsub steps (pi in four parts, for both halves of k),
    # the sign from floor(k / 2) (2 vmuls, 1 floor, 2 vmuls, vadd, vadds), the degree-9 odd
    # polynomial in x^2 (1 vmul for x^2, vmuls, 3 vmul, 4 vadds, the multiply by x and by
    # the sign) and a clamp to [-1, 1] (vmins, vmaxs): 21 mul, 15 add, 3 cast (round / floor
    # as float-to-float conversions), 2 max. Cos adds a half period (vadds) before rounding
    # and two vadds of pi/2 parts: 18 add
    "Sin": VectorProfile(1, 1, {"mul": 21, "add": 15, "cast": 3, "max": 2}, "fp32"),
    "Cos": VectorProfile(1, 1, {"mul": 21, "add": 18, "cast": 3, "max": 2}, "fp32"),
    "Tanh": VectorProfile(1, 1, {"exp": 1, "add": 2, "div": 1}, "fp32"),
    "Sigmoid": VectorProfile(1, 1, {"exp": 1, "add": 1, "div": 1}, "fp32"),
    "Maximum": VectorProfile(2, 1, {"max": 1}),
    "Minimum": VectorProfile(2, 1, {"max": 1}),
    "Less": VectorProfile(2, 1, {"max": 1}),
    "SelectV2": VectorProfile(3, 1, {"max": 1}),
    "LogSoftmax": VectorProfile(1, 1, {"max": 1, "add": 2, "exp": 2, "reduce": 1}, "fp32"),
    "LogSoftmaxGrad": VectorProfile(2, 1, {"exp": 1, "mul": 1, "reduce": 1, "add": 1}, "fp32"),
    "NLLLoss": VectorProfile(1, 0, {"add": 1}, "fp32"),
    "NLLLossGrad": VectorProfile(0, 1, {"mul": 1}, "fp32"),
    "ReduceSum": VectorProfile(1, 0, {"reduce": 1}, "fp32"),
    "ReduceMean": VectorProfile(1, 0, {"reduce": 1, "mul": 1}, "fp32"),
    "ReduceMax": VectorProfile(1, 0, {"max": 1}),
    # data movement: a fill writes, a transpose / concat / slice / pad / broadcast copy reads and
    # writes each element once (CANN's Fill, Transpose, ConcatD, StridedSlice, PadV3, BroadcastTo)
    "Fill": VectorProfile(0, 1, {}),
    "Transpose": VectorProfile(1, 1, {}),
    "ConcatD": VectorProfile(1, 1, {}),
    "StridedSlice": VectorProfile(1, 1, {}),
    "PadV3": VectorProfile(1, 1, {}),
    "BroadcastTo": VectorProfile(1, 1, {}),
    "SplitV": VectorProfile(1, 1, {}),
    # a k x k average pool: each output sums its window (explicit bytes give the traffic)
    "AvgPool": VectorProfile(1, 0.25, {"add": 2.25}),
    "AvgPoolGrad": VectorProfile(0.25, 1, {"add": 2.25, "mul": 1}),
    # random numbers: a counter-based generator (Philox 4x32: 10 rounds of a 32-bit multiply and
    # adds, amortised over its 4 outputs) per element, then the transform: Box-Muller for a
    # normal draw, a compare for a dropout mask, a multiply by the mask and the scale to apply it
    "RandomUniform": VectorProfile(0, 1, {"mul": 3, "add": 3}),
    "RandomNormal": VectorProfile(0, 1, {"mul": 5, "add": 3, "exp": 1, "sqrt": 1}),
    "DropOutGenMask": VectorProfile(0, 1, {"mul": 3, "add": 3, "max": 1}),
    "DropOutDoMask": VectorProfile(2, 1, {"mul": 2}),
    # a sequence written from its start and step (torch.arange)
    "Range": VectorProfile(0, 1, {"add": 1}),
    # multi-tensor kernels of torch's foreach optimizers (torch_npu's Foreach* ops), per element
    # of all the tensors of the list
    "ForeachAdd": VectorProfile(2, 1, {"add": 1}),
    "ForeachSub": VectorProfile(2, 1, {"add": 1}),
    "ForeachMul": VectorProfile(2, 1, {"mul": 1}),
    "ForeachDiv": VectorProfile(2, 1, {"div": 1}),
    "ForeachLerp": VectorProfile(2, 1, {"add": 2, "mul": 1}),
    "ForeachAddcmul": VectorProfile(3, 1, {"add": 1, "mul": 2}),
    "ForeachAddcdiv": VectorProfile(3, 1, {"add": 1, "mul": 1, "div": 1}),
    "ForeachSqrt": VectorProfile(1, 1, {"sqrt": 1}, "fp32"),
    "ForeachNeg": VectorProfile(1, 1, {"mul": 1}),
    "ForeachMaximum": VectorProfile(2, 1, {"max": 1}),
    "ForeachNorm": VectorProfile(1, 0, {"mul": 1, "reduce": 1}, "fp32"),
    "ForeachZero": VectorProfile(0, 1, {}),
    "ForeachCopy": VectorProfile(1, 1, {}),
}

#: Op types of PyTorch operators no mapping knows (``aten::<name>``, as torch's profiler names
#: them) are costed by :func:`generic_cost` from the bytes they move: recorded under their own
#: name, never dropped.
GENERIC_OP_PREFIX = "aten::"
#: The instruction mix a generic op is charged per element of its largest tensor: one simple
#: Vector instruction (an element-wise op), the least an operator that touches an element does.
GENERIC_OP_CLASSES = {"add": 1.0}
