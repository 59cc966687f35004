"""Llama-2-7B training step on an 8-card Ascend 910 server (tensor x data parallel, ZeRO-1)."""

import pytest

from simulator.models import LLAMA2_7B, training_step


@pytest.mark.oam(hardware="ascend910", devices=8)
@pytest.mark.parametrize("seq_len", [2048, 4096])
def test_llama2_7b_training_step(oam_profile, seq_len):
    profile = oam_profile.run(training_step, LLAMA2_7B, batch_size=1, seq_len=seq_len)
    # Every transformer layer runs one FlashAttention forward and one backward.
    assert len(profile.ops_of("FlashAttention")) == LLAMA2_7B.num_layers
    assert len(profile.ops_of("FlashAttentionGrad")) == LLAMA2_7B.num_layers
    assert profile.tokens_per_s > 0
