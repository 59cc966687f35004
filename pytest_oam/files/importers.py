"""Real profiler output into the same :class:`~simulator.profile.Profile` the simulator makes,
so the gate, ``oam compare`` and the diagnosis work on real runs too.

Formats:

* the torch_npu profiler's ``kernel_details.csv`` (``ASCEND_PROFILER_OUTPUT``) and msprof's
  ``op_summary_*.csv``: one row per device task, with the ``aic_*`` / ``aiv_*`` pipe ratios;
* Chrome-trace JSON, plain or gzip: PyTorch Kineto traces (``{"traceEvents": [...]}``; GPU
  ``kernel`` events are the operators, op type = the kernel's function name without namespace
  and template arguments) and torch_npu's ``trace_view.json`` (a top-level array; the
  ``Ascend Hardware`` process holds the device tasks).

A run's step time is the span of its device tasks in a step (``ProfilerStep#N`` annotations
in traces, ``Step Id`` in CSVs); a trace without step annotations is one step whose time is
the device's busy time (the union of its kernels), not the trace's span with the host's gaps.

Real files have traps, handled here: timestamps with trailing tabs or given as strings,
``N/A`` in metric columns, a top-level array instead of an object. Every problem is a
:class:`ImportError_` naming the file and the line or field at fault.

Identity of an imported profile: ``hardware`` is ``real:<source>`` (``real:torch_npu`` for
the CSVs, ``real:torch_npu-trace``, ``real:kineto``) and ``simulator_version`` is ``imported``,
so imported runs compare with imported runs of the same kind, never with simulated ones; the
workload fingerprint is the first step's op sequence, so runs that profiled different numbers
of steps still compare.
"""

from __future__ import annotations

import csv
import decimal
import hashlib
import io
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path

from simulator.profile import CommInfo, MemoryRecord, OpRecord, Profile, StepMemory
from simulator.units import GIGA, MEGA, S_PER_MS, S_PER_US, KiB, MiB

#: Column names of the two Ascend CSV flavours, first match wins.
_COLUMNS = {
    "type": ("Type", "OP Type", "Op Type"),
    "name": ("Name", "Op Name", "OP Name"),
    "start": ("Start Time(us)", "Task Start Time(us)", "Task Start Time"),
    "duration": ("Duration(us)", "Task Duration(us)"),
    "core": ("Accelerator Core", "Task Type"),
    "step": ("Step Id",),
    "block_dim": ("Block Dim",),
    "shapes": ("Input Shapes",),
    "dtypes": ("Input Data Types",),
}
_RATIOS = {
    "mac_ratio": ("aic_mac_ratio", "mac_ratio"),
    "vec_ratio": ("aiv_vec_ratio", "vec_ratio", "aic_vec_ratio"),
    "mte2_ratio": ("aic_mte2_ratio", "aiv_mte2_ratio", "mte2_ratio"),
}


class ImportError_(ValueError):
    """A profiler file that cannot be imported; the message names the file and what is wrong."""


def _number(text: object, path: Path, where: str, default: float | None = None) -> float:
    """A number from a real file: strips tabs and spaces, ``N/A`` and empty give ``default``."""
    raw = str(text).strip() if text is not None else ""
    if raw in ("", "N/A", "NA", "-") and default is not None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImportError_(f"{path}: {where}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ImportError_(f"{path}: {where}: {raw!r} is not finite")
    return value


def _timestamp_us(text: object, path: Path, where: str) -> decimal.Decimal:
    """A timestamp in microseconds, exactly: string timestamps such as
    ``"1704161511422904.204"`` lose their sub-microsecond part as floats."""
    raw = str(text).strip() if text is not None else ""
    try:
        value = decimal.Decimal(raw)
    except decimal.InvalidOperation:
        raise ImportError_(f"{path}: {where}: {raw!r} is not a number") from None
    if not value.is_finite():
        raise ImportError_(f"{path}: {where}: {raw!r} is not finite")
    return value


def _duration_us(text: object, path: Path, where: str) -> float:
    value = _number(text, path, where)
    if value < 0:
        raise ImportError_(f"{path}: {where}: negative duration {value:g}")
    return value


def _shapes(text: str) -> list[list[int]]:
    """``"32,3,224,224;64,3,11,11"`` (quoted in the CSV) -> ``[[32, 3, 224, 224], [64, 3, 11, 11]]``."""
    shapes = []
    for part in str(text).strip().strip('"').split(";"):
        dims = [d for d in part.strip().strip('"').split(",") if d.strip()]
        try:
            shapes.append([int(d) for d in dims])
        except ValueError:
            shapes.append([])
    return [s for s in shapes if s]


def _fingerprint(ops: Iterable[OpRecord]) -> str:
    """The op sequence of the first step: real runs profile different numbers of steps."""
    digest = hashlib.sha256()
    for op in ops:
        if op.step == 0:
            digest.update(f"{op.op_type}|{op.input_shapes}|{op.dtype};".encode())
    return digest.hexdigest()[:16]


def _profile(ops: list[OpRecord], source: str, steps: int, step_times_s: list[float] | None = None) -> Profile:
    return Profile(simulator_version="imported", hardware=f"real:{source}", devices=1, steps=max(1, steps),
                   workload_fingerprint=_fingerprint(ops), ops=ops, measured_step_times_s=step_times_s)


def _record(**fields) -> OpRecord:
    defaults = {"flop": 0.0, "hbm_bytes": 0.0, "l2_bytes": 0.0, "block_dim": 0, "dma_count": 0, "ai_core_util_frac": 0.0,
                    "hbm_bandwidth_util_frac": 0.0, "mac_ratio": 0.0, "vec_ratio": 0.0, "mte2_ratio": 0.0, "input_shapes": [],
                    "dtype": "", "attrs": {}, "source": None, "comm": None}
    return OpRecord(**{**defaults, **fields})


# -- Ascend CSV (kernel_details.csv, op_summary_*.csv) --------------------------------------------


def import_ascend_csv(path: str | Path) -> Profile:
    """A torch_npu ``kernel_details.csv`` or an msprof ``op_summary_*.csv``.

    Each row is a device task: ``op_type`` is its Type, ``name`` its Name; HCCL tasks go to the
    ``hccl`` stream. Steps are numbered from 0 in the order of their ``Step Id``.

    Raises:
        ImportError_: unreadable, not a CSV, a required column missing, or a bad number (the
            message names the file, the line and the column).
    """
    path = Path(path)
    text = _read_text(path)
    if not text.strip():
        raise ImportError_(f"{path}: is empty")
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = [h.strip() for h in (reader.fieldnames or [])]
    except csv.Error as exc:
        raise ImportError_(f"{path}: line 1: not a valid CSV header ({exc})") from None
    repeated = sorted({h for h in header if header.count(h) > 1 and h})
    if repeated:
        raise ImportError_(f"{path}: line 1: column {', '.join(map(repr, repeated))} appears more than once")
    reader.fieldnames = header

    def column(key: str, required: bool = True) -> str | None:
        for name in _COLUMNS[key]:
            if name in header:
                return name
        if required:
            raise ImportError_(f"{path}: no {' / '.join(_COLUMNS[key])} column; this is not a torch_npu "
                               f"kernel_details.csv or msprof op_summary CSV (columns: {', '.join(header[:8])} ...)")
        return None

    c_type, c_name, c_start, c_dur = column("type"), column("name"), column("start"), column("duration")
    c_core, c_step, c_block = column("core", False), column("step", False), column("block_dim", False)
    c_shapes, c_dtypes = column("shapes", False), column("dtypes", False)
    ratio_cols = {k: [c for c in names if c in header] for k, names in _RATIOS.items()}
    rows = []
    try:
        for line, row in enumerate(reader, start=2):
            if None in row:
                raise ImportError_(f"{path}: line {line}: more fields than the {len(header)} columns")
            if any(v is None for v in row.values()):
                filled = sum(v is not None for v in row.values())
                raise ImportError_(f"{path}: line {line}: {filled} fields for {len(header)} columns (truncated file?)")
            if not (row[c_type].strip() or row[c_name].strip()):
                raise ImportError_(f"{path}: line {line}: no {c_type} and no {c_name}")
            if c_step and not row[c_step].strip():
                raise ImportError_(f"{path}: line {line}: empty {c_step}")
            rows.append((line, row))
    except csv.Error as exc:
        raise ImportError_(f"{path}: line {reader.line_num}: not a valid CSV row ({exc})") from None
    if not rows:
        raise ImportError_(f"{path}: holds no task rows")
    def step_key(text: str) -> tuple:
        return (0, float(text), text) if re.fullmatch(r"[-+]?\d+(\.\d*)?", text) else (1, 0.0, text)

    step_ids = sorted({row[c_step].strip() for _, row in rows}, key=step_key) if c_step else ["0"]
    step_index = {s: i for i, s in enumerate(step_ids)}
    starts = [_timestamp_us(row[c_start], path, f"line {line}, column {c_start!r}") for line, row in rows]
    origin = min(starts)
    ops = []
    for (line, row), start in zip(rows, starts, strict=True):
        where = f"line {line}"
        core = row[c_core].strip() if c_core else ""
        ratios = {k: max((_number(row[c], path, f"{where}, column {c!r}", 0.0) for c in cols), default=0.0)
                  for k, cols in ratio_cols.items()}
        ops.append(_record(
            op_type=row[c_type].strip() or row[c_name].strip(),
            name=row[c_name].strip(),
            step=step_index[row[c_step].strip()] if c_step else 0,
            stream="hccl" if core.upper().startswith("HCCL") or row[c_type].strip().startswith("hcom") else "compute",
            # not display: the CSV's microseconds read into the profile's seconds
            start_s=float(start - origin) * S_PER_US,
            duration_s=_duration_us(row[c_dur], path, f"{where}, column {c_dur!r}") * S_PER_US,
            block_dim=max(0, int(_number(row[c_block], path, f"{where}, column {c_block!r}", 0.0))) if c_block else 0,
            input_shapes=_shapes(row[c_shapes]) if c_shapes else [],
            dtype=row[c_dtypes].split(";")[0].strip().lower() if c_dtypes else "",
            mac_ratio=min(1.0, max(0.0, ratios["mac_ratio"])), vec_ratio=min(1.0, max(0.0, ratios["vec_ratio"])),
            mte2_ratio=min(1.0, max(0.0, ratios["mte2_ratio"])),
        ))
    return _profile(ops, "torch_npu", len(step_ids))


# -- Chrome-trace JSON (Kineto, torch_npu trace_view.json) -----------------------------------------

#: Kineto categories imported as operators: device kernels. Host-driven copies and memsets
#: (``gpu_memcpy``, ``gpu_memset``) move data between operators and are left out.
_KERNEL_CATS = ("kernel",)


def _short_kernel_name(name: str) -> str:
    """A stable op type from a C++ kernel name: drop ``void``, anonymous namespaces, template
    and call arguments, and the namespace path."""
    text = name.replace("(anonymous namespace)::", "").removeprefix("void ").strip()
    text = re.split(r"[<(]", text, maxsplit=1)[0].strip()
    return text.rsplit("::", 1)[-1] or name


def _ascend_task_type(name: str) -> str:
    """``aclnnMm_MatMulCommon_MatMulV2`` -> ``MatMulV2`` (the kernel); ``Conv2D1_x`` -> ``Conv2D``."""
    if name.startswith("aclnn") and "_" in name:
        return name.rsplit("_", 1)[-1]
    return re.sub(r"\d+$", "", name.split("_")[0]) or name


def import_chrome_trace(path: str | Path) -> Profile:
    """A Kineto trace (GPU kernels, memcpy, memset) or a torch_npu ``trace_view.json`` (the
    ``Ascend Hardware`` process's tasks), plain or gzip-compressed.

    Steps come from ``ProfilerStep#N`` annotations when there are any (one step otherwise).

    Raises:
        ImportError_: unreadable, not JSON, no trace events, or a device event without a number
            where ``ts`` or ``dur`` should be (naming the file and the event).
    """
    path = Path(path)
    data = _read_json(path)
    events = data if isinstance(data, list) else data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list) or not any(isinstance(e, dict) and "ph" in e for e in events):
        raise ImportError_(f"{path}: no trace events: not a profile, a baseline file or a Chrome trace "
                           "(a JSON array of events, or an object with 'traceEvents')")
    def args_of(e: dict) -> dict:
        args = e.get("args")
        return args if isinstance(args, dict) else {}

    hardware_pids = {str(e.get("pid")) for e in events if isinstance(e, dict) and e.get("ph") == "M"
                     and e.get("name") == "process_name" and args_of(e).get("name") == "Ascend Hardware"}
    source = "torch_npu-trace" if hardware_pids else "kineto"
    device, steps = [], []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name = str(e.get("name", ""))
        if name.startswith("ProfilerStep#"):
            start = _timestamp_us(e.get("ts"), path, f"event {i} ('{name}') ts")
            steps.append((start, start + decimal.Decimal(repr(_duration_us(e.get("dur"), path, f"event {i} ('{name}') dur")))))
        if e.get("cat") in _KERNEL_CATS or str(e.get("pid")) in hardware_pids:
            device.append((i, e))
    if not device:
        raise ImportError_(f"{path}: no device events (Kineto 'kernel' events or an 'Ascend Hardware' process)")
    steps.sort()
    records = []
    for i, e in device:
        ts = _timestamp_us(e.get("ts"), path, f"event {i} ts")
        dur = _duration_us(e.get("dur"), path, f"event {i} dur")
        step = next((k for k, (s, end) in enumerate(steps) if s <= ts <= end), 0 if not steps else None)
        if step is None:
            continue  # outside every profiled step
        records.append((ts, dur, step, str(e.get("name", "")), args_of(e)))
    if not records:
        raise ImportError_(f"{path}: no device event falls inside a ProfilerStep")
    origin = min(r[0] for r in records)
    used_steps = sorted({r[2] for r in records})
    renumber = {s: i for i, s in enumerate(used_steps)}
    ops = [  # not display: the trace's microseconds read into seconds
        _record(op_type=_short_kernel_name(name) if source == "kineto" else _ascend_task_type(name),
                name=name[:200], step=renumber[step], stream="hccl" if "nccl" in name.lower() or name.startswith("hcom")
                else "compute", start_s=float(ts - origin) * S_PER_US, duration_s=dur * S_PER_US)
        for ts, dur, step, name, _ in sorted(records, key=lambda r: r[0])
    ]
    if steps:
        return _profile(ops, source, len(used_steps))
    # No ProfilerStep annotations: the span of a whole trace includes the host's idle gaps
    # (seconds of them in a benchmark), so the step time is the device's busy time instead.
    return _profile(ops, source, 1, step_times_s=[_busy_s(ops)])


def _busy_s(ops: list[OpRecord]) -> float:
    """Time in which at least one op ran (the union of the ops' intervals)."""
    total, end = 0.0, -math.inf
    for op in sorted(ops, key=lambda o: o.start_s):
        stop = op.start_s + op.duration_s
        if stop > end:
            total += stop - max(op.start_s, end)
            end = stop
    return total


# -- entry point --------------------------------------------------------------------------------


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed if gzip: regular files only (a named pipe is never opened),
    at most :data:`pytest_oam.fileio.MAX_INPUT_BYTES` after decompression."""
    from .fileio import InputFileError, read_input_bytes

    try:
        return read_input_bytes(path)
    except InputFileError as exc:
        raise ImportError_(f"{path}: {exc.problem}") from None


def _read_text(path: Path) -> str:
    try:
        return _read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ImportError_(f"{path}: is not UTF-8 text (byte {exc.start}): binary data?") from None


def _read_json(path: Path) -> object:
    raw = _read_bytes(path)  # its ImportError_ (a ValueError) is not "not valid JSON"
    try:
        return json.loads(raw)
    except RecursionError:
        raise ImportError_(f"{path}: is not a trace: its JSON nests too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, and int literals past the digit limit
        raise ImportError_(f"{path}: is not valid JSON ({exc})") from None


def import_torch_npu_folder(path: str | Path) -> Profile:
    """A torch_npu profiler output folder (``*_ascend_pt`` or its ``ASCEND_PROFILER_OUTPUT``):
    ``kernel_details.csv`` for the ops, plus, when present, ``operator_memory.csv`` for the
    memory records and ``communication.json`` for the collectives.

    From ``operator_memory.csv`` (sizes in KB = 1024 bytes, totals in MB = 2**20 bytes): one
    ``alloc`` record per row at its Allocation Time and one ``free`` at its Release Time when
    the tensor was released inside the window. ``cann::*`` rows are CANN's workspace pool, the
    others torch_npu's caching allocator; each reports its own totals and the device's are their
    sum. Per step: the peaks of the allocated and reserved totals, the allocation and free
    counts, and device mallocs / frees counted as the rises and falls of a pool's reserved
    total (a caching pool reserves memory only through device mallocs). What the file does not record is zero: allocator host time, retries, the
    inactive split bytes and the largest free block.

    From ``communication.json``: each collective's transit bytes (MB = 10**6 bytes, as its
    ``Bandwidth(GB/s)`` = MB / ms shows), the bandwidth of its busiest transport as bus
    bandwidth, bytes / elapse time as algorithm bandwidth, and its wait, synchronisation, idle
    and transit times as op attributes (``wait_time_s`` ...), matched to the ``hcom_*`` rows of
    ``kernel_details.csv`` by name. The algorithm and group size are not recorded there.

    Raises:
        ImportError_: no ``kernel_details.csv``, or a bad file (naming it, the line or field).
    """
    path = Path(path)
    folder = path / "ASCEND_PROFILER_OUTPUT" if (path / "ASCEND_PROFILER_OUTPUT").is_dir() else path
    kernels = folder / "kernel_details.csv"
    if not kernels.is_file():
        raise ImportError_(f"{path}: a folder without ASCEND_PROFILER_OUTPUT/kernel_details.csv or kernel_details.csv")
    profile = import_ascend_csv(kernels)
    origin_us = _csv_origin_us(kernels)
    update: dict[str, object] = {}
    if (folder / "communication.json").is_file():
        update["ops"] = _attach_communication(profile.ops, folder / "communication.json")
    if (folder / "operator_memory.csv").is_file():
        events = _operator_memory(folder / "operator_memory.csv", origin_us, profile)
        update["memory_events"] = events
        update["memory"] = _step_memory(events, profile.steps)
    if not update:
        return profile
    return Profile.model_validate({**profile.model_dump(), **{k: v for k, v in update.items()}})


def _csv_origin_us(path: Path) -> decimal.Decimal:
    """The first task start of a kernel_details.csv (the zero of the imported timeline)."""
    reader = csv.DictReader(io.StringIO(_read_text(path), newline=""))
    column = next(c for c in _COLUMNS["start"] if c in [h.strip() for h in reader.fieldnames or []])
    raw = column if column in (reader.fieldnames or []) else next(h for h in reader.fieldnames if h.strip() == column)
    return min(_timestamp_us(row[raw], path, "start") for row in reader)


def _step_of(time_s: float, profile: Profile) -> int:
    """The step whose op span holds ``time_s`` (the last step that started before it)."""
    starts = {}
    for op in profile.ops:
        if op.step not in starts or op.start_s < starts[op.step]:
            starts[op.step] = op.start_s
    step = 0
    for s, start in sorted(starts.items(), key=lambda kv: kv[1]):
        if start <= time_s:
            step = s
    return step


_MEMORY_COLUMNS = ("Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)", "Allocation Total Allocated(MB)",
                   "Allocation Total Reserved(MB)", "Release Total Allocated(MB)", "Release Total Reserved(MB)")


def _operator_memory(path: Path, origin_us: decimal.Decimal, profile: Profile) -> list[MemoryRecord]:
    reader = csv.DictReader(io.StringIO(_read_text(path), newline=""))
    header = [h.strip() for h in reader.fieldnames or []]
    missing = [c for c in _MEMORY_COLUMNS if c not in header]
    if missing:
        raise ImportError_(f"{path}: no {', '.join(map(repr, missing))} column; not a torch_npu operator_memory.csv")
    reader.fieldnames = header
    events = []
    try:
        rows = list(enumerate(reader, start=2))
    except csv.Error as exc:
        raise ImportError_(f"{path}: line {reader.line_num}: not a valid CSV row ({exc})") from None
    for line, row in rows:
        if None in row or any(v is None for v in row.values()):
            raise ImportError_(f"{path}: line {line}: {len(header)} columns expected (truncated file?)")

        def num(column: str, default: float | None = None, row=row, line=line) -> float:
            return _number(row[column], path, f"line {line}, column {column!r}", default)

        size = int(num("Size(KB)") * KiB)  # not display: the file's KB (1024 bytes) read into bytes
        # CANN's own workspace pool reports its own totals; everything else is torch_npu's
        # caching allocator
        pool = "cann" if row["Name"].strip().startswith("cann::") else "torch_npu"
        if size < 0:
            raise ImportError_(f"{path}: line {line}, column 'Size(KB)': negative size")
        stream = int(num("Stream Ptr", 0.0)) if "Stream Ptr" in header else 0
        for action, time_col, alloc_col, reserved_col in (
            ("alloc", "Allocation Time(us)", "Allocation Total Allocated(MB)", "Allocation Total Reserved(MB)"),
            ("free", "Release Time(us)", "Release Total Allocated(MB)", "Release Total Reserved(MB)"),
        ):
            if not row[time_col].strip():
                continue  # not released inside the profiling window
            # not display: the file's microseconds read into seconds
            time_s = max(0.0, float(_timestamp_us(row[time_col], path, f"line {line}, column {time_col!r}") - origin_us)
                         * S_PER_US)
            events.append(MemoryRecord(
                step=_step_of(time_s, profile), time_s=time_s, action=action, requested_bytes=size,
                block_bytes=size, address=0, pool=pool, stream=max(0, stream), latency_s=0.0,
                device_mallocs=0, device_frees=0, alloc_retried=False,
                # not display: the file's MB (2**20 bytes) read into bytes
                allocated_bytes=max(0, int(num(alloc_col, 0.0) * MiB)),
                reserved_bytes=max(0, int(num(reserved_col, 0.0) * MiB)),
            ))
    events.sort(key=lambda e: (e.time_s, e.action != "alloc"))
    # Each pool reports its own totals: the device's are their sum. A pool's reserved total
    # rises only by device mallocs and falls only by device frees.
    marked, pools = [], {}
    for e in events:
        previous = pools.get(e.pool)
        pools[e.pool] = (e.allocated_bytes, e.reserved_bytes)
        mallocs = int(previous is not None and e.reserved_bytes > previous[1])
        frees = int(previous is not None and e.reserved_bytes < previous[1])
        marked.append(e.model_copy(update={
            "device_mallocs": mallocs, "device_frees": frees,
            "allocated_bytes": sum(a for a, _ in pools.values()), "reserved_bytes": sum(r for _, r in pools.values()),
        }))
    return marked


def _step_memory(events: list[MemoryRecord], steps: int) -> list[StepMemory]:
    result = []
    for step in range(steps):
        mine = [e for e in events if e.step == step]
        if not mine:
            continue
        result.append(StepMemory(
            step=step, allocated_peak_bytes=max(e.allocated_bytes for e in mine),
            reserved_peak_bytes=max(e.reserved_bytes for e in mine),
            allocated_end_bytes=mine[-1].allocated_bytes, reserved_end_bytes=mine[-1].reserved_bytes,
            inactive_split_bytes=0, largest_free_block_bytes=0,
            alloc_count=sum(e.action == "alloc" for e in mine), free_count=sum(e.action == "free" for e in mine),
            device_mallocs=sum(e.device_mallocs for e in mine), device_frees=sum(e.device_frees for e in mine),
            alloc_retries=0, alloc_time_s=0.0,
        ))
    return result


_TIME_FIELDS = {"wait_time_s": "Wait Time(ms)", "synchronization_time_s": "Synchronization Time(ms)",
                "idle_time_s": "Idle Time(ms)", "transit_time_s": "Transit Time(ms)"}


def _attach_communication(ops: list[OpRecord], path: Path) -> list[OpRecord]:
    data = _read_json(path)
    if not isinstance(data, dict):
        raise ImportError_(f"{path}: is not a torch_npu communication.json (expected an object of steps)")
    info: dict[str, tuple[CommInfo, dict[str, float | str]]] = {}
    for step, groups in data.items():
        if not isinstance(groups, dict):
            raise ImportError_(f"{path}: {step}: expected an object with 'collective' and 'p2p'")
        for kind in ("collective", "p2p"):
            for key, op in (groups.get(kind) or {}).items():
                if key == "Total Op Info" or not isinstance(op, dict):
                    continue
                where = f"{step}.{kind}.{key}"
                times = op.get("Communication Time Info")
                links = op.get("Communication Bandwidth Info")
                if not isinstance(times, dict) or not isinstance(links, dict):
                    raise ImportError_(f"{path}: {where}: no 'Communication Time Info' / 'Communication Bandwidth Info'")
                # not display: the file's ms, MB (1e6 bytes) and GB/s read into seconds, bytes, bytes/s
                elapse_s = _number(times.get("Elapse Time(ms)"), path, f"{where}: 'Elapse Time(ms)'") * S_PER_MS
                transports = {
                    name: (_number(v.get("Transit Size(MB)"), path, f"{where}: {name} 'Transit Size(MB)'", 0.0) * MEGA,
                           _number(v.get("Bandwidth(GB/s)"), path, f"{where}: {name} 'Bandwidth(GB/s)'", 0.0) * GIGA)
                    for name, v in links.items() if isinstance(v, dict) and name != "SDMA"
                } or {}
                if not any(b for b, _ in transports.values()) and isinstance(links.get("SDMA"), dict):
                    sdma = links["SDMA"]
                    transports = {"SDMA": (_number(sdma.get("Transit Size(MB)"), path, f"{where}: SDMA size", 0.0) * MEGA,
                                           _number(sdma.get("Bandwidth(GB/s)"), path, f"{where}: SDMA bw", 0.0) * GIGA)}
                nbytes = sum(b for b, _ in transports.values())
                busiest = max(transports, key=lambda n: transports[n][0]) if transports else "none"
                attrs: dict[str, float | str] = {  # not display: the file's ms read into seconds
                    name: max(0.0, _number(times.get(col), path, f"{where}: {col!r}", 0.0)) * S_PER_MS
                    for name, col in _TIME_FIELDS.items()
                }
                attrs["transport"] = busiest
                comm = CommInfo(bytes=int(nbytes), algorithm="unrecorded",
                                algbw_bytes_per_s=nbytes / elapse_s if elapse_s > 0 else 0.0,
                                busbw_bytes_per_s=max(0.0, transports.get(busiest, (0, 0.0))[1]))
                info[key.split("@")[0]] = (comm, attrs)
    result = []
    for op in ops:
        found = info.get(op.name) if op.stream == "hccl" else None
        result.append(op if found is None else op.model_copy(update={"comm": found[0],
                                                                      "attrs": {**op.attrs, **found[1]}}))
    return result


def import_profile(path: str | Path) -> Profile:
    """Import whatever real profiler output ``path`` is: a ``.csv`` (torch_npu or msprof), a
    Chrome-trace ``.json`` / ``.json.gz``, or a torch_npu output folder
    (:func:`import_torch_npu_folder`).

    Raises:
        ImportError_: nothing importable there (naming the file and the problem).
    """
    path = Path(path)
    if path.is_dir():
        return import_torch_npu_folder(path)
    if path.suffix.lower() == ".csv":
        return import_ascend_csv(path)
    return import_chrome_trace(path)
