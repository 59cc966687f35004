"""Parallel layouts of published Llama-family training runs: ``simulator/data/published_layouts.json``.

Each entry is a run's launch configuration as its source sets it (tensor, pipeline and virtual
pipeline sizes, sequence parallelism, distributed optimizer, recompute, micro and global batch),
with the source. :meth:`PublishedLayout.parallel_layout` turns it into a :class:`ParallelLayout`
and :meth:`PublishedLayout.run_kwargs` into the arguments of
:func:`simulator.models.training_step`.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from .layout import ParallelLayout
from .llama_config import (
    LLAMA2_7B,
    LLAMA2_13B,
    LLAMA2_70B,
    LLAMA3_8B,
    QWEN2_7B,
    QWEN2_72B,
    LlamaConfig,
)

_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

#: The models the entries name.
MODELS: dict[str, LlamaConfig] = {
    c.name: c for c in (LLAMA2_7B, LLAMA2_13B, LLAMA2_70B, LLAMA3_8B, QWEN2_7B, QWEN2_72B)}


class PublishedLayout(BaseModel):
    """One published run's layout (see the data file's description for the derived sizes)."""

    model_config = _STRICT
    id: str = Field(min_length=1)
    model: str = Field(description="a key of MODELS")
    hardware: str
    devices: PositiveInt
    tensor_parallel: PositiveInt
    pipeline_parallel: PositiveInt
    virtual_pipeline: PositiveInt
    sequence_parallel: bool
    zero_stage: Literal[0, 1, 2, 3]
    recompute: Literal["selective", "full"] | None
    micro_batch_size: PositiveInt
    global_batch_size: PositiveInt
    seq_len: PositiveInt
    dtype: Literal["fp16", "bf16"]
    framework: Literal["ideal", "megatron"] = Field(
        "ideal", description="training_step's framework: 'megatron' for Megatron-LM / MindSpeed-LLM launch scripts "
                             "(their --no-gradient-accumulation-fusion and torch_npu kernels)")
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _sizes_divide(self) -> PublishedLayout:
        if self.model not in MODELS:
            raise ValueError(f"layout {self.id}: unknown model {self.model!r}; known: {', '.join(MODELS)}")
        model_parallel = self.tensor_parallel * self.pipeline_parallel
        if self.devices % model_parallel:
            raise ValueError(f"layout {self.id}: tp x pp = {model_parallel} does not divide {self.devices} devices")
        if self.global_batch_size % (self.micro_batch_size * self.data_parallel):
            raise ValueError(f"layout {self.id}: global batch {self.global_batch_size} is not a multiple of micro "
                             f"batch {self.micro_batch_size} x data parallel {self.data_parallel}")
        return self

    @property
    def data_parallel(self) -> int:
        return self.devices // (self.tensor_parallel * self.pipeline_parallel)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step and data-parallel replica."""
        return self.global_batch_size // (self.micro_batch_size * self.data_parallel)

    @property
    def config(self) -> LlamaConfig:
        return MODELS[self.model]

    def parallel_layout(self, micro_batches: int | None = None) -> ParallelLayout:
        """The run's :class:`ParallelLayout`; ``micro_batches`` replaces the published count (to
        simulate fewer, e.g. as many as the schedule keeps in flight).

        Raises:
            ValueError: the combination is one :class:`ParallelLayout` refuses.
        """
        return ParallelLayout(
            tensor_parallel=self.tensor_parallel, data_parallel=self.data_parallel, zero_stage=self.zero_stage,
            pipeline_parallel=self.pipeline_parallel,
            micro_batches=self.micro_batches if micro_batches is None else micro_batches,
            sequence_parallel=self.sequence_parallel, virtual_pipeline=self.virtual_pipeline)

    def run_kwargs(self, micro_batches: int | None = None) -> dict[str, object]:
        """Keyword arguments of ``simulator.run(training_step, self.config, **kwargs)``."""
        return {"hardware": self.hardware, "devices": self.devices, "layout": self.parallel_layout(micro_batches),
                "batch_size": self.micro_batch_size, "seq_len": self.seq_len, "dtype": self.dtype,
                "recompute": self.recompute, "framework": self.framework}


class PublishedLayoutsFile(BaseModel):
    model_config = _STRICT
    schema_version: Literal[1]
    description: str
    layouts: list[PublishedLayout]


@functools.cache
def load_published_layouts() -> tuple[PublishedLayout, ...]:
    """The entries of ``simulator/data/published_layouts.json``.

    Raises:
        pydantic.ValidationError: the file does not follow :class:`PublishedLayoutsFile`.
    """
    text = (resources.files("simulator") / "data" / "published_layouts.json").read_text(encoding="utf-8")
    return tuple(PublishedLayoutsFile.model_validate(json.loads(text)).layouts)
