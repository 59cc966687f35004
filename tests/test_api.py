"""The Python API: the snippet users write, its agreement with the plugin, and bad input."""

from __future__ import annotations

import json
import re

import pytest

import pytest_oam as oam
from pytest_oam.baseline import baseline_filename, load_baseline
from pytest_oam.compare import summarize
from pytest_oam.thresholds import ThresholdError


def snippet(tmp_path, **current_kwargs):
    baseline = oam.ProfileBaseline.create(model="llama-7b", dataset="wikitext-103", hardware="Ascend 910 x 8",
                                          tag="v1.0-optimized")
    baseline.collect()
    baseline.save(tmp_path / "baselines" / "llama-7b-v1.0.json")
    baseline = oam.ProfileBaseline.load(tmp_path / "baselines" / "llama-7b-v1.0.json")
    current = oam.collect_profile(model="llama-7b", dataset="wikitext-103", **current_kwargs)
    report = oam.compare_profiles(baseline, current, regression_threshold=0.05)
    if report.has_regression:
        for reg in report.regressions:
            print(reg.op_name, reg.current_time_s, reg.baseline_time_s, reg.regression_ratio)
    return report


def test_unchanged_model_prints_nothing(tmp_path, capsys) -> None:
    report = snippet(tmp_path)
    assert capsys.readouterr().out == ""
    assert report.status == "pass" and not report.has_regression


def test_slower_flash_attention_configuration_is_printed(tmp_path, capsys) -> None:
    report = snippet(tmp_path, block_size=64)
    out = capsys.readouterr().out
    assert out.startswith("FlashAttention ")
    (fa,) = [r for r in report.regressions if r.op_name == "FlashAttention"]
    assert fa.regression_ratio == pytest.approx(fa.current_time_s / fa.baseline_time_s) and fa.regression_ratio > 1.02
    assert json.loads(report.to_json())["status"] == "regressed"
    assert "| FlashAttention " in report.to_markdown()
    assert "FlashAttention" in report.to_text()


def test_api_file_is_a_plugin_baseline(tmp_path) -> None:
    baseline = oam.ProfileBaseline.create(model="llama-7b", steps=2)
    baseline.collect()
    baseline.save(tmp_path / "b.json")
    file = load_baseline(tmp_path / "b.json")
    assert (file.nodeid, file.model, file.dataset) == ("api:llama-7b", "llama-7b", "wikitext-103")


PLUGIN_TEST = """
import os
from pytest_oam.api import _DatasetSteps
from simulator.datasets import load_dataset
from simulator.models import LLAMA2_7B, training_step

def test_llama(oam_profile):
    lengths = load_dataset("wikitext-103").sample(4, 4096, seed=0)
    block = int(os.environ.get("BLOCK", "128"))
    oam_profile.run(_DatasetSteps(training_step, LLAMA2_7B, lengths, {"block_size": block}),
                    steps=4, hardware="ascend910", devices=8)
"""


def test_api_and_plugin_give_the_same_numbers(pytester, monkeypatch) -> None:
    pytester.makepyfile(test_llama=PLUGIN_TEST)
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=1)
    monkeypatch.setenv("BLOCK", "64")
    result = pytester.runpytest("--oam-baseline", "--oam-threshold", "*=5%", "--oam-threshold",
                                "FlashAttention*=2%", "--oam-report=r.json")
    result.assert_outcomes(failed=1)
    plugin = {v["op_type"]: v for v in json.loads((pytester.path / "r.json").read_text())["tests"][0]["verdicts"]}
    # The plugin's baseline file, loaded by the API, against the API's own profile.
    baseline = oam.ProfileBaseline.load(pytester.path / "baselines" / baseline_filename("test_llama.py::test_llama"))
    current = oam.collect_profile(model="llama-7b", dataset="wikitext-103", block_size=64)
    report = oam.compare_profiles(baseline, current, regression_threshold=0.05)
    api = {r.op_name: r for r in report.regressions}
    assert set(api) == {k for k, v in plugin.items() if v["status"] == "regressed"}
    for op, reg in api.items():
        assert reg.regression_ratio == pytest.approx(1 + plugin[op]["change_frac"], rel=1e-12)
        assert reg.baseline_time_s == pytest.approx(plugin[op]["baseline_s"], rel=1e-12)
        assert reg.current_time_s == pytest.approx(plugin[op]["current_s"], rel=1e-12)


def test_the_millisecond_fields_of_a_regression_still_work_but_are_deprecated() -> None:
    # Issue 21: the API speaks seconds; the old names stay, converted, with a DeprecationWarning
    from pytest_oam.api import Regression

    reg = Regression("MatMul", 0.002, 0.003, 1.5, 0.1)
    with pytest.warns(DeprecationWarning, match=r"Regression.current_time_ms is deprecated: use Regression.current_time_s"):
        assert reg.current_time_ms == pytest.approx(3.0)  # 0.003 s
    with pytest.warns(DeprecationWarning, match=r"baseline_time_ms is deprecated"):
        assert reg.baseline_time_ms == pytest.approx(2.0)  # 0.002 s


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: oam.ProfileBaseline.create(model="gpt-5"), ValueError,
         r"unknown model 'gpt-5'; known: llama-13b, llama-70b, llama-7b"),
        (lambda: oam.ProfileBaseline.create(model="llama-7b", dataset="c4"), ValueError,
         r"unknown dataset 'c4'; known: wikitext-103"),
        (lambda: oam.ProfileBaseline.create(model="llama-7b", hardware="H100 x 8"), ValueError,
         (r"unknown hardware 'H100 x 8'; known: ascend910, ascend910b, ascend910b4, each optionally with a card count, "
         r"e.g. 'Ascend 910 x 8'")),
        (lambda: oam.collect_profile(model="bert"), ValueError, r"unknown model 'bert'"),
        (lambda: oam.compare_profiles(None, None, regression_threshold=-0.05), ThresholdError,
         r"limit -0.05 is negative"),
        (lambda: oam.compare_profiles(None, None, alpha=1.5), ValueError,
         r"alpha must be strictly between 0 and 1, got 1.5"),
    ],
)
def test_bad_input_names_the_value_and_the_choices(call, error, message) -> None:
    with pytest.raises(error, match=message):
        call()


def test_baseline_from_other_hardware_is_an_error() -> None:
    base = oam.collect_profile(model="llama-7b", hardware="Ascend 910B x 8", steps=1)
    cur = oam.collect_profile(model="llama-7b", hardware="Ascend 910 x 8", steps=1)
    with pytest.raises(ValueError, match=r"baseline was made on ascend910b x 8, the current profile on ascend910 x 8"):
        oam.compare_profiles(base, cur)


@pytest.mark.parametrize(("text", "parsed"), [("Ascend 910 x 8", ("ascend910", 8)), ("ascend910b", ("ascend910b", 1)),
                                              ("Ascend 910B × 16", ("ascend910b", 16))])
def test_hardware_forms(text, parsed) -> None:
    assert oam.parse_hardware(text) == parsed


def test_a_hardware_file_with_a_card_count(tmp_path) -> None:
    # Regression test (review): oam collect --hardware ./my.json said "unknown hardware"
    import json

    from simulator.hardware import HardwareFileError, load_hardware

    data = load_hardware("ascend910b").model_dump(mode="json")
    data.update(name="my-910b", display_name="mine")
    path = tmp_path / "my-910b.json"
    path.write_text(json.dumps(data))
    assert oam.parse_hardware(f"{path} x 8") == (str(path), 8)
    assert oam.parse_hardware(str(path)) == (str(path), 1)
    with pytest.raises(HardwareFileError, match="no such hardware file"):
        oam.parse_hardware(str(tmp_path / "none.json"))
    with pytest.raises(ValueError, match="at least 1"):
        oam.parse_hardware(f"{path} x 0")


def test_dataset_lengths_are_reproducible() -> None:
    from simulator.datasets import load_dataset

    d = load_dataset("wikitext-103")
    assert d.sample(16, 4096, seed=3) == d.sample(16, 4096, seed=3)
    assert all(128 <= n <= 4096 and n % 128 == 0 for n in d.sample(1000, 4096, seed=1))


# -- focused collection -------------------------------------------------------------------


def test_focused_profile_keeps_the_focus_and_its_context_only() -> None:
    full = oam.collect_profile(model="llama-7b", steps=2)
    focused = oam.collect_profile(model="llama-7b", steps=2, focus="FlashAttention", context_ops=5)
    hits = [i for i, op in enumerate(full.ops) if op.op_type == "FlashAttention"]
    expected = sorted({j for i in hits for j in range(max(0, i - 5), min(len(full.ops), i + 6))})
    assert [op.name for op in focused.ops] == [full.ops[j].name for j in expected]
    assert [op.start_s for op in focused.ops] == [full.ops[j].start_s for j in expected]
    # every op left out is counted once in a summary of its step, type and stream
    left_out = len(full.ops) - len(expected)
    assert sum(s.count for s in focused.op_summaries) == left_out > 0
    assert (focused.focus, focused.context_ops) == ("FlashAttention", 5)
    assert len(focused.to_json()) < len(full.to_json()) / 2


def test_focused_profile_gives_the_same_verdicts_as_the_full_one() -> None:
    full = oam.collect_profile(model="llama-7b", steps=2)
    focused = full.focused("FlashAttention", 1)
    a, b = summarize(full), summarize(focused)
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)
    assert a.ops.keys() == b.ops.keys()
    for op_type in a.ops:
        for name, value in a.ops[op_type]:
            expected = value if value is None else pytest.approx(value, rel=1e-9)
            assert getattr(b.ops[op_type], name) == expected, (op_type, name)
    assert oam.compare_profiles(full, focused).status == "pass"
    slower = oam.collect_profile(model="llama-7b", steps=2, block_size=64, focus="FlashAttention")
    report = oam.compare_profiles(full, slower)
    assert [r.op_name for r in report.regressions][:1] == ["FlashAttention"]
    # the focused profile still locates the regressed op in the user's code
    (fa,) = [f for f in report.findings if f.op_type == "FlashAttention"]
    assert fa.call_sites and "llama.py" in fa.call_sites[0][0]


def test_focused_profile_round_trips_through_json() -> None:
    from simulator.profile import Profile

    focused = oam.collect_profile(model="llama-7b", steps=1, focus="FlashAttention*", context_ops=0)
    assert {op.op_type for op in focused.ops} == {"FlashAttention", "FlashAttentionGrad"}
    assert Profile.from_json(focused.to_json()) == focused


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"focus": "FlashAtention"}, "focus 'FlashAtention' matches no op type of the profile; there are: "),
        ({"focus": "FlashAttention", "context_ops": -1}, "context_ops must be an integer >= 0, got -1"),
        ({"context_ops": 3}, "context_ops applies only with focus=OP"),
    ],
)
def test_bad_focus_is_an_error(kwargs, message) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")) as info:
        oam.collect_profile(model="llama-7b", steps=1, **kwargs)
    if "matches no op type" in message:
        assert "FlashAttention" in str(info.value) and "MatMul" in str(info.value)



# -- review findings (each failed before its fix) ---------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fusion": "false"}, "parameter fusion must be true or false, got 'false'"),
        ({"block_size": 64.0}, "parameter block_size must be an integer >= 1, got 64.0"),
        ({"dtype": "int4"}, "parameter dtype 'int4' is not a training dtype on ascend910; use fp16"),
        ({"dtype": "bf16"}, "parameter dtype 'bf16' has no Cube rate on ascend910; use fp16"),
        ({"tensor_parallel": 3}, "parameter tensor_parallel=3 does not divide the 8 cards"),
        ({"seq_len": 100}, "seq_len applies only without a dataset"),
        ({"hardware": "Ascend 910 x -1"}, "hardware 'Ascend 910 x -1': the card count must be at least 1, got -1"),
        ({"hardware": "Ascend 910 x 0"}, "the card count must be at least 1, got 0"),
        ({"max_seq_len": 100}, "max_seq_len must be a positive multiple of 128, got 100"),
        ({"seed": -5}, "seed must be an integer >= 0, got -5"),
        ({"dataset": None, "seq_len": -8}, "seq_len must be an integer >= 1, got -8"),
        ({"steps": 0}, "steps must be an integer >= 1, got 0"),
    ],
)
def test_collection_settings_are_checked(kwargs, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        oam.collect_profile("llama-7b", **{"steps": 1, **kwargs})


def test_dataset_none_and_tensor_parallel() -> None:
    profile = oam.collect_profile("llama-7b", "none", steps=1, seq_len=1024, tensor_parallel=2)
    assert profile.tokens_per_step == 1024 * 4  # data parallelism 4 of 8 cards
    # the default layout on 8 x 910A: tensor parallelism 4 in an HCCS group, data parallelism 2
    assert oam.collect_profile("llama-7b", None, steps=1, seq_len=1024).tokens_per_step == 1024 * 2


def test_baseline_file_records_how_it_was_collected(tmp_path) -> None:
    made = oam.ProfileBaseline.create("llama-7b", dataset=None, seq_len=1024, steps=2,
                                      params={"block_size": 64, "fusion": False})
    made.collect()
    made.save(tmp_path / "b.json")
    again = oam.ProfileBaseline.load(tmp_path / "b.json")
    assert (again.dataset, again.seq_len, again.steps, again.params) == (None, 1024, 2, {"block_size": 64, "fusion": False})
    again.collect()
    assert oam.compare_profiles(made, again.profile).status == "pass"
    with pytest.raises(ValueError, match=r"b\.json\.gz: baseline files are plain JSON"):
        made.save(tmp_path / "b.json.gz")


def test_focused_profile_passes_even_a_zero_limit() -> None:
    # Sums over summarised ops round differently; that noise must never regress a gate.
    full = oam.collect_profile("llama-7b", steps=2)
    report = oam.compare_profiles(full, full.focused("FlashAttention", 5), regression_threshold="0%")
    assert report.status == "pass", report.to_text()


def test_multi_run_baseline_is_matched_by_fingerprint() -> None:
    from pytest_oam.baseline import BaselineFile

    long, short = oam.collect_profile("llama-7b", None, steps=1, seq_len=2048), oam.collect_profile(
        "llama-7b", None, steps=1, seq_len=1024)
    two = BaselineFile(nodeid="t", runs=[summarize(long), summarize(short)])
    assert oam.compare_profiles(two, short).comparison.baseline_step_s == summarize(short).step_time_s
    other = oam.collect_profile("llama-7b", None, steps=1, seq_len=512)
    with pytest.raises(ValueError, match="holds 2 profiled runs and none of them has the current workload"):
        oam.compare_profiles(two, other)


def test_per_op_thresholds() -> None:
    base = oam.collect_profile("llama-7b", steps=1)
    slow = oam.collect_profile("llama-7b", steps=1, block_size=64)
    loose = oam.compare_profiles(base, slow, thresholds={"FlashAttention*": "50%"})
    assert loose.status == "pass" and loose.limits["FlashAttention*"] == 0.5


def test_a_record_file_is_named_as_one_and_a_plugin_baseline_is_not_collected_again(pytester) -> None:
    # Newcomer findings: oam compare called a record "a compressed baseline file", and
    # ProfileBaseline.load(<a plugin baseline>).collect() said "unknown model 'test_x.py::test_y'"
    from pytest_oam.api import ProfileBaseline, ProfileFileError, load_any

    pytester.makepyfile(test_rec="""
def mm(npu):
    npu.matmul(npu.tensor((256, 256)), npu.tensor((256, 256)))

def test_mm(oam_profile):
    oam_profile.run(mm)
""")
    pytester.runpytest("--oam-save-baseline", "--oam-record=all").assert_outcomes(passed=1)
    (record,) = (pytester.path / ".oam" / "records").iterdir()
    with pytest.raises(ProfileFileError, match=r"is a record of test_rec.py::test_mm \(pytest --oam-record\); replay "
                                               r"it with: oam replay "):
        load_any(record)
    (baseline,) = (pytester.path / "baselines").iterdir()
    with pytest.raises(ValueError, match="this baseline was saved by the pytest plugin for test_rec.py::test_mm: run "
                                         "that test to collect it again"):
        ProfileBaseline.load(baseline).collect()


def test_every_name_of_the_package_api_is_there(tmp_path) -> None:
    # Newcomer: docs/api.md names oam.save_profile and oam.load_profile; the package had neither
    for name in oam.__all__:
        assert callable(getattr(oam, name)), name
    import simulator

    profile = simulator.run(lambda npu: npu.matmul(npu.tensor((64, 64)), npu.tensor((64, 64))))
    oam.save_profile(profile, tmp_path / "p.json")
    assert oam.load_profile(tmp_path / "p.json").op_types == ["MatMul"]
