"""The ``oam`` command: the Python API from a shell, exit codes, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import pytest_oam as oam
import simulator
from pytest_oam.cli import main

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--model", "llama-7b", "--steps", "2"]


def oam_cmd(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_console_script_and_module_run() -> None:
    (script,) = entry_points(group="console_scripts", name="oam")
    assert script.value == "pytest_oam.cli:console_main"
    result = subprocess.run([sys.executable, "-m", "pytest_oam", "--help"], capture_output=True, text=True, check=True)
    for text in ("usage: oam", "baseline", "collect", "compare", "exit codes: 0 nothing regressed"):
        assert text in result.stdout


def test_create_show_collect_compare(tmp_path, capsys) -> None:
    code, out, _ = oam_cmd(capsys, "baseline", "create", *FAST, "--tag", "v1", "-o", tmp_path / "b.json")
    assert code == 0 and out.startswith(f"wrote {tmp_path / 'b.json'}: llama-7b on ascend910 x 8, 2 steps")
    code, out, _ = oam_cmd(capsys, "baseline", "show", tmp_path / "b.json")
    assert code == 0 and "tag: v1" in out and "FlashAttention" in out and "mac_ratio" in out

    code, out, _ = oam_cmd(capsys, "collect", *FAST, "--focus", "FlashAttention", "-o", tmp_path / "same.json.gz")
    assert code == 0 and "summaries" in out
    code, out, _ = oam_cmd(capsys, "compare", tmp_path / "b.json", tmp_path / "same.json.gz")
    assert code == 0 and out.startswith("status: pass")

    code, _, _ = oam_cmd(capsys, "collect", *FAST, "--param", "block_size=64", "-o", tmp_path / "slow.json")
    assert code == 0
    code, out, _ = oam_cmd(capsys, "compare", tmp_path / "b.json", tmp_path / "slow.json", "--format", "json")
    assert code == 1
    data = json.loads(out)
    assert data["status"] == "regressed"
    # the same numbers as the Python API on the same files
    report = oam.compare_profiles(oam.ProfileBaseline.load(tmp_path / "b.json"), oam.api.load_profile(tmp_path / "slow.json"))
    assert data["verdicts"] == json.loads(report.to_json())["verdicts"]
    code, out, _ = oam_cmd(capsys, "compare", tmp_path / "b.json", tmp_path / "slow.json", "--format", "markdown")
    assert code == 1 and "| FlashAttention " in out and "block_size" in out


def test_existing_files_are_kept_unless_forced(tmp_path, capsys) -> None:
    target = tmp_path / "b.json"
    target.write_text("precious")
    code, _, err = oam_cmd(capsys, "baseline", "create", *FAST, "-o", target)
    assert code == 2 and "exists; pass --force" in err and target.read_text() == "precious"
    code, _, _ = oam_cmd(capsys, "baseline", "create", *FAST, "-o", target, "--force")
    assert code == 0 and json.loads(target.read_text())["nodeid"] == "api:llama-7b"
    # Newcomer finding: a folder as -o, even with --force, gave "[Errno 21] Is a directory" on a
    # temporary file's name
    code, _, err = oam_cmd(capsys, "collect", *FAST, "-o", tmp_path, "--force")
    assert code == 2 and f"-o {tmp_path}: is a folder; give a file name" in err


def test_plugin_baselines_can_be_shown_and_compared(capsys) -> None:
    path = next((ROOT / "baselines").glob("examples_test_llama2_training*.json"))
    code, out, _ = oam_cmd(capsys, "baseline", "show", path)
    assert code == 0 and "run 1: ascend910 x 8" in out
    code, out, _ = oam_cmd(capsys, "compare", path, path)
    assert code == 0 and out.startswith("status: pass")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["collect", "--model", "llama-8b"], "unknown model 'llama-8b'; known: llama-13b, llama-70b, llama-7b"),
        (["collect", *FAST, "--param", "blok_size=64"], "unknown parameter 'blok_size' for model 'llama-7b'; known: "),
        (["collect", *FAST, "--hardware", "Ascend 920 x 8"], "unknown hardware 'Ascend 920 x 8'; known: ascend910"),
        (["collect", *FAST, "--dataset", "wikitext-2"], "wikitext-2"),
        (["collect", *FAST, "--focus", "FlashAtention"], "focus 'FlashAtention' matches no op type"),
    ],
)
def test_bad_names_exit_2_naming_the_value(tmp_path, capsys, argv, message) -> None:
    code, out, err = oam_cmd(capsys, *argv, "-o", tmp_path / "p.json")
    assert code == 2 and message in err and out == ""
    assert not (tmp_path / "p.json").exists()


def test_bad_files_and_limits_exit_2(tmp_path, capsys) -> None:
    oam_cmd(capsys, "baseline", "create", *FAST, "-o", tmp_path / "b.json")
    (tmp_path / "garbage.json").write_text("not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    oam_cmd(capsys, "collect", *FAST, "--hardware", "ascend910b x 8", "-o", tmp_path / "b910b.json")
    cases = [
        ([tmp_path / "missing.json"], "missing.json: cannot be read"),
        ([tmp_path / "garbage.json"], "garbage.json: is not a JSON profile or baseline"),
        ([tmp_path / "list.json"], "list.json: no trace events: not a profile, a baseline file or a Chrome trace"),
        ([tmp_path / "b910b.json"], "the baseline was made on ascend910 x 8, the current profile on ascend910b x 8"),
        ([tmp_path / "b.json", "--threshold=-5%"], "-5%"),
        ([tmp_path / "b.json", "--threshold", "5"], "5"),
    ]
    for extra, message in cases:
        code, _, err = oam_cmd(capsys, "compare", tmp_path / "b.json", *extra)
        assert code == 2 and message in err, (extra, err)


def test_show_a_profile_says_what_it_is(tmp_path, capsys) -> None:
    oam_cmd(capsys, "collect", *FAST, "-o", tmp_path / "p.json.gz")
    code, _, err = oam_cmd(capsys, "baseline", "show", tmp_path / "p.json.gz")
    assert code == 2 and "p.json.gz: is a profile, not a baseline file" in err



def test_booleans_and_bad_params(tmp_path, capsys) -> None:
    from pytest_oam.cli import _param

    assert [_param(f"fusion={v}")[1] for v in ("no", "off", "False", "0")] == [False, False, False, 0]
    assert _param("fusion=yes")[1] is True
    code, _, err = oam_cmd(capsys, "collect", *FAST, "--param", "fusion=maybe", "-o", tmp_path / "p.json")
    assert code == 2 and "parameter fusion must be true or false, got 'maybe'" in err
    code, _, err = oam_cmd(capsys, "collect", *FAST, "--param", "dtype=bf16", "-o", tmp_path / "p.json")
    assert code == 2 and "has no Cube rate on ascend910" in err
    code, _, err = oam_cmd(capsys, "collect", *FAST, "--param", "seq_len=100", "-o", tmp_path / "p.json")
    assert code == 2 and "unknown parameter 'seq_len'" in err
    code, _, err = oam_cmd(capsys, "collect", *FAST, "--seq-len", "100", "-o", tmp_path / "p.json")
    assert code == 2 and "seq_len applies only without a dataset" in err
    code, _, err = oam_cmd(capsys, "collect", *FAST, "--context-ops", "3", "-o", tmp_path / "p.json")
    assert code == 2 and "context_ops applies only with focus=OP" in err
    code, _, err = oam_cmd(capsys, "baseline", "create", *FAST, "-o", tmp_path / "b.json.gz")
    assert code == 2 and "baseline files are plain JSON" in err
    assert not list(tmp_path.iterdir())


def test_compare_per_op_threshold_and_version(tmp_path, capsys) -> None:
    oam_cmd(capsys, "baseline", "create", *FAST, "-o", tmp_path / "b.json")
    oam_cmd(capsys, "collect", *FAST, "--param", "block_size=64", "-o", tmp_path / "slow.json")
    code, out, _ = oam_cmd(capsys, "compare", tmp_path / "b.json", tmp_path / "slow.json",
                           "--threshold", "FlashAttention*=60%", "--format", "json")
    assert code == 0 and json.loads(out)["limits"]["FlashAttention*"] == 0.6
    with pytest.raises(SystemExit):
        main(["--version"])
    assert f"simulator {simulator.__version__}" in capsys.readouterr().out


def test_compare_names_a_threshold_that_matches_nothing_and_checks_alpha(tmp_path, capsys) -> None:
    # Regression (newcomer): a mistyped pattern left the gate at its default limit, silently
    oam_cmd(capsys, "baseline", "create", *FAST, "-o", tmp_path / "b.json")
    code, out, _ = oam_cmd(capsys, "compare", tmp_path / "b.json", tmp_path / "b.json",
                           "--threshold", "Flashattention=1%")
    assert code == 0
    assert "note: thresholds match no row of this comparison: Flashattention (op types are case-sensitive: " in out
    for alpha in ("0", "1", "-1", "2"):
        code, _, err = oam_cmd(capsys, "compare", tmp_path / "b.json", tmp_path / "b.json", "--alpha", alpha)
        assert code == 2 and "oam compare: error: --alpha: alpha must be strictly between 0 and 1, got " in err


def test_collect_refuses_a_repeated_param_and_a_non_training_dtype(tmp_path, capsys) -> None:
    # Regressions (newcomer): the last --param won silently; dtype=int8 wrote an int8 training profile
    code, _, err = oam_cmd(capsys, "collect", *FAST, "--param", "block_size=64", "--param", "block_size=128",
                           "-o", tmp_path / "a.json")
    assert code == 2 and "--param block_size is given twice (64 and 128)" in err
    code, _, err = oam_cmd(capsys, "collect", *FAST, "--param", "dtype=int8", "-o", tmp_path / "b.json")
    assert code == 2 and "dtype 'int8' is not a training dtype on ascend910; use fp16" in err
    assert not (tmp_path / "a.json").exists() and not (tmp_path / "b.json").exists()


def test_compare_names_the_min_delta_option(tmp_path, capsys) -> None:
    oam_cmd(capsys, "baseline", "create", *FAST, "-o", tmp_path / "b.json")
    code, _, err = oam_cmd(capsys, "compare", tmp_path / "b.json", tmp_path / "b.json", "--min-delta-us", "-5")
    assert code == 2 and "--min-delta-us must be a finite number >= 0, got -5" in err


def test_empty_baseline_is_invalid(tmp_path, capsys) -> None:
    oam_cmd(capsys, "baseline", "create", *FAST, "-o", tmp_path / "b.json")
    data = json.loads((tmp_path / "b.json").read_text())
    data["runs"][0]["ops"] = {}
    (tmp_path / "empty.json").write_text(json.dumps(data))
    code, _, err = oam_cmd(capsys, "compare", tmp_path / "empty.json", tmp_path / "b.json")
    assert code == 2 and "runs.0.ops" in err
