"""Hostile and damaged files (issue 20): temporary files of killed writes, implausible or
ambiguous baselines, things that are not files where a file should be, decompression bombs,
text from data files that tries to forge report rows or colour the terminal, and a tuning job
whose workload module cannot be imported. Each error names the file and fits on one line."""

from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_oam import fileio
from pytest_oam.baseline import (
    BaselineError,
    BaselineFile,
    baseline_filename,
    load_baseline,
    save_baseline,
)
from pytest_oam.cli import main

REALDATA = Path(__file__).parent / "data" / "realdata" / "ascend-msinsight-alexnet2p-level1-rank0"
KERNELS = REALDATA / "kernel_details.csv"
#: An op name a crafted profiler CSV or baseline could carry: a column break and a new row for
#: Markdown, HTML for a job summary, a colour change and a fake PASSED for a terminal.
EVIL = "MatMul|x\n| fake | row |<script>alert(1)</script>\x1b[32mPASSED\x1b[0m\r"
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")


def baseline_data(nodeid: str = "test_x.py::test_x", **op_fields) -> dict:
    op = {"time_s": 1e-3, "mean_time_s": 1e-3, "count_per_step": 1.0, "flop": 1e9, "hbm_bytes": 1e6,
          "dma_count": 4.0, "mac_ratio": 0.5, "vec_ratio": 0.1, "mte2_ratio": 0.3, **op_fields}
    run = {"hardware": "ascend910", "devices": 1, "simulator_version": "0", "workload_fingerprint": "f",
           "steps": 2, "step_time_s": 2e-3, "step_time_mean_s": 2e-3, "ops": {"MatMul": op}}
    return {"schema_version": 1, "nodeid": nodeid, "runs": [run]}


def baseline_state(path: Path) -> str:
    from pytest_oam.baseline import baseline_state

    return baseline_state(path)


def call_with_timeout(fn, *args, fifo: Path | None = None, timeout_s: float = 10.0):
    """``fn(*args)`` in a thread: its result or exception, or a test failure if it blocks (on a
    named pipe: the pipe is then opened for writing, so that the blocked reader returns)."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        if fifo is not None:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # releases the blocked open()
            os.close(fd)
            thread.join(timeout_s)
        pytest.fail(f"{getattr(fn, '__name__', fn)} blocked for {timeout_s} s on {args}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


# -- 1. temporary files of killed writes --------------------------------------------------------------


def test_stale_temporary_files_of_killed_writes_are_removed_on_the_next_save(tmp_path) -> None:
    folder = tmp_path / "baselines"
    folder.mkdir()
    hour_ago = time.time() - 3600
    stale = folder / ".test_a.py_test_a-0123456789ab.json.k2j4_h1d.tmp"  # a write killed an hour ago
    fresh = folder / ".test_b.py_test_b-0123456789ab.json.p9q8r7s6.tmp"  # another run writing right now
    theirs = folder / "notes.tmp"  # not our pattern: never touched, however old
    for path in (stale, fresh, theirs):
        path.write_text("{")
    os.utime(stale, (hour_ago, hour_ago))
    os.utime(theirs, (hour_ago, hour_ago))
    target = folder / baseline_filename("test_x.py::test_x")
    save_baseline(target, BaselineFile.model_validate(baseline_data()))
    assert load_baseline(target).nodeid == "test_x.py::test_x"
    assert not stale.exists()
    assert fresh.exists() and theirs.exists()
    assert sorted(p.name for p in folder.iterdir()) == sorted([target.name, fresh.name, theirs.name])


# -- 2. baseline files --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("time_s", 1e308, "runs.0.ops.MatMul.time_s: Value error, 1e+308 s is implausible (more than 1e+06 s)"),
        ("mean_time_s", 2e6, "runs.0.ops.MatMul.mean_time_s: Value error, 2e+06 s is implausible"),
        ("hbm_bytes", 2.0**61, "runs.0.ops.MatMul.hbm_bytes: Value error, 2.30584e+18 bytes is implausible"),
        ("count_per_step", 1e13, "runs.0.ops.MatMul.count_per_step: Value error, 1e+13 is implausible"),
        ("flop", 1e30, "runs.0.ops.MatMul.flop: Value error, 1e+30 FLOP is implausible"),
        ("dma_count", 5e12, "runs.0.ops.MatMul.dma_count: Value error, 5e+12 is implausible"),
        ("run.step_time_s", 1e300, "runs.0.step_time_s: Value error, 1e+300 s is implausible"),
        ("run.memory_reserved_peak_bytes", 2**62, "runs.0.memory_reserved_peak_bytes: Value error, 4.61169e+18 "
                                                  "bytes is implausible"),
    ],
)
def test_implausible_baseline_values_are_refused_naming_file_field_and_value(tmp_path, field, value, message):
    data = baseline_data()
    if field.startswith("run."):
        data["runs"][0][field.removeprefix("run.")] = value
    else:
        data["runs"][0]["ops"]["MatMul"][field] = value
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError) as info:
        load_baseline(path)
    assert str(info.value).startswith(f"{path}: is not a valid baseline: ")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_largest_real_values_stay_plausible() -> None:
    # the committed baselines of the examples (llama-7b on 8 cards: 43 TFLOP and 91 GB of HBM
    # traffic per step in one op type) are far below every bound
    for path in (Path(__file__).parents[1] / "baselines").glob("*.json"):
        load_baseline(path)


def test_a_key_given_twice_is_refused_naming_the_key(tmp_path) -> None:
    text = json.dumps(baseline_data(), indent=1).replace('"time_s": 0.001', '"time_s": 0.001, "time_s": 1e-09')
    path = tmp_path / "b.json"
    path.write_text(text)
    with pytest.raises(BaselineError, match=r"b\.json: is not a valid baseline: it has the key 'time_s' twice"):
        load_baseline(path)


def test_a_key_given_twice_in_a_knowledge_base_or_profile_is_refused(tmp_path) -> None:
    from pytest_oam.api import ProfileFileError, load_any
    from pytest_oam.knowledge_base import KnowledgeBase, KnowledgeBaseError

    kb = tmp_path / "kb.json"
    kb.write_text('{"schema_version": 1, "records": [], "records": []}')
    with pytest.raises(KnowledgeBaseError, match=r"kb\.json: is not a knowledge base: it has the key 'records' twice"):
        KnowledgeBase.load(kb)
    profile = tmp_path / "p.json"
    profile.write_text('{"ops": [], "steps": 1, "steps": 2}')
    with pytest.raises(ProfileFileError, match=r"p\.json: is not a valid profile: it has the key 'steps' twice"):
        load_any(profile)


def test_baseline_state_of_missing_and_regular_files(tmp_path) -> None:
    path = tmp_path / "b.json"
    assert baseline_state(path) == "missing"
    assert baseline_state(tmp_path / "no-folder" / "b.json") == "missing"
    path.write_text(json.dumps(baseline_data()))
    assert baseline_state(path) == "present"
    link = tmp_path / "link.json"
    link.symlink_to(path)
    assert baseline_state(link) == "present" and load_baseline(link).nodeid == "test_x.py::test_x"


def test_a_dangling_symlink_is_an_error_not_a_missing_baseline(tmp_path) -> None:
    link = tmp_path / "b.json"
    link.symlink_to(tmp_path / "moved-away.json")
    expected = f"{link}: is a symbolic link to '{tmp_path / 'moved-away.json'}', which does not exist"
    with pytest.raises(BaselineError) as info:
        baseline_state(link)
    assert str(info.value).startswith(expected)
    with pytest.raises(BaselineError) as info:
        load_baseline(link)
    assert str(info.value).startswith(expected)
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    with pytest.raises(BaselineError, match=r"loop\.json: cannot be checked \(Too many levels of symbolic links\)"):
        baseline_state(loop)


def test_a_folder_at_the_baseline_path_is_an_error(tmp_path) -> None:
    (tmp_path / "b.json").mkdir()
    with pytest.raises(BaselineError, match=r"b\.json: is a folder, not a file"):
        baseline_state(tmp_path / "b.json")
    with pytest.raises(BaselineError, match=r"b\.json: is a folder, not a file"):
        load_baseline(tmp_path / "b.json")


@needs_fifo
def test_a_named_pipe_is_never_opened(tmp_path) -> None:
    from pytest_oam.api import ProfileFileError, load_any
    from pytest_oam.knowledge_base import KnowledgeBase, KnowledgeBaseError
    from pytest_oam.record import RecordError, load_record

    fifo = tmp_path / "b.json"
    os.mkfifo(fifo)
    with pytest.raises(BaselineError, match=r"b\.json: is a named pipe \(FIFO\), not a file"):
        baseline_state(fifo)
    for fn, error in ((load_baseline, BaselineError), (KnowledgeBase.load, KnowledgeBaseError),
                      (load_record, RecordError), (load_any, ProfileFileError)):
        with pytest.raises(error, match=r"b\.json: is a named pipe \(FIFO\), not a file"):
            call_with_timeout(fn, fifo, fifo=fifo)


@needs_fifo
def test_a_named_pipe_at_a_baseline_path_errors_the_test_instead_of_hanging(pytester) -> None:
    pytester.makepyfile(test_model="""
        def test_model(oam_profile):
            oam_profile.run(lambda npu: npu.matmul(npu.tensor((64, 64)), npu.tensor((64, 64))))
    """)
    folder = pytester.path / "baselines"
    folder.mkdir()
    fifo = folder / baseline_filename("test_model.py::test_model")
    os.mkfifo(fifo)
    try:
        result = pytester.runpytest_subprocess("--oam-baseline", "-p", "no:cacheprovider", timeout=120)
    except pytester.TimeoutExpired:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("pytest blocked reading the named pipe at the baseline path")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*{fifo.name}: is a named pipe (FIFO), not a file*"])


def test_a_dangling_symlink_at_a_baseline_path_errors_the_test(pytester) -> None:
    pytester.makepyfile(test_model="""
        def test_model(oam_profile):
            oam_profile.run(lambda npu: npu.matmul(npu.tensor((64, 64)), npu.tensor((64, 64))))
    """)
    folder = pytester.path / "baselines"
    folder.mkdir()
    link = folder / baseline_filename("test_model.py::test_model")
    link.symlink_to(pytester.path / "elsewhere.json")
    result = pytester.runpytest("--oam-baseline", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*{link.name}: is a symbolic link to *, which does not exist*"])


def test_a_folder_that_cannot_be_searched_is_a_clear_error(tmp_path, monkeypatch) -> None:
    # Root reads every folder whatever its mode: the permission error is simulated for this path.
    path = tmp_path / "locked" / "b.json"
    real_stat = os.stat

    def stat(target, *args, **kwargs):
        if Path(target) == path:
            raise PermissionError(13, "Permission denied", str(target))
        return real_stat(target, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    with pytest.raises(BaselineError) as info:
        baseline_state(path)
    with pytest.raises(BaselineError) as info2:
        load_baseline(path)
    monkeypatch.undo()
    for exc in (info.value, info2.value):
        assert str(exc) == f"{path}: cannot be checked: permission denied on its folder"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="running as root: a chmod 000 folder stays readable (the simulated case above covers it)")
def test_a_chmod_000_baseline_folder_is_a_clear_error(tmp_path) -> None:
    folder = tmp_path / "baselines"
    folder.mkdir()
    path = folder / "b.json"
    path.write_text(json.dumps(baseline_data()))
    folder.chmod(0)
    try:
        with pytest.raises(BaselineError, match="permission denied"):
            baseline_state(path)
        with pytest.raises(BaselineError, match="permission denied"):
            load_baseline(path)
    finally:
        folder.chmod(0o755)


# -- 3. decompression bombs ---------------------------------------------------------------------------


def write_gzip_of_zeros(path: Path, size: int) -> Path:
    chunk = bytes(2**24)
    with gzip.open(path, "wb", compresslevel=6) as fh:
        for _ in range(size // len(chunk)):
            fh.write(chunk)
        fh.write(bytes(size % len(chunk)))
    return path


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    """1.5 GiB of zeros, gzip-compressed to about 1.5 MB, written without holding it in memory."""
    return write_gzip_of_zeros(tmp_path_factory.mktemp("bomb") / "record.oam.json.gz", 3 * 2**29)


def test_gzip_readers_stop_past_the_limit(tmp_path) -> None:
    small = write_gzip_of_zeros(tmp_path / "zeros.json.gz", 2**20)
    with pytest.raises(fileio.InputFileError, match=r"decompresses to more than 65,536 bytes, the most pytest-oam "):
        fileio.read_input_bytes(small, limit=2**16)
    assert fileio.read_input_bytes(small, limit=2**20) == bytes(2**20)  # exactly at the limit is fine
    plain = tmp_path / "plain.json"
    plain.write_bytes(b" " * 1000)
    with pytest.raises(fileio.InputFileError, match="is larger than 999 bytes"):
        fileio.read_input_bytes(plain, limit=999)


def test_every_gzip_reader_applies_the_limit(tmp_path, monkeypatch) -> None:
    from pytest_oam.api import ProfileFileError, load_any
    from pytest_oam.importers import ImportError_, import_profile
    from pytest_oam.record import RecordError, load_record

    monkeypatch.setattr(fileio, "MAX_INPUT_BYTES", 2**16, raising=False)
    small = write_gzip_of_zeros(tmp_path / "zeros.json.gz", 2**20)
    for fn, error in ((load_record, RecordError), (load_any, ProfileFileError), (import_profile, ImportError_)):
        with pytest.raises(error, match=rf"^{small}: decompresses to more than 65,536 bytes"):
            fn(small)


def test_oam_replay_of_a_decompression_bomb_is_one_line_exit_2(bomb, capsys) -> None:
    code = main(["replay", str(bomb)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == (f"oam replay: error: {bomb}: decompresses to more than 1 GiB, the most pytest-oam reads: a "
                   "damaged or malicious gzip file (a decompression bomb)? Check where it came from\n")


def test_oam_compare_of_a_decompression_bomb_is_one_line_exit_2_in_bounded_memory(bomb, tmp_path) -> None:
    # In a child process, to measure its peak memory: the bomb is counted, never held.
    baseline = tmp_path / "b.json"
    baseline.write_text(json.dumps(baseline_data()))
    script = ("import resource, subprocess, sys\n"
              "r = subprocess.run([sys.executable, '-m', 'pytest_oam', 'compare', sys.argv[1], sys.argv[2]], "
              "capture_output=True, text=True)\n"
              "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
              "sys.stdout.write(r.stdout + r.stderr)\n")
    result = subprocess.run([sys.executable, "-c", script, str(baseline), str(bomb)], capture_output=True,
                            text=True, timeout=300, check=True)
    first, *rest = result.stdout.splitlines()
    code, max_rss_kib = map(int, first.split())
    assert code == 2 and rest == [f"oam compare: error: {bomb}: decompresses to more than 1 GiB, the most "
                                  "pytest-oam reads: a damaged or malicious gzip file (a decompression bomb)? "
                                  "Check where it came from"]
    assert max_rss_kib < 512 * 1024, f"peak memory {max_rss_kib / 1024:.0f} MiB reading a 1.5 MB file"


# -- 4. text from data files in reports ---------------------------------------------------------------


def evil_report():
    from pytest_oam.report import (
        DiagnosisReport,
        FindingReport,
        GateReport,
        OamReport,
        RunReport,
        TopOp,
        VerdictReport,
    )

    nodeid = "test_x.py::test[``<img src=x onerror=alert(1)>``]"
    verdicts = [VerdictReport(run=0, op_type=op, baseline_s=1e-3, current_s=2e-3, change_frac=1.0, limit_frac=0.1,
                              limit_source="default", status="regressed", statistic="median")
                for op in (EVIL, "Add")]
    finding = FindingReport(run=0, kind="regressed", op_type=EVIL, severity="serious", delta_s=1e-3,
                            step_share_frac=0.5, counters={}, call_sites=[(f"model.py:3 {EVIL}", 1e-3)],
                            advice=[f"look at {EVIL}"])
    diagnosis = DiagnosisReport(run=0, rule_id="spike", severity="warning", op_type=EVIL, op_name=EVIL,
                                location=f"x.py:1{EVIL}", description=f"slow {EVIL}", fix=f"fix {EVIL}",
                                gain_s=1e-4, step_share_frac=0.05)
    run = RunReport(index=0, status="regressed", hardware=f"ascend910{EVIL}", devices=1, step_time_s=2e-3,
                    top_ops=[TopOp(op_type=EVIL, time_s=1e-3, share_frac=0.5)])
    test = GateReport(nodeid=nodeid, status="regressed", failed=True, message=f"bad {EVIL}", runs=[run],
                      verdicts=verdicts, findings=[finding], diagnosis=[diagnosis], tuned_failures=[EVIL])
    return OamReport(pytest_oam_version="0", baseline_dir=None, tests=[test], status_counts={"regressed": 1})


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def unescaped_pipes(line: str) -> int:
    return line.count("|") - line.count("\\|")


def test_markdown_report_escapes_op_names_and_test_ids() -> None:
    from pytest_oam.report import markdown_report

    text = markdown_report(evil_report())
    for raw in ("<script>", "<img", "\x1b", "\r", "| fake | row |"):
        assert raw not in text, raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    tables = [rows for rows in (table_rows(block) for block in text.split("\n\n")) if rows]
    assert [len(rows) for rows in tables] == [3, 4]  # header, rule, 1 run; header, rule, 2 verdicts
    for rows in tables:
        assert len({unescaped_pipes(line) for line in rows}) == 1, rows
    assert "### regressed, tuned check failed: <code>test_x.py::test[&#96;&#96;&lt;img" in text


def test_terminal_text_has_no_escape_sequences_or_forged_lines() -> None:
    from pytest_oam.report import (
        diagnosis_text,
        findings_text,
        summary_table,
        terminal_safe,
        verdict_table,
    )

    report = evil_report()
    test = report.tests[0]
    table = summary_table(report.tests)
    assert len(table.splitlines()) == 3  # header, rule, one run
    verdicts = verdict_table(test.verdicts)
    assert len(verdicts.splitlines()) == 4
    assert len(diagnosis_text(test.diagnosis).splitlines()) == 2
    assert len(findings_text(test.findings).splitlines()) == 4  # finding, counters, where, what to do
    for text in (table, verdicts, diagnosis_text(test.diagnosis), findings_text(test.findings)):
        assert "\x1b" not in text and "\r" not in text
    assert terminal_safe(EVIL) == "MatMul|x | fake | row |<script>alert(1)</script>PASSED "
    assert terminal_safe("a\u202eDESSAP\x9b31m\x07\tb\x1b]8;;http://x\x1b\\link") == "aDESSAP blink"
    assert terminal_safe("one\r\ntwo", keep_newlines=True) == "one\ntwo"


def test_html_report_escapes_op_names_and_test_ids() -> None:
    from pytest_oam.html_report import html_report

    page = html_report(evil_report(), {}, spike_factor=3.0)
    assert "<script>alert" not in page and "<img src=x" not in page and "\x1b" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def evil_csv(source: Path, target: Path, slow: float = 1.0) -> Path:
    """A copy of a real kernel_details.csv whose Conv2D rows are renamed to :data:`EVIL`."""
    with source.open(newline="") as fh:
        rows = list(csv.reader(fh))
    header = rows[0]
    kind, duration = header.index("Type"), header.index("Duration(us)")
    for row in rows[1:]:
        if row[kind] == "Conv2D":
            row[kind] = EVIL
            row[duration] = str(float(row[duration]) * slow)
    with target.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return target


def test_oam_compare_of_crafted_profiler_csvs_escapes_the_op_name(tmp_path, capsys) -> None:
    base = evil_csv(KERNELS, tmp_path / "base.csv")
    current = evil_csv(KERNELS, tmp_path / "current.csv", slow=3.0)
    assert main(["compare", str(base), str(current), "--format", "markdown"]) == 1
    text = capsys.readouterr().out
    assert "<script>" not in text and "\x1b" not in text and "| fake | row |" not in text
    rows = table_rows(text)
    assert len({unescaped_pipes(line) for line in rows}) == 1 and any("&lt;script&gt;" in line for line in rows)
    assert main(["compare", str(base), str(current)]) == 1
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\r" not in text
    assert not any(line.lstrip().startswith(("| fake", "PASSED")) for line in text.splitlines())
    assert any("MatMul|x | fake | row |<script>alert(1)</script>PASSED" in line and "REGRESSED" in line
               for line in text.splitlines())


# -- 5. a tuning job whose workload module cannot be imported -----------------------------------------


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("def attention(npu:\n    pass\n",
         "workload module 'bad_job' has a syntax error: '(' was never closed ({folder}/bad_job.py, line 1); "
         "fix the module"),
        ("raise RuntimeError('no NPU driver here')\n",
         "workload module 'bad_job' raised RuntimeError when imported: no NPU driver here; fix the module "
         "(run: python -c 'import bad_job')"),
        ("import sys\nsys.exit(3)\n",
         "workload module 'bad_job' raised SystemExit when imported: 3; fix the module"),
        ("x = {}\ny = x['missing']\n",
         "workload module 'bad_job' raised KeyError when imported: 'missing'; fix the module"),
    ],
    ids=["syntax-error", "raises", "exits", "key-error"],
)
def test_oam_tune_names_a_workload_module_that_fails_to_import(tmp_path, capsys, module, message) -> None:
    (tmp_path / "bad_job.py").write_text(module)
    job = tmp_path / "job.toml"
    job.write_text('workload = "bad_job:attention"\noperator = "FlashAttention"\n[space]\nblock_size = [128]\n')
    sys.modules.pop("bad_job", None)
    assert main(["tune", str(job)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"oam tune: error: {job}: ") and message.format(folder=tmp_path) in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(tmp_path) not in sys.path[:1]  # the job's folder is taken off sys.path again


def test_oam_tune_refuses_a_workload_that_is_not_a_module_name(tmp_path, capsys) -> None:
    job = tmp_path / "job.toml"
    job.write_text('workload = "../evil:attention"\n[space]\nblock_size = [128]\n')
    assert main(["tune", str(job)]) == 2
    assert capsys.readouterr().err == (f"oam tune: error: {job}: workload '../evil:attention' must be "
                                       "module:function (a Python module name, importable from the job file's "
                                       "folder)\n")
