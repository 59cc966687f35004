"""Real profiler output into the same :class:`~simulator.profile.Profile` the simulator makes,
so the gate, ``oam compare`` and the diagnosis work on real runs too.

Formats:

* the torch_npu profiler's ``kernel_details.csv`` (``ASCEND_PROFILER_OUTPUT``) and msprof's
  ``op_summary_*.csv``: one row per device task, with the ``aic_*`` / ``aiv_*`` pipe ratios;
* Chrome-trace JSON, plain or gzip: PyTorch Kineto traces (``{"traceEvents": [...]}``; the
  GPU kernels, typed by the aten op that launched them: :mod:`.kineto`) and torch_npu's
  ``trace_view.json`` (a top-level array; kernels of the ``Ascend Hardware`` lanes and the
  collectives of the ``HCCL`` lane: :mod:`.trace_view`).

A run's step time is the span of its device tasks in a step (``ProfilerStep#N`` annotations
in traces, ``Step Id`` in CSVs); a trace without step annotations is one step whose time is
the device's busy time (the union of its kernels), not the trace's span with the host's gaps.

Real files have traps, handled here: timestamps with trailing tabs or given as strings,
``N/A`` in metric columns, a top-level array instead of an object. Every problem is a
:class:`ImportError_` naming the file and the line or field at fault; a file that is empty, cut
short, not UTF-8 or of another kind says so in its kind's words (:mod:`.file_kinds`).

Identity of an imported profile: ``hardware`` is ``real:<source>`` (``real:torch_npu`` for
the CSVs, ``real:torch_npu-trace``, ``real:kineto[:<GPU names>]``) and ``simulator_version`` is ``imported``,
so imported runs compare with imported runs of the same kind, never with simulated ones; the
workload fingerprint is the first step's op sequence, so runs that profiled different numbers
of steps still compare (for traces, stream by stream: :func:`.realfile.lanes_fingerprint`).
"""

from __future__ import annotations

import decimal
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from simulator.profile import CommInfo, MemoryRecord, OpRecord, Profile, StepMemory
from simulator.units import GIGA, MEGA, S_PER_MS, S_PER_US, KiB, MiB

from .file_kinds import check_input, json_kind_problem, json_problem
from .kernel_names import accelerator_core, imported_op_type, is_hccl, kernel_type
from .kineto import import_kineto
from .realfile import (  # ImportError_ is re-exported here: the importers' error
    ImportError_,
    csv_rows,
    duration_us,
    imported_profile,
    number,
    op_record,
    parse_shapes,
    read_bytes,
    read_text,
    step_key,
    timestamp_us,
)
from .trace_view import import_trace_view, is_trace_view

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
_CSV_KIND = "a torch_npu kernel_details.csv or msprof op_summary CSV"


def _input_shapes(cell: str) -> list[list[int]]:
    """The tensors' shapes of an ``Input Shapes`` cell (:func:`.realfile.parse_shapes`), scalars
    and absent inputs left out; none when the profiler recorded none or they do not parse."""
    try:
        shapes = parse_shapes(cell) or []
    except ValueError:
        return []  # oam validate --profile names such rows; the gate compares their times all the same
    return [list(s) for s in shapes if s]


def _fingerprint(ops: Iterable[OpRecord]) -> str:
    """The op sequence of the first step: real runs profile different numbers of steps."""
    digest = hashlib.sha256()
    for op in ops:
        if op.step == 0:
            digest.update(f"{op.op_type}|{op.input_shapes}|{op.dtype};".encode())
    return digest.hexdigest()[:16]


# -- Ascend CSV (kernel_details.csv, op_summary_*.csv) --------------------------------------------


@dataclass(frozen=True)
class AscendCsv:
    """A ``kernel_details.csv`` / ``op_summary_*.csv`` as read: its profile, whose ops are its
    rows in file order, and what the profile leaves out of them."""

    profile: Profile
    header: list[str]
    rows: list[dict[str, str]]
    #: The file's ``Step Id`` of each profile step (step ``k`` is ``step_ids[k]``); ``None``
    #: when the file has no such column (one step).
    step_ids: list[str] | None
    #: The first task's start, microseconds on the file's clock: the profile's time zero.
    origin_us: decimal.Decimal


def read_ascend_csv(path: str | Path) -> AscendCsv:
    """A torch_npu ``kernel_details.csv`` or an msprof ``op_summary_*.csv``, and its rows.

    Each row is a device task: ``op_type`` is its Type, ``name`` its Name. Steps are numbered
    from 0 in the order of their ``Step Id``. Where Type and Accelerator Core are ``N/A``
    (torch_npu's default Level0), the type comes from the Name and the core from the kernel
    table (:mod:`pytest_oam.files.kernel_names`); the core is kept as the op attribute
    ``accelerator_core``. HCCL tasks go to the ``hccl`` stream as the simulator's collectives
    (``AllReduce`` ...; :func:`~pytest_oam.files.kernel_names.imported_op_type`), their kernel
    type kept as the attribute ``kernel`` (``hcom_allReduce_``).

    Raises:
        ImportError_: unreadable, not a CSV, a required column missing, or a bad number (the
            message names the file, the line and the column).
    """
    path = Path(path)
    text = read_text(path)
    if not text.strip():
        raise ImportError_(f"{path}: is empty")
    header, rows = csv_rows(path, text, _CSV_KIND)

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
    for line, row in rows:
        if not (row[c_type].strip() or row[c_name].strip()):
            raise ImportError_(f"{path}: line {line}: no {c_type} and no {c_name}")
        if c_step and not row[c_step].strip():
            raise ImportError_(f"{path}: line {line}: empty {c_step}")
    if not rows:
        raise ImportError_(f"{path}: holds no task rows")
    step_ids = sorted({row[c_step].strip() for _, row in rows}, key=step_key) if c_step else None
    step_index = {s: i for i, s in enumerate(step_ids or [])}
    starts = [timestamp_us(row[c_start], path, f"line {line}, column {c_start!r}") for line, row in rows]
    origin = min(starts)
    ops = []
    for (line, row), start in zip(rows, starts, strict=True):
        where = f"line {line}"
        kind = kernel_type(row[c_type], row[c_name])  # Level0: from the name (kernel_names)
        core = accelerator_core(row[c_core] if c_core else "", kind)
        hccl = is_hccl(core, kind)
        op_type = imported_op_type(kind, hccl)
        ratios = {k: max((number(row[c], path, f"{where}, column {c!r}", 0.0) for c in cols), default=0.0)
                  for k, cols in ratio_cols.items()}
        ops.append(op_record(
            op_type=op_type,
            name=row[c_name].strip(),
            step=step_index[row[c_step].strip()] if c_step else 0,
            stream="hccl" if hccl else "compute",
            attrs={**({"accelerator_core": core} if core else {}), **({"kernel": kind} if kind != op_type else {})},
            # not display: the CSV's microseconds read into the profile's seconds
            start_s=float(start - origin) * S_PER_US,
            duration_s=duration_us(row[c_dur], path, f"{where}, column {c_dur!r}") * S_PER_US,
            block_dim=max(0, int(number(row[c_block], path, f"{where}, column {c_block!r}", 0.0))) if c_block else 0,
            input_shapes=_input_shapes(row[c_shapes]) if c_shapes else [],
            dtype=row[c_dtypes].split(";")[0].strip().lower() if c_dtypes else "",
            mac_ratio=min(1.0, max(0.0, ratios["mac_ratio"])), vec_ratio=min(1.0, max(0.0, ratios["vec_ratio"])),
            mte2_ratio=min(1.0, max(0.0, ratios["mte2_ratio"])),
        ))
    profile = imported_profile(ops, "torch_npu", len(step_ids or [0]), _fingerprint(ops))
    return AscendCsv(profile, header, [row for _, row in rows], step_ids, origin)


def import_ascend_csv(path: str | Path) -> Profile:
    """The profile of a torch_npu ``kernel_details.csv`` or an msprof ``op_summary_*.csv``
    (:func:`read_ascend_csv`).

    Raises:
        ImportError_: see :func:`read_ascend_csv`.
    """
    return read_ascend_csv(path).profile


# -- Chrome-trace JSON (Kineto, torch_npu trace_view.json) -----------------------------------------

def import_chrome_trace(path: str | Path) -> Profile:
    """A Chrome-trace JSON, plain or gzip: torch_npu's ``trace_view.json`` (it names an ``Ascend
    Hardware`` process; :func:`pytest_oam.files.trace_view.import_trace_view`) or a PyTorch
    Kineto trace (:func:`pytest_oam.files.kineto.import_kineto`).

    Raises:
        ImportError_: unreadable, not JSON, no trace events, no device events, or a device event
            without a number where ``ts`` or ``dur`` should be (naming the file and the event).
    """
    path = Path(path)
    data = _read_json(path)
    events = data if isinstance(data, list) else data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list) or not any(isinstance(e, dict) and "ph" in e for e in events):
        raise ImportError_(json_kind_problem(path, data) or f"{path}: no trace events: not a profile, a baseline "
                           "file or a Chrome trace (a JSON array of events, or an object with 'traceEvents')")
    if is_trace_view(events):
        return import_trace_view(path, events)
    return import_kineto(path, data)


# -- entry point --------------------------------------------------------------------------------


def _read_json(path: Path) -> object:
    raw = read_bytes(path)  # its ImportError_ (a ValueError) is not "not valid JSON"
    try:
        return json.loads(raw)
    except RecursionError:
        raise ImportError_(f"{path}: is not a trace: its JSON nests too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, and int literals past the digit limit
        raise ImportError_(json_problem(path, raw, exc)) from None  # empty, cut, CSV ... (file_kinds)


def import_torch_npu_folder(path: str | Path) -> Profile:
    """A torch_npu profiler output folder (``*_ascend_pt`` or its ``ASCEND_PROFILER_OUTPUT``):
    ``kernel_details.csv`` for the ops, plus, when present, ``operator_memory.csv`` for the
    memory records, ``communication.json`` for the collectives and ``step_trace_time.csv`` for
    each step's split (computing, exposed communication, free time ...:
    :func:`pytest_oam.files.step_trace.step_trace_for`).

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
    read = read_ascend_csv(kernels)
    profile = read.profile
    update: dict[str, object] = {}
    if (folder / "communication.json").is_file():
        update["ops"] = _attach_communication(profile.ops, folder / "communication.json")
    if (folder / "operator_memory.csv").is_file():
        events = _operator_memory(folder / "operator_memory.csv", read.origin_us, profile)
        update["memory_events"] = events
        update["memory"] = _step_memory(events, profile.steps)
    if (folder / "step_trace_time.csv").is_file():  # the step's split: computing, exposed communication, free ...
        from .step_trace import step_trace_for

        update["step_trace"] = step_trace_for(read.step_ids, folder / "step_trace_time.csv")
    if not update:
        return profile
    return Profile.model_validate({**profile.model_dump(), **{k: v for k, v in update.items()}})


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
    header, rows = csv_rows(path, read_text(path), "a torch_npu operator_memory.csv")
    missing = [c for c in _MEMORY_COLUMNS if c not in header]
    if missing:
        raise ImportError_(f"{path}: no {', '.join(map(repr, missing))} column; not a torch_npu operator_memory.csv")
    events = []
    for line, row in rows:

        def num(column: str, default: float | None = None, row=row, line=line) -> float:
            return number(row[column], path, f"line {line}, column {column!r}", default)

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
            time_s = max(0.0, float(timestamp_us(row[time_col], path, f"line {line}, column {time_col!r}") - origin_us)
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
                elapse_s = number(times.get("Elapse Time(ms)"), path, f"{where}: 'Elapse Time(ms)'") * S_PER_MS
                transports = {
                    name: (number(v.get("Transit Size(MB)"), path, f"{where}: {name} 'Transit Size(MB)'", 0.0) * MEGA,
                           number(v.get("Bandwidth(GB/s)"), path, f"{where}: {name} 'Bandwidth(GB/s)'", 0.0) * GIGA)
                    for name, v in links.items() if isinstance(v, dict) and name != "SDMA"
                } or {}
                if not any(b for b, _ in transports.values()) and isinstance(links.get("SDMA"), dict):
                    sdma = links["SDMA"]
                    transports = {"SDMA": (number(sdma.get("Transit Size(MB)"), path, f"{where}: SDMA size", 0.0) * MEGA,
                                           number(sdma.get("Bandwidth(GB/s)"), path, f"{where}: SDMA bw", 0.0) * GIGA)}
                nbytes = sum(b for b, _ in transports.values())
                busiest = max(transports, key=lambda n: transports[n][0]) if transports else "none"
                attrs: dict[str, float | str] = {  # not display: the file's ms read into seconds
                    name: max(0.0, number(times.get(col), path, f"{where}: {col!r}", 0.0)) * S_PER_MS
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
    problem = check_input(path)  # empty, mis-encoded, cut short or of another kind, said as such (file_kinds)
    if problem:
        raise ImportError_(problem)
    if path.is_dir():
        return import_torch_npu_folder(path)
    if path.name == "step_trace_time.csv":  # no operators: never a profile alone
        raise ImportError_(f"{path}: splits the step time but has no operators: give its torch_npu output folder")
    if path.name == "cluster_step_trace_time.csv":
        raise ImportError_(f"{path}: is a job's per-rank step split, not a profile: oam cluster reads it")
    if path.suffix.lower() == ".csv":
        return import_ascend_csv(path)
    return import_chrome_trace(path)
