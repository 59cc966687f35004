"""Workloads of the committed tuning jobs (``oam tune tuned/jobs/JOB.toml --save tuned/knowledge_base.json``)."""


def llama7b_attention(npu, seq_len=4096, block_size=128, pipeline_stages=2, fusion=True):
    """The causal FlashAttention forward of one Llama-2-7B layer: batch 1, 32 heads of 128."""
    npu.set_tokens_per_step(seq_len)
    q = npu.tensor((1, 32, seq_len, 128))
    npu.flash_attention(q, q, q, block_size=block_size, pipeline_stages=pipeline_stages, fusion=fusion, causal=True)
