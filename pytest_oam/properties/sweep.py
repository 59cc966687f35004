"""``oam sweep``: an operator's efficiency over a grid of shapes, as a table of the worst shapes
and a plot (a line per dtype over one axis, or a heat map over two).

    oam sweep MatMul --axis m=4096 --axis k=4096 --axis n=256:2048:16 --plot sweep.png
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

from ..format import fmt_frac, fmt_us, to_percent
from .perf import OP_AXES, Measurement, measure

#: Most shapes one sweep may simulate.
MAX_SWEEP_POINTS = 20_000


def parse_axis_values(text: str) -> list[int]:
    """``"4096"``, ``"128,256,512"`` or ``"START:STOP:STEP"`` (STOP included) -> the values.

    Raises:
        ValueError: not integers, a step below 1, or values below 1.
    """
    try:
        if ":" in text:
            start, stop, *rest = (int(p) for p in text.split(":"))
            step = rest[0] if rest else 1
            if len(rest) > 1 or step < 1:
                raise ValueError
            count = len(range(start, stop + 1, step))  # a range object: no list is built yet
            if count > MAX_SWEEP_POINTS:
                raise OverflowError(count)
            values = list(range(start, stop + 1, step))
        else:
            values = sorted({int(p) for p in text.split(",")})
    except OverflowError as exc:
        raise ValueError(f"axis values {text!r}: {exc.args[0]:,} values; at most {MAX_SWEEP_POINTS:,} per sweep") from None
    except ValueError:
        raise ValueError(f"axis values {text!r}: write N, N,M,... or START:STOP:STEP with STEP >= 1") from None
    if not values or min(values) < 1:
        raise ValueError(f"axis values {text!r}: need at least one value, all >= 1")
    return values


#: File types ``--plot`` writes.
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def check_plot(path: Path, axes: dict[str, list[int]], dtypes: list[str], force: bool) -> Path:
    """Check a ``--plot`` path before the sweep runs.

    Raises:
        ValueError: an unsupported file type, an existing file without ``force``, not one or
            two varying axes, or several dtypes for a heat map.
    """
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise ValueError(f"--plot {path}: write a {', '.join(PLOT_SUFFIXES)} file")
    if path.exists() and not force:
        raise ValueError(f"{path} exists; pass --force to overwrite it")
    varying = [a for a, v in axes.items() if len(v) > 1]
    if not 1 <= len(varying) <= 2:
        raise ValueError(f"a plot needs one or two varying axes, got {len(varying)} ({', '.join(varying) or 'none'})")
    if len(varying) == 2 and len(dtypes) > 1:
        raise ValueError("a heat map (two varying axes) shows one dtype; give one --dtype")
    return path


def parse_axes(op_type: str, entries: list[str]) -> dict[str, list[int]]:
    """``["m=4096", "n=256:4096:16", ...]`` -> per-axis values, every axis of the op given once.

    Raises:
        ValueError: an unknown op type or axis, a missing or repeated axis, a grid larger than
            :data:`MAX_SWEEP_POINTS`.
    """
    if op_type not in OP_AXES:
        raise ValueError(f"no sweep for op type {op_type!r}; known: {', '.join(OP_AXES)}")
    axes = OP_AXES[op_type]
    values: dict[str, list[int]] = {}
    for entry in entries:
        name, sep, spec = entry.partition("=")
        if not sep or name not in axes:
            raise ValueError(f"--axis {entry!r}: expected AXIS=VALUES with AXIS one of {', '.join(axes)}")
        if name in values:
            raise ValueError(f"--axis {name} given twice")
        values[name] = parse_axis_values(spec)
    missing = [a for a in axes if a not in values]
    if missing:
        raise ValueError(f"{op_type} needs --axis for {', '.join(missing)} (axes: {', '.join(axes)})")
    points = math.prod(len(v) for v in values.values())
    if points > MAX_SWEEP_POINTS:
        raise ValueError(f"the grid has {points:,} shapes; at most {MAX_SWEEP_POINTS:,} per sweep")
    return {a: values[a] for a in axes}


def run_sweep(op_type: str, axes: dict[str, list[int]], dtypes: list[str], hardware: str,
              attrs: dict | None = None) -> list[Measurement]:
    """Measure every shape of the grid for every dtype."""
    names = list(axes)
    return [
        measure(op_type, dict(zip(names, combo, strict=True)), dtype=dtype, hardware=hardware, **(attrs or {}))
        for dtype in dtypes
        for combo in itertools.product(*axes.values())
    ]


def worst_table(results: list[Measurement], top: int = 10, fmt: str = "simple") -> str:
    """The ``top`` least efficient shapes with their time and first finding."""
    from tabulate import tabulate

    rows = [
        (", ".join(f"{k}={v}" for k, v in m.shape.items()), m.dtype, fmt_us(m.time_s, grouping=True, unit=False),
         fmt_frac(m.efficiency_frac), m.findings[0] if m.findings else "-")
        for m in sorted(results, key=lambda m: m.efficiency_frac)[:top]
    ]
    return tabulate(rows, headers=("shape", "dtype", "time (us)", "of peak", "finding"), tablefmt=fmt)


def plot_sweep(results: list[Measurement], axes: dict[str, list[int]], path: Path) -> None:
    """Write the efficiency plot: a line per dtype over the one varying axis, or a heat map
    over the two varying axes (first dtype).

    Raises:
        ValueError: no axis or more than two axes vary.
        ImportError: matplotlib is not installed (``pip install 'pytest-oam[plot]'``).
    """
    varying = [a for a, v in axes.items() if len(v) > 1]
    check_plot(path, axes, list(dict.fromkeys(m.dtype for m in results)), force=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'pytest-oam[plot]'") from None
    op_type, hardware = results[0].op_type, results[0].hardware
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if len(varying) == 1:
        (axis,) = varying
        for dtype in dict.fromkeys(m.dtype for m in results):
            points = [m for m in results if m.dtype == dtype]
            ax.plot([m.shape[axis] for m in points], [to_percent(m.efficiency_frac) for m in points], label=dtype)
        ax.set_xlabel(axis)
        ax.set_ylabel("% of Cube peak")
        ax.legend()
    else:
        row_axis, col_axis = varying
        dtype = results[0].dtype
        grid = {(m.shape[row_axis], m.shape[col_axis]): to_percent(m.efficiency_frac) for m in results
                if m.dtype == dtype}
        rows, cols = axes[row_axis], axes[col_axis]
        # One cell per value, labelled with the value: the values need not be evenly spaced.
        image = ax.imshow([[grid[(r, c)] for c in cols] for r in rows], origin="lower", aspect="auto", cmap="viridis")
        for set_ticks, set_labels, values in ((ax.set_xticks, ax.set_xticklabels, cols),
                                              (ax.set_yticks, ax.set_yticklabels, rows)):
            step = max(1, len(values) // 12)
            set_ticks(range(0, len(values), step))
            set_labels([str(v) for v in values[::step]])
        fig.colorbar(image, ax=ax, label=f"% of Cube peak ({dtype})")
        ax.set_xlabel(col_axis)
        ax.set_ylabel(row_axis)
    fixed = ", ".join(f"{a}={v[0]}" for a, v in axes.items() if len(v) == 1)
    ax.set_title(f"{op_type} on {hardware}" + (f" ({fixed})" if fixed else ""))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
