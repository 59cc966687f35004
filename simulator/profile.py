"""The profile a simulated (or imported) run produces: versioned pydantic models.

A :class:`Profile` holds every operator record of every step. Times are seconds.
"""

from __future__ import annotations

import statistics
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt

_RECORD_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class CommInfo(BaseModel):
    """A collective's facts, named as nccl-tests and hccl_test report them."""

    model_config = _RECORD_CONFIG
    bytes: NonNegativeInt
    algorithm: str
    group_size: int = Field(ge=1)
    algbw_bytes_per_s: NonNegativeFloat
    busbw_bytes_per_s: NonNegativeFloat


class OpRecord(BaseModel):
    """One operator execution on the device.

    ``input_shapes`` are the shapes of the operator's inputs; ``source`` is ``file:line`` of
    the user code that called it.
    """

    model_config = _RECORD_CONFIG
    op_type: str
    name: str
    step: NonNegativeInt
    stream: Literal["compute", "hccl"]
    start_s: NonNegativeFloat
    duration_s: NonNegativeFloat
    flop: NonNegativeFloat
    hbm_bytes: NonNegativeFloat
    l2_bytes: NonNegativeFloat = 0.0
    block_dim: NonNegativeInt
    dma_count: NonNegativeInt
    ai_core_util_frac: NonNegativeFloat
    hbm_bandwidth_util_frac: NonNegativeFloat
    mac_ratio: NonNegativeFloat
    vec_ratio: NonNegativeFloat
    mte2_ratio: NonNegativeFloat
    input_shapes: list[list[int]]
    dtype: str
    attrs: dict[str, bool | int | float | str] = Field(default_factory=dict)
    source: str | None = None
    comm: CommInfo | None = None


class Profile(BaseModel):
    """Everything one run recorded.

    ``devices`` is the number of cards of the job (one rank is simulated; all ranks alike).
    ``tokens_per_step`` is set by the workload through ``npu.set_tokens_per_step``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    schema_version: Literal[1] = 1
    simulator_version: str
    hardware: str
    devices: int = Field(ge=1)
    steps: int = Field(ge=1)
    tokens_per_step: int | None = Field(default=None, ge=1)
    workload_fingerprint: str
    ops: list[OpRecord]

    # -- derived views (not serialised) ---------------------------------------------------

    @cached_property
    def step_times_s(self) -> list[float]:
        """Wall time of each step: last op end minus first op start, over all streams."""
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        for op in self.ops:
            end = op.start_s + op.duration_s
            if op.step not in first or op.start_s < first[op.step]:
                first[op.step] = op.start_s
            if op.step not in last or end > last[op.step]:
                last[op.step] = end
        return [last.get(s, 0.0) - first.get(s, 0.0) for s in range(self.steps)]

    @property
    def step_time_s(self) -> float:
        """Median step time in seconds."""
        return statistics.median(self.step_times_s)

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second of the whole job (``None`` if the workload set no token count)."""
        if self.tokens_per_step is None or self.step_time_s <= 0:
            return None
        return self.tokens_per_step / self.step_time_s

    @cached_property
    def _op_time_by_step(self) -> dict[str, dict[int, float]]:
        table: dict[str, dict[int, float]] = {}
        for op in self.ops:
            steps = table.setdefault(op.op_type, {})
            steps[op.step] = steps.get(op.step, 0.0) + op.duration_s
        return table

    @property
    def op_types(self) -> list[str]:
        """Op types in order of first appearance."""
        return list(self._op_time_by_step)

    def op_time_s(self, op_type: str) -> float:
        """Total time of ``op_type`` within a step, median over the steps it ran in, in seconds.

        Counting only the steps an op type ran in keeps periodic ops (an optimizer step every
        4th step of gradient accumulation) visible instead of a median of zero.
        Returns 0.0 for an op type the profile does not contain.
        """
        per_step = self._op_time_by_step.get(op_type)
        return statistics.median(per_step.values()) if per_step else 0.0

    def op_steps(self, op_type: str) -> int:
        """Number of steps in which ``op_type`` ran."""
        return len(self._op_time_by_step.get(op_type, ()))

    def ops_of(self, op_type: str) -> list[OpRecord]:
        return [op for op in self.ops if op.op_type == op_type]

    # -- serialisation ----------------------------------------------------------------------

    def to_json(self) -> str:
        """JSON text of the profile (round-trips through :meth:`from_json`)."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> Profile:
        """Parse a profile written by :meth:`to_json`.

        Raises:
            pydantic.ValidationError: the text is not a valid profile.
        """
        return cls.model_validate_json(text)
