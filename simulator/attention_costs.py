"""FlashAttention's cost models (:func:`flash_attention_cost`, :func:`flash_attention_grad_cost`) on
the kernel model of :mod:`simulator.kernel_model`: the fused kernel's Cube and Vector work per
(Q block, K/V block) pair, its HBM and L2 traffic, and on the split 910B the Cube-to-Vector
hand-off through global memory.
"""

from __future__ import annotations

import math

from .hardware import HardwareSpec
from .kernel_model import (
    ACCUMULATOR_BYTES,
    Kernel,
    OpCost,
    OpSpec,
    ceil_div,
    cube_time_s,
    run_kernel,
    vector_time_s,
)
from .units import DTYPE_BYTES

# --------------------------------------------------------------------------------------
# FlashAttention


def flash_attention_l1_bytes(block_size: int, head_dim: int, pipeline_stages: int, dtype: str) -> int:
    """L1 bytes one AI Core needs: a Q block plus ``pipeline_stages`` K and V blocks in flight."""
    elt = DTYPE_BYTES[dtype]
    return (block_size * head_dim + pipeline_stages * 2 * block_size * head_dim) * elt


def _flash_attention_common(spec: OpSpec, hw: HardwareSpec, backward: bool) -> OpCost:
    (b, h, s_q, d), (_, h_kv, s_kv, _) = spec.shapes[0], spec.shapes[1]
    block = spec.attr("block_size")
    stages = spec.attr("pipeline_stages")
    fusion = spec.attr("fusion")
    causal = spec.attr("causal")
    elt = DTYPE_BYTES[spec.dtype]
    need = flash_attention_l1_bytes(block, d, stages, spec.dtype)
    if need > hw.memory.l1_bytes_per_core:
        raise ValueError(
            f"{spec.op_type}: block_size={block}, head_dim={d}, pipeline_stages={stages} "
            f"need {need} bytes of L1 per AI Core; {hw.name} has {hw.memory.l1_bytes_per_core}"
        )
    q_blocks = ceil_div(s_q, block)
    kv_blocks = ceil_div(s_kv, block)
    # Causal masking skips the blocks above the diagonal: on average (n + 1) / 2 of n.
    kv_per_q = (kv_blocks + 1) / 2 if causal else float(kv_blocks)
    # Forward: QK^T and PV (2 matmuls per block pair); backward recomputes QK^T and does
    # dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q (5 matmuls), FlashAttention-2 paper.
    matmuls = 5 if backward else 2
    cube_per_pair = matmuls * cube_time_s(block, d, block, spec.dtype, hw)
    # Vector work per score element, in fp32 (FlashAttention-2's online softmax):
    # forward: scale, row max, subtract the max, exp, row sum, cast P to fp16 for PV, and
    # the rescale-and-accumulate of the output rows (2 ops per output element, d / block
    # of them per score element). Backward: see _fag_vector_s.
    out_per_score = d / block
    if backward:
        vec_per_pair = _fag_vector_s(block, s_q, s_kv, d, spec.dtype, causal, kv_per_q, fusion, hw)
    else:
        softmax_classes = {"mul": 1 + out_per_score, "reduce": 2, "add": 1 + out_per_score, "exp": 1, "cast": 1}
        # The Vector units beside each Cube unit share the softmax (910B: 2 per AI Core).
        vec_per_pair = vector_time_s(block * block, softmax_classes, "fp32", hw) / hw.vector_units_per_ai_core
    pairs_per_block = kv_per_q
    block_dim = b * h * q_blocks
    cube_s = pairs_per_block * cube_per_pair
    vec_s = pairs_per_block * vec_per_pair
    # Traffic per (batch, head): Q read once and O written once; K and V re-read per Q block.
    # Backward also reads O, dO and writes dQ, dK, dV (IO analysis of Dao et al., 2022).
    head_qo = s_q * d * elt
    head_kv = 2 * s_kv * d * elt
    kv_reads = q_blocks * kv_per_q * 2 * block * d * elt
    if backward:
        first_pass = 4 * head_qo + head_kv  # Q, O, dO read; dQ written
        unique = b * h * (first_pass + head_qo) + b * h_kv * head_kv  # dK, dV written
    else:
        unique = b * h * 2 * head_qo + b * h_kv * head_kv
    reread = b * h * kv_reads - b * h_kv * head_kv
    dma_per_block = 2 + 2 * math.ceil(pairs_per_block) + (3 if backward else 0)
    kernel_count = 1
    if not fusion:
        # Unfused: the score and probability tiles round-trip through HBM (write S, read S,
        # write P, read P), and QK^T, softmax and PV are separate kernels.
        unique += b * h * 4 * s_q * s_kv * elt * (kv_per_q / kv_blocks)
        dma_per_block += 4 * math.ceil(pairs_per_block)
        kernel_count = 3
    # The split 910B's hand-off (fused kernel only): its Cube and Vector cores share no buffer,
    # so every score block the Cube makes leaves L0C for global memory through the Cube core's
    # FixPipe, for the Vector cores to read. Forward, per (Q, K/V) block pair: S = QK^T (fp32)
    # and the PV partial output (block x D, fp32) the Vector cores rescale into O. Backward:
    # S and dP = dO V^T (fp32), and the dQ, dK, dV partials (block x D each, fp32, added into
    # global memory). The FixPipe is one more pipeline stage of the Cube core, double-buffered
    # with the mmads like the others (CANN's FlashAttentionScore(Grad) on Atlas A2).
    fixpipe_rate = hw.cube_unit.fixpipe_bytes_per_cycle_per_core
    fixpipe_s = 0.0
    if fusion and fixpipe_rate is not None:
        # A sequence shorter than a block hands off only the rows and columns it has.
        rows, cols = min(block, s_q), min(block, s_kv)
        scores, partials = (2, 3) if backward else (1, 1)
        handoff_bytes = (scores * rows * cols + partials * rows * d) * ACCUMULATOR_BYTES
        fixpipe_s = pairs_per_block * handoff_bytes / (fixpipe_rate * hw.ai_core.clock_hz)
    # K/V of the heads in flight stay in L2 when they fit.
    heads_in_flight = max(1, min(b * h, hw.ai_core.count) // max(1, q_blocks))
    if heads_in_flight * head_kv <= hw.memory.l2_bytes:
        hbm_bytes, l2_bytes = unique, max(0.0, reread)
    else:
        hbm_bytes, l2_bytes = unique + max(0.0, reread), 0.0
    vector_l2_bytes = 0.0
    if backward and fusion and fixpipe_rate is not None:
        # The split chip's round trip through the per-core workspace (an L2-resident buffer):
        # the Vector cores read S and dP and write P and dS (_fag_vector_l2_bytes_per_score), and
        # the Cube core reads P (for dV) and dS (for dQ and dK, kept in L1 between the two) back
        # once each, 16-bit (ComputeL1CustomMMDqkv of the SameAB kernel, file cited there).
        scores_computed = b * h * q_blocks * kv_per_q * min(block, s_q) * min(block, s_kv)
        vector_l2_bytes = scores_computed * _fag_vector_l2_bytes_per_score(s_kv, elt, kv_per_q, causal)
        l2_bytes += scores_computed * 2 * elt
    # Useful FLOP: with a causal mask each query row attends to the keys up to its own
    # position (the mask aligned at the bottom right when s_q < s_kv, as FlashAttention-2 does);
    # counted per element, not per block, so a longer sequence never has fewer FLOP.
    shorter = min(s_q, s_kv)
    pairs = s_q * s_kv - (shorter * (shorter - 1) / 2 if causal else 0)
    flop = 2.0 * matmuls * b * h * pairs * d
    kernel = Kernel(
        block_dim=block_dim,
        cube_s_per_block=cube_s,
        vector_s_per_block=vec_s,
        hbm_bytes=hbm_bytes,
        l2_bytes=l2_bytes,
        dma_per_block=dma_per_block,
        stages=stages,
        iterations=max(1.0, pairs_per_block),
        flop=flop,
        kernel_count=kernel_count,
        mix=fusion,
        fixpipe_s_per_block=fixpipe_s,
        vector_l2_bytes=vector_l2_bytes,
    )
    return run_kernel(kernel, hw, hw.ai_core.count)


# FlashAttentionScoreGrad's Vector side on Atlas A2 (template S1s2Bn2gs1s2SameAb, the one the
# 910B's tiling picks for 16-bit inputs; see the hardware files' attention workspace source).
# Sources: kernel github.com/hicann/ops-transformer commit 2f82d47a,
# attention/flash_attention_score_grad/op_kernel/arch22/flash_attention_score_grad_s1s2_bn2gs1s2_sab.h
# (ComputeVec, SubGrapA, SubGrapB, ComputeL1CustomMMDqkv); tiling github.com/repo-mirror-test/
# ops-transformer commit 7ab1fa15, attention/flash_attention_score_grad/op_host/arch32/
# flash_attention_score_grad_tiling_s1s2_bn2gs1s2_sab.cpp (DoSplit: 512 x 512 Cube blocks,
# baseMN = 128 x 64; ChooseL1Custom; GetShapeAttrsInfo); SimpleSoftMax: github.com/leideng/
# CANN-8.1.RC1 commit 4332a013, .../ascendc/include/highlevel_api/impl/activation/softmax/membase/
# common/simple_softmax_common_impl.h (fp32 basic block: Sub, Exp, Div). Each Vector core takes half of the Cube core's
# score block in sub-blocks of (baseMN / 256) rows x 256 columns and, per sub-block:
#   SubGrapA: MTE2 reads S (fp32) and the row max and sum (8 fp32 each per row), [the causal mask
#     bytes where the sub-block meets the diagonal], Muls by the scale, SelectWithBytesMask on
#     the masked sub-blocks, SimpleSoftMax (Sub max, Exp, Div by sum), Cast to 16 bits, MTE3 writes P;
#   SubGrapB: MTE2 reads dP = dO V^T (fp32) and the row's softmax-grad term D (8 fp32 per row;
#     D = rowsum(dO * O) is computed once per row before the main loop, not per block pair),
#     Sub D, Mul by P, Cast to 16 bits, MTE3 writes dS.
# With the matmul results in the NZ layout each fp32 tile also takes a Unified Buffer copy and
# an NZ-to-ND Copy, and each 16-bit tile a copy and an ND-to-NZ Copy before MTE3.
FAG_VECTOR_S2_COLUMNS = 256  # VEC_S2_LEN: columns of one Vector sub-block
FAG_ROW_STATS_BYTES = 3 * 8 * 4  # max, sum and D: 8 fp32 each per row, re-read per sub-block


def _fag_scores_nz(s_q: int, s_kv: int, d: int, dtype: str) -> bool:
    """Whether the SameAB tiling writes S and dP in the NZ layout (mm1IsNZOut): 16-bit inputs
    with a key length not a multiple of 128 below 5000, or bf16 with head dim 128 and both
    sequences >= 512 (ChooseL1Custom; it also asks for no PSE, no dropout, non-deterministic
    mode and 512 x 512 blocks, which the model does not represent and assumes)."""
    if DTYPE_BYTES[dtype] != 2:
        return False
    return (s_kv % 128 != 0 and s_kv < 5000) or (dtype == "bf16" and d == 128 and min(s_q, s_kv) >= 512)


def _fag_mask_frac(causal: bool, kv_per_q: float) -> float:
    """Share of the computed score blocks that carry the causal mask: the diagonal one of each
    Q block's ``kv_per_q`` (the model's block grid, not CANN's sub-blocks)."""
    return 1.0 / kv_per_q if causal else 0.0


def _fag_vector_s(block: int, s_q: int, s_kv: int, d: int, dtype: str, causal: bool, kv_per_q: float,
                  fusion: bool, hw: HardwareSpec) -> float:
    """Vector-unit seconds one AI Core spends on one (Q block, K/V block) pair of the backward
    (its Vector units share the pair), per the instruction list above. The NZ-layout copies are
    charged only for the fused kernel on a split chip (a FixPipe hand-off rate in the hardware
    file), where the matmul results reach the Vector cores through global memory."""
    fp32_classes = {"mul": 2, "add": 2, "exp": 1, "div": 1, "cast": 2}  # Muls, Sub, Exp, Div, Sub, Mul, 2 Casts
    mask = _fag_mask_frac(causal, kv_per_q)
    if mask:
        fp32_classes["max"] = 2 * mask  # SelectWithBytesMask: compare the mask bytes, select
    half_classes: dict[str, float] = {}
    split = fusion and hw.cube_unit.fixpipe_bytes_per_cycle_per_core is not None
    if split and _fag_scores_nz(s_q, s_kv, d, dtype):
        # UB copies (DataCopy, Copy) run one 256-byte repeat per cycle, counted as add-class.
        fp32_classes["add"] += 4  # S and dP: copy + NZ-to-ND each
        half_classes["add"] = 4  # P and dS: copy + ND-to-NZ each, 16-bit
    elements = block * block
    seconds = vector_time_s(elements, fp32_classes, "fp32", hw)
    if half_classes:
        seconds += vector_time_s(elements, half_classes, dtype, hw)
    return seconds / hw.vector_units_per_ai_core


def _fag_vector_l2_bytes_per_score(s_kv: int, elt: int, kv_per_q: float, causal: bool) -> float:
    """Bytes the Vector cores move per score element of the backward: S and dP in (fp32), P and
    dS out (``elt`` bytes, the input dtype), the row statistics once per sub-block row, one mask
    byte per element of the masked blocks."""
    cols = min(FAG_VECTOR_S2_COLUMNS, s_kv)  # CANN's sub-block, whatever the model's block_size
    return 2 * ACCUMULATOR_BYTES + 2 * elt + FAG_ROW_STATS_BYTES / cols + _fag_mask_frac(causal, kv_per_q)


def flash_attention_cost(spec: OpSpec, hw: HardwareSpec) -> OpCost:
    """FlashAttention forward. Shapes: q (B, H, S_q, D), k and v (B, H_kv, S_kv, D).

    Attributes: ``block_size`` (rows of Q and of K/V per block), ``pipeline_stages``,
    ``fusion``, ``causal``.

    Raises:
        ValueError: the blocks in flight do not fit in one AI Core's L1.
    """
    return _flash_attention_common(spec, hw, backward=False)


def flash_attention_grad_cost(spec: OpSpec, hw: HardwareSpec) -> OpCost:
    """FlashAttention backward; same shapes and attributes as the forward."""
    return _flash_attention_common(spec, hw, backward=True)
