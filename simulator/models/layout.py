"""Megatron-style parallel layouts: :class:`ParallelLayout`.

Tensor parallelism (Shoeybi et al., "Megatron-LM", 2019), pipeline parallelism in the 1F1B
schedule and its interleaved form (Narayanan et al., "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", SC 2021), sequence parallelism (Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models", MLSys 2023) and ZeRO stages 0
to 3 over data parallelism (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", SC 2020).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .llama_config import LlamaConfig

#: ZeRO stages :class:`ParallelLayout` takes: 0 nothing sharded, 1 the optimizer state, 2 the
#: gradients too, 3 the parameters too.
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class ParallelLayout:
    """Megatron-style layout: ``tensor_parallel`` x ``data_parallel`` x ``pipeline_parallel`` cards.

    Ranks are ordered as Megatron's default ``tp-dp-pp``: tensor-parallel groups are
    consecutive ranks (inside one HCCS group when they fit), data-parallel groups take every
    ``tensor_parallel``-th rank within a pipeline stage, and stage ``k`` starts at rank
    ``k * tensor_parallel * data_parallel``. ``micro_batches`` per step run in the 1F1B pipeline
    schedule (Narayanan et al., SC 2021), or one after the other with gradient accumulation
    without pipelining.

    Args:
        zero_stage: what is sharded over data parallelism (Rajbhandari et al., SC 2020): 0
            nothing (gradients all-reduced, as Megatron without ``--use-distributed-optimizer``);
            1 the fp32 optimizer state (gradients reduce-scattered, the updated parameters
            all-gathered: Megatron's distributed optimizer, the default here); 2 the gradients
            too (every micro-batch's gradients are reduce-scattered, none accumulated in full);
            3 the parameters too (each module's parameters all-gathered before its forward and
            again before its backward, one module ahead; its gradients reduce-scattered).
            Stages 2 and 3 need ``pipeline_parallel == 1`` (DeepSpeed's pipeline engine, the
            one framework that combines them, supports ZeRO stage 0 or 1 only).
        sequence_parallel: Megatron's sequence parallelism (Korthikanti et al., section 4.2.2):
            the norms, residual adds and the hidden states between the tensor-parallel regions
            are split along the sequence over the tensor-parallel group, and each
            tensor-parallel AllReduce becomes a ReduceScatter leaving that region plus an
            AllGather entering the next. Without tensor parallelism it changes nothing (Megatron
            turns it off when ``tensor_model_parallel_size == 1``).
        virtual_pipeline: model chunks per pipeline stage (Megatron's interleaved 1F1B,
            ``--num-layers-per-virtual-pipeline-stage``): stage ``k`` holds chunks ``k``,
            ``k + pp``, ``k + 2 pp``, ... of ``pp * virtual_pipeline`` equal chunks of layers.
            The bubble shrinks by ``virtual_pipeline`` at the cost of as many more
            point-to-point transfers. Needs ``pipeline_parallel >= 2`` and ``micro_batches``
            a multiple of ``pipeline_parallel`` (Megatron's requirement of the schedule).

    Raises:
        ValueError: a size is not a positive integer, ``zero_stage`` is not 0 to 3, or the
            combination is one the schedules above do not run (the message says which).
        TypeError: ``sequence_parallel`` is not a bool.
    """

    tensor_parallel: int = 1
    data_parallel: int = 1
    zero_stage: int = 1
    pipeline_parallel: int = 1
    micro_batches: int = 1
    sequence_parallel: bool = False
    virtual_pipeline: int = 1

    def __post_init__(self) -> None:
        for field_name in ("tensor_parallel", "data_parallel", "pipeline_parallel", "micro_batches",
                           "virtual_pipeline"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ParallelLayout.{field_name} must be a positive integer, got {value!r}")
        if isinstance(self.zero_stage, bool) or self.zero_stage not in ZERO_STAGES:
            raise ValueError(f"ParallelLayout.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if not isinstance(self.sequence_parallel, bool):
            raise TypeError(f"ParallelLayout.sequence_parallel must be True or False, got {self.sequence_parallel!r}")
        if self.zero_stage >= 2 and self.pipeline_parallel > 1:
            raise ValueError(f"ParallelLayout.zero_stage={self.zero_stage} needs pipeline_parallel=1 (got "
                             f"{self.pipeline_parallel}): pipeline engines shard at most the optimizer state (ZeRO-1)")
        if self.virtual_pipeline > 1:
            if self.pipeline_parallel < 2:
                raise ValueError(f"ParallelLayout.virtual_pipeline={self.virtual_pipeline} needs pipeline_parallel "
                                 f">= 2, got {self.pipeline_parallel}")
            if self.micro_batches % self.pipeline_parallel:
                raise ValueError(f"ParallelLayout.virtual_pipeline={self.virtual_pipeline} needs micro_batches a "
                                 f"multiple of pipeline_parallel={self.pipeline_parallel} (the interleaved "
                                 f"schedule's requirement), got {self.micro_batches}")

    @property
    def devices(self) -> int:
        return self.tensor_parallel * self.data_parallel * self.pipeline_parallel

    @property
    def sequence_sharded(self) -> bool:
        """Whether sequence parallelism splits anything: it is on and there is tensor parallelism."""
        return self.sequence_parallel and self.tensor_parallel > 1

    @property
    def virtual_stages(self) -> int:
        """Model chunks over the whole pipeline: ``pipeline_parallel * virtual_pipeline``."""
        return self.pipeline_parallel * self.virtual_pipeline

    def tp_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.tensor_parallel))

    def dp_ranks(self) -> tuple[int, ...]:
        return tuple(range(0, self.tensor_parallel * self.data_parallel, self.tensor_parallel))

    def stage_rank(self, stage: int) -> int:
        """The first rank of pipeline stage ``stage`` (rank 0's peer there)."""
        return stage * self.tensor_parallel * self.data_parallel

    def next_stage_rank(self) -> int:
        """Rank 0's peer in pipeline stage 1."""
        return self.stage_rank(1)

    def check_model(self, config: LlamaConfig, batch_size: int, seq_len: int) -> None:
        """Check that the layout splits ``config`` evenly.

        Raises:
            ValueError: tensor parallelism does not divide the KV heads, the FFN size and the
                vocabulary; the virtual stages do not divide the layers; or, with sequence
                parallelism, tensor parallelism does not divide ``seq_len`` (Megatron's rule).
        """
        t = self.tensor_parallel
        if config.num_kv_heads % t or config.ffn_hidden_size % t or config.vocab_size % t:
            raise ValueError(f"{config.name}: tensor_parallel={t} must divide kv heads, FFN size and vocabulary")
        if config.num_layers % self.pipeline_parallel:
            raise ValueError(f"{config.name}: pipeline_parallel={self.pipeline_parallel} must divide the "
                             f"{config.num_layers} layers")
        if config.num_layers % self.virtual_stages:
            raise ValueError(f"{config.name}: pipeline_parallel={self.pipeline_parallel} x virtual_pipeline="
                             f"{self.virtual_pipeline} must divide the {config.num_layers} layers")
        if self.sequence_sharded and seq_len % t:
            raise ValueError(f"{config.name}: sequence_parallel splits seq_len={seq_len} over tensor_parallel={t}; "
                             "it must divide it")

    @classmethod
    def default_for(cls, config: LlamaConfig, devices: int, hccs_group_size: int) -> ParallelLayout:
        """Tensor parallelism over one HCCS group (or fewer cards), data parallelism across."""
        tp = 1
        while (
            tp * 2 <= min(devices, hccs_group_size)
            and devices % (tp * 2) == 0
            and config.num_kv_heads % (tp * 2) == 0
        ):
            tp *= 2
        return cls(tensor_parallel=tp, data_parallel=devices // tp)
