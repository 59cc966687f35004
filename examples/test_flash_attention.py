"""FlashAttention forward over sequence lengths (Llama-2-7B attention: 32 heads of 128)."""

import pytest


def attention(npu, *, batch, heads, seq_len, head_dim, causal):
    q = npu.tensor((batch, heads, seq_len, head_dim), "fp16")
    k = npu.tensor((batch, heads, seq_len, head_dim), "fp16")
    v = npu.tensor((batch, heads, seq_len, head_dim), "fp16")
    npu.flash_attention(q, k, v, block_size=128, pipeline_stages=2, causal=causal)
    npu.set_tokens_per_step(batch * seq_len)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq_len", [1024, 2048, 4096, 8192, 16384])
def test_flash_attention_forward(oam_profile, seq_len, causal):
    profile = oam_profile.run(attention, batch=1, heads=32, seq_len=seq_len, head_dim=128, causal=causal)
    assert profile.op_types == ["FlashAttention"]
