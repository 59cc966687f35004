"""Model builders: real models from their published architectures, as workloads."""

from .layout import ParallelLayout
from .llama import (
    LLAMA2_7B,
    LLAMA2_13B,
    LLAMA2_70B,
    QWEN3_0_6B,
    RECOMPUTE_MODES,
    LlamaConfig,
    MemoryEstimate,
    memory_estimates,
    memory_per_card_bytes,
    pipeline_plan,
    training_step,
)

__all__ = [
    "LLAMA2_7B", "LLAMA2_13B", "LLAMA2_70B", "QWEN3_0_6B", "RECOMPUTE_MODES", "LlamaConfig", "MemoryEstimate", "ParallelLayout",
    "memory_estimates", "memory_per_card_bytes", "pipeline_plan", "training_step",
]
