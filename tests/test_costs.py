"""Cost models: golden values with their derivation, and Hypothesis properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from simulator.costs import VECTOR_PROFILES, OpSpec, conv_output_hw, op_cost
from simulator.hardware import load_hardware
from simulator.kernel_model import pipelined_time_s

HARDWARE = ["ascend910", "ascend910b", "ascend910b4"]
A910 = load_hardware("ascend910")


def mm(m: int, k: int, n: int, batch: int = 1, dtype: str = "fp16") -> OpSpec:
    return OpSpec("MatMul", ((batch, m, k), (batch, k, n)), dtype)


def fa(b, h, s, d, *, block=128, stages=2, fusion=True, causal=False, op="FlashAttention") -> OpSpec:
    attrs = (("block_size", block), ("causal", causal), ("fusion", fusion), ("pipeline_stages", stages))
    return OpSpec(op, ((b, h, s, d), (b, h, s, d), (b, h, s, d)), "fp16", attrs)


# -- golden values ------------------------------------------------------------------------------


def test_peak_fp16_rates() -> None:
    # 32 AI Cores x 4096 MAC/cycle x 2 FLOP x 1.0 GHz; 24 x 4096 x 2 x 1.8 GHz.
    assert A910.peak_cube_flop_per_s("fp16") == pytest.approx(262.144e12)
    assert load_hardware("ascend910b").peak_cube_flop_per_s("fp16") == pytest.approx(353.8944e12)


def test_matmul_single_block_golden() -> None:
    # 128x128x128 fp16 on ascend910: one 128x128 tile (n_t capped by nothing smaller), one K chunk.
    # Cube: 128*128*128 / 4096 MAC/cycle = 512 cycles / (1 GHz * 0.85) = 602.353 ns.
    # HBM: A and B panels 2 * 128*128*2 B = 65536 B read (fits L2: unique bytes), C 32768 B
    #      written: 98304 B / (1.2e12 B/s * 0.8) = 102.4 ns, slower than the same bytes through
    #      L2 (98304 B / 3.52e12 B/s = 27.9 ns), so HBM bounds it; plus 3 DMAs * 0.3 us = 900 ns.
    # Pipeline, 2 stages over K / 16 = 8 iterations: steady max(1002.4, 1604.753 / 2) = 1002.4 ns,
    # plus the fill (1604.753 - 1002.4) / 8 = 75.294 ns -> 1077.694 ns; plus the launch floor,
    # launch.kernel_launch_latency_s = 0.92 us (ascend910.json: the 910B2's median device floor
    # over the 18 smallest AI_VECTOR_CORE kernels of the AlexNet Level1 profile, taken for the
    # 910A; tests/test_launch_calibration.py) -> 0.92 + 1.077694 = 1.997694 us.
    cost = op_cost(mm(128, 128, 128), A910)
    assert cost.block_dim == 1 and cost.dma_count == 3
    assert cost.hbm_bytes == 98304
    assert cost.duration_s == pytest.approx(0.92e-6 + 1077.694e-9, rel=1e-6)
    assert cost.flop == 2 * 128**3


def test_allreduce_mesh_golden() -> None:
    # 16 MiB fp16 AllReduce over 4 cards of one HCCS mesh on ascend910: Mesh algorithm,
    # ReduceScatter + AllGather = 2 passes of (2 us + (16 MiB / 4) / (30 GB/s * 0.8)) = 353.525 us;
    # reduction: 3/4 * 8 Mi elements / (128 lanes * 1 GHz * 0.83 efficiency * 32 cores)
    # = 1.8506 us; launch floor 0.92 us (ascend910.json launch.kernel_launch_latency_s, see
    # test_matmul_single_block_golden) -> 0.92 + 353.525 + 1.8506 = 356.296 us.
    spec = OpSpec("AllReduce", ((2048, 4096),), "fp16", (("ranks", (0, 1, 2, 3)),))
    cost = op_cost(spec, A910)
    assert cost.comm.algorithm == "mesh"
    assert cost.duration_s == pytest.approx(0.92e-6 + 2 * (2e-6 + 4 * 2**20 / 24e9) + 1.536e-6 / 0.83, rel=1e-9)
    assert cost.comm.busbw_bytes_per_s == pytest.approx(cost.comm.algbw_bytes_per_s * 2 * 3 / 4)


def test_allreduce_algorithm_follows_topology() -> None:
    def algo(ranks, hw="ascend910"):
        spec = OpSpec("AllReduce", ((1 << 20,),), "fp16", (("ranks", ranks),))
        return op_cost(spec, load_hardware(hw)).comm.algorithm

    assert algo((0, 1, 2, 3)) == "mesh"
    assert algo(tuple(range(8))) == "hierarchical-mesh-ring"  # two HCCS groups on a 910A server
    assert algo((0, 4)) == "ring-pcie"
    assert algo(tuple(range(8)), "ascend910b") == "mesh"  # one 8-card HCCS mesh on 910B
    assert algo(tuple(range(16))) == "hierarchical-ring-roce"  # two servers
    assert algo(tuple(range(32))) == "hierarchical-halving-doubling-roce"  # four servers


# -- properties ---------------------------------------------------------------------------------

dims = st.integers(min_value=1, max_value=8192)


def roofline_s(cost, hw, dtype="fp16") -> float:
    compute = cost.flop / hw.peak_cube_flop_per_s(dtype)
    memory = cost.hbm_bytes / hw.memory.hbm_bandwidth_bytes_per_s
    return max(compute, memory)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(HARDWARE), dims, dims, dims, st.integers(1, 8))
def test_matmul_never_beats_roofline_and_is_finite(hw_name, m, k, n, batch) -> None:
    hw = load_hardware(hw_name)
    cost = op_cost(mm(m, k, n, batch), hw)
    assert math.isfinite(cost.duration_s) and cost.duration_s > 0
    assert cost.duration_s >= roofline_s(cost, hw)
    for ratio in (cost.mac_ratio, cost.mte2_ratio, cost.ai_core_util_frac):
        assert 0 <= ratio <= 1


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(HARDWARE), dims, dims, dims, st.sampled_from("mkn"), st.integers(1, 4096))
def test_matmul_more_work_never_less_time(hw_name, m, k, n, axis, extra) -> None:
    hw = load_hardware(hw_name)
    bigger = {"m": (m + extra, k, n), "k": (m, k + extra, n), "n": (m, k, n + extra)}[axis]
    assert op_cost(mm(*bigger), hw).duration_s >= op_cost(mm(m, k, n), hw).duration_s


seq = st.integers(min_value=1, max_value=16384)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(HARDWARE), st.integers(1, 4), st.integers(1, 64), seq, st.sampled_from([64, 128]),
       st.sampled_from([64, 128, 256]), st.integers(1, 3), st.booleans(), st.booleans())
def test_flash_attention_roofline_finite(hw_name, b, h, s, d, block, stages, fusion, causal) -> None:
    hw = load_hardware(hw_name)
    cost = op_cost(fa(b, h, s, d, block=block, stages=stages, fusion=fusion, causal=causal), hw)
    assert math.isfinite(cost.duration_s) and cost.duration_s > 0
    assert cost.duration_s >= roofline_s(cost, hw)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(HARDWARE), st.integers(1, 32), seq, st.integers(1, 4096), st.booleans(),
       st.sampled_from(["FlashAttention", "FlashAttentionGrad"]))
def test_flash_attention_longer_sequence_never_faster(hw_name, h, s, extra, causal, op) -> None:
    hw = load_hardware(hw_name)
    short = op_cost(fa(1, h, s, 128, causal=causal, op=op), hw).duration_s
    long = op_cost(fa(1, h, s + extra, 128, causal=causal, op=op), hw).duration_s
    assert long >= short


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(HARDWARE), st.integers(1, 32), seq)
@example("ascend910b4", 1, 129)  # found by a random run: one head, a 128-row block and one row more
def test_unfused_attention_moves_more_bytes(hw_name, h, s) -> None:
    # The fused kernel pays the larger launch floor of a Cube+Vector (MIX) kernel, so for tiny
    # sequences three plain kernels can start sooner; past the launch floors, unfused is slower
    # once the Q blocks fill the AI Cores. With fewer, the fused kernel's idle cores and its
    # Cube-to-Vector hand-off can cost it that lead: one head of S = 129-140 on the 20-core 910B4
    # (2 blocks) is the only place it does (by at most 0.55%, over h <= 32, S < 2,200 on all three
    # specs), so there the unfused may be up to 1% faster.
    hw = load_hardware(hw_name)
    fused = op_cost(fa(1, h, s, 128), hw)
    unfused = op_cost(fa(1, h, s, 128, fusion=False), hw)
    assert unfused.hbm_bytes > fused.hbm_bytes
    fused_busy_s = fused.duration_s - hw.launch.mix_kernel_launch_latency_s
    unfused_busy_s = unfused.duration_s - 3 * hw.launch.kernel_launch_latency_s
    if h * -(-s // 128) >= hw.ai_core.count:
        assert unfused_busy_s > fused_busy_s
    else:
        assert unfused_busy_s > 0.99 * fused_busy_s


VECTOR_OPS = sorted(VECTOR_PROFILES)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(HARDWARE), st.sampled_from(VECTOR_OPS), st.integers(1, 1 << 26), st.integers(1, 1 << 20))
def test_vector_ops_roofline_and_monotone(hw_name, op, n, extra) -> None:
    hw = load_hardware(hw_name)
    small = op_cost(OpSpec(op, ((n,),), "fp16"), hw)
    large = op_cost(OpSpec(op, ((n + extra,),), "fp16"), hw)
    assert math.isfinite(small.duration_s) and small.duration_s > 0
    assert small.duration_s >= small.hbm_bytes / hw.memory.hbm_bandwidth_bytes_per_s
    assert large.duration_s >= small.duration_s


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(HARDWARE), st.sampled_from(VECTOR_OPS), st.integers(1, 1 << 24),
       st.sampled_from(["fp16", "bf16", "fp32"]))
def test_explicit_bytes_of_the_profiles_own_traffic_cost_the_same(hw_name, op, n, dtype) -> None:
    """A captured op (simulator.capture) gives the bytes it reads and writes; given exactly the
    traffic the op's profile implies for n elements, the cost is the profile's own."""
    hw = load_hardware(hw_name)
    prof = VECTOR_PROFILES[op]
    elt = {"fp16": 2, "bf16": 2, "fp32": 4}[dtype]
    read_bytes, write_bytes = prof.read_elements * n * elt, prof.write_elements * n * elt
    if read_bytes + write_bytes == 0 or not float(read_bytes).is_integer() or not float(write_bytes).is_integer():
        return  # a profile moving fractions of an element has no whole-byte form to compare with
    attrs = (("read_bytes", int(read_bytes)), ("write_bytes", int(write_bytes)))
    implied = op_cost(OpSpec(op, ((n,),), dtype), hw)
    explicit = op_cost(OpSpec(op, ((n,),), dtype, attrs), hw)
    assert explicit.hbm_bytes == pytest.approx(implied.hbm_bytes)
    assert explicit.duration_s == pytest.approx(implied.duration_s, rel=1e-9)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(HARDWARE), st.sampled_from([*VECTOR_OPS, "aten::cumsum"]), st.integers(1, 1 << 24),
       st.integers(0, 1 << 26), st.integers(0, 1 << 26), st.integers(1, 1 << 24))
def test_explicit_bytes_more_traffic_never_less_time(hw_name, op, n, read_bytes, write_bytes, extra) -> None:
    """Vector ops with explicit traffic, and generic ops (aten::*, costed from their bytes):
    finite, above the HBM roofline of the bytes they move, monotone in those bytes."""
    hw = load_hardware(hw_name)
    if read_bytes + write_bytes == 0:
        read_bytes = 1
    base = op_cost(OpSpec(op, ((n,),), "fp16", (("read_bytes", read_bytes), ("write_bytes", write_bytes))), hw)
    more = op_cost(OpSpec(op, ((n,),), "fp16", (("read_bytes", read_bytes + extra), ("write_bytes", write_bytes))), hw)
    assert math.isfinite(base.duration_s) and base.duration_s > 0
    assert base.duration_s >= (read_bytes + write_bytes) / hw.memory.hbm_bandwidth_bytes_per_s * (1 - 1e-9)
    # up to what the overlap of the kernel's units may hide: more bytes read lengthen the read
    # queue (MTE2) and so the time the write queue and the Vector unit overlap with it; Hypothesis
    # found 183 more bytes read (of 4 MiB written) 1.7e-11 s faster, within that overlap
    assert more.duration_s >= base.duration_s - base.overlappable_s


def _vector_cycles_per_element(spec: OpSpec, hw, compute_dtype: str) -> float:
    """The Vector unit's cycles per element of a Vector kernel spread evenly over every core: its
    busy time per block (``vec_ratio`` is a share of all cores' time) at the unit's rate."""
    cost = op_cost(spec, hw)
    cores = hw.ai_core.vector_core_count
    assert cost.block_dim == cores
    per_block_s = cost.vec_ratio * cores * cost.duration_s / cost.block_dim
    rate = hw.vector_ops_per_cycle(compute_dtype) * hw.ai_core.clock_hz * hw.vector_unit.efficiency_frac
    return per_block_s * rate / (math.prod(spec.shapes[0]) / cores)


def test_vector_mixes_count_the_instructions_of_canns_kernels() -> None:
    """RmsNorm, RotaryPositionEmbedding and Add as CANN's kernels run them on the 910B (the
    derivations are beside the mixes in simulator/vector_profiles.py), in one-cycle instructions
    per element of the dtype they compute in: RmsNorm on bf16 casts x, squares it (mul), folds the
    row sum (add), broadcasts rstd (a move, counted as cast), multiplies by it and by gamma and
    casts back: 3 cast + 3 mul + 1 add = 7 in fp32 (it was 3 mul + 1 two-cycle reduce = 5).
    RotaryPositionEmbedding: cast, rotate-half copy, 2 mul, add, cast = 6 in fp32 (was 3). Add on
    bf16 casts both inputs and the output around one fp32 add: 4 in fp32 (was 1 in bf16); fp32 +
    bf16 -> fp32 (the replay's cast_elements = 1): 2 in fp32; fp32 and fp16 adds add natively."""
    hw = load_hardware("ascend910b4")
    n = hw.ai_core.vector_core_count * 64 * 1024  # whole 32-byte blocks on every core
    shape = ((n // 1024, 1024),)
    cases = [
        (OpSpec("RmsNorm", shape, "bf16"), "fp32", 7.0),
        (OpSpec("RotaryPositionEmbedding", shape, "bf16"), "fp32", 6.0),
        (OpSpec("Add", shape, "bf16"), "fp32", 4.0),
        (OpSpec("Add", shape, "fp32", (("cast_elements", 1.0), ("read_bytes", 6 * n), ("write_bytes", 4 * n))),
         "fp32", 2.0),
        (OpSpec("Add", shape, "fp32"), "fp32", 1.0),
        (OpSpec("Add", shape, "fp16"), "fp16", 1.0),
    ]
    for spec, compute_dtype, cycles in cases:
        assert _vector_cycles_per_element(spec, hw, compute_dtype) == pytest.approx(cycles), spec
    # an all-bf16 Add given its bytes casts every element it reads and writes, as without them
    explicit = OpSpec("Add", shape, "bf16", (("read_bytes", 4 * n), ("write_bytes", 2 * n)))
    assert _vector_cycles_per_element(explicit, hw, "fp32") == pytest.approx(4.0)
    with pytest.raises(ValueError, match="cast_elements must be a number >= 0"):
        op_cost(OpSpec("Add", shape, "fp32", (("cast_elements", -1.0),)), hw)


def test_a_generic_op_needs_its_bytes() -> None:
    with pytest.raises(ValueError, match="aten::cumsum: a generic op needs attributes read_bytes and write_bytes"):
        op_cost(OpSpec("aten::cumsum", ((16,),), "fp16"), A910)
    with pytest.raises(KeyError, match="no cost model for op type 'Cumsum'"):
        op_cost(OpSpec("Cumsum", ((16,),), "fp16"), A910)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(HARDWARE), st.sampled_from(["AllReduce", "AllGather", "ReduceScatter"]),
       st.integers(2, 16), st.integers(1, 1 << 28), st.integers(1, 1 << 24))
def test_collectives_more_bytes_never_less_time(hw_name, op, p, n, extra) -> None:
    hw = load_hardware(hw_name)
    ranks = (("ranks", tuple(range(p))),)
    small = op_cost(OpSpec(op, ((n,),), "fp16", ranks), hw)
    large = op_cost(OpSpec(op, ((n + extra,),), "fp16", ranks), hw)
    assert math.isfinite(small.duration_s) and small.duration_s > 0
    assert large.duration_s >= small.duration_s


def conv(op, n, cin, hw_px, cout, k, stride):
    pad = k // 2
    ho, wo = conv_output_hw(hw_px, hw_px, k, k, stride, pad)
    attrs = {"stride": stride, "padding": pad}
    if op == "Conv2D":
        shapes = ((n, cin, hw_px, hw_px), (cout, cin, k, k))
    elif op == "Conv2DBackpropInput":
        shapes, attrs["input_hw"] = ((n, cout, ho, wo), (cout, cin, k, k)), (hw_px, hw_px)
    else:
        shapes, attrs["kernel_hw"] = ((n, cin, hw_px, hw_px), (n, cout, ho, wo)), (k, k)
    return OpSpec(op, shapes, "fp16", tuple(sorted(attrs.items())))


CONV_OPS = ["Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"]
channels = st.integers(1, 1024)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(HARDWARE), st.sampled_from(CONV_OPS), st.integers(1, 64), channels, st.integers(7, 112),
       channels, st.sampled_from([1, 3, 7]), st.sampled_from([1, 2]), st.sampled_from(["n", "cin", "cout"]),
       st.integers(1, 64))
def test_convolutions_roofline_finite_and_monotone(hw_name, op, n, cin, px, cout, k, stride, axis, extra) -> None:
    hw = load_hardware(hw_name)
    cost = op_cost(conv(op, n, cin, px, cout, k, stride), hw)
    assert math.isfinite(cost.duration_s) and cost.duration_s > 0
    assert cost.duration_s >= roofline_s(cost, hw)
    bigger = {"n": (n + extra, cin, cout), "cin": (n, cin + extra, cout), "cout": (n, cin, cout + extra)}[axis]
    larger = op_cost(conv(op, bigger[0], bigger[1], px, bigger[2], k, stride), hw)
    assert larger.duration_s >= cost.duration_s
    assert larger.flop >= cost.flop


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(HARDWARE), st.sampled_from(["Embedding", "EmbeddingDenseGrad"]), st.integers(1, 1 << 16),
       st.integers(1, 8192), st.integers(1, 4096))
def test_embedding_finite_roofline_and_monotone(hw_name, op, tokens, hidden, extra) -> None:
    hw = load_hardware(hw_name)
    small = op_cost(OpSpec(op, ((tokens,), (32000, hidden)), "fp16"), hw)
    large = op_cost(OpSpec(op, ((tokens + extra,), (32000, hidden)), "fp16"), hw)
    assert math.isfinite(small.duration_s) and small.duration_s > 0
    assert small.duration_s >= small.hbm_bytes / hw.memory.hbm_bandwidth_bytes_per_s
    assert large.duration_s >= small.duration_s


def test_conv_golden_flop_and_channel_padding() -> None:
    # ResNet-50's stem on 910A: 7x7 stride 2, 3 -> 64 channels, 224 -> 112 pixels. FLOP
    # counted as issued to the Cube: the 3 input channels pad to C0 = 16 in NC1HWC0, so the
    # reduction axis is 16 * 49 = 784 (not 147): 2 * (1 * 112 * 112) * 784 * 64 = 1,258,815,488.
    cost = op_cost(conv("Conv2D", 1, 3, 224, 64, 7, 2), A910)
    assert cost.flop == 2 * 112 * 112 * 784 * 64


parts = st.lists(st.floats(0, 1e-3, allow_nan=False), min_size=1, max_size=3)


@given(parts, st.integers(1, 8), st.floats(1, 64))
def test_pipeline_bounds_and_more_stages_never_slower(p, stages, iterations) -> None:
    t = pipelined_time_s(tuple(p), stages, iterations)
    assert max(p) * (1 - 1e-12) <= t <= sum(p) * (1 + 1e-12)
    assert pipelined_time_s(tuple(p), stages + 1, iterations) <= t * (1 + 1e-12)
    assert pipelined_time_s(tuple(p), 1, iterations) == pytest.approx(sum(p))


# -- invalid input ------------------------------------------------------------------------------


def test_flash_attention_block_that_does_not_fit_l1_is_named() -> None:
    # Q block 1024x128 + 4 stages x (K + V) blocks of 1024x128, fp16 = 2.25 MiB > 1 MiB L1.
    with pytest.raises(ValueError, match=r"FlashAttention: block_size=1024, head_dim=128, pipeline_stages=4 need 2359296 bytes of L1 per AI Core; ascend910 has 1048576"):
        op_cost(fa(1, 8, 4096, 128, block=1024, stages=4), A910)


def test_unsupported_dtype_on_cube_is_named() -> None:
    with pytest.raises(ValueError, match="the Cube unit of ascend910 has no bf16 rate"):
        op_cost(mm(64, 64, 64, dtype="bf16"), A910)


def test_unknown_op_type() -> None:
    with pytest.raises(KeyError, match="no cost model for op type 'Conv9D'"):
        op_cost(OpSpec("Conv9D", ((1,),), "fp16"), A910)


def test_pipeline_rejects_zero_stages() -> None:
    with pytest.raises(ValueError, match="pipeline_stages must be >= 1"):
        pipelined_time_s((1.0,), 0)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(HARDWARE), st.integers(1, 8), seq, st.integers(1, 512), st.booleans(),
       st.sampled_from(["FlashAttention", "FlashAttentionGrad"]))
def test_flash_attention_flop_grow_with_the_sequence(hw_name, h, s, extra, causal, op) -> None:
    # Regression: causal FLOP were counted per block, so S = 1024 -> 1025 lost 1% of the FLOP.
    hw = load_hardware(hw_name)
    short = op_cost(fa(1, h, s, 128, causal=causal, op=op), hw).flop
    assert op_cost(fa(1, h, s + extra, 128, causal=causal, op=op), hw).flop > short


def test_causal_flop_golden() -> None:
    # Forward: QK^T and PV, 2 FLOP per multiply-add each: 4 * D FLOP per (query, key) pair;
    # causal S = 1024 keeps S (S + 1) / 2 = 524,800 pairs: 4 * 128 * 524,800 per head.
    assert op_cost(fa(1, 1, 1024, 128, causal=True), A910).flop == 4 * 128 * 524_800


def _fa_spec(op: str, fusion: bool = True) -> OpSpec:
    # The LLM profile's attention shape: one micro-batch, 16 heads of 128, S = 4096, causal.
    shape = (1, 16, 4096, 128)
    attrs = tuple(sorted({"block_size": 128, "pipeline_stages": 2, "fusion": fusion, "causal": True}.items()))
    return OpSpec(op, (shape, shape, shape), "bf16", attrs)


@pytest.mark.parametrize("op, handoff_bytes_per_score", [("FlashAttention", 8), ("FlashAttentionGrad", 20)])
def test_flash_attention_on_a_split_chip_pays_the_fixpipe_hand_off(op, handoff_bytes_per_score) -> None:
    # Regression test (issue 23): the split 910B hands every fp32 score block (and the fp32 partial
    # outputs) from the Cube core's L0C to global memory through its FixPipe; the model did not
    # charge it, and simulated the real FlashAttentionScore(Grad) kernels 32% and 64% short.
    # Forward: S and the PV partial, (128 x 128 + 128 x 128) x 4 B per 128 x 128 block pair = 8 B
    # per score element; backward: S, dP and the dQ, dK, dV partials = 20 B per score element.
    hw = load_hardware("ascend910b4")
    without = hw.model_copy(update={"cube_unit": hw.cube_unit.model_copy(
        update={"fixpipe_bytes_per_cycle_per_core": None})})
    cost, bare = op_cost(_fa_spec(op), hw), op_cost(_fa_spec(op), without)
    # per Cube core: 16 heads x 32 Q blocks over 20 cores = 26 waves of 16.5 causal pairs each
    fixpipe_s = 26 * 16.5 * handoff_bytes_per_score * 128 * 128 / (86 * 1.65e9)
    assert fixpipe_s > bare.duration_s / 2  # the hand-off is a stage as long as the others ...
    assert cost.duration_s >= fixpipe_s  # ... and the kernel cannot beat its own FixPipe
    assert cost.duration_s > bare.duration_s * 1.1
    # the unfused kernels round-trip S and P through HBM already: nothing more to charge
    assert op_cost(_fa_spec(op, fusion=False), hw) == op_cost(_fa_spec(op, fusion=False), without)
