"""Your own PyTorch code, captured: Hugging Face's Llama-2-7B training step (forward, backward,
AdamW) on 8 x Ascend 910B, sharded with FSDP2, written as ordinary torch code.

No weights are ever allocated: the step runs on fake tensors (docs/torch.md). Needs torch and
transformers: the README's first command installs them (``pip install '.[examples]'``).
"""

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch example needs torch: pip install '.[examples]'")
transformers = pytest.importorskip("transformers", reason="the PyTorch example needs transformers")


def setup():
    from torch.distributed.fsdp import fully_shard

    torch.set_default_dtype(torch.bfloat16)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig())  # Llama-2-7B shapes
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), foreach=True), torch.randint(0, 32000, (1, 4096))


def train_step(model, opt, tokens):
    model(input_ids=tokens, labels=tokens).loss.backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.oam(hardware="ascend910b", devices=8)
def test_llama2_7b_fsdp2_training_step(oam_profile):
    profile = oam_profile.run_torch(train_step, setup=setup)
    # every decoder layer runs one fused attention forward and one backward
    assert len(profile.ops_of("FlashAttention")) == len(profile.ops_of("FlashAttentionGrad")) == 32
    # FSDP2 gathers each layer's parameters in forward and again in backward, and the root's once
    assert len(profile.ops_of("AllGather")) == 2 * 32 + 1
