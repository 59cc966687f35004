"""MatMul sweep: square GEMMs and the projection shapes of a Llama-2-7B layer (2048 tokens)."""

import pytest

SHAPES = {
    "square-1024": (1024, 1024, 1024),
    "square-4096": (4096, 4096, 4096),
    "square-8192": (8192, 8192, 8192),
    "llama7b-qkv": (2048, 4096, 12288),
    "llama7b-o": (2048, 4096, 4096),
    "llama7b-gate-up": (2048, 4096, 22016),
    "llama7b-down": (2048, 11008, 4096),
    "skinny-decode": (16, 4096, 4096),
}


def gemm(npu, m, k, n):
    npu.matmul(npu.tensor((m, k)), npu.tensor((k, n)))


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_matmul(oam_profile, shape):
    profile = oam_profile.run(gemm, *shape)
    assert profile.op_types == ["MatMul"]
