"""Model builders: real models from their published architectures, as workloads."""

from .llama import LLAMA2_7B, LLAMA2_13B, LLAMA2_70B, LlamaConfig, ParallelLayout, training_step

__all__ = ["LLAMA2_7B", "LLAMA2_13B", "LLAMA2_70B", "LlamaConfig", "ParallelLayout", "training_step"]
