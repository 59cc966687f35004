"""``oam calibrate PROFILE... -o FILE.json`` (issue 23): fit a hardware file to real torch_npu
profiles and use it as ``--oam-hardware FILE``, ``hardware="FILE"`` and ``oam validate --hardware
FILE``. Real data (tests/data/realdata/SOURCES.md): the LLM Level2 profile (entry 10a) and the
AlexNet Level1 and Level2 profiles of the same 2-NPU job (entries 1 and 4: two separate
profiling runs on the same machine)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from datetime import datetime
from pathlib import Path

import pytest

import simulator
from pytest_oam.calibrate import fit_time_scales, host_intervals_s, median_abs_error
from pytest_oam.cli import main
from pytest_oam.files.importers import read_ascend_csv
from pytest_oam.kernel_replay import replay_kernels, replay_profile
from simulator.costs import OpSpec, op_cost
from simulator.hardware import CalibrationSpec, HardwareFileError, load_hardware

DATA = Path(__file__).parent / "data" / "realdata"
LLM = DATA / "ascend-msinsight-llm-pp2dp2-level2-rank0"
LLM_CSV = LLM / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
ALEXNET_L1 = DATA / "ascend-msinsight-alexnet2p-level1-rank0"
ALEXNET_L2 = DATA / "ascend-msinsight-alexnet2p-level2-rank0"
LEVEL0 = DATA / "ascend-msinsight-alexnet2p-level0-rank0"
HEADER = ("Step Id,Stream ID,Name,Type,Accelerator Core,Start Time(us),Duration(us),Block Dim,Mix Block Dim,"
          "Input Shapes,Input Data Types,Output Shapes,Output Data Types\n")


def run(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def llm_calibrated(tmp_path_factory) -> tuple[Path, str]:
    """``oam calibrate LLM -o my-910b.json``, once for the module: the file and what it printed."""
    import contextlib
    import io

    path = tmp_path_factory.mktemp("cal") / "my-910b.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["calibrate", str(LLM), "-o", str(path)]) == 0
    return path, out.getvalue()


def test_llm_calibration_loads_carries_provenance_and_beats_its_base(llm_calibrated) -> None:
    path, printed = llm_calibrated
    spec = load_hardware(str(path))
    cal = spec.calibration
    assert spec.name == "my-910b" and cal is not None
    base = replay_profile(LLM)  # what oam validate --profile picks and measures
    assert cal.base_hardware == base.hardware
    assert [p.path for p in cal.profiles] == [str(LLM_CSV)]
    assert cal.profiles[0].sha256 == hashlib.sha256(LLM_CSV.read_bytes()).hexdigest()
    assert cal.profiles[0].kernels == cal.kernels == base.kernels
    assert datetime.fromisoformat(cal.created_utc).utcoffset().total_seconds() == 0
    assert cal.source.startswith("calibration: ")
    # the fitted values: per op type with its kernel count; below 5 kernels the base is kept
    assert cal.op_time_scale["MatMul"].kernels == 336 and cal.op_time_scale["MatMul"].fitted
    assert cal.op_time_scale["Embedding"].kernels == 2 and not cal.op_time_scale["Embedding"].fitted
    assert cal.op_time_scale["Embedding"].time_scale == 1.0
    bundled = load_hardware(base.hardware)
    assert spec.profiler.profiled_host_dispatch_s == cal.profiled_host_dispatch_s_fitted is not None
    assert cal.profiled_host_dispatch_s_before == bundled.profiler.profiled_host_dispatch_s
    assert spec.launch.host_dispatch_s == bundled.launch.host_dispatch_s  # unprofiled runs: the base's
    # the file, replayed through the cost model (op_cost applies the scales), is what it says
    after = replay_profile(LLM, str(path))
    assert after.kernels == base.kernels
    assert cal.median_abs_error_frac_before == pytest.approx(base.median_abs_error_frac)
    assert after.median_abs_error_frac == pytest.approx(cal.median_abs_error_frac_after)
    # measured with simulator 0.10.0 on ascend910b4: 23.6% before, 11.5% after (0.9.0: 23.2%, 11.6%)
    assert after.median_abs_error_frac < base.median_abs_error_frac
    assert "median |error| per kernel:" in printed and f"wrote {path}" in printed


def test_pipes_show_the_cost_models_own_unit_times_on_a_calibrated_spec(llm_calibrated) -> None:
    """--pipes compares the cost model's units with msprof's: a calibrated spec's time scale (which
    lengthens or shortens every op of a type) is not a unit's error, so it is taken out."""
    calibrated = replay_profile(LLM, str(llm_calibrated[0]))
    base = replay_profile(LLM)
    scale = load_hardware(str(llm_calibrated[0])).calibration.op_time_scale["MatMul"].time_scale
    assert scale != pytest.approx(1.0, abs=0.01)  # the fit moved MatMul (1.10 on simulator 0.10.0)
    assert calibrated.by_op_type["MatMul"].simulated_s == pytest.approx(scale * base.by_op_type["MatMul"].simulated_s)
    for op in ("MatMul", "RmsNorm", "Add"):
        assert calibrated.pipes[op].unit_simulated_s == pytest.approx(base.pipes[op].unit_simulated_s)
        assert calibrated.pipes[op].dma_simulated_s == pytest.approx(base.pipes[op].dma_simulated_s)


def test_fitting_alexnet_level1_improves_the_separate_level2_run(tmp_path, capsys) -> None:
    """The issue's key test: fitted on one profile, better on ANOTHER profile of the same machine
    (a separate profiling run of the same job), not only on itself."""
    out = tmp_path / "alexnet-npu.json"
    assert run(["calibrate", str(ALEXNET_L1), "-o", str(out)], capsys)[0] == 0
    before = replay_profile(ALEXNET_L2)
    after = replay_profile(ALEXNET_L2, str(out))
    assert after.kernels == before.kernels > 0
    # measured with simulator 0.10.0 (and 0.9.0) on ascend910b: 37.7% before, 20.6% after (75 kernels)
    assert after.median_abs_error_frac < before.median_abs_error_frac


def _micro_batches(replayed) -> tuple[list, list]:
    """The LLM profile's kernels of micro-batch 1 and of micro-batch 2. Rank 0 is pipeline stage 0
    of 2 with 2 micro-batches (1F1B: F1 F2 B1 B2); each phase ends with the stage's
    hcom_batchSendRecv_ to stage 1 (rows 441, 884, 1397), and B2 ends where the gradient
    reduction (the first hcom_reduceScatter_) begins. The optimizer after it is in neither."""
    types = [row["Type"] for row in replayed.read.rows]
    f1_end, f2_end, b1_end = [i for i, t in enumerate(types) if t == "hcom_batchSendRecv_"]
    b2_end = types.index("hcom_reduceScatter_")
    first = [k for k in replayed.kernels if k.index < f1_end or f2_end < k.index < b1_end]
    second = [k for k in replayed.kernels if f1_end < k.index < f2_end or b1_end < k.index < b2_end]
    return first, second


def test_fitting_one_llm_micro_batch_improves_the_other() -> None:
    replayed = replay_kernels(LLM)
    first, second = _micro_batches(replayed)
    assert len(first) > 800 and len(second) > 800  # 921 and 924
    scales = {t: f["scale"] for t, f in fit_time_scales(first).items()}
    # measured with simulator 0.10.0 on ascend910b4: 23.9% before, 12.3% after on micro-batch 2
    assert median_abs_error(second, scales) < median_abs_error(second)


def test_op_cost_applies_the_calibrated_scale_of_the_op_type_only() -> None:
    base = load_hardware("ascend910b")
    calibration = CalibrationSpec(
        source="calibration: test", base_hardware="ascend910b", created_utc="2025-01-01T00:00:00+00:00", tool="test",
        profiles=[{"path": "x.csv", "sha256": "0" * 64, "kernels": 1, "host_gaps": 0}], min_kernels=1,
        op_time_scale={"MatMul": {"time_scale": 2.5, "kernels": 1, "fitted": True,
                                  "median_abs_error_frac_before": 0.5, "median_abs_error_frac_after": 0.1}},
        profiled_host_dispatch_s_before=None, profiled_host_dispatch_s_fitted=None, kernels=1,
        median_abs_error_frac_before=0.5, median_abs_error_frac_after=0.1)
    hw = base.model_copy(update={"calibration": calibration})
    matmul = OpSpec("MatMul", ((1, 4096, 4096), (1, 4096, 4096)), "bf16")
    add = OpSpec("Add", ((4096, 4096),), "bf16")
    assert op_cost(matmul, hw).duration_s == pytest.approx(2.5 * op_cost(matmul, base).duration_s)
    assert op_cost(add, hw).duration_s == op_cost(add, base).duration_s


def test_host_intervals_skip_busy_pairs_collective_waits_other_issues_and_steps(tmp_path) -> None:
    # Each pair below is left out by one rule: the test fails if any rule is removed, or if a
    # collective merely running across a gap were a reason to leave the pair out
    rows = [  # (step, stream, name, type, core, start us, duration us)
        (1, "2", "a", "Add", "AI_VECTOR_CORE", 0.0, 10.0),
        (1, "2", "b", "Add", "AI_VECTOR_CORE", 100.0, 10.0),  # idle 90 us: the host; 100 us start to start
        (1, "N/A", "hcom", "hcom_allReduce_", "HCCL", 105.0, 500.0),  # issued between b and c; ends at 605 us
        (1, "2", "c", "Add", "AI_VECTOR_CORE", 200.0, 10.0),  # b -> c is two issues: left out
        (1, "2", "d", "Add", "AI_VECTOR_CORE", 700.0, 10.0),  # waited for the collective ending in the gap
        (1, "2", "d2", "Add", "AI_VECTOR_CORE", 710.02, 10.0),  # back to back: the device was busy
        (1, "2", "f", "Add", "AI_VECTOR_CORE", 830.0, 10.0),  # idle 109.98 us: 119.98 us start to start
        (1, "3", "e", "DSAGenBitMask", "DSA_SQE", 900.0, 1.0),  # another stream: f -> g is two issues
        (1, "N/A", "long", "hcom_allReduce_", "HCCL", 950.0, 10000.0),  # runs across the next gap
        (1, "2", "g", "Add", "AI_VECTOR_CORE", 1000.0, 10.0),
        (1, "2", "h", "Add", "AI_VECTOR_CORE", 1150.0, 10.0),  # idle 140 us beside the collective: 150 us
        (1, "2", "i", "FlashAttentionScore", "MIX_AIC", 1300.0, 10.0),  # fused attention: its own host call
        (2, "2", "j", "Add", "AI_VECTOR_CORE", 1400.0, 10.0),  # the next step: the loop's own host work
    ]
    path = tmp_path / "kernel_details.csv"
    path.write_text(HEADER + "".join(f'{p},{s},{n},{t},{c},{b}\t,{d},40,0,"8",FLOAT,"8",FLOAT\n'
                                     for p, s, n, t, c, b, d in rows), encoding="utf-8")
    assert host_intervals_s(read_ascend_csv(path)) == pytest.approx([100e-6, 119.98e-6, 150e-6])


def test_a_calibrated_file_runs_everywhere_a_bundled_name_does(llm_calibrated, tmp_path, capsys) -> None:
    path, _ = llm_calibrated

    def mm(npu):
        a = npu.tensor((4096, 4096), "bf16")
        npu.matmul(a, a)

    calibrated = simulator.run(mm, hardware=str(path))
    bundled = simulator.run(mm, hardware=load_hardware(str(path)).calibration.base_hardware)
    assert calibrated.hardware == "my-910b"
    scale = load_hardware(str(path)).calibration.op_time_scale["MatMul"].time_scale
    assert calibrated.op_time_s("MatMul") == pytest.approx(scale * bundled.op_time_s("MatMul"))
    assert load_hardware("my-910b") is load_hardware(str(path))  # its runs' profiles find it by name
    code, out, _ = run(["validate", "--profile", str(LLM), "--hardware", str(path), "--format", "json"], capsys)
    assert code in (0, 1) and json.loads(out)["hardware"] == str(path)


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such hardware file"),
    ("{not json", "not valid JSON: "),
    ('{"schema_version": 1}', "field name: Field required"),
])
def test_bad_hardware_files_get_one_line_naming_file_and_field(tmp_path, capsys, content, message) -> None:
    path = tmp_path / "hw.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(HardwareFileError, match=f"^{path}: .*{message}"):
        load_hardware(str(path))
    assert main(["validate", "--profile", str(LLM), "--hardware", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: " in err and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_number_written_as_a_string_is_refused_naming_its_field(llm_calibrated, tmp_path) -> None:
    """A hand-edited scale of "1.2" (a string) was read as 1.2 by pydantic's lax mode: a file that
    says what it does not mean must not load."""
    data = json.loads(llm_calibrated[0].read_text(encoding="utf-8"))
    data["name"] = "my-edited-910b"
    data["calibration"]["op_time_scale"]["MatMul"]["time_scale"] = "1.2"
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(HardwareFileError, match=f"^{path}: field calibration.op_time_scale.MatMul.time_scale: "):
        load_hardware(str(path))
    data["calibration"]["op_time_scale"]["MatMul"]["time_scale"] = 1.2
    path.write_text(json.dumps(data), encoding="utf-8")
    assert load_hardware(str(path)).calibration.op_time_scale["MatMul"].time_scale == 1.2


def test_a_file_with_a_bundled_name_is_refused(tmp_path) -> None:
    path = tmp_path / "copy.json"
    path.write_text(json.dumps(load_hardware("ascend910b").model_dump(mode="json")), encoding="utf-8")
    with pytest.raises(HardwareFileError, match="field name: 'ascend910b' is a bundled spec's name"):
        load_hardware(str(path))


def test_bad_input_is_one_line_and_nothing_is_lost(tmp_path, capsys) -> None:
    out = tmp_path / "out.json"
    code, _, err = run(["calibrate", str(LEVEL0), "-o", str(out)], capsys)
    assert code == 2 and "a Level0 profile" in err and str(LEVEL0) in err and err.count("\n") == 1
    assert not out.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(["calibrate", str(empty), "-o", str(out)], capsys)
    assert code == 2 and f"{empty}: a folder without" in err and err.count("\n") == 1
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    code, _, err = run(["calibrate", str(ALEXNET_L1), "-o", str(blocker / "hw.json")], capsys)
    assert code == 2 and f"-o {blocker / 'hw.json'}: cannot write it" in err and err.count("\n") == 1
    precious = tmp_path / "notes.json"
    precious.write_text('{"mine": true}', encoding="utf-8")
    code, _, err = run(["calibrate", str(ALEXNET_L1), "-o", str(precious)], capsys)
    assert code == 2 and "refusing to overwrite" in err and err.count("\n") == 1
    assert precious.read_text(encoding="utf-8") == '{"mine": true}'
    # a file oam calibrate wrote is replaced: calibrating again is the point
    assert run(["calibrate", str(ALEXNET_L1), "-o", str(out)], capsys)[0] == 0
    assert run(["calibrate", str(ALEXNET_L2), "-o", str(out)], capsys)[0] == 0
    assert load_hardware(str(out)).calibration.profiles[0].path.startswith(str(ALEXNET_L2))


def test_pytest_oam_hardware_accepts_a_calibrated_file(pytester, llm_calibrated) -> None:
    path, _ = llm_calibrated
    shutil.copy(path, pytester.path / "calibrated.json")
    pytester.makepyfile(test_model="""
def mm(npu):
    a = npu.tensor((4096, 4096), "bf16")
    npu.matmul(a, a)

def test_model(oam_profile):
    assert oam_profile.run(mm).hardware == "my-910b"  # the spec's name, written from oam calibrate's -o
""")
    pytester.runpytest("--oam-hardware", "./calibrated.json").assert_outcomes(passed=1)
    pytester.makepyfile(test_marker="""
import pytest

@pytest.mark.oam(hardware="calibrated.json")  # beside this file
def test_marked(oam_profile):
    def mm(npu):
        npu.matmul(npu.tensor((64, 64), "bf16"), npu.tensor((64, 64), "bf16"))
    assert oam_profile.run(mm).hardware == "my-910b"
""")
    pytester.runpytest("test_marker.py").assert_outcomes(passed=1)
    (pytester.path / "broken.json").write_text("{", encoding="utf-8")
    result = pytester.runpytest("--oam-hardware", "./broken.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --oam-hardware: */broken.json: not valid JSON*"])


@pytest.mark.parametrize("name", ["../../pwned", "", "  ", "my-910b.json", "a/b"])
def test_a_file_whose_name_is_not_a_plain_name_is_refused(tmp_path, name) -> None:
    # Regression (newcomer): "../../pwned" reached the gate, which looked it up as a path and
    # crashed with a traceback; "../my-910b.json" silently loaded another file's spec.
    path = tmp_path / "hw.json"
    data = load_hardware("ascend910b").model_dump(mode="json") | {"name": name}
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(HardwareFileError, match=f"^{path}: field name: .* is not a spec name"):
        load_hardware(str(path))


def test_bad_json_message_reads_once(tmp_path) -> None:
    path = tmp_path / "hw.json"
    path.write_text('{"name": "x', encoding="utf-8")
    with pytest.raises(HardwareFileError) as info:
        load_hardware(str(path))
    assert "starting at line 1, column 10" in str(info.value) and "at at" not in str(info.value)


def test_a_profile_given_twice_is_refused(tmp_path, capsys) -> None:
    # Regression (newcomer): the folder and its CSV counted the same kernels and host gaps twice
    out = tmp_path / "out.json"
    code, _, err = run(["calibrate", str(ALEXNET_L1), str(ALEXNET_L1 / "kernel_details.csv"), "-o", str(out)], capsys)
    assert code == 2 and "give each profile once" in err and err.count("\n") == 1 and not out.exists()


def test_calibrate_markdown_table_escapes_its_pipes(tmp_path, capsys) -> None:
    code, out, _ = run(["calibrate", str(ALEXNET_L1), "-o", str(tmp_path / "a.json"), "--format", "markdown"], capsys)
    assert code == 0 and "median \\|error\\| before" in out


def test_a_trace_read_as_a_profile_gets_a_short_error(tmp_path, capsys) -> None:
    # Regression (newcomer): a trace_view.json given as a profile printed 137 KB of "column names"
    trace = tmp_path / "kernel_details.csv"
    events = ", ".join(f'{{"ph": "X", "ts": "{i}", "name": "op{i % 20}", "pid": 1, "tid": 2}}' for i in range(2000))
    trace.write_text(f"[{events}]\n", encoding="utf-8")  # one line, as torch_npu writes it
    code, _, err = run(["validate", "--profile", str(trace)], capsys)
    assert code == 2 and err.count("\n") == 1 and len(err) < 400, err


def test_a_profile_that_does_not_say_its_npu_needs_hardware(tmp_path, capsys) -> None:
    # Regression (newcomer): without the Accelerator Core column every spec was equally close and
    # the alphabetically first (the 910A) was taken silently
    import csv

    rows = list(csv.DictReader(LLM_CSV.open(encoding="utf-8")))
    header = [h for h in rows[0] if h != "Accelerator Core"]
    folder = tmp_path / "no-core"
    folder.mkdir()
    with (folder / "kernel_details.csv").open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, header, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows[:200])
    for argv in (["validate", "--profile", str(folder)], ["calibrate", str(folder), "-o", str(tmp_path / "o.json")]):
        code, _, err = run(argv, capsys)
        assert code == 2 and "does not say which NPU it ran on" in err and str(folder) in err, err
    code, _, _ = run(["validate", "--profile", str(folder), "--hardware", "ascend910b4"], capsys)
    assert code in (0, 1)


def test_calibrating_again_into_the_same_file_says_baselines_must_be_saved_again(tmp_path, capsys) -> None:
    # Newcomer: the spec keeps its name, so baselines saved with the old figures came out
    # REGRESSED with a misleading diagnosis and no word that the hardware file had changed
    out = tmp_path / "npu.json"
    code, first, _ = run(["calibrate", str(ALEXNET_L1), "-o", str(out)], capsys)
    assert code == 0 and "replaced the earlier calibration" not in first
    code, second, _ = run(["calibrate", str(ALEXNET_L2), "-o", str(out)], capsys)
    assert code == 0 and f"replaced the earlier calibration in {out}" in second and "--oam-save-baseline" in second


def test_the_fitted_host_time_is_the_profiled_one_only(llm_calibrated) -> None:
    # Newcomer: oam validate --profile --hardware my-910b.json compared the step with the base's
    # profiled host time, not the one the file was fitted to (also a profiled run's). Decision:
    # the fit goes into profiler.profiled_host_dispatch_s only; launch.host_dispatch_s (every
    # unprofiled run) stays the base's, as a profile cannot separate the profiler's own overhead
    path, printed = llm_calibrated
    spec = load_hardware(str(path))
    base = load_hardware(spec.calibration.base_hardware)
    assert spec.profiler.profiled_host_dispatch_s == spec.calibration.profiled_host_dispatch_s_fitted
    assert spec.profiler.profiled_host_dispatch_s != base.profiler.profiled_host_dispatch_s
    assert spec.launch == base.launch
    assert "host dispatch per kernel under the profiler: " in printed
    assert "launch.host_dispatch_s kept: a profile cannot separate the profiler's overhead" in printed


def test_a_file_an_earlier_oam_calibrate_wrote_still_loads(llm_calibrated, tmp_path) -> None:
    path, _ = llm_calibrated
    data = json.loads(path.read_text(encoding="utf-8"))
    cal = data["calibration"]
    fitted = cal.pop("profiled_host_dispatch_s_fitted")
    cal.pop("profiled_host_dispatch_s_before")
    base_launch_s = data["launch"]["host_dispatch_s"]
    cal.update(host_dispatch_s_before=base_launch_s, host_dispatch_s_fitted=fitted)  # the earlier keys
    data["launch"]["host_dispatch_s"] = fitted  # where the earlier calibrate wrote it
    data["profiler"]["profiled_host_dispatch_s"] = 9e-6  # anything but the fitted value
    data["name"] = "earlier-910b"
    old = tmp_path / "earlier-910b.json"
    old.write_text(json.dumps(data), encoding="utf-8")
    spec = load_hardware(str(old))
    read = spec.calibration
    assert read.profiled_host_dispatch_s_fitted == fitted and read.profiled_host_dispatch_s_before is None
    # The fitted (profiled) interval no longer makes every unprofiled run host-bound: launch gets the
    # base's value back, and the fitted one goes where this version writes it
    assert fitted != base_launch_s
    assert spec.launch.host_dispatch_s == base_launch_s
    assert spec.profiler.profiled_host_dispatch_s == fitted


def test_a_calibrated_scale_of_an_unknown_op_type_is_refused(tmp_path, capsys) -> None:
    # Review: op_cost looks the scale up by op type, so a typo ("Matmul") scaled nothing, silently
    data = load_hardware("ascend910b").model_dump(mode="json") | {"name": "typo-910b"}
    data["calibration"] = {
        "source": "calibration: test", "base_hardware": "ascend910b", "created_utc": "2025-01-01T00:00:00+00:00",
        "tool": "test", "profiles": [{"path": "x.csv", "sha256": "0" * 64, "kernels": 1, "host_gaps": 0}],
        "min_kernels": 1, "op_time_scale": {"Matmul": {"time_scale": 2.0, "kernels": 1, "fitted": True,
                                                       "median_abs_error_frac_before": 0.5,
                                                       "median_abs_error_frac_after": 0.1}},
        "profiled_host_dispatch_s_before": None, "profiled_host_dispatch_s_fitted": None, "kernels": 1,
        "median_abs_error_frac_before": 0.5, "median_abs_error_frac_after": 0.1}
    path = tmp_path / "typo-910b.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    expected = (rf"^{re.escape(str(path))}: field calibration.op_time_scale: 'Matmul' is not a simulator op type \(did you mean "
                r"'MatMul'\? op types are case-sensitive\), so its scale would change nothing$")

    def mm(npu):
        npu.matmul(npu.tensor((64, 64), "bf16"), npu.tensor((64, 64), "bf16"))

    with pytest.raises(HardwareFileError, match=expected):
        simulator.run(mm, hardware=str(path))
    code, _, err = run(["validate", "--profile", str(ALEXNET_L2), "--hardware", str(path)], capsys)
    assert code == 2 and str(path) in err and "'Matmul'" in err and err.count("\n") == 1, err
    # a name like no op type gets the list of them
    data["calibration"]["op_time_scale"] = {"Zzz": data["calibration"]["op_time_scale"]["Matmul"]}
    unlike = tmp_path / "unlike-910b.json"
    unlike.write_text(json.dumps(data | {"name": "unlike-910b"}), encoding="utf-8")
    with pytest.raises(HardwareFileError, match=r"'Zzz' is not a simulator op type, .*; known op types: .*'?MatMul'?, "):
        simulator.run(mm, hardware=str(unlike))
    data["calibration"]["op_time_scale"] = {"MatMul": data["calibration"]["op_time_scale"]["Zzz"]}
    fixed = tmp_path / "fixed-910b.json"
    fixed.write_text(json.dumps(data | {"name": "fixed-910b"}), encoding="utf-8")
    assert simulator.run(mm, hardware=str(fixed)).hardware == "fixed-910b"


@pytest.mark.parametrize("name", ["my 910b.json", "-x.json", "x.json.json"])
def test_an_output_name_that_cannot_be_a_spec_name_is_refused_before_any_work(tmp_path, capsys, name) -> None:
    # Review: "my 910b.json" was written, then refused when loaded ("field name: 'my 910b' ...")
    out = tmp_path / name
    code, _, err = run(["calibrate", str(ALEXNET_L1), "-o", str(out)], capsys)
    assert code == 2 and "becomes the spec's name" in err and err.count("\n") == 1 and not out.exists(), err


def test_two_files_with_one_name_and_different_figures_are_refused(tmp_path) -> None:
    # Review: the second file's spec silently replaced the first's for every run that names it
    first, second = tmp_path / "a" / "npu.json", tmp_path / "b" / "npu.json"
    for path, host_s in ((first, 2e-5), (second, 9e-5)):
        data = load_hardware("ascend910b").model_dump(mode="json") | {"name": "npu"}
        data["launch"]["host_dispatch_s"] = host_s
        path.parent.mkdir()
        path.write_text(json.dumps(data), encoding="utf-8")
    assert load_hardware(str(first)).launch.host_dispatch_s == 2e-5
    assert load_hardware(str(first)).name == "npu"  # the same file again is fine
    with pytest.raises(HardwareFileError, match=f"^{second}: field name: 'npu' is also the name of {first}"):
        load_hardware(str(second))
    assert load_hardware("npu").launch.host_dispatch_s == 2e-5


def test_llm_calibration_fits_the_hccs_link_from_the_communication_matrix(llm_calibrated) -> None:
    # the LLM folder's communication_matrix.json: HCCS carried 1,766.6 MB in 92.97 ms, 19.0 GB/s
    # achieved; written over ascend910b4's link efficiency 0.8, rounded to 0.1 GB/s: 23.8 GB/s
    # (the bundled spec has the 910B2's 19.6 GB/s)
    path, printed = llm_calibrated
    spec = load_hardware(str(path))
    fit = spec.calibration.link_rates["HCCS"]
    assert fit.field == "hccs_link_bandwidth_bytes_per_s"
    assert fit.achieved_bytes_per_s == pytest.approx(19.0e9, rel=1e-3)
    assert spec.interconnect.hccs_link_bandwidth_bytes_per_s == fit.fitted_bytes_per_s == pytest.approx(23.8e9)
    assert fit.before_bytes_per_s == pytest.approx(19.6e9)
    assert "HCCS links: 19.0 GB/s achieved over 1,766.6 MB" in printed


def test_calibration_fits_the_link_rate_of_the_user_s_machine(tmp_path, capsys) -> None:
    # a machine whose HCCS links carry 40 GB/s: the profile folder's communication.json says so
    folder = tmp_path / "rank0_ascend_pt"
    shutil.copytree(ALEXNET_L1, folder)
    info = {"Transit Size(MB)": 400.0, "Transit Time(ms)": 10.0, "Bandwidth(GB/s)": 40.0}
    (folder / "communication.json").write_text(json.dumps({"step1": {"collective": {
        "Total Op Info": {"Communication Time Info": {}, "Communication Bandwidth Info": {"HCCS": info}}}}}))
    out = tmp_path / "fast-links.json"
    code, printed, _ = run(["calibrate", str(folder), "-o", str(out)], capsys)
    assert code == 0, printed
    spec = load_hardware(str(out))
    assert spec.interconnect.hccs_link_bandwidth_bytes_per_s == pytest.approx(40e9 / spec.interconnect.link_efficiency_frac)
    assert "hccs_link_bandwidth_bytes_per_s: replaced by oam calibrate" in spec.interconnect.source
    # a broken one is named, and nothing is written
    (folder / "communication.json").write_text("{")
    broken = tmp_path / "broken.json"
    code, _, err = run(["calibrate", str(folder), "-o", str(broken)], capsys)
    assert code == 2 and "communication.json: is not JSON" in err and not broken.exists()


def test_a_link_that_carried_little_keeps_the_base_rate(tmp_path) -> None:
    # Regression test (review): 112 bytes of all-gathers timed their start-up, not the link, and
    # were written as a 0.03 GB/s HCCS rate. Under 64 MiB a transport keeps the base's value.
    from pytest_oam.calibrate import MIN_LINK_FIT_BYTES, fit_link_rates

    def write(mb: float) -> Path:  # at 20 GB/s
        path = tmp_path / f"communication_{mb}.json"
        info = {"Transit Size(MB)": mb, "Transit Time(ms)": mb / 20.0, "Bandwidth(GB/s)": 20.0}
        path.write_text(json.dumps({"s": {"collective": {"Total Op Info": {"Communication Bandwidth Info": {"HCCS": info}}}}}))
        return path

    base = load_hardware("ascend910b")
    assert fit_link_rates([write(0.000112)], base) == {}
    big = fit_link_rates([write(MIN_LINK_FIT_BYTES / 1e6 * 2)], base)
    assert big["HCCS"]["fitted_bytes_per_s"] == pytest.approx(20e9 / 0.8)


@pytest.mark.parametrize("info, message", [
    ({"Transit Size(MB)": -5.0, "Transit Time(ms)": 1.0}, "cannot be negative"),
    ({"Transit Size(MB)": 427.0, "Transit Time(ms)": 0.0}, "carried in 0 ms"),
    ({"Transit Size(MB)": 7.5e11, "Transit Time(ms)": 1.0}, "faster than the card's HBM"),
])
def test_impossible_link_figures_are_refused_naming_the_file(tmp_path, capsys, info, message) -> None:
    # Regression tests (newcomer): negative sizes were dropped without a word, and a rate no link
    # can carry (above the card's HBM bandwidth) was written into the hardware file
    folder = tmp_path / "rank0_ascend_pt"
    shutil.copytree(ALEXNET_L1, folder)
    (folder / "communication.json").write_text(json.dumps({"step1": {"collective": {
        "Total Op Info": {"Communication Bandwidth Info": {"HCCS": info}}}}}))
    out = tmp_path / "out.json"
    code, _, err = run(["calibrate", str(folder), "-o", str(out)], capsys)
    assert code == 2 and message in err and "communication.json" in err and not out.exists()


def test_a_communication_file_that_fits_nothing_says_the_rates_are_kept(tmp_path, capsys) -> None:
    folder = tmp_path / "rank0_ascend_pt"
    shutil.copytree(ALEXNET_L1, folder)
    info = {"Transit Size(MB)": 0.001, "Transit Time(ms)": 0.01}
    (folder / "communication.json").write_text(json.dumps({"step1": {"collective": {
        "Total Op Info": {"Communication Bandwidth Info": {"HCCS": info}}}}}))
    code, printed, _ = run(["calibrate", str(folder), "-o", str(tmp_path / "out.json")], capsys)
    assert code == 0 and "links: kept:" in printed and "communication.json" in printed
