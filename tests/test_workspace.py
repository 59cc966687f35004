"""Operator workspaces: CANN's fused attention kernels ask for device workspace, which torch_npu's
default task queue takes from the caching allocator right before the kernel and frees after it.
Golden values are derived from the tiling formulas cited in the hardware files' ``workspace``
group; the derivation of each is in its comment."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import simulator
from simulator.costs import OpSpec, op_workspace_bytes
from simulator.hardware import list_hardware, load_hardware
from simulator.units import MiB

B2 = load_hardware("ascend910b")
A910 = load_hardware("ascend910")


def _fa(op_type: str, b: int, n: int, s: int, d: int, hw=B2, *, n_kv: int | None = None, dtype: str = "bf16",
        fusion: bool = True) -> int:
    q, kv = (b, n, s, d), (b, n if n_kv is None else n_kv, s, d)
    shapes = (q, kv, kv) if op_type == "FlashAttention" else (q, kv, kv, q)
    return op_workspace_bytes(OpSpec(op_type, shapes, dtype, (("fusion", fusion),)), hw)


def test_flash_attention_forward_workspace_golden() -> None:
    # per vector core: score blocks 8 x 128 x 128 x 4 B = 524,288 B, two copies (S % 64 == 0)
    # = 1,048,576 B, plus 4 output buffers of 128 x 128 x 4 B = 262,144 B; x 48 vector cores
    # (910B2) = 62,914,560 B, plus the 16 MiB reserve = 79,691,776 B
    assert _fa("FlashAttention", 1, 32, 4608, 128) == 79_691_776
    # S = 4,600 is not a multiple of 64: three score copies, (1,572,864 + 262,144) x 48 + 16 MiB
    assert _fa("FlashAttention", 1, 32, 4600, 128) == 104_857_600
    # the 910A's 32 vector units: (1,048,576 + 262,144) x 32 + 16 MiB
    assert _fa("FlashAttention", 1, 32, 4608, 128, A910) == 58_720_256


def test_flash_attention_grad_workspace_golden() -> None:
    # Each part is placed at (offset + size + 512) // 512 x 512, from the 64 KiB sync buffer:
    # dq, dk, dv fp32 (32 x 4,608 x 128 x 4 = 75,497,472 B each) -> 75,563,520, 151,061,504,
    # 226,559,488; + softmax gradient 32 x 32 x 4,608 = 4,718,592 (already 512-aligned)
    # -> 231,278,080; + 48 cores x 512 x 512 x 4 x 2 = 100,663,296 -> 331,941,888, + 20 MiB
    # = 352,913,408; + sink 32 x 4,608 x 4,608 / 8,192 x 4 = 331,776 -> 353,245,696, + 20 MiB
    # = 374,217,216; + 4 B -> 374,217,728, + 20 MiB = 395,189,248
    assert _fa("FlashAttentionGrad", 1, 32, 4608, 128) == 395_189_248
    # grouped-query attention, 8 kv heads: dk and dv are 18,874,368 B each -> 75,563,520,
    # 94,438,400, 113,313,280; + 4,718,592 -> 118,031,872; + blocks -> 218,695,680, + 20 MiB
    # = 239,667,200; + sink (query heads) -> 239,999,488, + 20 MiB = 260,971,008; + 4 B
    # -> 260,971,520, + 20 MiB = 281,943,040
    assert _fa("FlashAttentionGrad", 1, 32, 4608, 128, n_kv=8) == 281_943_040


@given(s=st.integers(2048, 32768), extra=st.integers(1, 4096), n=st.integers(1, 64))
def test_grad_workspace_grows_with_the_sequence_and_forward_does_not(s: int, extra: int, n: int) -> None:
    assert _fa("FlashAttentionGrad", 1, n, s + extra, 128) > _fa("FlashAttentionGrad", 1, n, s, 128)
    aligned = 64 * (s // 64)
    assert _fa("FlashAttention", 1, n, aligned, 128) == _fa("FlashAttention", 2, n, aligned + 64 * extra, 128)


def test_no_workspace_model_outside_the_templates() -> None:
    assert op_workspace_bytes(OpSpec("MatMul", ((1, 64, 64), (1, 64, 64)), "fp16"), B2) == 0
    bare = B2.model_copy(update={"workspace": None})
    assert _fa("FlashAttentionGrad", 1, 32, 4608, 128, bare) == 0
    assert _fa("FlashAttention", 1, 32, 1024, 128) == 0  # another template serves S_kv <= 1,024
    assert _fa("FlashAttention", 1, 32, 4096, 64) == 0  # and head dims up to 64
    assert _fa("FlashAttentionGrad", 1, 32, 1024, 128) == 0  # 512 x 512 blocks from 2,048 tokens
    assert _fa("FlashAttention", 1, 32, 4096, 128, dtype="fp32") == 0
    assert _fa("FlashAttention", 1, 32, 4096, 128, fusion=False) == 0  # three separate kernels


@pytest.mark.parametrize("name", list_hardware())
def test_every_bundled_hardware_file_models_workspaces(name: str) -> None:
    assert load_hardware(name).workspace is not None


def test_the_workspace_is_allocated_after_the_output_and_freed_after_the_kernel() -> None:
    def work(npu):
        q = npu.tensor((1, 32, 4608, 128), "bf16")
        npu.flash_attention(q, q, q)

    profile = simulator.run(work, hardware="ascend910b", memory=True)
    events = [(e.action, e.requested_bytes) for e in profile.memory_events]
    q_bytes = 32 * 4608 * 128 * 2
    # q, the output, then the workspace, freed at once; q and the output go at the step's end
    assert events[:4] == [("alloc", q_bytes), ("alloc", q_bytes), ("alloc", 79_691_776), ("free", 79_691_776)]
    (step,) = profile.memory
    # each block is the request + 32 B rounded up to 512 B: 37,749,248 and 79,692,288 B
    assert step.allocated_peak_bytes == 2 * 37_749_248 + 79_692_288


def test_the_grad_workspace_comes_after_its_three_outputs() -> None:
    def work(npu):
        q = npu.tensor((1, 8, 2048, 128), "bf16")
        npu.flash_attention_grad(q, q, q, q)

    profile = simulator.run(work, hardware="ascend910b", memory=True)
    q_bytes = 8 * 2048 * 128 * 2
    workspace = _fa("FlashAttentionGrad", 1, 8, 2048, 128)
    assert [(e.action, e.requested_bytes) for e in profile.memory_events][:6] == [
        ("alloc", q_bytes), ("alloc", q_bytes), ("alloc", q_bytes), ("alloc", q_bytes),
        ("alloc", workspace), ("free", workspace)]


def test_the_unfused_path_takes_no_workspace() -> None:
    def work(npu):
        q = npu.tensor((1, 32, 4608, 128), "bf16")
        npu.flash_attention(q, q, q, fusion=False)

    profile = simulator.run(work, hardware="ascend910b", memory=True)
    assert 79_691_776 not in [e.requested_bytes for e in profile.memory_events]


def test_a_workspace_that_does_not_fit_flushes_the_cache_before_flash_attention() -> None:
    hw = A910
    # the workspace, (1,048,576 + 262,144) x 32 + 16 MiB = 56 MiB on the 910A, is larger than
    # every cached block (32 MiB)
    assert _fa("FlashAttention", 1, 8, 2048, 128, hw, dtype="fp16") == 58_720_256
    block = 32 * MiB

    def work(npu):
        q = npu.tensor((1, 8, 2048, 128))  # 4 MiB: a 20 MiB segment, shared with the output
        fill = []
        while npu.allocator.stats().reserved_bytes + block <= npu.allocator.capacity_bytes:
            fill.append(npu.tensor((block // 2,)))
        del fill  # every 32 MiB segment cached, unsplit; the device is full
        npu.flash_attention(q, q, q, name="attn")

    profile = simulator.run(work, memory=True)
    (attn,) = [op for op in profile.ops if op.name == "attn"]
    # the output fits the cache (it splits the q segment); the workspace finds no block, no room
    # for a segment, so the allocator synchronises, frees its unsplit cache and retries
    assert attn.alloc_retries == 1
    assert attn.device_frees > 900
    assert attn.alloc_stall_s >= attn.device_frees * hw.allocator.device_free_latency_s
