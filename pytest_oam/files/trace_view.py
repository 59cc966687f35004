"""torch_npu's ``trace_view.json`` (``ASCEND_PROFILER_OUTPUT``) into a profile.

The file is a top-level JSON array of Chrome-trace events. Its lanes are told apart by their
``process_name`` / ``thread_name`` metadata, never by position or pid:

* ``Ascend Hardware``, one thread per device stream (``Stream 2`` ...): the device tasks. The
  kernels (``Task Type`` ``AI_CORE``, ``AI_VECTOR_CORE``, ``MIX_AIC``, ``MIX_AIV``, ``AI_CPU``,
  ``DSA_SQE``, or ``Other`` in older files) become compute ops, exactly the rows
  ``kernel_details.csv`` lists, typed as its ``Type`` column types them
  (:func:`pytest_oam.files.kernel_names.kernel_type_from_name`: ``MatMulV2``, ``TransData``);
  the runtime's own tasks (``EVENT_RECORD`` / ``EVENT_WAIT``, ``MEMCPY_ASYNC``, place holders)
  and HCCL's sub-tasks on its streams (``Notify Wait``, ``Write Value``, ``SDMA`` ...) are not
  operators and are left out;
* ``HCCL`` (``Communication`` in some versions), threads ``Group N Communication``: each event
  is one collective, such as ``hcom_allReduce__868_0_1``; it becomes an op on the ``hccl``
  stream named as the ``kernel_details.csv`` importer names it, the simulator's collective
  (``AllReduce``, ``AllGather``, ``ReduceScatter``, ``Broadcast``, ``AllToAll``, ``Send``,
  ``Receive``; :func:`pytest_oam.files.kernel_names.imported_op_type`), with its kernel type
  (``kernel``: ``hcom_allReduce_``), ``alg_type``, ``data_type`` and ``count`` as attributes. The ``Plane N`` threads (the collective's transfers, link by link) are left out: the
  collective already holds their time;
* ``Python``, ``CANN`` and unnamed host processes: host activity, not operators. They give the
  steps (``ProfilerStep#N``) and the launches (flow events);
* ``Overlap Analysis`` (Computing / Communication / Free) and the counter processes (``AI Core
  Freq``, ``HBM``, ``LLC``, ``NPU MEM``, ``Acc PMU``, ``QoS``, ``Stars Soc Info``): derived
  views and counters, not operators.

A device task belongs to the step whose ``ProfilerStep#N`` window holds its launch on the
host: the start of its ``async_npu`` flow (the op's enqueue in the Python thread), else of its
``HostToDevice`` flow (the task's dispatch). A task without a flow (the second kernel of one
op, a MemSet before its MatMul) is in the step of the task before it on its stream, which ran
before it. Without step annotations the run is one step whose time is the device's busy time.

The workload fingerprint is made lane by lane (each stream's op sequence and the
communication lane's collectives with their sizes), so two ranks of one job whose streams
interleave differently have the same fingerprint.
"""

from __future__ import annotations

import decimal
from collections import defaultdict
from pathlib import Path

from simulator.profile import Profile
from simulator.units import DTYPE_BYTES, S_PER_US

from .kernel_names import imported_op_type, kernel_type_from_name
from .realfile import (
    ImportError_,
    StepWindows,
    duration_us,
    event_args,
    lanes_fingerprint,
    link_time_us,
    op_record,
    step_window,
    timestamp_us,
    trace_profile,
)

#: ``process_name`` of the device lanes and the communication lanes.
DEVICE_PROCESSES = ("Ascend Hardware",)
COMMUNICATION_PROCESSES = ("HCCL", "Communication")
#: ``Task Type`` of the device tasks that are kernels: the ``Accelerator Core`` values of
#: ``kernel_details.csv`` (torch_npu profiler documentation, "kernel_details.csv").
KERNEL_TASK_TYPES = frozenset({"AI_CORE", "AI_VECTOR_CORE", "AI_CPU", "MIX_AIC", "MIX_AIV", "DSA_SQE"})
#: Task names of the runtime and of HCCL's sub-tasks, for older files whose ``Task Type`` is
#: ``Other`` for every task: synchronisation, copies and transfers, not operators.
NOT_KERNEL_NAMES = frozenset({
    "EVENT_RECORD", "EVENT_WAIT", "MEMCPY_ASYNC", "Notify Wait", "Notify Record", "Write Value", "SDMA", "Memcpy",
    "Reduce Inline", "Inline Reduce", "RDMASend", "RDMA Send", "Reduce TBE", "PLACE_HOLDER",
})
#: Flow categories that link a host launch to a device task, the closest to the user's code first.
_LAUNCH_FLOWS = ("async_npu", "HostToDevice")


def _key(value: object) -> str:
    """A pid or tid as a dictionary key: real files write numbers, strings or worse."""
    return str(value)


def _is_kernel(event: dict, collective_links: set[str]) -> bool:
    args = event_args(event)
    task_type = str(args.get("Task Type", "")).strip()
    if task_type in KERNEL_TASK_TYPES:
        return True
    if task_type not in ("", "Other"):
        return False  # EVENT_*_SQE, PCIE_DMA_SQE, SDMA_SQE, PLACE_HOLDER_SQE, Notify Wait, Write Value ...
    if str(event.get("name", "")) in NOT_KERNEL_NAMES:
        return False
    # a task linked to a collective is one of its transfers
    return "connection_id" not in args or _key(args["connection_id"]) not in collective_links


#: Processes only a torch_npu timeline names.
_TORCH_NPU_PROCESSES = (*DEVICE_PROCESSES, *COMMUNICATION_PROCESSES, "CANN", "Overlap Analysis")


def is_trace_view(events: list) -> bool:
    """Whether a list of trace events is a torch_npu timeline: it names an ``Ascend Hardware``,
    ``HCCL``, ``CANN`` or ``Overlap Analysis`` process."""
    return any(isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name"
               and event_args(e).get("name") in _TORCH_NPU_PROCESSES for e in events)


def import_trace_view(path: Path, events: list) -> Profile:
    """The profile of a torch_npu ``trace_view.json`` whose parsed events are ``events``.

    Ops: the kernels of the ``Ascend Hardware`` streams (stream ``compute``) and the
    collectives of the ``HCCL`` lane (stream ``hccl``), ordered by start; times in seconds from
    the first of them. Hardware ``real:torch_npu-trace``.

    Raises:
        ImportError_: no device task in the file, or a device task without a number where
            ``ts`` or ``dur`` should be (naming the file and the event).
    """
    processes: dict[str, str] = {}
    threads: dict[tuple[str, str], str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M":
            if e.get("name") == "process_name":
                processes[_key(e.get("pid"))] = str(event_args(e).get("name", ""))
            elif e.get("name") == "thread_name":
                threads[(_key(e.get("pid")), _key(e.get("tid")))] = str(event_args(e).get("name", ""))

    steps, tasks, collectives = [], [], []
    flow_starts: dict[tuple[str, str], decimal.Decimal] = {}
    flow_ends: dict[tuple[str, str, decimal.Decimal], list[tuple[str, str]]] = defaultdict(list)
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            continue
        phase, name = e.get("ph"), str(e.get("name", ""))
        if phase in ("s", "f") and e.get("cat") in _LAUNCH_FLOWS:
            ts = link_time_us(e)
            if ts is None:
                continue
            flow = (str(e.get("cat")), _key(e.get("id")))
            if phase == "s":
                flow_starts[flow] = ts
            else:
                flow_ends[(_key(e.get("pid")), _key(e.get("tid")), ts)].append(flow)
            continue
        if phase != "X":
            continue
        process = processes.get(_key(e.get("pid")), "")
        if name.startswith("ProfilerStep#"):
            steps.append(step_window(e, path, i))
        elif process in DEVICE_PROCESSES:
            tasks.append((i, e))
        elif process in COMMUNICATION_PROCESSES and "Plane" not in threads.get((_key(e.get("pid")),
                                                                               _key(e.get("tid"))), ""):
            collectives.append((i, e))
    collective_links = {_key(event_args(e).get("connection_id")) for _, e in collectives if "connection_id" in event_args(e)}
    device = [(i, e, "compute") for i, e in tasks if _is_kernel(e, collective_links)]
    device += [(i, e, "hccl") for i, e in collectives]
    if not device:
        raise ImportError_(f"{path}: a torch_npu trace_view.json without device tasks: its 'Ascend Hardware' "
                           "process has no kernel and there is no HCCL collective")
    windows = StepWindows(steps)

    # (lane, ts, dur, launch step or None, event) per device op, in each lane's order
    lanes: dict[tuple[str, str], list] = defaultdict(list)
    for i, e, stream in device:
        ts = timestamp_us(e.get("ts"), path, f"event {i} ts")
        dur = duration_us(e.get("dur"), path, f"event {i} dur")
        lane = (_key(e.get("pid")), _key(e.get("tid")))
        launches = {cat: flow_starts[(cat, fid)] for cat, fid in flow_ends.get((*lane, ts), ())
                    if (cat, fid) in flow_starts}
        launch = next((launches[cat] for cat in _LAUNCH_FLOWS if cat in launches), None)
        step = windows.at(launch) if launch is not None and windows else None
        lanes[lane].append([ts, dur, step, launch is not None, stream, e])
    rows = []
    for lane, items in lanes.items():
        items.sort(key=lambda item: item[0])
        previous: list[int | None] = []  # the step of the task before, once there is one
        for item in items:
            ts, _, step, launched, _, _ = item
            if not windows:
                step = 0
            elif not launched:
                # no launch recorded: with the task before it on its stream (a stream runs in
                # order), else the last step that started before it ran
                step = previous[0] if previous else windows.started_by(ts)
            previous[:] = [step]
            if step is not None:
                rows.append((lane, ts, item[1], step, launched, item[4], item[5]))
    if not rows:
        raise ImportError_(f"{path}: a torch_npu trace_view.json whose device tasks were all launched outside its "
                           f"{len(windows)} ProfilerStep windows")
    used = sorted({row[3] for row in rows})
    renumber = {s: k for k, s in enumerate(used)}
    origin = min(row[1] for row in rows)
    ops, keys = [], defaultdict(list)
    for lane, ts, dur, step, _, stream, e in sorted(rows, key=lambda row: row[1]):
        name = str(e.get("name", ""))
        kind = kernel_type_from_name(name) or name  # as kernel_details.csv's Type (kernel_names)
        op_type = imported_op_type(kind, stream == "hccl")
        attrs: dict[str, str | int | float] = {"kernel": kind} if kind != op_type else {}
        if stream == "hccl":
            args = event_args(e)
            for field, attr in (("alg_type", "algorithm"), ("data_type", "data_type"), ("count", "count")):
                value = args.get(field)
                if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                    attrs[attr] = value
            itemsize = DTYPE_BYTES.get(str(args.get("data_type", "")).lower())
            if itemsize and isinstance(args.get("count"), int) and args["count"] >= 0:
                attrs["bytes"] = args["count"] * itemsize
        if renumber[step] == 0:
            keys[lane].append(f"{op_type}|{attrs.get('data_type', '')}|{attrs.get('count', '')}")
        ops.append(op_record(op_type=op_type, name=name[:200], step=renumber[step], stream=stream,
                             # not display: the trace's microseconds read into seconds
                             start_s=float(ts - origin) * S_PER_US, duration_s=dur * S_PER_US, attrs=attrs))
    return trace_profile(ops, "torch_npu-trace", len(used) if windows else 0, lanes_fingerprint(keys.values()))
