"""The kernel model every AI Core cost model shares (:mod:`simulator.costs`): an op's
specification (:class:`OpSpec`) and cost (:class:`OpCost`), and a tiled kernel
(:class:`Kernel`) turned into time and msprof-style counters by :func:`run_kernel`.

* work is cut into ``block_dim`` blocks spread over the AI Cores; blocks run in
  ``ceil(block_dim / cores)`` waves, so an idle last wave costs a whole wave (wave
  quantisation);
* inside a block the Cube unit, the Vector unit and the MTE2/MTE3 DMA queues work as a
  pipeline over ``iterations`` equal iterations (K chunks, K/V blocks, Unified Buffer chunks).
  Each buffer in flight lets one more unit work at once, so with ``stages`` buffers the
  steady state runs at ``max(max(parts), sum(parts) / stages)`` and the first iteration
  (pipeline fill) is not overlapped (see :func:`pipelined_time_s`);
* HBM traffic is shared by the active cores; every DMA transfer pays a fixed start-up cost on
  its core's queue;
* each kernel pays the hardware's launch floor.

Times are seconds, sizes bytes, work FLOP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .hardware import HardwareSpec
from .units import DTYPE_BYTES

Shape = tuple[int, ...]

#: Matmul base tile (rows of A, columns of B per block) before L0C limits are applied.
#: A kernel-tiling policy, not a hardware figure: CANN's matmul samples use baseM=128 and
#: baseN=256 for fp16.
MATMUL_BASE_M = 128
MATMUL_BASE_N = 256
#: Buffers in flight for kernels that use plain double buffering.
DOUBLE_BUFFER_STAGES = 2
#: Accumulator bytes per element in L0C and the Unified Buffer (fp32 accumulation).
ACCUMULATOR_BYTES = DTYPE_BYTES["fp32"]


@dataclass(frozen=True, slots=True)
class OpSpec:
    """What an operator call is: enough to cost it, hashable so costs can be cached.

    ``attrs`` is a sorted tuple of ``(name, value)`` pairs.
    """

    op_type: str
    shapes: tuple[Shape, ...]
    dtype: str
    attrs: tuple[tuple[str, object], ...] = ()

    def attr(self, name: str, default=None):
        for key, value in self.attrs:
            if key == name:
                return value
        return default


@dataclass(frozen=True, slots=True)
class CommCost:
    """Extra facts of a collective, as nccl-tests / hccl_test report them."""

    bytes: int
    algorithm: str
    group_size: int
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float


@dataclass(frozen=True, slots=True)
class OpCost:
    """Result of a cost model. Times in seconds, traffic in bytes."""

    duration_s: float
    flop: float
    hbm_bytes: float
    l2_bytes: float
    block_dim: int
    dma_count: int
    ai_core_util_frac: float
    mac_ratio: float
    vec_ratio: float
    mte2_ratio: float
    kernel_count: int = 1
    comm: CommCost | None = field(default=None)
    overlapped_s: float = 0.0  # time the kernel's units (Cube, Vector, MTE) worked at once
    overlappable_s: float = 0.0  # the most they could have: all but the longest unit


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, multiple: int) -> int:
    return ceil_div(a, multiple) * multiple


def numel(shape: Shape) -> int:
    return math.prod(shape)


def pipelined_time_s(parts_s: tuple[float, ...], stages: int, iterations: float = 1.0) -> float:
    """Time of a pipeline whose units need ``parts_s`` seconds in all, over ``iterations``.

    With ``stages`` buffers in flight at most ``stages`` units work at once, so the steady
    state takes ``max(max(parts), sum(parts) / stages)``; the first iteration fills the
    pipeline without overlap. One stage, or one iteration, runs the parts one after another.
    ``iterations`` may be fractional (work / grain), which keeps the fill cost per grain
    constant: more work never takes less time.

    Raises:
        ValueError: ``stages`` or ``iterations`` < 1.
    """
    if stages < 1:
        raise ValueError(f"pipeline_stages must be >= 1, got {stages}")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    total = sum(parts_s)
    steady = max(max(parts_s), total / stages)
    return steady + (total - steady) / iterations


@dataclass(frozen=True, slots=True)
class Kernel:
    """A tiled AI Core kernel: per-block work, block count, and whole-kernel traffic."""

    block_dim: int
    cube_s_per_block: float
    vector_s_per_block: float
    hbm_bytes: float
    l2_bytes: float
    dma_per_block: int
    stages: int
    iterations: float
    flop: float
    kernel_count: int = 1
    mix: bool = False  # runs the Cube and Vector units in one kernel (its own launch floor)
    fixpipe_s_per_block: float = 0.0  # Cube core's FixPipe (L0C -> GM) time: the split chip's hand-off
    # Bytes the Vector cores' own MTE2/MTE3 queues move between global memory (through L2) and
    # their Unified Buffers, whole kernel: on the split chip the scores they read and the tiles
    # they write back for the Cube. A pipeline part of its own (other queues, other cores).
    vector_l2_bytes: float = 0.0


def run_kernel(k: Kernel, hw: HardwareSpec, cores: int) -> OpCost:
    """Turn a tiled kernel into time and counters (see the module docstring).

    The kernel is one pipeline over all its waves: compute is ``waves`` times a block's work,
    DMA is the whole kernel's traffic at the shared bandwidth plus each core's queue of
    transfer start-ups, and only the first iteration is left unoverlapped.
    """
    waves = ceil_div(k.block_dim, cores)
    active_cores = min(k.block_dim, cores)
    mem = hw.memory
    # Every read reaches the cores through L2: misses cost HBM bandwidth, and all of the
    # traffic crosses L2; the two run concurrently, so the slower one bounds the transfer.
    transfer_s = max(
        k.hbm_bytes / (mem.hbm_bandwidth_bytes_per_s * mem.hbm_efficiency_frac),
        (k.hbm_bytes + k.l2_bytes) / mem.l2_bandwidth_bytes_per_s,
    )
    mte_s = transfer_s + waves * k.dma_per_block * hw.dma.mte_startup_latency_s
    cube_s = waves * k.cube_s_per_block
    vector_s = waves * k.vector_s_per_block
    parts = (cube_s, vector_s, mte_s) + ((waves * k.fixpipe_s_per_block,) if k.fixpipe_s_per_block else ())
    if k.vector_l2_bytes:
        # No published rate for a Vector core's MTE2/MTE3 alone: the chip's L2 bandwidth, which
        # all of the kernel's transfers share, bounds them.
        parts += (k.vector_l2_bytes / mem.l2_bandwidth_bytes_per_s,)
    busy_s = pipelined_time_s(parts, k.stages, waves * k.iterations)
    # The queues overlap, but every byte they move crosses the one L2: the kernel takes at least
    # all of its traffic over the L2 bandwidth.
    busy_s = max(busy_s, (k.hbm_bytes + k.l2_bytes + k.vector_l2_bytes) / mem.l2_bandwidth_bytes_per_s)
    floor_s = hw.launch.mix_kernel_launch_latency_s if k.mix else hw.launch.kernel_launch_latency_s
    launch_s = floor_s * k.kernel_count
    duration_s = launch_s + busy_s
    core_capacity_s = cores * duration_s
    return OpCost(
        duration_s=duration_s,
        flop=k.flop,
        hbm_bytes=k.hbm_bytes,
        l2_bytes=k.l2_bytes + k.vector_l2_bytes,
        block_dim=k.block_dim,
        dma_count=k.dma_per_block * k.block_dim,
        ai_core_util_frac=k.block_dim * busy_s / waves / core_capacity_s,
        mac_ratio=k.block_dim * k.cube_s_per_block / core_capacity_s,
        vec_ratio=k.block_dim * k.vector_s_per_block / core_capacity_s,
        mte2_ratio=min(1.0, active_cores * mte_s / core_capacity_s),
        kernel_count=k.kernel_count,
        overlapped_s=max(0.0, sum(parts) - busy_s),
        overlappable_s=sum(parts) - max(parts),
    )


def cube_time_s(m: int, k: int, n: int, dtype: str, hw: HardwareSpec) -> float:
    """Cube unit time of one (m x k) @ (k x n) tile; dims pad up to the 16x16x16 fractal."""
    cu = hw.cube_unit
    macs = (
        round_up(m, cu.fractal_m) * round_up(k, cu.fractal_k) * round_up(n, cu.fractal_n)
    )
    cycles = macs / hw.cube_macs_per_cycle(dtype)
    return cycles / (hw.ai_core.clock_hz * cu.efficiency_frac)


def vector_time_s(elements: float, op_classes: dict[str, float], dtype: str, hw: HardwareSpec) -> float:
    """Vector unit time for ``elements`` elements, each costing the given instruction classes."""
    vu = hw.vector_unit
    cycles_per_element = sum(vu.cycles_per_op_class[c] * n for c, n in op_classes.items())
    rate = hw.vector_ops_per_cycle(dtype) * hw.ai_core.clock_hz * vu.efficiency_frac
    return elements * cycles_per_element / rate


def vector_unit_time_s(elements: float, op_classes: dict[str, float], dtype: str, hw: HardwareSpec) -> float:
    """Seconds for all Vector units of the chip to process ``elements`` elements held in the
    Unified Buffer (no memory traffic), each costing the given instruction classes.

    Raises:
        ValueError: the Vector unit has no rate for ``dtype``.
        KeyError: an unknown instruction class.
    """
    return vector_time_s(elements, op_classes, dtype, hw) / hw.ai_core.vector_core_count
