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
* ``profiler.profiled_host_dispatch_s``, the host time to issue one eager kernel while
  torch_npu's profiler records (:func:`simulator.runtime.timeline.dispatch`: the host issues
  kernels one after another that far apart, and a kernel starts once its stream is free and the
  host has issued it; kernels shorter than that leave the device idle, and the start-to-start
  interval of two such kernels is the host's interval): the mean of :func:`host_intervals_s`
  over the profiles. The mean, not the median: a stretch of host-bound kernels lasts the sum of
  their intervals, so the mean is the constant interval that gives it the same length (the
  intervals are skewed, long host stalls included: median 107 us and mean 174 us on the real LLM
  profile). It is what a simulated step is compared with when the real step was
  profiled (``oam validate --profile``'s step composition). ``launch.host_dispatch_s``, the host
  time of an unprofiled run, is kept from the base: the interval includes the profiler's own
  host overhead (record_shapes, with_stack), which a profile cannot separate.

What the fit does not capture: a kernel's error that depends on its shape within an op type (a
scale moves every kernel of a type alike, so the launch floor of small kernels and the
efficiency of large ones cannot both be fitted); op types the replay cannot re-cost (``LpNormV2``,
HCCL tasks, convolutions); collectives, pipeline bubbles and synchronisations; and the host
time of an unprofiled run (the fitted interval includes the profiler's own host overhead).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections import Counter, defaultdict
from datetime import datetime, timezone
from itertools import pairwise
from pathlib import Path

from simulator.profile import DEVICE_WAIT_MIN_GAP_S, any_between

from .files.importers import AscendCsv
from .kernel_replay import ReplayedKernel, ReplayError, replay_kernels

#: Fewest kernels of an op type for its scale to be fitted (and fewest host gaps for the host
#: interval): a median of fewer is one or two kernels' noise.
DEFAULT_MIN_KERNELS = 5
#: The Accelerator Core of a kernel that runs the Cube and Vector units together (torch_npu's
#: FlashAttentionScore and its gradient in the LLM profile).
MIX_CUBE_CORE = "MIX_AIC"


#: The interconnect field each transport of a profile's communication files sets (SIO, the
#: die-to-die link of a dual-die package, has none in the hardware files).
LINK_FIELDS = {"HCCS": "hccs_link_bandwidth_bytes_per_s", "PCIE": "pcie_bandwidth_bytes_per_s",
               "RDMA": "roce_bandwidth_bytes_per_s"}
#: Fewest bytes a transport must have carried in the profiles for its rate to be fitted: 64 MiB
#: take 3.4 ms at 20 GB/s, over 2,000 times an HCCS transfer's start-up latency (1.5 us in the
#: hardware files), so the rate is the links' and not their latency. Fewer keep the base's value.
MIN_LINK_FIT_BYTES = 64 * 1024 * 1024


class CalibrationError(ValueError):
    """Input ``oam calibrate`` cannot use; the one-line message names the file or option."""


def file_sha256(path: Path) -> str:
    """SHA-256 of the file's bytes, hexadecimal."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def host_intervals_s(read: AscendCsv) -> list[float]:
    """The host's time per kernel where the host was the bottleneck, read from a real
    ``kernel_details.csv`` (``read``: :func:`pytest_oam.files.importers.read_ascend_csv` of it):
    the start-to-start intervals, in seconds, of consecutive kernels (``before``, ``after``) on
    the profile's compute stream (its ``Stream ID`` with the most non-HCCL tasks) where

    * both are in the same step (a step boundary is the training loop's own host work);
    * the device sat idle between them, longer than :data:`simulator.profile.DEVICE_WAIT_MIN_GAP_S` (otherwise the
      device, not the host, set the pace);
    * no other device task (another stream's kernel, a DSA task, a collective) started between
      their starts: the host issued nothing else in between, so the interval is one issue;
    * no collective (an HCCL task) ended in the idle gap: the compute stream may have waited for
      it rather than for the host. A collective running across the whole gap is no reason to
      leave the pair out: it runs on its own stream, and the compute stream went on beside it
      (the AlexNet profiles' first gradient all-reduce runs 79 ms across the whole backward,
      whose kernels still start about 100 us apart);
    * ``after`` is not a fused attention kernel (Accelerator Core ``MIX_AIC``: the Cube and
      Vector units together), whose longer host call the spec may cost apart
      (``launch.attention_host_dispatch_s``; not measured here).

    The one definition of ``oam calibrate``'s fitted ``profiler.profiled_host_dispatch_s`` and of
    the bundled specs' (tests/test_step_composition.py recomputes it). The intervals include the
    profiler's own host overhead: the profile was collected under it.
    """
    ops, rows = read.profile.ops, read.rows
    streams = [row.get("Stream ID", "").strip() for row in rows]
    counts = Counter(s for op, s in zip(ops, streams, strict=True) if op.stream != "hccl")
    if not counts:
        return []
    stream = counts.most_common(1)[0][0]
    tasks = sorted(zip(ops, streams, strict=True), key=lambda task: task[0].start_s)  # every device task
    on_stream = [i for i, (op, s) in enumerate(tasks) if op.stream != "hccl" and s == stream]
    collective_ends = sorted(op.start_s + op.duration_s for op in ops if op.stream == "hccl")
    intervals = []
    for i, j in pairwise(on_stream):
        before, after = tasks[i][0], tasks[j][0]
        idle_from, idle_to = before.start_s + before.duration_s, after.start_s
        if before.step != after.step or idle_to - idle_from <= DEVICE_WAIT_MIN_GAP_S:
            continue
        if j != i + 1:
            continue  # another task started between them: the host issued it in the interval
        if any_between(collective_ends, idle_from, idle_to):
            continue
        if str(after.attrs.get("accelerator_core", "")).upper() == MIX_CUBE_CORE:
            continue  # a fused attention call: the host's own interval, launch.attention_host_dispatch_s
        intervals.append(after.start_s - before.start_s)
    return intervals


def communication_file(csv_path: Path) -> Path | None:
    """The communication file beside a profile's ``kernel_details.csv``: its
    ``communication_matrix.json``, else its ``communication.json``, else None."""
    from .files.communication_matrix import COMMUNICATION_FILE, MATRIX_FILE

    for name in (MATRIX_FILE, COMMUNICATION_FILE):
        if (csv_path.parent / name).is_file():
            return csv_path.parent / name
    return None


def fit_link_rates(files: list[Path], base) -> dict[str, dict]:
    """Per transport with a field in the hardware file (:data:`LINK_FIELDS`) that carried at least
    :data:`MIN_LINK_FIT_BYTES` in the profiles, the rate their communication files show (their summed collectives' bytes over transit time,
    :func:`pytest_oam.files.communication_matrix.read_link_rates`, pooled over the files) and
    the value to write: that over ``base``'s ``interconnect.link_efficiency_frac``, which the cost
    model applies, rounded to 0.1 GB/s.

    Raises:
        CalibrationError: a communication file that cannot be read (the message names it).
    """
    from .files.communication_matrix import read_link_rates
    from .files.realfile import ImportError_
    from .format import fmt_gb_per_s, fmt_mb, fmt_ms

    pooled: dict[str, list[float]] = {}
    for file in files:
        try:
            rates = read_link_rates(file)
        except ImportError_ as exc:
            raise CalibrationError(str(exc)) from None
        for transport, rate in rates.items():
            total = pooled.setdefault(transport, [0.0, 0.0])
            total[0] += rate.transit_bytes
            total[1] += rate.transit_s
    ic = base.interconnect
    # a link reads what it carries from the card's memory: no faster than the HBM
    ceiling = base.memory.hbm_bandwidth_bytes_per_s
    fits = {}
    for transport, (nbytes, seconds) in sorted(pooled.items()):
        field = LINK_FIELDS.get(transport)
        if field is None or nbytes < MIN_LINK_FIT_BYTES:
            continue
        achieved = nbytes / seconds
        if achieved > ceiling:
            raise CalibrationError(f"{', '.join(map(str, files))}: {transport} carried {fmt_mb(nbytes)} in "
                                   f"{fmt_ms(seconds, 3)}, {fmt_gb_per_s(achieved)}, faster than the card's HBM "
                                   f"({fmt_gb_per_s(ceiling)}): not a link rate")
        fits[transport] = {"field": field, "achieved_bytes_per_s": achieved, "transit_bytes": nbytes,
                           "before_bytes_per_s": getattr(ic, field),
                           "fitted_bytes_per_s": round(achieved / ic.link_efficiency_frac, -8)}
    return fits


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
    intervals = {str(r.csv_path): host_intervals_s(r.read) for r in replays}
    every_interval = [i for found in intervals.values() for i in found]
    host_fitted = (round(statistics.fmean(every_interval), 12)  # whole picoseconds: the file stays readable
                   if len(every_interval) >= min_kernels else None)
    comm_files = [f for f in (communication_file(r.csv_path) for r in replays) if f is not None]
    link_rates = fit_link_rates(comm_files, base)
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
              "(pytest_oam/calibrate.py); profiler.profiled_host_dispatch_s is the mean host interval per kernel "
              "(pytest_oam.calibrate.host_intervals_s: consecutive compute-stream kernels in one step with the device "
              "idle between them, nothing else issued between and no collective ending in the gap; "
              f"{len(every_interval):,} such pairs), or the base's value when fewer than {min_kernels}. Measured under "
              "the profiler, whose own host overhead the interval includes, so launch.host_dispatch_s (unprofiled "
              "runs) is kept from the base"
              + ("; interconnect " + ", ".join(f"{f['field']}" for f in link_rates.values()) + ": the bytes over transit "
                 "time of the summed collectives in " + ", ".join(map(str, comm_files)) + ", over "
                 "interconnect.link_efficiency_frac (pytest_oam.calibrate.fit_link_rates)" if link_rates else ""))
    calibration = {
        "source": source, "base_hardware": base_name,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "tool": f"pytest-oam {pytest_oam.__version__}, simulator {simulator.SIMULATOR_VERSION}",
        "profiles": [{"path": str(r.csv_path), "sha256": file_sha256(r.csv_path), "kernels": len(r.kernels),
                      "host_gaps": len(intervals[str(r.csv_path)])} for r in replays],
        "min_kernels": min_kernels, "op_time_scale": op_time_scale,
        "profiled_host_dispatch_s_before": base.profiler.profiled_host_dispatch_s,
        "profiled_host_dispatch_s_fitted": host_fitted,
        "kernels": len(kernels), "median_abs_error_frac_before": median_abs_error(kernels),
        "median_abs_error_frac_after": median_abs_error(kernels, scales),
        "link_files": [str(f) for f in comm_files],
        "link_rates": link_rates,
    }
    CalibrationSpec.model_validate(calibration)  # our own output: fail here, not when it is read back
    data = base.model_dump(mode="json")
    name = output.stem if output.stem not in list_hardware() else f"{output.stem}-calibrated"
    data.update(name=name, display_name=f"{base.display_name}, calibrated ({output.name})", calibration=calibration)
    if host_fitted is not None:
        # a profiled run's host time per kernel: what a profiled step is compared with (oam validate
        # --profile's step composition); launch.host_dispatch_s (unprofiled runs) stays the base's,
        # as the profile cannot separate the profiler's own host overhead from the dispatch
        before = base.profiler.profiled_host_dispatch_s
        data["profiler"]["profiled_host_dispatch_s"] = host_fitted
        data["profiler"]["source"] += (". profiled_host_dispatch_s: replaced by oam calibrate ("
                                       + ("none" if before is None else f"{before:g} s") + f" in {base_name}): the "
                                       "mean host interval of the profiles, see the calibration group")
    for transport, fit in link_rates.items():
        data["interconnect"][fit["field"]] = fit["fitted_bytes_per_s"]
        data["interconnect"]["source"] += (f". {fit['field']}: replaced by oam calibrate ({fit['before_bytes_per_s']:g} "
                                           f"in {base_name}): the {transport} rate of the profiles' communication "
                                           "files, see the calibration group")
    HardwareSpec.model_validate(data)
    output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return calibration


def calibration_text(calibration: dict, output: Path, fmt: str = "simple") -> str:
    """What ``oam calibrate`` prints: the fit per op type, the host interval and the overall
    median |error| before and after."""
    from tabulate import tabulate

    from .format import fmt_gb_per_s, fmt_mb, fmt_percent, fmt_time, table_cell

    rows = [(table_cell(t, fmt), f["kernels"], f"{f['time_scale']:.3f}" if f["fitted"] else "kept",
             fmt_percent(f["median_abs_error_frac_before"], 1), fmt_percent(f["median_abs_error_frac_after"], 1))
            for t, f in sorted(calibration["op_time_scale"].items()) if f["kernels"]]
    lines = [(f"calibrated {calibration['base_hardware']} to {len(calibration['profiles'])} profile(s), "
              f"{calibration['kernels']:,} kernels re-costed"), "",
             tabulate(rows, headers=("op type", "kernels", "time scale", table_cell("median |error| before", fmt), "after"),
                      tablefmt=fmt, disable_numparse=True), ""]
    host, before = calibration["profiled_host_dispatch_s_fitted"], calibration["profiled_host_dispatch_s_before"]
    gaps = sum(p["host_gaps"] for p in calibration["profiles"])
    lines.append(f"host dispatch per kernel under the profiler: {'none' if before is None else fmt_time(before)} -> "
                 + (f"{fmt_time(host)} ({gaps:,} host gaps)" if host is not None
                    else f"kept ({gaps:,} host gaps, fewer than {calibration['min_kernels']:,})")
                 + "; launch.host_dispatch_s kept: a profile cannot separate the profiler's overhead")
    if calibration.get("link_files") and not calibration.get("link_rates"):
        lines.append(f"links: kept: {', '.join(calibration['link_files'])} show no transport between NPUs that "
                     f"carried {fmt_mb(MIN_LINK_FIT_BYTES)} or more")
    for transport, fit in sorted(calibration.get("link_rates", {}).items()):
        lines.append(f"{transport} links: {fmt_gb_per_s(fit['achieved_bytes_per_s'])} achieved over "
                     f"{fmt_mb(fit['transit_bytes'])}; interconnect.{fit['field']} "
                     f"{fmt_gb_per_s(fit['before_bytes_per_s'])} -> {fmt_gb_per_s(fit['fitted_bytes_per_s'])}")
    lines.append(f"median |error| per kernel: {fmt_percent(calibration['median_abs_error_frac_before'], 1)} before, "
                 f"{fmt_percent(calibration['median_abs_error_frac_after'], 1)} after")
    lines.append(f"wrote {table_cell(output, fmt)}: use it as --oam-hardware {table_cell(output, fmt)}, "
                 f"hardware=\"{table_cell(output, fmt)}\" or oam validate --hardware {table_cell(output, fmt)}")
    return "\n".join(lines)
