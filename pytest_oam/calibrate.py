"""Calibration to the user's own NPU: ``oam calibrate PROFILE... -o my-910b.json``.

Fits, to real torch_npu Level1/Level2 profiles (their ``kernel_details.csv``, the input of
``oam validate --profile``), two things the simulator's hardware file holds, and writes a complete
hardware file (the schema of ``simulator/hardware/*.json``) with the provenance of the fit in its
``calibration`` group:

* a time scale per simulator op type: every kernel of the profiles is re-costed on the base
  spec (:func:`pytest_oam.kernel_replay.replay_kernels`, the replay of ``oam validate
  --profile``); the scale of an op type is the median over its kernels of measured / simulated
  time (the median ratio: half the kernels end slower, half faster; robust to the odd kernel
  that waited or was preempted). An op type with fewer than ``min_kernels`` kernels keeps the
  base's scale. :func:`simulator.costs.op_cost` multiplies each op's duration by its type's scale.
* ``launch.host_dispatch_s``, the host time to issue one eager kernel
  (:func:`simulator.runtime.timeline.dispatch`: the host issues kernels one after another that
  far apart, and a kernel starts once its stream is free and the host has issued it; kernels
  shorter than that leave the device idle, and the start-to-start interval of two such kernels
  is the host's interval): the median start-to-start interval of consecutive kernels on the
  compute stream with the device idle between them (the gap longer than
  :data:`HOST_WAIT_MIN_GAP_S`), no collective ending in the gap (the device may have waited
  for it rather than for the host), and the second kernel not a fused attention kernel, whose
  longer host call the spec may cost apart (``launch.attention_host_dispatch_s``, kept from the
  base).

What the fit does not capture: a kernel's error that depends on its shape within an op type (a
scale moves every kernel of a type alike, so the launch floor of small kernels and the
efficiency of large ones cannot both be fitted); op types the replay cannot re-cost (``SwiGlu``,
HCCL tasks, convolutions); collectives, pipeline bubbles and synchronisations; and the
profiler's own host overhead, which the fitted host interval includes (a profiled run issues
kernels more slowly than an unprofiled one).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

from .kernel_replay import ReplayedKernel, ReplayedKernels, ReplayError, replay_kernels

#: Fewest kernels of an op type for its scale to be fitted (and fewest host gaps for the host
#: interval): a median of fewer is one or two kernels' noise.
DEFAULT_MIN_KERNELS = 5
#: Idle time between two kernels on the compute stream above which the device waited (for the
#: host): kernels queued back to back start 0.02 us after the previous one ends in the LLM
#: Level2 profile of tests/data/realdata (the 25th percentile of its gaps).
HOST_WAIT_MIN_GAP_S = 1e-6
#: The Accelerator Core of a kernel that runs the Cube and Vector units together (torch_npu's
#: FlashAttentionScore and its gradient in the LLM profile).
MIX_CUBE_CORE = "MIX_AIC"


class CalibrationError(ValueError):
    """Input ``oam calibrate`` cannot use; the one-line message names the file or option."""


def file_sha256(path: Path) -> str:
    """SHA-256 of the file's bytes, hexadecimal."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def host_intervals_s(replayed: ReplayedKernels) -> list[float]:
    """Start-to-start intervals, in seconds, of consecutive kernels on the profile's compute
    stream (its ``Stream ID`` with the most non-HCCL kernels) where the device was idle between
    them (longer than :data:`HOST_WAIT_MIN_GAP_S`), both in the same step, no collective (an HCCL
    task) ended in the gap, and the second is not a fused attention kernel (``MIX_AIC``: the
    Cube and Vector units together, whose host call the spec may cost apart,
    ``launch.attention_host_dispatch_s``; not fitted here)."""
    ops, rows = replayed.read.profile.ops, replayed.read.rows
    compute = [(op, row.get("Stream ID", "").strip()) for op, row in zip(ops, rows, strict=True)
               if op.stream != "hccl"]
    if not compute:
        return []
    stream = Counter(s for _, s in compute).most_common(1)[0][0]
    kernels = sorted((op for op, s in compute if s == stream), key=lambda op: op.start_s)
    collective_ends = sorted(op.start_s + op.duration_s for op in ops if op.stream == "hccl")
    intervals = []
    for before, after in zip(kernels, kernels[1:]):
        idle_from, idle_to = before.start_s + before.duration_s, after.start_s
        if before.step != after.step or idle_to - idle_from <= HOST_WAIT_MIN_GAP_S:
            continue
        if any(idle_from <= end <= idle_to for end in collective_ends):
            continue
        if str(after.attrs.get("accelerator_core", "")).upper() == MIX_CUBE_CORE:
            continue  # a fused attention call: the host's own interval, launch.attention_host_dispatch_s
        intervals.append(after.start_s - before.start_s)
    return intervals


def _median_abs(errors: list[float]) -> float:
    return statistics.median(abs(e) for e in errors)


def fit_time_scales(kernels: list[ReplayedKernel], min_kernels: int = DEFAULT_MIN_KERNELS) -> dict[str, dict]:
    """Per simulator op type: the median of measured / simulated time over its kernels
    (``scale``; 1.0 below ``min_kernels`` kernels), the kernel count, whether it was fitted,
    and the median |error| per kernel before and after the scale.

    ``kernels`` were re-costed on the base spec; a kernel simulated at 0 s is left out.
    """
    by_type: dict[str, list[ReplayedKernel]] = defaultdict(list)
    for k in kernels:
        if k.simulated_s > 0:
            by_type[k.op_type].append(k)
    fits = {}
    for op_type, found in sorted(by_type.items()):
        fitted = len(found) >= min_kernels
        # the median of the log ratios is the log of the median ratio (a geometric mean of the
        # two middle ones for an even count): symmetric in faster and slower
        scale = math.exp(statistics.median(math.log(k.measured_s / k.simulated_s) for k in found)) if fitted else 1.0
        fits[op_type] = {
            "scale": scale, "kernels": len(found), "fitted": fitted,
            "before": _median_abs([k.error_frac for k in found]),
            "after": _median_abs([(scale * k.simulated_s - k.measured_s) / k.measured_s for k in found]),
        }
    return fits


def median_abs_error(kernels: list[ReplayedKernel], scales: dict[str, float] | None = None) -> float | None:
    """Median |error| per kernel, each kernel's simulated time times its op type's scale
    (``scales``; 1.0 where absent). None without kernels."""
    scales = scales or {}
    errors = [(scales.get(k.op_type, 1.0) * k.simulated_s - k.measured_s) / k.measured_s for k in kernels]
    return _median_abs(errors) if errors else None


def _check_output(path: Path) -> None:
    """Refuse ``-o`` before any work: a folder, or an existing file that is not a calibrated
    hardware file (overwriting one is the point of calibrating again; anything else is kept)."""
    from simulator.hardware import HardwareFileError, load_hardware_file, spec_name_problem

    if path.is_dir():
        raise CalibrationError(f"-o {path}: is a folder; give a file name such as my-910b.json")
    if path.suffix.lower() != ".json":
        raise CalibrationError(f"-o {path}: a hardware file is JSON; give a name ending in .json")
    problem = spec_name_problem(path.stem)
    if problem:  # the stem becomes the spec's name, which runs and baselines record
        raise CalibrationError(f"-o {path}: the file's name {path.stem!r} becomes the spec's name: {problem}; "
                               "give a name such as my-910b.json")
    if path.exists() or path.is_symlink():
        try:
            spec = load_hardware_file(path)
        except HardwareFileError:
            spec = None
        if spec is None or spec.calibration is None:
            raise CalibrationError(f"-o {path}: exists and is not a hardware file oam calibrate wrote; "
                                   "refusing to overwrite it (nothing was written)")


def _refuse_duplicates(profiles: list[Path]) -> None:
    """Refuse a profile given twice (as a folder and its CSV, or a copy): it would count twice.

    Raises:
        CalibrationError: two profiles' kernel_details.csv have the same bytes (SHA-256).
    """
    from .kernel_replay import kernel_details_path

    seen: dict[str, Path] = {}
    for path in profiles:
        try:
            digest = file_sha256(kernel_details_path(path))
        except (OSError, ValueError):
            continue  # the replay names what is wrong with it
        if digest in seen:
            raise CalibrationError(f"{path}: the same kernel_details.csv as {seen[digest]} (SHA-256 {digest[:12]}); "
                                   "give each profile once (nothing was written)")
        seen[digest] = path


def _base_for(profiles: list[Path], hardware: str | None) -> str:
    """``hardware``, or the bundled spec ``oam validate --profile`` picks for every profile."""
    if hardware is not None:
        return hardware
    from .files.importers import ImportError_, read_ascend_csv
    from .kernel_replay import kernel_details_path, profile_hardware, require_shapes

    picks = {}
    for path in profiles:
        csv_path = kernel_details_path(path)
        try:
            read = read_ascend_csv(csv_path)
        except ImportError_ as exc:
            raise ReplayError(str(exc)) from None
        require_shapes(csv_path, read.header)
        try:
            picks[str(path)] = profile_hardware(read.rows, None).spec
        except ReplayError as exc:
            raise ReplayError(f"{csv_path}: {exc}") from None
    if len(set(picks.values())) > 1:
        listed = ", ".join(f"{p} -> {s}" for p, s in picks.items())
        raise CalibrationError(f"the profiles ran on different NPUs by their core counts ({listed}): calibrate one "
                               "machine at a time, or give --hardware BASE")
    return next(iter(picks.values()))


def calibrate(profiles: list[str | Path], output: str | Path, hardware: str | None = None,
              min_kernels: int = DEFAULT_MIN_KERNELS) -> dict:
    """Fit the base spec (``hardware``: a bundled name or a hardware file; None: the bundled
    spec ``oam validate --profile`` picks for the profiles) to ``profiles`` and write the
    calibrated hardware file to ``output`` (atomically, keys sorted).

    Returns:
        The ``calibration`` group written, as a dict (see
        :class:`simulator.hardware.CalibrationSpec`).

    Raises:
        CalibrationError: no profile, ``min_kernels`` < 1, an ``output`` that is a folder, not
            ``.json``, or an existing file that is not a calibrated hardware file (refused before
            any work), profiles of different NPUs, no kernel re-costed.
        ReplayError: a profile that cannot be replayed (no kernel_details.csv, Level0, ...).
        OSError: ``output`` cannot be written (the message names it).
    """
    import pytest_oam
    import simulator
    from simulator.hardware import CalibrationSpec, HardwareSpec, list_hardware, load_hardware

    from .files.fileio import atomic_write_text

    output = Path(output)
    if not profiles:
        raise CalibrationError("give at least one PROFILE")
    if min_kernels < 1:
        raise CalibrationError(f"--min-kernels must be at least 1, got {min_kernels}")
    _check_output(output)
    paths = [Path(p) for p in profiles]
    _refuse_duplicates(paths)
    base_name = _base_for(paths, hardware)
    base = load_hardware(base_name)
    replays = [replay_kernels(p, base_name) for p in paths]
    kernels = [k for r in replays for k in r.kernels]
    if not kernels:
        raise CalibrationError(f"no kernel of {', '.join(map(str, paths))} could be re-costed: nothing to fit "
                               "(oam validate --profile says why, kernel type by kernel type)")
    fits = fit_time_scales(kernels, min_kernels)
    intervals = {str(r.csv_path): host_intervals_s(r) for r in replays}
    every_interval = [i for found in intervals.values() for i in found]
    host_fitted = (round(statistics.median(every_interval), 12)  # whole picoseconds: the file stays readable
                   if len(every_interval) >= min_kernels else None)
    base_scales = base.calibration.op_time_scale if base.calibration is not None else {}
    scales = {t: f["scale"] for t, f in fits.items()}
    op_time_scale = {name: {"time_scale": s.time_scale, "kernels": 0, "fitted": False,
                            "median_abs_error_frac_before": 0.0, "median_abs_error_frac_after": 0.0}
                     for name, s in base_scales.items()}  # the base's own scales are kept
    for op_type, f in fits.items():
        kept = base_scales[op_type].time_scale if op_type in base_scales else 1.0
        op_time_scale[op_type] = {"time_scale": kept * f["scale"], "kernels": f["kernels"], "fitted": f["fitted"],
                                  "median_abs_error_frac_before": f["before"],
                                  "median_abs_error_frac_after": f["after"]}
    names = ", ".join(f"{r.csv_path} ({len(r.kernels):,} kernels)" for r in replays)
    source = (f"calibration: oam calibrate fitted {base_name} to {names}: op_time_scale is, per simulator op type with "
              f"at least {min_kernels} re-costed kernels, the median of measured / simulated time per kernel "
              "(pytest_oam/calibrate.py); launch.host_dispatch_s is the median start-to-start interval of consecutive "
              "compute-stream kernels with the device idle between them and no collective ending in the gap "
              f"({len(every_interval):,} such pairs), or the base's value when fewer. Measured under the profiler, "
              "whose own host overhead the interval includes")
    calibration = {
        "source": source, "base_hardware": base_name,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "tool": f"pytest-oam {pytest_oam.__version__}, simulator {simulator.SIMULATOR_VERSION}",
        "profiles": [{"path": str(r.csv_path), "sha256": file_sha256(r.csv_path), "kernels": len(r.kernels),
                      "host_gaps": len(intervals[str(r.csv_path)])} for r in replays],
        "min_kernels": min_kernels, "op_time_scale": op_time_scale,
        "host_dispatch_s_before": base.launch.host_dispatch_s, "host_dispatch_s_fitted": host_fitted,
        "kernels": len(kernels), "median_abs_error_frac_before": median_abs_error(kernels),
        "median_abs_error_frac_after": median_abs_error(kernels, scales),
    }
    CalibrationSpec.model_validate(calibration)  # our own output: fail here, not when it is read back
    data = base.model_dump(mode="json")
    name = output.stem if output.stem not in list_hardware() else f"{output.stem}-calibrated"
    data.update(name=name, display_name=f"{base.display_name}, calibrated ({output.name})", calibration=calibration)
    if host_fitted is not None:
        data["launch"]["host_dispatch_s"] = host_fitted
        data["launch"]["source"] += (f". host_dispatch_s: replaced by oam calibrate ({base.launch.host_dispatch_s:g} s in "
                                     f"{base_name}): see the calibration group")
        # the fit is a profiled run's host time, so it is also what a profiled step is compared with
        # (oam validate --profile's step composition)
        data["profiler"]["profiled_host_dispatch_s"] = host_fitted
        data["profiler"]["source"] += (". profiled_host_dispatch_s: the host_dispatch_s oam calibrate fitted (the "
                                       "profiles it was fitted to were profiled runs)")
    HardwareSpec.model_validate(data)
    output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return calibration


def calibration_text(calibration: dict, output: Path, fmt: str = "simple") -> str:
    """What ``oam calibrate`` prints: the fit per op type, the host interval and the overall
    median |error| before and after."""
    from tabulate import tabulate

    from .format import fmt_percent, fmt_time, table_cell

    rows = [(table_cell(t, fmt), f["kernels"], f"{f['time_scale']:.3f}" if f["fitted"] else "kept",
             fmt_percent(f["median_abs_error_frac_before"], 1), fmt_percent(f["median_abs_error_frac_after"], 1))
            for t, f in sorted(calibration["op_time_scale"].items()) if f["kernels"]]
    lines = [f"calibrated {calibration['base_hardware']} to {len(calibration['profiles'])} profile(s), "
             f"{calibration['kernels']:,} kernels re-costed", "",
             tabulate(rows, headers=("op type", "kernels", "time scale", table_cell("median |error| before", fmt), "after"),
                      tablefmt=fmt, disable_numparse=True), ""]
    host = calibration["host_dispatch_s_fitted"]
    gaps = sum(p["host_gaps"] for p in calibration["profiles"])
    lines.append(f"host dispatch per kernel: {fmt_time(calibration['host_dispatch_s_before'])} -> "
                 + (f"{fmt_time(host)} ({gaps:,} host gaps)" if host is not None
                    else f"kept ({gaps} host gaps, fewer than {calibration['min_kernels']})"))
    lines.append(f"median |error| per kernel: {fmt_percent(calibration['median_abs_error_frac_before'], 1)} before, "
                 f"{fmt_percent(calibration['median_abs_error_frac_after'], 1)} after")
    lines.append(f"wrote {table_cell(output, fmt)}: use it as --oam-hardware {table_cell(output, fmt)}, "
                 f"hardware=\"{table_cell(output, fmt)}\" or oam validate --hardware {table_cell(output, fmt)}")
    return "\n".join(lines)
