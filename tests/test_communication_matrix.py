"""torch_npu's communication_matrix.json: the link rates read from it, and the 910B4 spec's HCCS
link rate calibrated on the real LLM profile's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_oam.files.communication_matrix import read_link_rates
from pytest_oam.files.realfile import ImportError_
from simulator.hardware import load_hardware

REAL = Path(__file__).parent / "data" / "realdata"
LLM_MATRIX = REAL / "ascend-msinsight-llm-pp2dp2-level2-rank0" / "ASCEND_PROFILER_OUTPUT" / "communication_matrix.json"
CLUSTER_MATRIX = REAL / "ascend-msinsight-cluster16-analysis" / "cluster_communication_matrix.json"


def test_the_real_llm_profile_s_hccs_rate() -> None:
    # step 13's summed entries (batchsendrecv-total 16.8 MB, reduce-total 751.6 MB, allreduce-total
    # 622.3 MB, allgather-total 375.8 MB, each on link 0-1; the per-operator top1/middle/bottom
    # entries repeat them and are not read): 1,766.6 MB in 92.97 ms
    rates = read_link_rates(LLM_MATRIX)
    assert set(rates) == {"HCCS"}
    hccs = rates["HCCS"]
    assert hccs.transit_bytes == pytest.approx(1766.5544e6)
    assert hccs.transit_s == pytest.approx(92.97342e-3)
    assert hccs.bytes_per_s == pytest.approx(19.0e9, rel=1e-3)


def test_the_910b4_spec_takes_the_910b2_s_measured_link_not_its_validation_file_s() -> None:
    # the LLM profile's own rate (19.0 GB/s achieved, 23.8 GB/s per link by the same measure) is
    # not used: its step composition is checked against that file
    assert (load_hardware("ascend910b4").interconnect.hccs_link_bandwidth_bytes_per_s
            == load_hardware("ascend910b").interconnect.hccs_link_bandwidth_bytes_per_s)


def test_the_cluster_file_s_total_op_info_entries() -> None:
    # msprof-analyze's cluster file sums per group as "Total Op Info": one 20.97 MB RDMA send
    rates = read_link_rates(CLUSTER_MATRIX)
    assert rates["RDMA"].transit_bytes == pytest.approx(20.97152e6)
    assert rates["RDMA"].bytes_per_s == pytest.approx(24.28e9, rel=1e-3)


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "communication_matrix.json"
    path.write_text(json.dumps(data))
    return path


def test_single_operators_and_local_copies_are_not_counted(tmp_path) -> None:
    link = {"Transport Type": "HCCS", "Transit Size(MB)": 100.0, "Transit Time(ms)": 10.0, "Bandwidth(GB/s)": 10.0}
    local = {"Transport Type": "LOCAL", "Transit Size(MB)": 100.0, "Transit Time(ms)": 1.0, "Bandwidth(GB/s)": 100.0}
    data = {"step1": {"collective": {
        "allreduce-top1@1": {"0-1": link},  # one operator, repeated in the total
        "allreduce-total@1": {"0-1": link, "0-0": local},
        "allgather-total@1": {"1-1": link},  # a rank to itself
    }}}
    hccs = read_link_rates(_write(tmp_path, data))["HCCS"]
    assert (hccs.transit_bytes, hccs.links) == (100e6, 1)


@pytest.mark.parametrize("content, message", [
    ("{", r"communication_matrix.json: is not JSON"),
    ("[]", r"is a JSON list, not an object"),
    ('{"step1": {}}', r"no link entry"),
    (('{"s": {"c": {"x-total@1": {"0-1": {"Transport Type": "HCCS", "Transit Size(MB)": "lots", '
      '"Transit Time(ms)": 1}}}}}'), r"s/c/x-total@1/0-1: Transit Size\(MB\): 'lots' is not a number"),
])
def test_bad_files_are_named(tmp_path, content, message) -> None:
    path = tmp_path / "communication_matrix.json"
    path.write_text(content)
    with pytest.raises(ImportError_, match=message):
        read_link_rates(path)


def test_the_910b2_spec_s_hccs_link_is_calibrated_on_the_alexnet_profile() -> None:
    # the 2-card AlexNet job's gradient all-reduces ("Total Op Info" of communication.json):
    # 427.6 MB over HCCS in 27.32 ms, 15.7 GB/s achieved; SDMA (the copy engine) repeats it
    alexnet = REAL / "ascend-msinsight-alexnet2p-level1-rank0" / "communication.json"
    rates = read_link_rates(alexnet)
    assert set(rates) == {"HCCS"}
    assert rates["HCCS"].bytes_per_s == pytest.approx(15.65e9, rel=1e-3)
    ic = load_hardware("ascend910b").interconnect
    assert ic.hccs_link_bandwidth_bytes_per_s == pytest.approx(round(rates["HCCS"].bytes_per_s / ic.link_efficiency_frac, -8))


def test_communication_json_reads_the_summed_group_and_not_sdma(tmp_path) -> None:
    def info(mb: float, ms: float) -> dict:
        return {"Transit Size(MB)": mb, "Transit Time(ms)": ms, "Bandwidth(GB/s)": mb / ms if ms else 0}

    op = {"Communication Time Info": {}, "Communication Bandwidth Info": {"HCCS": info(10, 1), "SDMA": info(10, 1)}}
    total = {"Communication Time Info": {}, "Communication Bandwidth Info": {
        "HCCS": info(30, 2), "SDMA": info(30, 2), "RDMA": info(0, 0)}}
    data = {"step1": {"collective": {"hcom_allReduce_1": op, "hcom_allReduce_2": op, "Total Op Info": total}}}
    rates = read_link_rates(_write(tmp_path, data))
    assert set(rates) == {"HCCS"}
    assert (rates["HCCS"].transit_bytes, rates["HCCS"].transit_s) == (30e6, 2e-3)


def test_a_file_nested_too_deep_or_summing_to_no_rate_is_named(tmp_path) -> None:
    # Regression tests (review): a RecursionError traceback; an infinite rate written as a link rate
    deep = tmp_path / "communication_matrix.json"
    deep.write_text('{"a": ' * 5000 + "{}" + "}" * 5000)
    with pytest.raises(ImportError_, match="nested too deep"):
        read_link_rates(deep)
    huge = {"s": {"c": {"x-total@1": {"0-1": {"Transport Type": "HCCS", "Transit Size(MB)": 1e308,
                                              "Transit Time(ms)": 1}}}}}
    with pytest.raises(ImportError_, match="not a rate"):
        read_link_rates(_write(tmp_path, huge))
