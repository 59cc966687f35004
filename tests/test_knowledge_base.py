"""The tuned-results knowledge base: records written from tuning results and read back, never
replaced unless asked, corrupt files named, lookups that ignore stale records, and the
``assert_near_tuned`` gate end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator
from pytest_oam import (
    KnowledgeBase,
    KnowledgeBaseError,
    OptimizationTarget,
    ParameterSpace,
    auto_tune,
)
from pytest_oam.knowledge_base import TunedGateFailure, TunedRecord, assert_near_tuned
from pytest_oam.tune import TuneError

ROOT = Path(__file__).resolve().parents[1]
SEQ = 4096
SHAPES = [[1, 32, SEQ, 128]] * 3  # q, k, v of the FlashAttention call


def attention(npu, block_size=128, pipeline_stages=2, fusion=True):
    npu.set_tokens_per_step(SEQ)
    q = npu.tensor((1, 32, SEQ, 128))
    npu.flash_attention(q, q, q, block_size=block_size, pipeline_stages=pipeline_stages, fusion=fusion, causal=True)


def two_shapes(npu, block_size=128):
    for seq in (SEQ, 2 * SEQ):
        q = npu.tensor((1, 32, seq, 128))
        npu.flash_attention(q, q, q, block_size=block_size)


TARGET = OptimizationTarget(operator="FlashAttention", metric="latency_ms")


@pytest.fixture(scope="module")
def result():
    space = ParameterSpace().add_discrete("block_size", [64, 128, 256]).add_int("pipeline_stages", 1, 3)
    space.add_boolean("fusion")
    return auto_tune(target=TARGET, param_space=space, workload=attention, max_iterations=50)


def latency_s(**config) -> float:
    return simulator.run(attention, **config).op_time_s("FlashAttention")


def test_a_saved_result_is_found_by_lookup_with_before_and_after(result, tmp_path) -> None:
    path = tmp_path / "tuned" / "kb.json"
    record = result.save_to(path)
    kb = KnowledgeBase.load(path)
    assert kb.records == [record]
    config = kb.lookup("FlashAttention", shapes=SHAPES, dtype="fp16", hardware="ascend910")
    assert config == result.best_params
    # the record holds the simulator's own numbers: default and tuned, one call each
    assert record.tuned.latency_s == latency_s(**config) < record.default.latency_s == latency_s()
    assert record.tuned.metrics["latency_ms"] == pytest.approx(record.tuned.latency_s * 1e3)
    assert record.search == "exhaustive" and record.unique_evaluations == 18
    assert record.simulator_version == simulator.SIMULATOR_VERSION and record.hardware == "ascend910"
    config["block_size"] = 16  # a copy: the knowledge base is not changed through it
    assert kb.lookup("FlashAttention", shapes=SHAPES)["block_size"] == result.best_params["block_size"]
    for other in ({"hardware": "ascend910b"}, {"dtype": "bf16"}, {"shapes": [[1, 32, 2 * SEQ, 128]] * 3},
                  {"simulator_version": "0.0.1"}):
        assert kb.lookup("FlashAttention", **{"shapes": SHAPES, **other}) is None
    assert kb.lookup("MatMul", shapes=SHAPES) is None
    saved = json.loads(path.read_text())
    assert saved["schema_version"] == 1 and path.read_text() == kb.dump()


def test_a_record_is_replaced_only_when_asked(result, tmp_path) -> None:
    path = tmp_path / "kb.json"
    result.save_to(path)
    before = path.read_bytes()
    with pytest.raises(KnowledgeBaseError, match=f"{path}: already has a record for FlashAttention "
                                                  rf"\[1, 32, {SEQ}, 128\] x3 fp16 causal=True on ascend910 .*replace=True"):
        result.save_to(path)
    assert path.read_bytes() == before
    other = KnowledgeBase.load(path)
    other.add(other.records[0].model_copy(update={"hardware": "ascend910b"}))  # another key: added
    other.save()
    replaced = result.save_to(path, replace=True, workload="mod:attention")
    kb = KnowledgeBase.load(path)
    assert len(kb.records) == 2 and replaced in kb.records and replaced.workload == "mod:attention"


def test_stale_records_are_not_used_but_named(result, tmp_path) -> None:
    path = tmp_path / "kb.json"
    record = result.save_to(path)
    kb = KnowledgeBase(path, [record.model_copy(update={"simulator_version": "0.0.1"}),
                              record.model_copy(update={"hardware": "ascend910b"})])
    assert kb.lookup("FlashAttention", shapes=SHAPES) is None
    assert {(r.hardware, r.simulator_version) for r in kb.stale("FlashAttention", shapes=SHAPES)} == {
        ("ascend910", "0.0.1"), ("ascend910b", simulator.SIMULATOR_VERSION)}


def _valid_file(result, tmp_path) -> dict:
    result.save_to(tmp_path / "valid.json")
    return json.loads((tmp_path / "valid.json").read_text())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: "", "is empty"),
        (lambda d: '{"schema_version": 1, "records": [', "is truncated: JSON ends early"),
        (lambda d: '{"schema_version": 1,, "records": []}', "is not valid JSON: Expecting property name"),
        (lambda d: [1, 2], "is not a JSON object"),
        (lambda d: {**d, "schema_version": 2}, "has schema_version 2; this pytest-oam reads knowledge base version 1"),
        (lambda d: {"records": d["records"]}, "has schema_version None"),
        (lambda d: {**d, "colour": "red"}, "colour: Extra inputs are not permitted"),
        (lambda d: {**d, "records": [{**d["records"][0], "tuned": {"latency_s": -1.0, "metrics": {}}}]},
         "records.0.tuned.latency_s: Input should be greater than 0"),
        (lambda d: {**d, "records": d["records"] * 2}, "has two records for FlashAttention"),
    ],
)
def test_a_corrupt_or_foreign_file_is_named(result, tmp_path, mutate, message) -> None:
    data = mutate(_valid_file(result, tmp_path))
    path = tmp_path / "kb.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    before = path.read_bytes()
    with pytest.raises(KnowledgeBaseError, match=message) as info:
        KnowledgeBase.load(path)
    assert str(info.value).startswith(f"{path}: ")
    with pytest.raises(KnowledgeBaseError, match=message):
        result.save_to(path, replace=True)  # never written over
    assert path.read_bytes() == before
    with pytest.raises(KnowledgeBaseError):
        KnowledgeBase.load(tmp_path / "missing.json", missing_ok=False)


def test_what_cannot_be_recorded_says_why(result, tmp_path) -> None:
    space = ParameterSpace().add_discrete("block_size", [64, 128])
    both = auto_tune(target=TARGET, param_space=space, workload=two_shapes)
    with pytest.raises(TuneError, match=r"FlashAttention runs with 2 different shapes .*pass shapes="):
        both.save_to(tmp_path / "kb.json")
    record = both.save_to(tmp_path / "kb.json", shapes=[[1, 32, 2 * SEQ, 128]] * 3)
    assert record.shapes == [[1, 32, 2 * SEQ, 128]] * 3
    whole_step = auto_tune(target=OptimizationTarget(metric="latency_ms"), param_space=space, workload=two_shapes)
    with pytest.raises(TuneError, match="give the target an operator"):
        whole_step.save_to(tmp_path / "kb.json")
    impossible = OptimizationTarget(operator="FlashAttention", metric="latency_ms", constraint="latency_ms < 1e-6")
    none = auto_tune(target=impossible, param_space=space, workload=attention)
    with pytest.raises(TuneError, match="no feasible configuration of FlashAttention"):
        none.save_to(tmp_path / "kb.json")
    with pytest.raises(TuneError, match="ran no FlashAttention with shapes"):
        result.save_to(tmp_path / "kb.json", shapes=[[1, 1, 16, 16]])


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data())
def test_the_file_text_is_canonical_and_round_trips(result, tmp_path, data) -> None:
    base = result.save_to(tmp_path / "base.json", replace=True)
    records = data.draw(st.lists(st.builds(
        lambda hw, ver, seq, block: base.model_copy(update={
            "hardware": hw, "simulator_version": ver, "shapes": [[1, 32, seq, 128]] * 3,
            "config": {**base.config, "block_size": block}}),
        st.sampled_from(["ascend910", "ascend910b"]), st.sampled_from(["0.1.0", "0.2.1"]),
        st.sampled_from([512, 1024, 4096]), st.sampled_from([64, 128])),
        max_size=6, unique_by=lambda r: r.key))
    order = data.draw(st.permutations(records))
    one, two = KnowledgeBase(tmp_path / "a.json", records), KnowledgeBase(tmp_path / "b.json", order)
    assert one.dump() == two.dump()  # the order records were added in does not show in the file
    one.save()
    assert KnowledgeBase.load(one.path).records == one.records


# -- oam tune --save --------------------------------------------------------------------------------

WORKLOAD_MODULE = f'''
def attention(npu, block_size=128, pipeline_stages=2, fusion=True):
    q = npu.tensor((1, 32, {SEQ}, 128))
    npu.flash_attention(q, q, q, block_size=block_size, pipeline_stages=pipeline_stages, fusion=fusion, causal=True)
'''

JOB = '''
workload = "kb_job:attention"
operator = "FlashAttention"
metric = "latency_ms"

[space]
block_size = [64, 128, 256]
pipeline_stages = {int = [1, 3]}
'''


def test_oam_tune_save_writes_a_record_and_keeps_it(tmp_path, capsys) -> None:
    from pytest_oam.cli import main

    (tmp_path / "kb_job.py").write_text(WORKLOAD_MODULE)
    (tmp_path / "job.toml").write_text(JOB)
    kb_path = tmp_path / "tuned" / "knowledge_base.json"
    assert main(["tune", str(tmp_path / "job.toml"), "--save", str(kb_path)]) == 0
    # the job tunes block_size and pipeline_stages: causal and fusion are the call's fixed attributes
    assert (f"recorded in {kb_path}: FlashAttention [1, 32, {SEQ}, 128] x3 fp16 causal=True fusion=True on ascend910"
            in capsys.readouterr().out)
    (record,) = KnowledgeBase.load(kb_path).records
    assert record.workload == "kb_job:attention" and set(record.config) == {"block_size", "pipeline_stages"}
    before = kb_path.read_bytes()
    assert main(["tune", str(tmp_path / "job.toml"), "--save", str(kb_path)]) == 2
    captured = capsys.readouterr()
    assert "9 configurations evaluated" in captured.out  # the results are shown all the same
    assert f"{kb_path}: already has a record for FlashAttention" in captured.err and "--replace" in captured.err
    assert kb_path.read_bytes() == before
    assert main(["tune", str(tmp_path / "job.toml"), "--save", str(kb_path), "--replace", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["saved_to"] == str(kb_path)
    assert main(["tune", str(tmp_path / "job.toml"), "--replace"]) == 2
    assert "--replace: replaces a knowledge base record only together with --save" in capsys.readouterr().err


def test_oam_tune_save_refuses_a_corrupt_file_before_tuning(tmp_path, capsys) -> None:
    from pytest_oam.cli import main

    (tmp_path / "kb_job.py").write_text(WORKLOAD_MODULE)
    (tmp_path / "job.toml").write_text(JOB)
    kb_path = tmp_path / "kb.json"
    kb_path.write_text('{"schema_version": 7, "records": []}')
    assert main(["tune", str(tmp_path / "job.toml"), "--save", str(kb_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"{kb_path}: has schema_version 7" in captured.err
    assert kb_path.read_text() == '{"schema_version": 7, "records": []}'


# -- the gate ------------------------------------------------------------------------------------


def test_assert_near_tuned_outside_pytest(result, tmp_path) -> None:
    path = tmp_path / "kb.json"
    record = result.save_to(path)
    assert assert_near_tuned(simulator.run(attention, **record.config), "FlashAttention", path, limit="0%") == [record]
    slower_frac = record.default.latency_s / record.tuned.latency_s - 1
    assert slower_frac > 0.02  # the default is slower than the tuned optimum by more than the limit below
    with pytest.raises(TunedGateFailure) as info:
        assert_near_tuned(simulator.run(attention), "FlashAttention", path, limit="2%", config={"block_size": 128})
    message = str(info.value)
    assert (f"FlashAttention [1, 32, {SEQ}, 128] x3 fp16 on ascend910 (simulator {simulator.SIMULATOR_VERSION}) "
            f"takes {record.default.latency_s * 1e6:,.1f} us per call with {{'block_size': 128}}, "
            f"{slower_frac * 100:.1f}% slower than the tuned {record.tuned.latency_s * 1e6:,.1f} us (limit 2%); "
            f"use the tuned configuration {record.config}") in message
    assert_near_tuned(simulator.run(attention), "FlashAttention", path, limit=f"{slower_frac * 100 + 0.1}%")
    with pytest.raises(ValueError, match="the profile has no 'MatMul' call"):
        assert_near_tuned(simulator.run(attention), "MatMul", path)
    # an fnmatch glob, as in the tuned= marker (a gap noted at issue 9's last stop)
    assert assert_near_tuned(simulator.run(attention, **record.config), "Flash*", path, limit="0%") == [record]
    with pytest.raises(TunedGateFailure, match="slower than the tuned"):
        assert_near_tuned(simulator.run(attention), "FlashAttention*", path, limit="2%")
    with pytest.raises(ValueError, match="the profile has no 'Mat\\*' call"):
        assert_near_tuned(simulator.run(attention), "Mat*", path)
    with pytest.raises(ValueError, match="is not a percentage"):
        assert_near_tuned(simulator.run(attention), "FlashAttention", path, limit="fast")


def test_the_tuned_configuration_passes_with_memory_modelled(result, tmp_path) -> None:
    # Regression: a run with memory=True charged its first step's allocator stall to the
    # FlashAttention call, so the tuned configuration itself failed its own tuned check.
    path = tmp_path / "kb.json"
    record = result.save_to(path)
    profile = simulator.run(attention, memory=True, **record.config)
    assert profile.ops_of("FlashAttention")[0].alloc_stall_s > 0  # the first step waited for memory
    assert assert_near_tuned(profile, "FlashAttention", path, limit="0%") == [record]


TEST_MODULE = f'''
import pytest

def attention(npu, block_size=128, pipeline_stages=2, fusion=True):
    q = npu.tensor((1, 32, {SEQ}, 128))
    npu.flash_attention(q, q, q, block_size=block_size, pipeline_stages=pipeline_stages, fusion=fusion, causal=True)

TUNED = {{TUNED}}

def test_tuned_config(oam_profile):
    oam_profile.run(attention, **TUNED)
    oam_profile.assert_near_tuned("FlashAttention", limit="2%")

def test_default_config(oam_profile):
    oam_profile.run(attention)
    oam_profile.assert_near_tuned("FlashAttention", limit="2%", config={{"block_size": 128}})

def test_on_910b(oam_profile):
    oam_profile.run(attention, hardware="ascend910b", **TUNED)
    oam_profile.assert_near_tuned("FlashAttention")
'''


def test_assert_near_tuned_in_a_test_run(pytester: pytest.Pytester, result) -> None:
    record = result.save_to(pytester.path / "tuned" / "knowledge_base.json")
    pytester.makepyfile(test_attention=TEST_MODULE.replace("{TUNED}", repr(record.config)))
    outcome = pytester.runpytest("-p", "no:cacheprovider")
    outcome.assert_outcomes(passed=1, failed=2)
    shapes = f"FlashAttention [[]1, 32, {SEQ}, 128[]] x3 fp16"
    outcome.stdout.fnmatch_lines([
        "*TunedGateFailure: " + shapes + f" on ascend910 (simulator {simulator.SIMULATOR_VERSION}) takes "
        f"{record.default.latency_s * 1e6:,.1f} us per call with {{'block_size': 128}}, *% slower than the tuned "
        f"{record.tuned.latency_s * 1e6:,.1f} us (limit 2%); use the tuned configuration {record.config}",
    ])
    outcome.stdout.fnmatch_lines([f"*no tuned record for {shapes} on ascend910b (simulator *) with * in *knowledge_base.json*"])


def test_a_stale_record_is_named_in_the_failure(pytester: pytest.Pytester, result) -> None:
    record = result.save_to(pytester.path / "elsewhere.json")
    KnowledgeBase(pytester.path / "kb" / "tuned.json", [record.model_copy(update={"simulator_version": "0.0.1"})]).save()
    pytester.makeini("[pytest]\noam_knowledge_base = kb/tuned.json\n")
    pytester.makepyfile(test_attention=TEST_MODULE.replace("{TUNED}", repr(record.config)))
    outcome = pytester.runpytest("-p", "no:cacheprovider", "-k", "tuned_config")
    outcome.assert_outcomes(failed=1)
    outcome.stdout.fnmatch_lines([
        (f"*no tuned record for FlashAttention * on ascend910 (simulator {simulator.SIMULATOR_VERSION}) with * in "
         f"*kb/tuned.json; stale records, not used: ascend910, simulator 0.0.1: config {record.config}*"),
    ])


# -- the committed knowledge base ----------------------------------------------------------------


def test_the_committed_knowledge_base_reproduces() -> None:
    kb = KnowledgeBase.load(ROOT / "tuned" / "knowledge_base.json", missing_ok=False)
    assert kb.records
    for record in kb.records:
        assert isinstance(record, TunedRecord) and record.tuned.latency_s <= record.default.latency_s
        assert record.operator == "FlashAttention"  # the jobs in tuned/jobs
        if record.simulator_version != simulator.SIMULATOR_VERSION:
            continue  # stale: the gate says so; re-tune with the job in tuned/

        def one_call(npu, record=record):
            q, k, v = (npu.tensor(tuple(shape), record.dtype) for shape in record.shapes)
            npu.flash_attention(q, k, v, causal=True, **{k_: v_ for k_, v_ in record.config.items()})

        profile = simulator.run(one_call, hardware=record.hardware)
        assert profile.op_time_s(record.operator) == pytest.approx(record.tuned.latency_s, rel=1e-12)


def test_a_record_is_used_only_for_calls_with_its_attributes(tmp_path, result) -> None:
    # Regression (review): the key left out op attributes, so a causal record judged a
    # non-causal call of the same shapes (and the other way round).
    path = tmp_path / "kb.json"
    record = result.save_to(path)
    assert record.attrs == {"causal": True}

    def non_causal(npu):
        q = npu.tensor((1, 32, SEQ, 128))
        npu.flash_attention(q, q, q, causal=False, **record.config)

    with pytest.raises(TunedGateFailure) as info:
        assert_near_tuned(simulator.run(non_causal), "FlashAttention", path, limit="50%")
    message = str(info.value)
    assert "no tuned record for FlashAttention" in message and "'causal': False" in message
    assert "records for other attributes, not used: FlashAttention" in message and "causal=True" in message
    kb = KnowledgeBase.load(path)
    assert kb.lookup("FlashAttention", shapes=SHAPES, attrs={"causal": False}) is None
    assert kb.lookup("FlashAttention", shapes=SHAPES, attrs={"causal": True, "block_size": 64}) == record.config


def test_a_tuned_attribute_under_another_parameter_name_is_not_a_fixed_one(tmp_path) -> None:
    # Newcomer finding: the README's workload tunes enable_fusion, which the op records as
    # fusion; with fusion on in both the default and the best, the record kept fusion=True as a
    # fixed attribute, and the tuned check skipped (passed) a test run with fusion off, 76% slower.
    def readme_attention(npu, block_size=128, enable_fusion=True):
        npu.set_tokens_per_step(SEQ)
        q = npu.tensor((1, 32, SEQ, 128))
        npu.flash_attention(q, q, q, block_size=block_size, fusion=enable_fusion, causal=True)

    space = ParameterSpace().add_discrete("block_size", [128, 256]).add_boolean("enable_fusion")
    tuned = auto_tune(target=TARGET, param_space=space, workload=readme_attention)
    assert tuned.best_params["enable_fusion"] is True
    record = tuned.save_to(tmp_path / "kb.json")
    assert record.attrs == {"causal": True, "pipeline_stages": 2}  # fusion was tuned: not a fixed attribute
    with pytest.raises(TunedGateFailure, match="FlashAttention.*slower than"):
        assert_near_tuned(simulator.run(readme_attention, enable_fusion=False), "FlashAttention", tmp_path / "kb.json",
                          limit="5%")
