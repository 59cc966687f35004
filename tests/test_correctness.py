"""Values on the simulated NPU (npu.from_numpy) and the fatal correctness rules: nan-inf,
fp16-overflow, shape-mismatch, out-of-bounds. Each rule fires on a small workload built to show
it, stays silent on a healthy one, and names the op and the line of user code."""

from __future__ import annotations

import numpy as np
import pytest

import simulator
from pytest_oam.rules import run_rules
from simulator import ShapeError
from simulator.hardware import load_hardware
from simulator.numerics import round_bf16
from simulator.runtime import recost

A910 = load_hardware("ascend910")
HERE = __file__.rsplit("/", 1)[-1]


def fatal(workload, rule_id, **kwargs):
    """The findings of ``rule_id`` on a run of ``workload``; every one must be fatal."""
    found = [f for f in run_rules(simulator.run(workload, **kwargs), A910) if f.rule_id == rule_id]
    assert all(f.severity == "fatal" for f in found), found
    return found


# -- values ----------------------------------------------------------------------------------------


def test_from_numpy_converts_as_the_host_does() -> None:
    def work(npu):
        # fp16 spacing at 1 is 2**-10: 1 + 2**-12 rounds to 1; 1e5 is beyond 65504: Inf on the host
        half = npu.to_numpy(npu.from_numpy(np.array([1 + 2**-12, 1e5, -2.5]), "fp16"))
        assert half.dtype == np.float16 and half.tolist() == [1.0, np.inf, -2.5]
        # bf16 keeps 7 mantissa bits (spacing 2**-7 at 1). 1 + 2**-8 is halfway between 1 and
        # 1 + 2**-7: ties to even gives 1. 1 + 3 * 2**-8 is halfway between 1 + 2**-7 (odd last
        # bit) and 1 + 2**-6 (even): 1 + 2**-6. 1 + 2**-8 + 2**-20 is above halfway: 1 + 2**-7.
        bf = npu.to_numpy(npu.from_numpy(np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20]), "bf16"))
        assert bf.dtype == np.float32 and bf.tolist() == [1.0, 1 + 2**-6, 1 + 2**-7]
        assert npu.to_numpy(npu.from_numpy(np.array([[2.9, -2.9]]), "int32")).tolist() == [[2, -2]]

    simulator.run(work)


def test_round_bf16_keeps_nan_and_overflows_to_inf() -> None:
    fp32_max = np.finfo(np.float32).max  # above bf16's largest, 0x7F7F0000: rounds up to Inf
    out = round_bf16(np.array([np.nan, fp32_max, -fp32_max, np.inf], dtype=np.float32))
    assert np.isnan(out[0]) and out[1:].tolist() == [np.inf, -np.inf, np.inf]


def test_from_numpy_and_to_numpy_errors() -> None:
    def work(npu):
        with pytest.raises(ShapeError, match="dtype 'int8' cannot carry data; use one of fp16, bf16, fp32, int32"):
            npu.from_numpy(np.ones(4), "int8")
        with pytest.raises(ShapeError, match="array must hold numbers, got numpy dtype <U1"):
            npu.from_numpy(np.array(["a"]))
        with pytest.raises(ShapeError, match="must hold positive integers"):
            npu.from_numpy(np.float32(1.0))  # no axis
        with pytest.raises(ValueError, match=r"Tensor\(\[4\], fp16\) carries no data"):
            npu.to_numpy(npu.tensor((4,)))

    simulator.run(work)


def test_ops_compute_in_fp32_and_store_in_the_output_dtype() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 64)), rng.standard_normal((64, 32))
    w = rng.standard_normal(64)

    a16, b16 = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)

    def work(npu):
        ta, tw = npu.from_numpy(a, "fp32"), npu.from_numpy(w, "fp32")
        # the 910's Cube unit has no fp32 rate: the matmul runs on fp16 operands, accumulates in
        # fp32 and rounds once to fp16 (relative spacing 2**-10 ~ 1e-3; the order of the sum may
        # move the last bit)
        got = npu.to_numpy(npu.matmul(npu.from_numpy(a, "fp16"), npu.from_numpy(b, "fp16")))
        assert got.dtype == np.float16
        np.testing.assert_allclose(got, (a16 @ b16).astype(np.float16), rtol=2**-10, atol=2**-14)
        e = np.exp(a - a.max(axis=-1, keepdims=True))
        np.testing.assert_allclose(npu.to_numpy(npu.softmax(ta)), e / e.sum(axis=-1, keepdims=True), rtol=1e-5)
        np.testing.assert_allclose(npu.to_numpy(npu.silu(ta)), a / (1 + np.exp(-a)), rtol=1e-5)
        rms = a / np.sqrt((a * a).mean(axis=-1, keepdims=True) + 1e-5) * w
        np.testing.assert_allclose(npu.to_numpy(npu.rms_norm(ta, tw)), rms, rtol=1e-4)
        np.testing.assert_allclose(npu.to_numpy(npu.add(ta, tw)), a + w, rtol=1e-6, atol=1e-6)
        assert npu.to_numpy(npu.cast(ta, "fp16")).dtype == np.float16
        # an input without data, or an op with no reference kernel: a result without data
        assert npu.matmul(npu.from_numpy(a), npu.tensor((64, 32))).data is None
        assert npu.rotary_embedding(ta).data is None

    profile = simulator.run(work)
    assert profile.ops[0].checks.output_shape == [2, 3, 32] and profile.ops[0].checks.saturated_count == 0

    def bf16(npu):  # the 910B's Cube unit has a bf16 rate: results are bf16-rounded float32
        out = npu.to_numpy(npu.matmul(npu.from_numpy(a, "bf16"), npu.from_numpy(b, "bf16")))
        assert out.dtype == np.float32 and np.array_equal(round_bf16(out), out)

    simulator.run(bf16, hardware="ascend910b")
    # the two calls without values record nothing
    assert [op.checks for op in profile.ops[-2:]] == [None, None]


def test_flash_attention_reference_with_causal_mask_and_grouped_heads() -> None:
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((1, 4, 3, 16)), rng.standard_normal((1, 2, 5, 16)), rng.standard_normal((1, 2, 5, 16))

    def reference(causal):
        kk, vv = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)  # 4 query heads over 2 kv heads
        s = q @ np.swapaxes(kk, -1, -2) / 4.0  # sqrt(16)
        if causal:  # query i of 3 sees keys j <= i + (5 - 3)
            s = np.where(np.arange(5)[None, :] <= np.arange(3)[:, None] + 2, s, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return p / p.sum(axis=-1, keepdims=True) @ vv

    def work(npu):
        tq, tk, tv = (npu.from_numpy(x, "fp16") for x in (q, k, v))
        for causal in (False, True):
            # inputs rounded to fp16 (relative 2**-11) and the output too: a few fp16 ulps
            np.testing.assert_allclose(npu.to_numpy(npu.flash_attention(tq, tk, tv, causal=causal)),
                                       reference(causal), rtol=4e-3, atol=4e-3)

    simulator.run(work)


def test_fp16_saturates_at_65504_and_counts_it() -> None:
    def work(npu):
        # fp16 holds 65504, then 65536 is Inf; halfway, 65520, rounds to even (Inf): an overflow;
        # 65519 rounds down to 65504: no overflow.
        x = npu.from_numpy(np.array([65519.0, 65520.0, -70000.0, 1.0]), "fp32")
        out = npu.cast(x, "fp16")
        assert npu.to_numpy(out).tolist() == [65504.0, 65504.0, -65504.0, 1.0]
        y = npu.from_numpy(np.array([np.inf, 0.0, 1.0]), "fp16")
        npu.mul(y, npu.from_numpy(np.array([1.0, np.inf, 2.0]), "fp16"))  # Inf, 0 x Inf = NaN, 2

    cast, mul = simulator.run(work).ops
    assert (cast.checks.saturated_count, cast.checks.max_abs_value, cast.checks.inf_count) == (2, 70000.0, 0)
    assert (mul.checks.inf_count, mul.checks.nan_count, mul.checks.max_abs_value) == (1, 1, 2.0)


def test_checks_survive_recost_and_focus() -> None:
    def work(npu):
        x = npu.from_numpy(np.full((16, 16), 1e5), "fp32")
        npu.cast(x, "fp16")
        q = npu.tensor((1, 8, 1024, 128))
        npu.flash_attention(q, q, q)

    profile = simulator.run(work)
    assert recost(profile, "ascend910b").ops[0].checks == profile.ops[0].checks
    # focused on FlashAttention with no context, the Cast is kept for its checks
    assert [op.op_type for op in profile.focused("FlashAttention", 0).ops] == ["Cast", "FlashAttention"]


# -- the rules ---------------------------------------------------------------------------------------


def test_fp16_overflow() -> None:
    def work(npu, scale=300.0):
        a = npu.from_numpy(np.full((4, 64), scale), "fp16")
        b = npu.from_numpy(np.full((64, 8), 10.0), "fp16")
        npu.matmul(a, b, name="proj")  # line asserted below

    (f,) = fatal(work, "fp16-overflow")
    assert (f.op_type, f.op_name) == ("MatMul", "proj")
    assert f.location.endswith(f"{HERE}:{work.__code__.co_firstlineno + 3}")
    # every element is 64 x 300 x 10 = 192000 > 65504, 192000 / 65504 = 2.93x; 4 x 8 = 32 elements
    assert "32 of 32 elements of its fp16 output [4, 8] overflowed" in f.description
    assert "largest |value| 192000 before the cast, 2.93x the fp16 limit" in f.description
    assert fatal(work, "fp16-overflow", scale=1.0) == []  # 64 x 1 x 10 = 640 fits


def test_nan_inf_reports_the_first_op_that_produced_them() -> None:
    def work(npu, first=np.inf):
        x = npu.from_numpy(np.array([[first, 1.0, 2.0, 3.0]]), "fp32")
        p = npu.softmax(x)  # exp(Inf - Inf): NaN
        npu.add(p, p)

    (f,) = fatal(work, "nan-inf")
    assert (f.op_type, f.op_name) == ("Softmax", "Softmax")
    assert f.location.endswith(f"{HERE}:{work.__code__.co_firstlineno + 2}")
    # the max is Inf, so every exp(x - max) is exp(-Inf) = 0 or exp(NaN): 1 NaN and 3 zeros,
    # and 0 / NaN-sum makes all 4 NaN; the Add carries them on
    assert "produced 4 NaN and 0 Inf of 4 elements" in f.description
    assert "later op calls that carry them on: 1, at 1 call sites" in f.description
    assert fatal(work, "nan-inf", first=0.0) == []


def test_shape_mismatch() -> None:
    def work(npu, declared=(8, 4)):
        a, w = npu.tensor((4, 64)), npu.tensor((8, 64))
        y = npu.matmul(a, w, transpose_b=True)
        npu.expect_shape(y, declared)

    (f,) = fatal(work, "shape-mismatch")
    assert f.op_type == "MatMul" and f.location.endswith(f"{HERE}:{work.__code__.co_firstlineno + 2}")
    assert "returns [4, 8] (32 elements) but the workload declared [8, 4] (32 elements)" in f.description
    assert fatal(work, "shape-mismatch", declared=(4, 8)) == []


def test_expect_shape_needs_an_op_output() -> None:
    def work(npu):
        with pytest.raises(ValueError, match="was not produced by an operator of this NPU"):
            npu.expect_shape(npu.tensor((4,)), (4,))

    simulator.run(work)


def test_out_of_bounds() -> None:
    def work(npu, offset=200):
        x = npu.from_numpy(np.arange(256.0).reshape(4, 64), "fp32")
        v = npu.view(x, offset, (8, 8), name="tail")
        return v

    (f,) = fatal(work, "out-of-bounds", memory=True)
    assert (f.op_type, f.op_name) == ("View", "tail")
    assert f.location.endswith(f"{HERE}:{work.__code__.co_firstlineno + 2}")
    # 200 + 64 = 264 elements against 4 x 64 = 256: 8 past the end
    assert "a [8, 8] view (64 elements) at offset 200 into a [4, 64] tensor of 256 elements reaches 8 " in f.description
    assert fatal(work, "out-of-bounds", offset=192) == []  # 192 + 64 = 256: the last 64 elements exactly

    def in_bounds(npu):
        x = npu.from_numpy(np.arange(256.0).reshape(4, 64), "fp32")
        assert npu.to_numpy(npu.view(x, 192, (8, 8))).ravel().tolist() == list(range(192, 256))
        assert npu.view(x, 200, (8, 8)).data is None  # past the end there are no values

    profile = simulator.run(in_bounds)
    assert [op.duration_s for op in profile.ops] == [0.0, 0.0]  # a view runs no kernel


def test_healthy_value_workload_is_quiet() -> None:
    rng = np.random.default_rng(2)

    def work(npu):
        x = npu.from_numpy(rng.standard_normal((2, 128, 256)), "fp16")
        w = npu.from_numpy(rng.standard_normal((256, 256)) / 16, "fp16")
        h = npu.rms_norm(x, npu.from_numpy(np.ones(256), "fp16"))
        y = npu.expect_shape(npu.matmul(h, w), (2, 128, 256))
        npu.gelu(npu.add(y, x))
        npu.softmax(npu.view(y, 0, (256, 256)))

    assert run_rules(simulator.run(work, devices=1), A910) == []


# -- in the plugin ---------------------------------------------------------------------------------

OVERFLOW_SUITE = """
import numpy as np

def overflow(npu):
    a = npu.from_numpy(np.full((16, 64), 300.0), "fp16")
    npu.matmul(a, npu.from_numpy(np.full((64, 16), 10.0), "fp16"), name="scores")

def test_overflow(oam_profile):
    oam_profile.run(overflow)

def test_fits(oam_profile):
    oam_profile.run(lambda npu: npu.add(npu.from_numpy(np.ones((16, 16))), npu.from_numpy(np.ones((16, 16)))))
"""


def test_plugin_fails_an_overflowing_test_without_a_baseline(pytester) -> None:
    pytester.makepyfile(test_suite=OVERFLOW_SUITE)
    result = pytester.runpytest()  # no --oam-baseline
    result.assert_outcomes(passed=1, failed=1)
    # pytester strips the suite's leading newline: the matmul is on line 5. Every element is
    # 64 x 300 x 10 = 192000 > 65504, 16 x 16 = 256 of them.
    result.stdout.fnmatch_lines([
        "*_ test_overflow _*",
        "oam diagnosis: 1 fatal finding in test_suite.py::test_overflow",
        "[[]fatal[]] fp16-overflow: MatMul at test_suite.py:5: scores: 256 of 256 elements of its fp16 output*",
        "*FAILED test_suite.py::test_overflow - oam diagnosis: 1 fatal finding*",
    ])
    assert "performance gate: NOT-GATED" not in result.stdout.str()  # the gate itself did not fail


# -- found by a second review --------------------------------------------------------------------

def test_a_view_of_a_view_is_bounded_by_the_allocation() -> None:
    def work(npu):
        a = npu.tensor((4, 8), "fp16")  # 32 elements
        v = npu.view(a, 0, (4,))
        npu.view(v, 2, (4,))  # elements 2..5 of a: inside
        npu.view(v, 30, (4,))  # elements 30..33 of a: 2 past the end

    inside, outside = simulator.run(work).ops[1:]
    assert inside.checks.out_of_bounds_elements == 0
    assert outside.checks.out_of_bounds_elements == 2
    (finding,) = [f for f in run_rules(simulator.run(work), A910) if f.rule_id == "out-of-bounds"]
    assert "element 30 of an allocation of 32 elements" in finding.description


def test_integer_arithmetic_is_not_modelled_and_int32_inputs_are_range_checked() -> None:
    import numpy as np

    def add(npu):
        i = npu.from_numpy(np.array([16777217, 2**30], np.int32), dtype="int32")
        out = npu.add(i, i)
        assert out.data is None  # no silently rounded float32 result
        c = npu.cast(npu.from_numpy(np.array([1e10, -3.5], np.float32), dtype="fp32"), "int32")
        assert npu.to_numpy(c).tolist() == [2**31 - 1, -3]

    profile = simulator.run(add)
    (cast,) = profile.ops_of("Cast")
    assert cast.checks.saturated_count == 1  # 1e10 does not fit in int32

    def too_big(npu):
        npu.from_numpy(np.array([2**40]), dtype="int32")

    with pytest.raises(simulator.ShapeError, match=r"from_numpy: 1 values do not fit in int32"):
        simulator.run(too_big)


def test_long_attention_is_computed_in_chunks() -> None:
    import numpy as np

    from simulator import numerics

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 300, 16)).astype(np.float32)
    k = rng.standard_normal((1, 2, 300, 16)).astype(np.float32)
    v = rng.standard_normal((1, 2, 300, 16)).astype(np.float32)
    whole = numerics._flash_attention([q, k, v], {"causal": True})
    old = numerics.ATTENTION_CHUNK_ELEMENTS
    numerics.ATTENTION_CHUNK_ELEMENTS = 2 * 300 * 7  # 7 query rows at a time
    try:
        chunked = numerics._flash_attention([q, k, v], {"causal": True})
    finally:
        numerics.ATTENTION_CHUNK_ELEMENTS = old
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-6)


def test_a_run_with_fatal_findings_is_not_saved_as_a_baseline(pytester) -> None:
    # Regression (review): --oam-save-baseline saved the numbers of a run that overflowed.
    pytester.makepyfile(test_overflow="""
import numpy as np

def overflow(npu):
    x = npu.from_numpy(np.full((4, 4), 60000.0), dtype="fp16")
    npu.add(x, x)

def test_overflow(oam_profile):
    oam_profile.run(overflow)
""")
    result = pytester.runpytest("--oam-save-baseline", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*fp16-overflow*"])
    assert not (pytester.path / "baselines").exists() or not list((pytester.path / "baselines").iterdir())


def test_out_of_bounds_copy() -> None:
    def work(npu, src_offset_bytes=4 * 200, nbytes=4 * 64):
        x = npu.from_numpy(np.arange(256.0).reshape(4, 64), "fp32")  # 1024 bytes
        y = npu.from_numpy(np.zeros((2, 64)), "fp32")  # 512 bytes
        npu.memcpy(y, x, nbytes, dst_offset_bytes=4 * 64, src_offset_bytes=src_offset_bytes, name="shard")
        return npu.to_numpy(y)

    (f,) = fatal(work, "out-of-bounds")
    assert (f.op_type, f.op_name) == ("Memcpy", "shard")
    assert f.location.endswith(f"{HERE}:{work.__code__.co_firstlineno + 3}")
    # source: bytes 800 .. 1056 of 1024, 32 past the end; destination: bytes 256 .. 512 of 512, in bounds
    assert ("a copy of 256 bytes (fp32) from byte 800 of a [4, 64] source into byte 256 of a [2, 64] destination "
            "reads 32 bytes past the end of the source's allocation of 1024 bytes") in f.description
    assert "destination's allocation" not in f.description
    # the destination overruns: bytes 256 .. 768 of 512
    (f,) = fatal(work, "out-of-bounds", src_offset_bytes=0, nbytes=512)
    assert "writes 256 bytes past the end of the destination's allocation of 512 bytes" in f.description
    assert fatal(work, "out-of-bounds", src_offset_bytes=4 * 192) == []  # bytes 768 .. 1024: the last 64 exactly

    def in_bounds(npu):
        x = npu.from_numpy(np.arange(256.0).reshape(4, 64), "fp32")
        y = npu.from_numpy(np.zeros((2, 64)), "fp32")
        row = npu.view(y, 64, (64,))  # shares y's memory
        npu.memcpy(y, x, 4 * 64, dst_offset_bytes=4 * 64, src_offset_bytes=4 * 192)
        assert npu.to_numpy(y)[0].tolist() == [0.0] * 64 and npu.to_numpy(y)[1].tolist() == list(range(192, 256))
        assert npu.to_numpy(row).tolist() == list(range(192, 256))  # the view sees the copy
        past = npu.memcpy(y, x, 4 * 64, dst_offset_bytes=4 * 96)  # writes 128 bytes past y: no values change
        assert past is y and npu.to_numpy(y)[1].tolist() == list(range(192, 256))
        # through a view the allocation underneath bounds the copy: row starts at y's byte 256
        npu.memcpy(row, x, 4 * 64, dst_offset_bytes=4)

    profile = simulator.run(in_bounds)
    copies = [op for op in profile.ops if op.op_type == "Memcpy"]
    assert [op.checks.out_of_bounds_elements for op in copies] == [0, 32, 1]
    assert copies[0].checks.output_shape == [64] and copies[0].checks.max_abs_value == 255.0
    assert copies[2].attrs["dst_offset_bytes"] == 4 and copies[2].attrs["dst_allocation_offset_bytes"] == 260


def test_memcpy_is_costed_as_a_dma_move() -> None:
    from simulator.costs import OpSpec, op_cost

    def work(npu, nbytes):
        npu.memcpy(npu.tensor((1 << 24,)), npu.tensor((1 << 24,)), nbytes)

    (small,) = simulator.run(work, nbytes=2 << 20).ops
    (large,) = simulator.run(work, nbytes=32 << 20).ops
    for op, nbytes in ((small, 2 << 20), (large, 32 << 20)):
        assert op.hbm_bytes == 2 * nbytes and op.flop == 0 and op.mac_ratio == 0 and op.vec_ratio == 0
    # more bytes never less time, and no faster than HBM allows for reading and writing them
    assert large.duration_s > small.duration_s
    assert large.duration_s >= 2 * (32 << 20) / A910.memory.hbm_bandwidth_bytes_per_s
    # the same move as an element-wise kernel that computes nothing (CANN's TensorMove)
    spec = OpSpec("Memcpy", ((1 << 24,), (1 << 24,)), "fp16", (("nbytes", 2 << 20),))
    assert op_cost(spec, A910).duration_s == small.duration_s
    with pytest.raises(ValueError, match="nbytes must be a positive whole number of fp16 elements"):
        op_cost(OpSpec("Memcpy", spec.shapes, "fp16", (("nbytes", 3),)), A910)


@pytest.mark.parametrize(("call", "message"), [
    (lambda npu, a, b: npu.memcpy(a, npu.tensor((8,), "fp32"), 4), "src is fp32 but dst is fp16"),
    (lambda npu, a, b: npu.memcpy(a, b, 3), "nbytes must be an integer > 0 and a multiple of 2"),
    (lambda npu, a, b: npu.memcpy(a, b, 0), "nbytes must be an integer > 0"),
    (lambda npu, a, b: npu.memcpy(a, b, 4, src_offset_bytes=-2), "src_offset_bytes must be an integer >= 0"),
    (lambda npu, a, b: npu.memcpy(a, b, 4, dst_offset_bytes=1.0), "dst_offset_bytes must be an integer >= 0"),
    (lambda npu, a, b: npu.memcpy(a, "b", 4), "src must be a Tensor"),
])
def test_bad_memcpy_arguments(call, message) -> None:
    def work(npu):
        with pytest.raises(ShapeError, match=message):
            call(npu, npu.tensor((8,)), npu.tensor((8,)))

    simulator.run(work)


def test_memcpy_from_a_tensor_without_values_forgets_dst_values() -> None:
    # Regression: dst kept its old values after a copy from a shape-only tensor, and a later op
    # reported an fp16 overflow computed from values that had been overwritten.
    def work(npu):
        dst = npu.from_numpy(np.full((64, 64), 300.0), "fp16")
        view = npu.view(dst, 0, (64,))
        npu.memcpy(dst, npu.tensor((64, 64), "fp16"), 8192)
        assert dst.data is None and view.data is None
        npu.matmul(dst, dst)  # 300 * 300 * 64 would overflow fp16 if the old values were used

    profile = simulator.run(work)
    assert run_rules(profile, A910) == []
