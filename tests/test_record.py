"""Record and replay (--oam-record, oam replay), op callbacks and the collection modes."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

import simulator
from pytest_oam.cli import main
from pytest_oam.record import RecordError, load_record, record_filename, replay, what_if
from simulator.hardware import load_hardware
from simulator.runtime import recost

pytest.importorskip("xdist")

# A failing run needs a workload with memory (memory rows and alloc records), two runs, and a
# slowdown that regresses MatMul while FlashAttention stays within its limit.
SUITE = """
import json, os
import pytest

SCALE = json.loads(os.environ.get("OAM_TEST_SCALE", "{}"))

def attention(npu, seq_len):
    q = npu.tensor((1, 16, seq_len, 128), "fp16")
    npu.flash_attention(q, q, q, block_size=128, pipeline_stages=2)
    npu.matmul(npu.tensor((seq_len, 1024)), npu.tensor((1024, 1024)))

def test_attention(oam_profile):
    oam_profile.run(attention, seq_len=2048, op_time_scale=SCALE, memory=True, steps=2)
    oam_profile.run(attention, seq_len=1024, op_time_scale=SCALE)

def test_steady(oam_profile):
    oam_profile.run(attention, seq_len=512)
"""
NODEID = "test_suite.py::test_attention"


def oam_cmd(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def records(pytester: pytest.Pytester, folder: str = ".oam/records") -> list[Path]:
    path = pytester.path / folder
    return sorted(path.glob("*.oam.json.gz")) if path.is_dir() else []


@pytest.fixture(params=["0", "2"], ids=["in-process", "xdist-n2"])
def run(request, pytester: pytest.Pytester, monkeypatch):
    """Run the inner suite in a subprocess, without or with ``-n 2``."""
    pytester.makepyfile(test_suite=SUITE)

    def go(*args: str, scale: dict | None = None):
        monkeypatch.setenv("OAM_TEST_SCALE", json.dumps(scale or {}))
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", request.param, *args)

    return go


def test_failed_test_is_recorded_and_replays_the_same_in_a_fresh_process(run, pytester, capsys) -> None:
    run("--oam-save-baseline").assert_outcomes(passed=2)
    assert records(pytester) == []  # nothing failed: the default records failed tests only
    result = run("--oam-baseline", "--oam-report=r.json", scale={"MatMul": 1.3})
    result.assert_outcomes(passed=1, failed=1)
    (path,) = records(pytester)
    assert path.name == record_filename(NODEID)
    result.stdout.fnmatch_lines([f"oam: recorded 1 test in .oam/records (replay: oam replay .oam/records/{path.name})"])

    record = load_record(path)
    assert record.nodeid == NODEID and record.test_outcome == "passed" and record.gate.status == "regressed"
    assert [r.config.steps for r in record.runs] == [2, 1]
    assert [r.config.memory for r in record.runs] == [True, False]
    assert record.runs[0].config.op_time_scale == {"MatMul": 1.3}
    assert record.runs[0].config.workload == "test_suite.attention"
    assert set(record.hardware) == {"ascend910"} and record.hardware["ascend910"] == load_hardware("ascend910")
    assert record.baseline is not None and record.baseline.nodeid == NODEID
    mem = record.runs[0].profile
    assert mem.memory_events and sum(e.action == "alloc" for e in mem.memory_events) == sum(
        m.alloc_count for m in mem.memory)
    # the recorded gate is the one in the run's JSON report
    report = json.loads((pytester.path / "r.json").read_text())
    (gate,) = [t for t in report["tests"] if t["nodeid"] == NODEID]
    assert record.gate.model_dump(mode="json") == gate

    # replay in a fresh process: same verdicts and findings, exit 1 because the gate fails
    proc = subprocess.run([sys.executable, "-m", "pytest_oam", "replay", str(path), "--format", "json"],
                          check=False, capture_output=True, text=True, cwd=pytester.path)
    assert proc.returncode == 1, proc.stderr
    replayed = json.loads(proc.stdout)
    assert replayed["same_as_recorded"] is True and replayed["differences"] == []
    assert replayed["gate"] == gate
    regressed = [(v["run"], v["op_type"]) for v in replayed["gate"]["verdicts"] if v["status"] == "regressed"]
    assert regressed == [(0, "MatMul"), (1, "MatMul")]

    code, out, _ = oam_cmd(capsys, "replay", path)
    assert code == 1
    assert "REGRESSED" in out and "MatMul" in out and "same verdicts and findings as recorded" in out


def test_record_modes_and_folder(pytester, monkeypatch) -> None:
    pytester.makepyfile(test_suite=SUITE)
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=2)
    monkeypatch.setenv("OAM_TEST_SCALE", json.dumps({"MatMul": 1.3}))
    pytester.runpytest("--oam-baseline", "--oam-record=none").assert_outcomes(passed=1, failed=1)
    assert records(pytester) == []
    monkeypatch.setenv("OAM_TEST_SCALE", "{}")
    result = pytester.runpytest("--oam-baseline", "--oam-record=all", "--oam-record-dir=rec", "-v")
    result.assert_outcomes(passed=2)
    assert [p.name for p in records(pytester, "rec")] == sorted(
        record_filename(n) for n in (NODEID, "test_suite.py::test_steady"))
    result.stdout.fnmatch_lines(["oam: recorded 2 tests in rec (replay: oam replay rec/*"])
    for path in records(pytester, "rec"):
        assert replay(load_record(path)).same


def test_record_dir_that_is_a_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "rec").write_text("not a folder")
    result = pytester.runpytest("--oam-record-dir=rec")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--oam-record-dir: *rec exists and is not a folder*"])


def test_unwritable_record_folder_is_reported_not_lost(pytester: pytest.Pytester, monkeypatch) -> None:
    pytester.makepyfile(test_suite=SUITE)
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=2)
    (pytester.path / "blocker").write_text("a file where a folder should be")
    monkeypatch.setenv("OAM_TEST_SCALE", json.dumps({"MatMul": 1.3}))
    result = pytester.runpytest_subprocess("--oam-baseline", "--oam-record-dir=blocker/rec")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["oam: --oam-record: blocker/rec/*.oam.json.gz not written: *"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A record of ``test_attention`` (two runs, one with memory) made by a real pytest run."""
    folder = tmp_path_factory.mktemp("recorded")
    (folder / "test_suite.py").write_text(SUITE)
    for args in (["--oam-save-baseline"], ["--oam-baseline", "--oam-record=all"]):
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=folder,
                       check=True, capture_output=True)
    return folder / ".oam" / "records" / record_filename(NODEID)


def test_what_if_resimulates_the_recorded_ops_on_other_hardware(recorded, capsys) -> None:
    path = recorded
    record = load_record(path)
    same = what_if(record, "ascend910")
    for old, new in same.runs:  # the same hardware gives the recorded timeline back
        assert new.step_times_s == pytest.approx(old.step_times_s, rel=1e-12)
    other = what_if(record, "ascend910b")
    for old, new in other.runs:
        assert new.hardware == "ascend910b" and new.step_time_s < old.step_time_s  # the 910B is faster
        assert [op.op_type for op in new.ops] == [op.op_type for op in old.ops]
    code, out, _ = oam_cmd(capsys, "replay", path, "--hardware", "ascend910b")
    assert code == 0
    assert "ascend910 (recorded)" in out and "ascend910b (what-if)" in out and "FlashAttention" in out
    code, out, _ = oam_cmd(capsys, "replay", path, "--hardware", "ascend910b", "--format", "json")
    runs = json.loads(out)
    assert [r["run"] for r in runs] == [1, 2] and runs[0]["step_time_s"] < runs[0]["recorded_step_time_s"]
    code, _, err = oam_cmd(capsys, "replay", path, "--hardware", "h100")
    assert code == 2 and "unknown hardware 'h100'" in err


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw[: len(raw) // 2], "damaged or truncated gzip file"),
    (lambda raw: b"\x00\xffgarbage" * 10, "is not a record (neither gzip nor UTF-8 JSON)"),
    (lambda raw: b'{"kind": "pytest-oam-record", "schema_version": 1', "is not valid JSON"),
    (lambda raw: gzip.compress(json.dumps({**json.loads(gzip.decompress(raw)), "schema_version": 9}).encode()),
     "has schema_version 9; this pytest-oam reads versions 1 and 2"),
    (lambda raw: gzip.compress(json.dumps({**json.loads(gzip.decompress(raw)), "runs": "x"}).encode()),
     "is not a valid record: runs: Input should be a valid list"),
    (lambda raw: json.dumps({"schema_version": 1, "nodeid": "t", "runs": []}).encode(), "is a baseline file"),
])
def test_bad_records_are_named_errors(recorded, tmp_path, capsys, damage, message) -> None:
    path = recorded
    bad = tmp_path / "bad.oam.json.gz"
    bad.write_bytes(damage(path.read_bytes()))
    with pytest.raises(RecordError, match="bad.oam.json.gz"):
        load_record(bad)
    code, out, err = oam_cmd(capsys, "replay", bad)
    assert code == 2 and out == "" and str(bad) in err and message in err
    assert path.exists()  # the good record is untouched


def test_a_version_1_record_is_read_with_its_findings_on_the_one_severity_scale(recorded, tmp_path) -> None:
    data = json.loads(gzip.decompress(recorded.read_bytes()))
    finding = {"run": 0, "kind": "regressed", "op_type": "FlashAttention", "severity": "critical", "delta_s": 1e-3,
               "step_share_frac": 0.2, "counters": {}, "call_sites": [], "advice": ["x"]}
    old = {**data, "schema_version": 1, "gate": {**data["gate"], "findings": [finding]}}
    path = tmp_path / "old.oam.json.gz"
    path.write_bytes(gzip.compress(json.dumps(old).encode()))
    record = load_record(path)
    assert record.schema_version == 2 and [f.severity for f in record.gate.findings] == ["serious"]


# -- op callbacks and the collection modes ----------------------------------------------------

def _two_ops(npu, events: list) -> None:
    a = npu.tensor((1024, 1024))
    events.append("issue MatMul")
    npu.matmul(a, a)
    events.append("issue Add")
    npu.add(a, a)
    events.append("issue Mul")
    npu.mul(a, a)
    events.append("done")


def test_offline_callbacks_see_every_op_after_the_run_without_overhead() -> None:
    events: list[str] = []
    with simulator.register_op_callback("*", lambda r: events.append(f"cb {r.op_type}")):
        profile = simulator.run(_two_ops, events)
    assert events == ["issue MatMul", "issue Add", "issue Mul", "done", "cb MatMul", "cb Add", "cb Mul"]
    assert profile.collection == "offline"
    plain = simulator.run(_two_ops, [])
    assert profile.step_times_s == plain.step_times_s


def test_online_callbacks_see_each_op_during_the_run_and_cost_a_documented_overhead() -> None:
    events: list[str] = []
    with simulator.register_op_callback("MatMul", lambda r: events.append(f"cb {r.op_type}")), \
            simulator.register_op_callback("Ad?", lambda r: events.append(f"cb {r.op_type}")):
        profile = simulator.run(_two_ops, events, collection="online", steps=2)
    # a record is delivered once final: when the next op is issued, or at the end of the step
    assert events == ["issue MatMul", "issue Add", "cb MatMul", "issue Mul", "cb Add", "done"] * 2
    offline = simulator.run(_two_ops, [], steps=2)
    hw = load_hardware("ascend910")
    overhead_s = hw.profiler.online_callback_overhead_s
    assert overhead_s > 0
    # The callbacks run on the host, in the process that issues the kernels: each op's overhead
    # delays the host's next issue (simulator/runtime/timeline.py, Timeline.finish), not the
    # device. These 1024 x 1024 kernels (~10 us each) are shorter than the host's interval
    # (launch.host_dispatch_s = 20 us), so the run is host-bound: the ops start every
    # 20 + 5 us instead of every 20 us, and a step (first start to last end) is two intervals
    # longer (the last op's overhead falls after the step's end).
    assert max(op.duration_s for op in offline.ops) < hw.launch.host_dispatch_s
    for online_s, offline_s in zip(profile.step_times_s, offline.step_times_s):
        assert online_s == pytest.approx(offline_s + 2 * overhead_s, rel=1e-9)
    assert [op.start_s for op in profile.ops[:3]] == pytest.approx(
        [0.0, hw.launch.host_dispatch_s + overhead_s, 2 * (hw.launch.host_dispatch_s + overhead_s)])
    assert [op.duration_s for op in profile.ops] == [op.duration_s for op in offline.ops]
    # re-costing the online profile on the same card charges the overhead the same way
    assert recost(profile, "ascend910").step_times_s == pytest.approx(profile.step_times_s, rel=1e-12)
    assert profile.collection == "online"


def _long_ops(npu, events: list) -> None:
    a = npu.tensor((4096, 4096))
    npu.matmul(a, a)
    npu.add(a, a)
    npu.mul(a, a)


def test_online_callback_overhead_is_host_time_hidden_while_the_device_is_busy() -> None:
    # Regression test (issue 23): the overhead was charged to the device's stream, so it showed
    # in a device-bound step and hid behind the host in a host-bound one, the reverse of what a
    # host-side callback does. Here every kernel is longer than the host's interval
    # (launch.host_dispatch_s + online_callback_overhead_s = 25 us): the host runs ahead and
    # the online run's timeline is the offline one.
    hw = load_hardware("ascend910")
    online = simulator.run(_long_ops, [], collection="online", steps=2)
    offline = simulator.run(_long_ops, [], steps=2)
    interval_s = hw.launch.host_dispatch_s + hw.profiler.online_callback_overhead_s
    assert min(op.duration_s for op in offline.ops) > interval_s
    assert [op.start_s for op in online.ops] == [op.start_s for op in offline.ops]
    assert online.step_times_s == offline.step_times_s
    # re-costed (a what-if on the same card), the online profile keeps the same model
    assert recost(online, "ascend910").step_times_s == pytest.approx(online.step_times_s, rel=1e-12)


def test_callback_by_op_name_and_removal() -> None:
    seen: list[str] = []

    def workload(npu):
        a = npu.tensor((256, 256))
        npu.add(a, a, name="layers.0.residual")
        npu.add(a, a, name="layers.1.residual")

    handle = simulator.register_op_callback("layers.1.*", lambda r: seen.append(r.name))
    simulator.run(workload)
    handle.remove()
    handle.remove()  # harmless
    simulator.run(workload)
    assert seen == ["layers.1.residual"]


@pytest.mark.parametrize("args, error", [
    (("", print), TypeError), ((3, print), TypeError), (("MatMul", "not callable"), TypeError),
])
def test_bad_callback_registration(args, error) -> None:
    with pytest.raises(error, match="register_op_callback"):
        simulator.register_op_callback(*args)


def test_unknown_collection_mode() -> None:
    with pytest.raises(ValueError, match="collection must be one of offline, online, got 'live'"):
        simulator.run(_two_ops, [], collection="live")


def test_recost_needs_the_full_op_sequence() -> None:
    profile = simulator.run(_two_ops, []).focused("MatMul", context_ops=0)
    with pytest.raises(ValueError, match="focused profile"):
        recost(profile, "ascend910b")


COLLECT_SUITE = """
import simulator
import pytest

def workload(npu):
    a = npu.tensor((1024, 1024))
    npu.matmul(a, a)

@pytest.fixture
def watcher():
    seen = []
    with simulator.register_op_callback("*", lambda r: seen.append(r.op_type)):
        yield seen

def test_watched(oam_profile, watcher):
    profile = oam_profile.run(workload)
    print("COLLECTION", profile.collection, "watched", "+".join(watcher))

def test_unwatched(oam_profile):
    print("COLLECTION", oam_profile.run(workload).collection)
"""


def test_auto_collection_is_offline_when_gating_and_online_when_watched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_collect=COLLECT_SUITE)
    result = pytester.runpytest_subprocess("-s")
    result.stdout.fnmatch_lines(["*COLLECTION online watched MatMul*", "*COLLECTION offline*"])
    result = pytester.runpytest_subprocess("-s", "--oam-save-baseline")
    result.stdout.fnmatch_lines(["*COLLECTION offline watched MatMul*", "*COLLECTION offline*"])
    result = pytester.runpytest_subprocess("-s", "--oam-collect=online")
    result.stdout.fnmatch_lines(["*COLLECTION online watched MatMul*", "*COLLECTION online*"])
    result.assert_outcomes(passed=2)


def test_online_run_against_an_offline_baseline_is_incomparable(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_collect=COLLECT_SUITE)
    pytester.runpytest_subprocess("--oam-save-baseline").assert_outcomes(passed=2)
    result = pytester.runpytest_subprocess("--oam-baseline", "--oam-collect=online", "--oam-strict")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*collection_mode differs: baseline 'offline', current 'online'*"])
    pytester.runpytest_subprocess("--oam-baseline", "--oam-collect=offline").assert_outcomes(passed=2)


def test_bad_collect_ini_value(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_collect=COLLECT_SUITE)
    pytester.makeini("[pytest]\noam_collect = sometimes\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*oam_collect (ini): 'sometimes' is not one of auto, offline, online*"])


OWN_FAILURE = """
def mm(npu):
    a = npu.tensor((1024, 1024))
    npu.matmul(a, a)

def test_own_failure(oam_profile):
    oam_profile.run(mm)
    assert False, "the test's own failure"
"""


def test_a_test_that_fails_by_itself_replays_as_failed(pytester, capsys) -> None:
    # Regression (review): the replay said "passed" and exited 0 for a test that failed on its own.
    pytester.makepyfile(test_own=OWN_FAILURE)
    pytester.runpytest("--oam-baseline", "-p", "no:cacheprovider").assert_outcomes(failed=1)
    (path,) = records(pytester)
    assert load_record(path).test_outcome == "failed"
    code, out, _ = oam_cmd(capsys, "replay", path)
    assert code == 1
    assert "the gate passed; the test itself FAILED" in out and "its own error, not the gate's" in out


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["runs"][0]["profile"].update(hardware="foo"), "its runs name hardware 'foo' but it holds specs"),
    (lambda d: d.update(hardware={}), "its runs name hardware 'ascend910' but it holds specs only for none"),
    (lambda d: d["gate_inputs"].update(cli_thresholds={"FlashAttention": "50%"}),
     "gate_inputs.cli_thresholds.FlashAttention: Input should be a valid number"),
    (lambda d: d["gate_inputs"].update(cli_thresholds=[1]), "gate_inputs.cli_thresholds: Input should be a valid"),
    (lambda d: d["gate_inputs"].update(bogus=1), "gate_inputs"),
])
def test_damaged_gate_settings_are_named_errors(recorded, tmp_path, capsys, edit, message) -> None:
    # Regression (review): these edits crashed oam replay with a traceback.
    data = json.loads(gzip.decompress(recorded.read_bytes()))
    edit(data)
    bad = tmp_path / "edited.oam.json.gz"
    bad.write_bytes(gzip.compress(json.dumps(data).encode()))
    code, out, err = oam_cmd(capsys, "replay", bad)
    assert code == 2 and out == "" and message in err and "Traceback" not in err
