"""Real profiler output (tests/data/realdata, origins and licences in its SOURCES.md) imported
into profiles, compared, and malformed files refused with a clear error."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import pytest_oam as oam
from pytest_oam.api import load_any
from pytest_oam.cli import main
from pytest_oam.importers import ImportError_, import_profile

DATA = Path(__file__).parent / "data" / "realdata"
LEVEL1 = DATA / "ascend-msinsight-alexnet2p-level1-rank0" / "kernel_details.csv"
LEVEL2 = DATA / "ascend-msinsight-alexnet2p-level2-rank0" / "kernel_details.csv"
TRACE_VIEW = DATA / "ascend-msprof-analyze-advisor-ut" / "trace_view.json"
KINETO1 = DATA / "hta-critical-path-alexnet-run1" / "benchmark_result_493459_1694039959_trace.json.gz"
KINETO2 = DATA / "hta-critical-path-alexnet-run2" / "benchmark_result_2869224_1695835535_trace.json.gz"
RANK0 = DATA / "hta-trace-filter-128rank" / "sampled_rank-0.json.gz"


@pytest.mark.parametrize(
    ("path", "source", "tasks", "some_type"),
    [
        (LEVEL1, "torch_npu", 191, "Conv2DBackpropFilter"),  # 191 device tasks (SOURCES.md)
        (LEVEL2, "torch_npu", 191, "MatMulV2"),
        # 276 Ascend Hardware tasks, ts as strings; 274 kernels: the 2 MEMCPY_ASYNC tasks are copies
        (TRACE_VIEW, "torch_npu-trace", 274, "ZerosLike"),
        # 79 GPU kernels; op type = the launching aten op; the trace names 8 A100s
        (KINETO1, "kineto:NVIDIA A100-PG509-200", 79, "aten::cudnn_convolution"),
        (KINETO2, "kineto:NVIDIA A100-PG509-200", 79, "aten::clamp_min_"),
        (RANK0, "kineto", None, "aten::cumsum"),  # no deviceProperties
    ],
)
def test_every_real_file_imports(path, source, tasks, some_type) -> None:
    profile = import_profile(path)
    assert profile.hardware == f"real:{source}" and profile.simulator_version == "imported"
    if tasks is not None:
        assert len(profile.ops) == tasks
    assert some_type in profile.op_types
    assert all(op.duration_s >= 0 and op.start_s >= 0 for op in profile.ops)


def test_ascend_csv_details() -> None:
    profile = import_profile(LEVEL1)
    (hccl,) = {(op.stream, op.op_type) for op in profile.ops if op.name.startswith("hcom")}
    # N/A metrics, HCCL tasks on their own stream, named as the simulator names its collectives
    assert hccl == ("hccl", "AllReduce")
    conv = next(op for op in profile.ops if op.op_type == "Conv2D")
    # shapes as recorded (the device's NC1HWC0 layout) and the pipe ratios are kept
    assert conv.input_shapes[0] == [32, 1, 224, 224, 8] and conv.mac_ratio > 0
    folder = import_profile(LEVEL1.parent)  # the output folder works too (and adds memory and comm)
    assert [(o.name, o.start_s, o.duration_s) for o in folder.ops] == [(o.name, o.start_s, o.duration_s)
                                                                      for o in profile.ops]


def slowed(path: Path, tmp_path: Path, op_type: str, factor: float) -> Path:
    """A copy of a kernel_details.csv with ``op_type`` rows ``factor`` times slower."""
    lines = path.read_text().splitlines(keepends=True)
    header = lines[0].split(",")
    type_col, dur_col = header.index("Type"), header.index("Duration(us)")
    out = [lines[0]]
    for line in lines[1:]:
        cells = line.split(",")
        if cells[type_col] == op_type:
            cells[dur_col] = f"{float(cells[dur_col]) * factor:.3f}"
        out.append(",".join(cells))
    target = tmp_path / "kernel_details.csv"
    target.write_text("".join(out))
    return target


def test_two_real_ascend_runs_pass_at_10_percent_and_a_slowdown_is_caught(tmp_path, capsys) -> None:
    code = main(["compare", str(LEVEL1), str(LEVEL2), "--threshold", "10%"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("status: pass")
    # tiny ops move by more than 10% between the runs, by a few microseconds: shown, not failed
    assert "NLLLoss" in out and "above limit, below min time" in out
    code = main(["compare", str(LEVEL1), str(slowed(LEVEL2, tmp_path, "MatMulV2", 1.2)), "--threshold", "10%"])
    out = capsys.readouterr().out
    assert code == 1
    (row,) = [line for line in out.splitlines() if line.startswith("MatMulV2")]
    assert "REGRESSED" in row


def test_two_kineto_runs_pass_and_a_slowdown_is_caught(tmp_path) -> None:
    # Regression: without ProfilerStep annotations the step was the trace's span, host gaps
    # included (16.0 s against 12.8 s), and one direction regressed; now it is the device's
    # busy time, and both directions pass.
    for a, b in ((KINETO1, KINETO2), (KINETO2, KINETO1)):
        assert oam.compare_profiles(load_any(a), load_any(b), "10%").status == "pass"
    data = json.loads(gzip.decompress(KINETO2.read_bytes()))
    for event in data["traceEvents"]:
        if event.get("cat") == "kernel" and "cudnn" in event.get("name", ""):
            event["dur"] = event["dur"] * 1.2
    slow = tmp_path / "slow.json.gz"
    slow.write_bytes(gzip.compress(json.dumps(data).encode()))
    current = load_any(slow)
    report = oam.compare_profiles(load_any(KINETO1), current, "10%")
    slowed_types = {op.op_type for op in current.ops if "cudnn" in op.name}
    assert report.has_regression
    assert {r.op_name for r in report.regressions} - {"step"} <= slowed_types


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (LEVEL1.read_text()[:5000], "line "),  # cut in the middle of a row
        ("Name,Foo\nx,1\n", "no Type / OP Type / Op Type column"),
        (b"\x00\x01\xff\xfe garbage", "is not UTF-8 text"),
        ("Step Id,Name,Type,Start Time(us),Duration(us)\n1,a,Add,12x,3\n", "line 2, column 'Start Time(us)': '12x' is not a number"),
        ("Step Id,Name,Type,Start Time(us),Duration(us)\n", "holds no task rows"),
        ("", "is empty"),
        ("Step Id,Name,Type,Start Time(us),Duration(us),Duration(us)\n1,a,Add,1,3,4\n", "'Duration(us)' appears more"),
        ("Step Id,Name,Type,Start Time(us),Duration(us)\n1,a,Add,1,-3\n", "line 2, column 'Duration(us)': negative"),
        ("Step Id,Name,Type,Start Time(us),Duration(us)\n,a,Add,1,3\n", "line 2: empty Step Id"),
        ("Step Id,Name,Type,Start Time(us),Duration(us)\n1,,,1,3\n", "line 2: no Type and no Name"),
    ],
)
def test_malformed_csv_is_named(tmp_path, content, message) -> None:
    path = tmp_path / "kernel_details.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ImportError_) as info:
        import_profile(path)
    assert str(path) in str(info.value) and message in str(info.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur"', "a Kineto trace, an unclosed object"),
        ('{"foo": 1}', "no trace events"),
        ('[{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 1, "dur": 2}]', "no device events"),
        ('[{"ph": "X", "cat": "kernel", "name": "k", "ts": "abc", "dur": 2}]', "event 0 ts: 'abc' is not a number"),
        ('[{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": NaN}]', "event 0 dur: 'nan' is not finite"),
        ('[{"ph": "X", "cat": "kernel", "name": "k", "ts": 1}]', "event 0 dur: '' is not a number"),
        ('[{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": -2}]', "event 0 dur: negative duration"),
        ("[" * 100000 + "]" * 100000, "nests too deeply"),
    ],
    ids=["truncated", "no-events", "no-device-events", "string-ts", "nan-dur", "no-dur", "negative-dur", "deep"],
)
def test_malformed_trace_is_named(tmp_path, content, message, capsys) -> None:
    path = tmp_path / "trace.json"
    path.write_text(content)
    with pytest.raises(ImportError_, match=message):
        import_profile(path)
    # the oam command turns it into one line on stderr and exit 2, never a traceback
    assert main(["compare", str(path), str(path)]) == 2
    assert str(path) in capsys.readouterr().err


def test_chrome_trace_of_simulated_and_real_profiles(tmp_path, capsys) -> None:
    import simulator
    from pytest_oam.trace import to_chrome_trace

    def work(npu):
        q = npu.tensor((1, 8, 1024, 128))
        npu.flash_attention(q, q, q)
        npu.all_reduce(npu.tensor((1 << 20,)))

    profile = simulator.run(work, devices=8, steps=2, memory=True)
    trace = to_chrome_trace(profile)
    events = trace["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(profile.ops) == 4
    assert {e["tid"] for e in slices} == {1, 2}  # compute and HCCL tracks
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"AI Core pipes", "HBM (caching allocator)"}
    # one memory counter sample per allocator call, at its time, with the device totals after it
    memory = [e for e in events if e["name"] == "HBM (caching allocator)"]
    assert len(memory) == len(profile.memory_events) > 0
    assert [m["args"]["reserved_bytes"] for m in memory] == [e.reserved_bytes for e in profile.memory_events]
    assert [m["ts"] for m in memory] == [e.time_s * 1e6 for e in profile.memory_events]
    comm = [e for e in slices if e["tid"] == 2]
    assert comm[0]["args"]["ranks"] == list(range(8))
    assert slices[0]["args"]["source"].endswith(f"test_importers.py:{work.__code__.co_firstlineno + 2}")
    # the command writes real profiles too, as JSON any trace viewer reads
    assert main(["trace", str(LEVEL1), "-o", str(tmp_path / "t.json")]) == 0
    written = json.loads((tmp_path / "t.json").read_text())
    assert sum(e["ph"] == "X" for e in written["traceEvents"]) == 191
    assert main(["trace", str(LEVEL1), "-o", str(tmp_path / "t.json")]) == 2  # kept without --force



def test_cr_only_line_ends_import(tmp_path) -> None:
    # Regression: a CSV with CR-only line ends raised a csv.Error traceback.
    path = tmp_path / "kernel_details.csv"
    path.write_bytes(b"Step Id,Name,Type,Start Time(us),Duration(us)\r1,a,Add,1,3\r")
    assert [op.op_type for op in import_profile(path).ops] == ["Add"]


def test_odd_but_valid_traces_import(tmp_path) -> None:
    # Regressions: non-dict args and list pids crashed with AttributeError / TypeError.
    path = tmp_path / "t.json"
    path.write_text(json.dumps([
        {"ph": "M", "name": "process_name", "pid": [9], "args": "Ascend Hardware"},
        {"ph": "X", "cat": "kernel", "name": "void k<int>(int)", "ts": "10.25", "dur": 2, "args": [1, 2]},
    ]))
    profile = import_profile(path)
    assert [op.op_type for op in profile.ops] == ["k"]


def test_step_ids_sort_as_numbers_and_step_counts_may_differ(tmp_path) -> None:
    header = "Step Id,Name,Type,Start Time(us),Duration(us)\n"
    one = tmp_path / "one.csv"
    one.write_text(header + "10,a,Add,100,5\n10,b,Mul,110,7\n")
    two = tmp_path / "two.csv"
    two.write_text(header + "9,a,Add,0,5\n9,b,Mul,10,7\n10,a,Add,100,5\n10,b,Mul,110,7\n")
    profile = import_profile(two)
    assert [op.step for op in profile.ops] == [0, 0, 1, 1]  # 9 before 10, not "10" < "9"
    assert oam.compare_profiles(import_profile(one), profile).status == "pass"


FOLDER1 = DATA / "ascend-msinsight-alexnet2p-level1-rank0"


def test_torch_npu_folder_brings_memory_and_communication() -> None:
    profile = import_profile(FOLDER1)
    assert len(profile.ops) == 191
    # operator_memory.csv: 184 rows, 24 not released in the window (SOURCES.md)
    assert sum(e.action == "alloc" for e in profile.memory_events) == 184
    assert sum(e.action == "free" for e in profile.memory_events) == 184 - 24
    assert {e.pool for e in profile.memory_events} == {"torch_npu", "cann"}
    (step,) = profile.memory
    # the two pools reserve 1452.0 MB (torch_npu) + 74.75 MB (cann::* rows) all along
    assert step.reserved_peak_bytes == int((1452.0 + 74.75) * 2**20)
    assert step.alloc_count == 184 and step.free_count == 160 and step.device_mallocs == 0
    assert all(a.time_s <= b.time_s for a, b in zip(profile.memory_events, profile.memory_events[1:]))
    # communication.json: four allReduce ops matched by name to the hcom rows
    hccl = [op for op in profile.ops if op.stream == "hccl"]
    assert len(hccl) == 4 and all(op.comm is not None for op in hccl)
    first = next(op for op in hccl if op.name == "hcom_allReduce__586_0_1")
    assert first.comm.bytes == 28_647_232  # 28.647232 MB over HCCS
    assert first.comm.busbw_bytes_per_s == pytest.approx(15.7676e9)
    assert first.comm.algbw_bytes_per_s == pytest.approx(28_647_232 / 79.08952021875e-3)
    assert first.attrs["wait_time_s"] == pytest.approx(5.64663284375e-3)
    assert first.attrs["idle_time_s"] == pytest.approx(73.20370259375e-3)
    assert first.attrs["transport"] == "HCCS" and first.comm.group_size is None
    # review finding: the memory records say nothing of retries, so the baseline must not claim
    # that the run never flushed (which would make any later flush a regression "from none")
    from pytest_oam.compare import summarize

    assert summarize(profile).alloc_retries_per_step is None
    # the ASCEND_PROFILER_OUTPUT level works the same as its parent
    assert import_profile(FOLDER1).ops == profile.ops


@pytest.mark.parametrize(("name", "content", "message"), [
    ("communication.json", "[1, 2]", "is not a torch_npu communication.json"),
    ("communication.json", '{"step1": {"collective": {"hcom_x": {"Communication Time Info": {}}}}}',
     "step1.collective.hcom_x: no 'Communication Time Info' / 'Communication Bandwidth Info'"),
    ("communication.json", ('{"step1": {"collective": {"hcom_x": {"Communication Time Info": '
     '{"Elapse Time(ms)": "soon"}, "Communication Bandwidth Info": {}}}}}'),
     "step1.collective.hcom_x: 'Elapse Time(ms)': 'soon' is not a number"),
    ("communication.json", '{"step1": ', "a torch_npu communication.json, an unclosed object"),
    ("operator_memory.csv", "Name,Size(KB)\naten::empty,4\n", "no 'Allocation Time(us)'"),
    ("operator_memory.csv", None, "line 3: 3 fields for 15 columns (truncated file?)"),
    ("operator_memory.csv", "\x00\x01\xfe\xff" * 50, "is not UTF-8 text"),
])
def test_malformed_folder_files_are_named(tmp_path, name, content, message) -> None:
    folder = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    folder.mkdir(parents=True)
    for f in ("kernel_details.csv", "communication.json", "operator_memory.csv"):
        (folder / f).write_bytes((FOLDER1 / f).read_bytes())
    if content is None:  # cut the second data row short
        lines = (FOLDER1 / name).read_text().splitlines()
        content = "\n".join([lines[0], lines[1], lines[2][:30]]) + "\n"
    (folder / name).write_bytes(content.encode("latin-1") if isinstance(content, str) else content)
    with pytest.raises(ImportError_) as err:
        import_profile(tmp_path / "rank0_ascend_pt")
    assert str(folder / name) in str(err.value) and message in str(err.value)


def _multi_step_csv(path: Path, means_us: dict[str, float], steps: int, seed: int, noise_frac: float) -> Path:
    """A kernel_details.csv of ``steps`` steps whose op times scatter around ``means_us``."""
    import random

    rnd = random.Random(seed)
    lines, t = ["Step Id,Name,Type,Accelerator Core,Start Time(us),Duration(us)"], 0.0
    for step in range(steps):
        for name, mean in means_us.items():
            duration = max(1.0, rnd.gauss(mean, mean * noise_frac))
            lines.append(f"{step},{name}_{step},{name},AI_CORE,{t:.3f}\t,{duration:.3f}")
            t += duration + 5.0
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_noisy_change_above_the_limit_is_shown_as_not_significant(tmp_path, capsys) -> None:
    # 6 steps each, 15% step-to-step noise, MatMul's mean moved +12%: the medians differ by
    # +16.4%, above the 10% limit, but the samples overlap (p = 0.09 one-sided)
    base = _multi_step_csv(tmp_path / "b.csv", {"MatMul": 500, "Add": 100}, 6, seed=1, noise_frac=0.15)
    cur = _multi_step_csv(tmp_path / "c.csv", {"MatMul": 560, "Add": 100}, 6, seed=2, noise_frac=0.15)
    report = oam.compare_profiles(load_any(base), load_any(cur))
    matmul = next(v for v in report.comparison.verdicts if v.op_type == "MatMul")
    assert matmul.change_frac > 0.10 and matmul.status == "not-significant" and matmul.statistic == "p=0.09"
    assert report.status == "pass" and report.regressions == []
    assert "above the limit but not significant" in report.to_text() and "MatMul +16.4% (p=0.09)" in report.to_text()
    assert json.loads(report.to_json())["notes"][0].startswith("above the limit but not significant")
    code = main(["compare", str(base), str(cur)])
    assert code == 0 and "above limit, not significant (p=0.09)" in capsys.readouterr().out
    # a stricter level of evidence is the user's choice; a looser one turns it into a regression
    assert main(["compare", str(base), str(cur), "--alpha", "0.1"]) == 1
    capsys.readouterr()
    assert main(["compare", str(base), str(cur), "--alpha", "1.5"]) == 2
    assert "alpha must be strictly between 0 and 1, got 1.5" in capsys.readouterr().err


def test_a_clear_change_with_enough_samples_is_a_regression(tmp_path) -> None:
    base = _multi_step_csv(tmp_path / "b.csv", {"MatMul": 500, "Add": 100}, 12, seed=1, noise_frac=0.02)
    cur = _multi_step_csv(tmp_path / "c.csv", {"MatMul": 650, "Add": 100}, 12, seed=2, noise_frac=0.02)
    report = oam.compare_profiles(load_any(base), load_any(cur))
    assert report.status == "regressed" and [r.op_name for r in report.regressions] == ["MatMul", "step"]
    # with fewer than 5 steps on a side there is no test: the limit (and the minimum time) alone decide
    few = _multi_step_csv(tmp_path / "few.csv", {"MatMul": 560, "Add": 100}, 4, seed=2, noise_frac=0.15)
    few_base = _multi_step_csv(tmp_path / "few_b.csv", {"MatMul": 500, "Add": 100}, 4, seed=1, noise_frac=0.15)
    verdicts = oam.compare_profiles(load_any(few_base), load_any(few)).comparison.verdicts
    assert all(v.status != "not-significant" for v in verdicts)  # 4 steps < 5 samples: not tested


def test_real_profiles_get_the_rules_that_need_no_hardware_spec(capsys) -> None:
    # Regression (review): communication.json was imported but fed no verdict or finding.
    report = oam.compare_profiles(load_any(FOLDER1), load_any(FOLDER1))
    found = {d.rule_id: d for d in report.diagnosis}
    # 4 allReduce ops: 105.99 ms elapsed, 5.94 ms of it waiting (communication.json "Total Op
    # Info"); the step is 136.6 ms of device tasks
    assert found["comm-wait"].severity == "warning" and "waited 5.94 ms per step" in found["comm-wait"].description
    assert found["comm-share"].severity == "serious" and "100.05 ms per step" in found["comm-share"].description
    assert not {"low-ai-core-utilization", "memory-bound", "slow-link"} & set(found)  # they need a spec
    assert json.loads(report.to_json())["diagnosis"][0]["rule_id"] == "comm-share"
    assert main(["compare", str(FOLDER1), str(FOLDER1)]) == 0
    assert "[warning] comm-wait: AllReduce" in capsys.readouterr().out  # the collective, as simulated runs name it
    # the kernel_details.csv alone has no communication data: no communication finding
    plain = oam.compare_profiles(load_any(LEVEL1), load_any(LEVEL1))
    assert not {"comm-wait", "comm-share"} & {d.rule_id for d in plain.diagnosis}


def test_peak_memory_keeps_its_stricter_limit_in_compare_profiles() -> None:
    # Review finding: compare_profiles judged memory rows at the default 10%, the plugin at 5%.
    report = oam.compare_profiles(load_any(FOLDER1), load_any(FOLDER1))
    limits = {v.op_type: v.limit_frac for v in report.comparison.verdicts}
    assert limits["memory.reserved_peak"] == limits["memory.allocated_peak"] == 0.05
    assert limits["step"] == 0.10
    assert oam.compare_profiles(load_any(FOLDER1), load_any(FOLDER1), regression_threshold="1%").comparison \
        .verdicts[-1].limit_frac <= 0.01


def test_trace_of_a_focused_profile_says_what_it_leaves_out(tmp_path, capsys) -> None:
    import simulator
    from pytest_oam.api import save_profile

    def work(npu):
        a = npu.tensor((2048, 2048))
        for _ in range(3):
            npu.matmul(a, a)
        q = npu.tensor((1, 8, 1024, 128))
        npu.flash_attention(q, q, q)

    focused = simulator.run(work).focused("FlashAttention", context_ops=0)
    save_profile(focused, tmp_path / "p.json")
    assert main(["trace", str(tmp_path / "p.json"), "-o", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    # before the fix: only "wrote ...: 1 ops", the three MatMuls silently missing from the timeline
    assert "note: a focused profile (focus 'FlashAttention'): 3 other ops (" in out
    assert "collect without --focus for the whole timeline" in out
    written = json.loads((tmp_path / "t.json").read_text())
    assert written["otherData"]["summarised_ops"] == 3
    assert sum(e["ph"] == "X" for e in written["traceEvents"]) == 1
