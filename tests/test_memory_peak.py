"""What held device memory at the allocated peak: the profile's ``memory_peak``, the baseline's
``memory_peak_live`` and the diagnosis of a regressed peak that compares them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from pytest_oam.compare import peak_holders, portable_site, summarize
from pytest_oam.diagnosis import _peak_holders
from simulator.profile import LiveMemory
from simulator.units import MiB


def _workload(npu):
    x = npu.tensor((1024, 1024))  # line 21: 2 MiB (fp16)
    q = npu.tensor((1, 32, 4096, 128))  # line 22: 32 MiB
    o = npu.flash_attention(q, q, q, causal=True)  # line 23
    npu.flash_attention_grad(q, q, q, o, causal=True)  # line 24
    return x


def test_memory_peak_names_what_held_the_memory() -> None:
    peak = simulator.run(_workload, hardware="ascend910b", memory=True).memory_peak
    site = f"{__file__}:"
    # The backward's workspace (simulator.costs.op_workspace_bytes) reaches the peak, right
    # after its three gradients. Block sizes are torch_npu's round_size (simulator.allocator):
    # the request + 32 B rounded up to 512 B, so 32 MiB (1*32*4096*128 fp16) -> 32 MiB + 512 B
    # = 33,554,944 B and 2 MiB -> 2 MiB + 512 B; the large pool hands out such blocks unsplit.
    assert peak.step == 0
    assert (peak.reached_by.op_type, peak.reached_by.kind, peak.reached_by.source) == (
        "FlashAttentionGrad", "workspace", site + "24")
    live = {(g.op_type, g.kind, g.source): (g.size_bytes, g.count) for g in peak.live}
    assert live == {
        ("FlashAttentionGrad", "workspace", site + "24"): (peak.reached_by.size_bytes, 1),
        ("FlashAttentionGrad", "output", site + "24"): (3 * 33_554_944, 3),
        (None, "tensor", site + "22"): (33_554_944, 1),
        ("FlashAttention", "output", site + "23"): (33_554_944, 1),
        (None, "tensor", site + "21"): (2 * MiB + 512, 1),
    }
    assert [g.size_bytes for g in peak.live] == sorted((g.size_bytes for g in peak.live), reverse=True)
    assert sum(g.size_bytes for g in peak.live) == peak.allocated_bytes


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.booleans()), min_size=1, max_size=30), st.integers(1, 3))
def test_memory_peak_adds_up_to_the_allocated_peak(plan, steps) -> None:
    """Whatever is allocated and freed, the groups at the peak add up to the run's allocated
    peak (the largest of the steps' ``allocated_peak_bytes``)."""

    def workload(npu):
        kept = []
        for mib, keep in plan:
            t = npu.tensor((mib * MiB,), "int8")
            if keep:
                kept.append(t)
            else:
                npu.free(t)
        npu.add(kept[0], kept[0]) if kept else None

    profile = simulator.run(workload, steps=steps, memory=True)
    peak = profile.memory_peak
    assert peak.allocated_bytes == max(m.allocated_peak_bytes for m in profile.memory)
    assert sum(g.size_bytes for g in peak.live) == peak.allocated_bytes
    # the allocation that reached the peak is live in its own group
    (group,) = [g for g in peak.live if (g.op_type, g.kind, g.source) == (
        peak.reached_by.op_type, peak.reached_by.kind, peak.reached_by.source)]
    assert group.size_bytes >= peak.reached_by.size_bytes


def test_no_memory_peak_without_memory_tracking() -> None:
    assert simulator.run(_workload).memory_peak is None


def test_baseline_keeps_peak_holders_relative_to_the_root() -> None:
    root = str(Path(__file__).parent.parent)
    run = summarize(simulator.run(_workload, hardware="ascend910b", memory=True), root)
    assert [g.source for g in run.memory_peak_live][:1] == ["tests/test_memory_peak.py:24"]
    assert json.loads(run.model_dump_json())["memory_peak_live"][0]["kind"] == "workspace"
    # Without a root (the Python API): files without folders
    assert summarize(simulator.run(_workload, hardware="ascend910b", memory=True)).memory_peak_live[0].source == (
        "test_memory_peak.py:24")


def test_portable_site() -> None:
    assert portable_site("/a/b/test_x.py:12 (in /venv/site-packages/simulator/models/llama.py:379)") == (
        "test_x.py:12 (in llama.py:379)")
    assert portable_site("/a/b/test_x.py:12 (in /venv/llama.py:379)", "/a") == "b/test_x.py:12 (in llama.py:379)"
    assert portable_site("C:\\work\\m.py:3") == "m.py:3"
    assert (portable_site("<stdin>:1"), portable_site(None)) == ("<stdin>:1", None)


def test_peak_holders_add_up_groups_whose_portable_sites_meet() -> None:
    # Review finding: encoder/layers.py:2 and decoder/layers.py:2 outside the root both become
    # layers.py:2; the baseline kept one of them and compared both current groups with it.
    live = [_group("/x/encoder/layers.py:2", 30), _group("/x/decoder/layers.py:2", 10), _group("/r/t.py:5", 8)]
    assert [(g.source, g.size_bytes // MiB, g.count) for g in peak_holders(live, "/r")] == [
        ("layers.py:2", 40, 2), ("t.py:5", 8, 1)]


def _group(source, mib, count=1, op_type="MatMul", kind="output"):
    return LiveMemory(op_type=op_type, kind=kind, source=source, size_bytes=mib * MiB, count=count)


def _holders(current, baseline):
    return _peak_holders(peak_holders(current), None if baseline is None else peak_holders(baseline), "the peak")


def test_peak_holders_match_a_moved_unchanged_line_and_tell_changed_ones_as_new_and_gone() -> None:
    baseline = [_group("model.py:10", 32), _group("model.py:40", 8, kind="tensor", op_type=None)]
    # Three lines added above: line 40 moved to 43 unchanged (same size and count: matched);
    # line 10 moved to 13 and grew (a new group and a gone one: the line alone cannot tell)
    text, sites, kind = _holders([_group("/ck/model.py:13", 128, 4), _group("/ck/model.py:43", 8, op_type=None,
                                                                             kind="tensor")], baseline)
    assert text == ("; at the peak held more: MatMul outputs at model.py:13 +128.00 MiB (new: 4 allocations, none at "
                    "the baseline's peak); held less: MatMul output at model.py:10 -32.00 MiB (no longer live at the "
                    "peak)")
    assert (sites, kind) == ([("model.py:13", 128.0 * MiB)], "output")
    # Newcomer finding: a new tensor on a new line was told as the old line 5 "grown" (16 -> 128
    # MiB), when line 5's tensor was only no longer live at the new peak
    text, _, _ = _holders([_group("t.py:10", 128, op_type=None, kind="tensor")],
                          [_group("t.py:5", 16, op_type=None, kind="tensor")])
    assert "tensor made at t.py:10 +128.00 MiB (new: 1 allocation" in text
    assert "held less: tensor made at t.py:5 -16.00 MiB (no longer live at the peak)" in text
    # The same site grew: before and after; more than three growths are summed
    text, _, _ = _holders([_group("t.py:1", 64, 2), _group("t.py:2", 4), _group("t.py:3", 3), _group("t.py:4", 2),
                           _group("t.py:5", 1)], [_group("t.py:1", 32)])
    assert text.startswith("; at the peak held more: MatMul outputs at t.py:1 +32.00 MiB (32.00 MiB -> 64.00 MiB, "
                           "1 -> 2 allocations); MatMul output at t.py:2 +4.00 MiB")
    assert text.endswith("; 2 more +3.00 MiB")
    # Nothing grew
    text, sites, _ = _holders([_group("t.py:1", 16)], [_group("t.py:1", 32)])
    assert text == ("; at the peak no call site held more than at the baseline's peak; held less: MatMul output at "
                    "t.py:1 -16.00 MiB (32.00 MiB -> 16.00 MiB, 1 -> 1 allocation)") and sites == []
    # A baseline saved before the holders were kept: the largest holders, and how to compare
    text, sites, _ = _holders([_group("t.py:1", 64), _group("t.py:2", 8)], None)
    assert text.startswith("; at the peak the most was held by MatMul output at t.py:1: 64.00 MiB; MatMul output at "
                           "t.py:2: 8.00 MiB (the baseline has no record of what held its peak: save it again")


def test_peak_holders_do_not_tell_groups_below_a_cut_baseline_as_new(monkeypatch) -> None:
    # Review finding: with the baseline cut to its largest groups, unchanged small groups that
    # did not make the cut were told as new growth, crowding out the real one.
    import pytest_oam.compare as compare_module
    import pytest_oam.diagnosis as diagnosis_module

    monkeypatch.setattr(compare_module, "PEAK_LIVE_GROUPS", 3)
    monkeypatch.setattr(diagnosis_module, "PEAK_LIVE_GROUPS", 3)
    baseline = [_group(f"t.py:{i}", 10 + i) for i in range(6)]  # keeps 15, 14, 13 MiB
    current = [*baseline[:5], _group("t.py:5", 40), _group("t.py:9", 20)]
    text, _, _ = _holders(current, baseline)
    assert text == ("; at the peak held more: MatMul output at t.py:5 +25.00 MiB (15.00 MiB -> 40.00 MiB, 1 -> 1 "
                    "allocation); MatMul output at t.py:9 +20.00 MiB (new: 1 allocation, none among its 3 largest at "
                    "the baseline's peak)")


@pytest.mark.parametrize("reserved_only", [False, True])
def test_a_regressed_reserved_peak(pytester, monkeypatch, reserved_only) -> None:
    # Review findings: with only the reserved peak regressed, the text blamed the order tensors
    # were live in; the reserved row's pointer to the allocated row is given only when that row
    # names what held the memory.
    pytester.makepyfile(test_frag="""
import os
from simulator.units import MiB

def work(npu):
    scratch = npu.tensor((int(os.environ.get("SCRATCH", "30")) * MiB,), "int8")
    npu.free(scratch)
    out = npu.tensor((int(os.environ.get("OUT", "30")) * MiB,), "int8")
    npu.add(out, out)

def test_frag(oam_profile):
    oam_profile.run(work, memory=True)
""")
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=1)
    if reserved_only:  # a 20 MiB scratch segment that the 30 MiB output does not fit: a new segment
        monkeypatch.setenv("SCRATCH", "20")
        lines = [("*peak reserved memory grew *, the allocated peak only +0.0%: the rest is memory the caching "
                  "allocator reserved that no tensor held at the peak: a request that no cached free block fits*")]
    else:
        monkeypatch.setenv("OUT", "40")
        lines = ["*peak reserved memory grew *; what held more at the allocated peak: see memory.allocated_peak:*",
                 "*where: test_frag.py:7 (40.00 MiB at the peak)",
                 "*where: test_frag.py:8 (40.00 MiB at the peak)",
                 "*held more: tensor made at test_frag.py:7 +10.00 MiB (30.00 MiB -> 40.00 MiB, 1 -> 1 allocation)*"]
    result = pytester.runpytest("--oam-baseline", "-o", "oam_thresholds=memory.*=1%")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(lines)
