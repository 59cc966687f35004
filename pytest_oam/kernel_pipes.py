"""Which unit's model is off: each op type's Cube, Vector and DMA busy time in a real profile
(msprof's PipeUtilization columns of ``kernel_details.csv``) beside the simulator's, for
``oam validate --profile --pipes`` (:mod:`pytest_oam.kernel_replay`)."""

from __future__ import annotations

from collections import Counter, defaultdict

from pydantic import BaseModel, ConfigDict, Field

from .files.realfile import number_or_none

_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _LeftOut(Exception):
    """Why one kernel is not in the pipe table."""


class PipeTimes(BaseModel):
    """Busy time of the units of one op type's kernels, measured (msprof's PipeUtilization columns of
    kernel_details.csv) and simulated, summed over every block of the kernels (core-seconds,
    :func:`pipe_times`).

    A Cube kernel (``AI_CORE``) is compared by its Cube unit, a Vector kernel (``AI_VECTOR_CORE``,
    or ``MIX_AIV`` that the simulator runs as a Vector kernel: its Vector cores' columns) by its
    Vector unit; both by their DMA queues.
    """

    model_config = _STRICT
    kernels: int = Field(description="Kernels compared")
    unit: str = Field(description="Cube (aic_mac_time) or Vector (aiv_vec_time)")
    unit_measured_s: float = Field(description="The unit's measured busy time")
    unit_simulated_s: float = Field(description="The simulator's: the unit's share of the simulated duration")
    mte2_measured_s: float = Field(description="aic_mte2_time / aiv_mte2_time: the MTE2 queue (reads into the core)")
    write_measured_s: float = Field(description="aic_fixpipe_time (Cube) / aiv_mte3_time (Vector): the queue that "
                                    "writes results out")
    dma_simulated_s: float = Field(description="The simulator's DMA time: one queue for reads and writes, at the "
                                   "shared HBM (or L2) bandwidth, with the start-up cost of each transfer")


#: msprof's per-block busy-time columns (us) of kernel_details.csv (aic_metrics PipeUtilization, the
#: default), per accelerator core: (unit, DMA in, DMA out).
PIPE_COLUMNS = {"AI_CORE": ("aic_mac_time(us)", "aic_mte2_time(us)", "aic_fixpipe_time(us)"),
                "AI_VECTOR_CORE": ("aiv_vec_time(us)", "aiv_mte2_time(us)", "aiv_mte3_time(us)")}
#: A Vector kernel with a little Cube work (RmsNormGrad): its Vector cores' columns, where the
#: simulator runs it as a Vector kernel.
PIPE_COLUMNS["MIX_AIV"] = PIPE_COLUMNS["AI_VECTOR_CORE"]
#: How much longer than the kernel's Duration a unit's busy time may read before the row is left out
#: of the pipe table (a block's busy time is within the kernel's; the slack is for rounding).
PIPE_SLACK_FRAC = 0.01


def _pipe_value(row: dict[str, str], column: str, duration_s: float) -> float:
    """One pipe column of a row (microseconds in the file), in seconds; raises :class:`_LeftOut`
    with why it cannot be used."""
    if column not in row or row[column] is None:
        raise _LeftOut(f"no {column} column")
    value = number_or_none(row[column])
    if value is None or value < 0:
        raise _LeftOut("a pipe time that is not a number >= 0")
    value_s = value * 1e-6
    if value_s > duration_s * (1 + PIPE_SLACK_FRAC):
        raise _LeftOut("a pipe time longer than the kernel")
    return value_s


def pipe_times(kernels, rows: list[dict[str, str]], spec: str) -> tuple[dict[str, PipeTimes], dict[str, int]]:
    """Per op type, the busy time of the Cube or Vector unit and of the DMA queues of its kernels,
    measured (msprof's columns, :data:`PIPE_COLUMNS`, per block, times the row's Block Dim) beside
    the simulator's (its pipe shares of all its cores' time over the simulated duration, before any
    calibrated time scale), all in core-seconds, so the two need not cut the work into as many
    blocks; and the replayed kernels left out, counted by reason: ``MIX_AIC`` kernels
    (FlashAttention: Cube and Vector cores not one to one), kernels with no unit in the simulator or
    that it runs on the other kind of core, rows without the columns or a Block Dim, or with a value
    that is not a number >= 0 or is longer than the kernel.
    Shows which unit's model is off where a kernel's duration is.
    """
    from simulator.hardware import load_hardware

    hw = load_hardware(spec)
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * 6)
    left_out: Counter[str] = Counter()
    for k in kernels:
        row, cost = rows[k.index], k.cost
        core = (row.get("Accelerator Core") or "").strip().upper()
        try:
            if cost.block_dim < 1:
                raise _LeftOut("no unit in the simulator (a view or a host-side op)")
            if core not in PIPE_COLUMNS:
                raise _LeftOut("MIX_AIC (fused Cube and Vector): their cores are not one to one" if core == "MIX_AIC"
                                    else f"{core or 'no Accelerator Core'}: no unit columns for it")
            cube = cost.mac_ratio > 0
            if cube != (core == "AI_CORE"):
                raise _LeftOut(f"the simulator runs it on the {'Cube' if cube else 'Vector'} unit, the card on {core}")
            measured = [_pipe_value(row, c, k.measured_s) for c in PIPE_COLUMNS[core]]
            blocks = number_or_none(row.get("Block Dim"))
            if blocks is None or blocks < 1 or blocks != int(blocks):
                raise _LeftOut("no Block Dim to sum its blocks' busy time over")
        except _LeftOut as why:
            left_out[str(why)] += 1
            continue
        # Both sides summed over the kernel's blocks (core-seconds), so the card's Block Dim and the
        # simulator's need not agree: msprof's columns are per block of the row's Block Dim (its
        # total cycles over Block Dim and the clock); the simulator's pipe ratios are shares of
        # all its cores' time. A calibrated spec's time scale is taken out: the cost model's own.
        cores = hw.ai_core.count if cube else hw.ai_core.vector_core_count
        scale = 1.0 if hw.calibration is None else hw.calibration.time_scale(k.op_type)
        all_cores_s = cost.duration_s / scale * cores
        acc = sums[(k.op_type, "Cube" if cube else "Vector")]
        for i, value in enumerate((1, measured[0] * blocks, (cost.mac_ratio if cube else cost.vec_ratio) * all_cores_s,
                                   measured[1] * blocks, measured[2] * blocks, cost.mte2_ratio * all_cores_s)):
            acc[i] += value
    units = Counter(op for op, _ in sums)
    pipes = {(op if units[op] == 1 else f"{op} ({unit})"): PipeTimes(
                kernels=int(a[0]), unit=unit, unit_measured_s=a[1], unit_simulated_s=a[2], mte2_measured_s=a[3],
                write_measured_s=a[4], dma_simulated_s=a[5])
             for (op, unit), a in sorted(sums.items())}
    return pipes, dict(left_out.most_common())


def pipes_text(pipes: dict[str, PipeTimes], left_out: dict[str, int], fmt: str = "simple") -> str:
    """The per-unit table of :func:`pipe_times` (``oam validate --profile --pipes``) and the kernels
    left out of it, by reason."""
    from tabulate import tabulate

    from .format import fmt_time, table_cell

    lines = []
    if pipes:
        rows = [(table_cell(op, fmt), p.kernels, p.unit, fmt_time(p.unit_measured_s), fmt_time(p.unit_simulated_s),
                 f"{p.unit_simulated_s / p.unit_measured_s:.2f}" if p.unit_measured_s > 0 else "-",
                 fmt_time(p.mte2_measured_s), fmt_time(p.write_measured_s), fmt_time(p.dma_simulated_s))
                for op, p in pipes.items()]
        headers = [table_cell(h, fmt) for h in ("op type", "kernels", "unit", "unit measured", "unit simulated",
                                                "simulated / measured", "MTE2 measured", "MTE3 or FixPipe measured",
                                                "DMA simulated")]
        lines += [("busy time per unit in core-seconds, summed over every block of each op type's kernels (msprof's "
                   "pipe columns; the simulator's DMA is one queue for reads and writes)"),
                  tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)]
    else:
        lines.append("pipes: no kernel has msprof's per-unit busy times to compare (its PipeUtilization columns, "
                     "such as aiv_vec_time(us))")
    if left_out:
        lines.append("not in the table: " + "; ".join(f"{n:,} kernels: {why}" for why, n in left_out.items()))
    return "\n".join(lines)
