"""torch_npu ``trace_view.json`` (issue 24): lanes read by their names, HCCL collectives on the
communication stream with their real names, host and derived lanes left out, steps by launch,
and a fingerprint that does not depend on how the streams interleave.

The real file is the Level0 timeline of rank 0 of a 2-NPU AlexNet job
(tests/data/realdata/ascend-msinsight-alexnet2p-level0-rank0/trace_view.json.gz, the origin's
bytes gzip-compressed; SOURCES.md). The job's rank 1 timeline is not published, so
:func:`second_rank` makes it from rank 0's, as described there.
"""

from __future__ import annotations

import csv
import decimal
import gzip
import hashlib
import json
import random
from pathlib import Path

import pytest

import pytest_oam as oam
from pytest_oam.api import load_any
from pytest_oam.cli import main
from pytest_oam.files.kernel_names import collective_op_type, kernel_type_from_name
from pytest_oam.importers import ImportError_, import_profile

DATA = Path(__file__).parent / "data" / "realdata"
LEVEL0 = DATA / "ascend-msinsight-alexnet2p-level0-rank0"
TRACE = LEVEL0 / "trace_view.json.gz"
LEVEL1 = DATA / "ascend-msinsight-alexnet2p-level1-rank0" / "kernel_details.csv"
LEVEL2 = DATA / "ascend-msinsight-alexnet2p-level2-rank0" / "kernel_details.csv"


def rank0_events() -> list[dict]:
    return json.loads(gzip.decompress(TRACE.read_bytes()))


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def lanes(events: list[dict]) -> tuple[dict, dict]:
    """(pid -> process_name, (pid, tid) -> thread_name) from the metadata events."""
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    return processes, threads


def second_rank(events: list[dict], hccl_scale: float = 1.0) -> list[dict]:
    """Rank 1 of the job, made from rank 0's real timeline.

    * Noise: each device task's duration is scaled by the ratio the *same task* showed between
      two real collections of this job, Level2 over Level1 (their kernel_details.csv list the
      same 191 tasks in the same order as the Level0 file; the trace's tasks are matched to them
      by name and start time). Median 3%, at most 60% on a few-microsecond task.
    * Another process: every pid moved by 1000, the device streams renumbered (2, 3, 4 ->
      18, 19, 20, their thread names too), another clock origin (+52.817125 ms).
    * Another interleaving: stream 3 (the DSA tasks, each about 300 us before the next task of
      stream 2) and the HCCL lane start 400 us later, so their tasks fall between other tasks of
      stream 2 than in rank 0; the events are shuffled.
    * ``hccl_scale``: the collectives of the HCCL lane that much slower (a slow link).
    """
    processes, threads = lanes(events)
    level0, level1, level2 = csv_rows(LEVEL0 / "kernel_details.csv"), csv_rows(LEVEL1), csv_rows(LEVEL2)
    noise = {(r0["Name"], r0["Start Time(us)"].strip()): float(r2["Duration(us)"]) / float(r1["Duration(us)"])
             for r0, r1, r2 in zip(level0, level1, level2, strict=True) if float(r1["Duration(us)"]) > 0}
    hardware = next(pid for pid, name in processes.items() if name == "Ascend Hardware")
    streams = {2: 18, 3: 19, 4: 20}
    origin, late = decimal.Decimal("52817.125"), decimal.Decimal(400)
    out = []
    for event in events:
        e = dict(event)
        lane, process = threads.get((e.get("pid"), e.get("tid")), ""), processes.get(e.get("pid"), "")
        if "ts" in e:
            ts = decimal.Decimal(str(e["ts"])) + origin + (late if lane in ("Stream 3", "Group 0 Communication") else 0)
            e["ts"] = f"{ts:.3f}"
        if e.get("ph") == "X" and process in ("Ascend Hardware", "HCCL"):
            e["dur"] = e["dur"] * noise.get((e["name"], str(event["ts"])), 1.0)
            if lane == "Group 0 Communication":
                e["dur"] *= hccl_scale
        if e.get("pid") == hardware and e.get("tid") in streams:
            e["tid"] = streams[e["tid"]]
            if e.get("name") == "thread_name":
                e["args"] = {"name": f"Stream {e['tid']}"}
        if "pid" in e and isinstance(e["pid"], int):
            e["pid"] += 1000
        out.append(e)
    random.Random(24).shuffle(out)
    return out


def write(tmp_path: Path, name: str, events: list[dict]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(events))
    return path


def time_ordered_fingerprint(profile) -> str:
    """The fingerprint as it was before lanes: the op types of all streams in start order."""
    return hashlib.sha256("|".join(op.op_type for op in profile.ops).encode()).hexdigest()[:16]


def test_the_trace_holds_exactly_the_tasks_kernel_details_lists() -> None:
    profile = import_profile(TRACE)
    rows = csv_rows(LEVEL0 / "kernel_details.csv")
    # 191 rows: 172 AI_CORE + 13 MIX_AIV + 2 DSA_SQE kernels and 4 hcom_allReduce collectives; the
    # trace's other 346 Ascend Hardware tasks are EVENT_RECORD/WAIT, MEMCPY_ASYNC and HCCL's Notify
    # Wait / Write Value / SDMA transfers, and its Python, CANN, Overlap Analysis and counter lanes
    # are host activity or derived views
    # the CSV writes durations to the nanosecond (2193.583 for the trace's 2193.5838125 us)
    traced = sorted((op.name, op.duration_s * 1e6) for op in profile.ops)
    listed = sorted((r["Name"], float(r["Duration(us)"])) for r in rows)
    assert [name for name, _ in traced] == [name for name, _ in listed]
    assert all(abs(a - b) <= 1e-3 for (_, a), (_, b) in zip(traced, listed))
    assert {op.op_type for op in profile.ops} == {kernel_type_from_name(r["Name"]) for r in rows} - {
        "hcom_allReduce_"} | {"AllReduce"}
    assert profile.hardware == "real:torch_npu-trace" and profile.steps == 1


def test_hccl_tasks_are_collectives_on_the_communication_stream() -> None:
    profile = import_profile(TRACE)
    hccl = [op for op in profile.ops if op.stream == "hccl"]
    assert [op.name for op in hccl] == [f"hcom_allReduce__868_{k}_1" for k in range(4)]
    assert {op.op_type for op in hccl} == {"AllReduce"}
    assert not any(op.stream == "hccl" for op in profile.ops if op.op_type != "AllReduce")
    # the lane's args: MESH-RING, FP32, 4,097,000 elements = 16,388,000 bytes
    first = hccl[0]
    assert first.attrs == {"kernel": "hcom_allReduce_", "algorithm": "MESH-RING", "data_type": "FP32",
                           "count": 4097000, "bytes": 16388000}
    assert first.duration_s == pytest.approx(72994.4384375e-6)


@pytest.mark.parametrize(("name", "op_type"), [
    ("hcom_allReduce__868_0_1", "AllReduce"), ("hcom_allGather__097_6_1", "AllGather"),
    ("hcom_reduceScatter__097_4_1", "ReduceScatter"), ("hcom_broadcast__1_0_1", "Broadcast"),
    ("hcom_alltoallv__3_0_1", "AllToAll"), ("hcom_allToAllV__3_0_1", "AllToAll"),  # as other CANN versions write it
    ("hcom_send__2_0_1", "Send"), ("hcom_receive__2_0_1", "Receive"),
    ("hcom_batchSendRecv__128_3_1", "hcom_batchSendRecv_"),  # no such op in the simulator: kept as is
])
def test_collective_names(name, op_type) -> None:
    """The one rule of kernel_names: the name's kernel type, then the kernel table's collective."""
    assert collective_op_type(kernel_type_from_name(name)) == op_type


def test_lanes_are_known_by_their_names_not_their_numbers(tmp_path) -> None:
    events = rank0_events()
    processes, _ = lanes(events)
    hardware = next(pid for pid, name in processes.items() if name == "Ascend Hardware")
    # the same events, with the device process named as something else: no kernel is left
    renamed = [dict(e, args={"name": "Ascend Hardware (renamed)"}) if e.get("pid") == hardware
               and e.get("name") == "process_name" else e for e in events]
    profile = import_profile(write(tmp_path, "trace_view.json", renamed))
    assert {op.op_type for op in profile.ops} == {"AllReduce"}


def test_two_ranks_of_one_job_pass_at_10_percent(tmp_path, capsys) -> None:
    rank0 = import_profile(TRACE)
    rank1_path = write(tmp_path, "trace_view.json", second_rank(rank0_events()))
    rank1 = import_profile(rank1_path)
    # the streams interleave differently: in start order the op sequences differ ...
    assert [op.op_type for op in rank0.ops] != [op.op_type for op in rank1.ops]
    assert time_ordered_fingerprint(rank0) != time_ordered_fingerprint(rank1)
    # ... but each lane's sequence is the same, so the workload is
    assert rank0.workload_fingerprint == rank1.workload_fingerprint
    assert main(["compare", str(TRACE), str(rank1_path), "--threshold", "10%"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("status: pass")
    assert any(line.startswith("AllReduce") and "pass" in line for line in out.splitlines())


def test_a_slower_hccl_link_fails_naming_the_collective(tmp_path, capsys) -> None:
    slow = write(tmp_path, "trace_view.json", second_rank(rank0_events(), hccl_scale=1.2))
    assert main(["compare", str(TRACE), str(slow), "--threshold", "10%"]) == 1
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("AllReduce")]
    # rank 0's four collectives take 72,994.438 + 2,193.583 + 2,489.529 + 7,839.336 = 85,516.886 us;
    # rank 1's noise (the same collectives' Level2/Level1 ratios 1.0933, 0.9685, 1.0272, 0.3972)
    # makes them 87,602.6 us (+2.4%), and x 1.2: +22.9%
    assert "REGRESSED" in row and "+22.9%" in row
    report = oam.compare_profiles(load_any(TRACE), load_any(slow), "10%")
    assert "AllReduce" in {r.op_name for r in report.regressions}


def test_a_changed_workload_changes_the_fingerprint(tmp_path) -> None:
    events = rank0_events()
    first = next(i for i, e in enumerate(events) if e.get("name") == "aclnnMm_MatMulCommon_MatMulV2")
    fewer = events[:first] + events[first + 1:]
    assert import_profile(write(tmp_path, "a.json", fewer)).workload_fingerprint != \
        import_profile(TRACE).workload_fingerprint
    bigger = [dict(e, args={**e["args"], "count": 2 * e["args"]["count"]}) if str(e.get("name")).startswith("hcom_")
              and e.get("ph") == "X" else e for e in events]
    assert import_profile(write(tmp_path, "b.json", bigger)).workload_fingerprint != \
        import_profile(TRACE).workload_fingerprint


def test_device_tasks_belong_to_the_step_that_launched_them(tmp_path) -> None:
    # The host's ProfilerStep#50 ends after every task here. Cut it to end just after the last
    # launch (the last flow start): the tasks that run after that still came from step 50.
    events = rank0_events()
    last_launch = max(decimal.Decimal(e["ts"]) for e in events if e.get("ph") == "s"
                      and e.get("cat") in ("async_npu", "HostToDevice"))
    step = next(e for e in events if str(e.get("name")).startswith("ProfilerStep#"))
    cut = float(last_launch - decimal.Decimal(step["ts"])) + 1.0
    later = [e for e in events if e.get("ph") == "X" and e.get("cat") is None
             and decimal.Decimal(str(e.get("ts", 0))) > decimal.Decimal(step["ts"]) + decimal.Decimal(repr(cut))]
    assert later  # tasks start after the cut window ends: a time window would drop them
    shortened = [dict(e, dur=cut) if e is step else e for e in events]
    profile = import_profile(write(tmp_path, "trace_view.json", shortened))
    assert len(profile.ops) == 191 and profile.steps == 1


def test_tasks_launched_outside_every_step_are_named(tmp_path) -> None:
    events = rank0_events()
    moved = [dict(e, ts="1.000") if str(e.get("name")).startswith("ProfilerStep#") else e for e in events]
    with pytest.raises(ImportError_, match="launched outside its 1 ProfilerStep windows"):
        import_profile(write(tmp_path, "trace_view.json", moved))
