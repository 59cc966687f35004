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
from pytest_oam.diagnosis import PeakMemory, _peak_holders
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


def _holders(current, baseline, root=None):
    """The diagnosis of a current peak's groups (as the profile holds them, uncut) against a
    baseline's (as a baseline keeps them: :func:`peak_holders`)."""
    kept = None if baseline is None else peak_holders(baseline)
    return _peak_holders(PeakMemory(
        current_live=sorted(current, key=lambda g: -g.size_bytes), baseline_live=kept,
        current_peak_bytes=sum(g.size_bytes for g in current),
        baseline_peak_bytes=None if baseline is None else sum(g.size_bytes for g in baseline), root=root))


def test_peak_holders_match_a_moved_unchanged_line_and_tell_changed_ones_as_new_and_gone() -> None:
    baseline = [_group("model.py:10", 32), _group("model.py:40", 8, kind="tensor", op_type=None)]
    # Three lines added above: line 40 moved to 43 unchanged (same size and count: matched);
    # line 10 moved to 13 and grew (a new group and a gone one: the line alone cannot tell)
    text, sites, kind = _holders([_group("/ck/model.py:13", 128, 4), _group("/ck/model.py:43", 8, op_type=None,
                                                                             kind="tensor")], baseline)
    assert text == ("; at the allocated peak held more: MatMul outputs at model.py:13 +128.00 MiB (new: 4 allocations, none at "
                    "the baseline's peak); held less: MatMul output at model.py:10 -32.00 MiB (no longer live at the "
                    "peak)")
    assert (sites, kind) == ([("/ck/model.py:13", 128.0 * MiB)], "output")  # where: lines get the run's own path
    # Newcomer finding: a new tensor on a new line was told as the old line 5 "grown" (16 -> 128
    # MiB), when line 5's tensor was only no longer live at the new peak
    text, _, _ = _holders([_group("t.py:10", 128, op_type=None, kind="tensor")],
                          [_group("t.py:5", 16, op_type=None, kind="tensor")])
    assert "tensor made at t.py:10 +128.00 MiB (new: 1 allocation" in text
    assert "held less: tensor made at t.py:5 -16.00 MiB (no longer live at the peak)" in text
    # The same site grew: before and after; more than three growths are summed
    text, _, _ = _holders([_group("t.py:1", 64, 2), _group("t.py:2", 4), _group("t.py:3", 3), _group("t.py:4", 2),
                           _group("t.py:5", 1)], [_group("t.py:1", 32)])
    assert text.startswith("; at the allocated peak held more: MatMul outputs at t.py:1 +32.00 MiB (32.00 MiB -> 64.00 MiB, "
                           "1 -> 2 allocations); MatMul output at t.py:2 +4.00 MiB")
    assert text.endswith("; 2 more +3.00 MiB")
    # Nothing grew
    text, sites, _ = _holders([_group("t.py:1", 16)], [_group("t.py:1", 32)])
    assert text == ("; at the allocated peak no call site held more than at the baseline's peak; held less: MatMul output at "
                    "t.py:1 -16.00 MiB (32.00 MiB -> 16.00 MiB, 1 -> 1 allocation)") and sites == []
    # A baseline saved before the holders were kept: the largest holders, and how to compare
    text, sites, _ = _holders([_group("t.py:1", 64), _group("t.py:2", 8)], None)
    assert text.startswith("; at the allocated peak the most was held by MatMul output at t.py:1: 64.00 MiB; MatMul output at "
                           "t.py:2: 8.00 MiB (the baseline has no record of what held its peak: save it again")


def test_peak_holders_do_not_tell_groups_below_a_cut_baseline_as_new(monkeypatch) -> None:
    # Review finding: with the baseline cut to its largest groups, unchanged small groups that
    # did not make the cut were told as new growth, crowding out the real one.
    import pytest_oam.compare as compare_module

    monkeypatch.setattr(compare_module, "PEAK_LIVE_GROUPS", 3)
    baseline = [_group(f"t.py:{i}", 10 + i) for i in range(6)]  # keeps 15, 14, 13 MiB
    current = [*baseline[:5], _group("t.py:5", 40), _group("t.py:9", 20)]
    text, _, _ = _holders(current, baseline)
    assert text == ("; at the allocated peak held more: MatMul output at t.py:5 +25.00 MiB (15.00 MiB -> 40.00 MiB, 1 -> 1 "
                    "allocation); MatMul output at t.py:9 +20.00 MiB (new: 1 allocation, none among the groups it kept "
                    "at the baseline's peak)")
    # t.py:0-2 (10-12 MiB) are in the current run, not in the cut baseline, and no larger than
    # its smallest kept group (13 MiB): not told as new


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
                 "*where: test_frag.py:8 (40.00 MiB at the peak)",
                 "*where: test_frag.py:7 (40.00 MiB at the peak)",
                 "*held more: Add output at test_frag.py:8 +10.00 MiB (30.00 MiB -> 40.00 MiB, 1 -> 1 allocation); tensor made at test_frag.py:7 +10.00 MiB (30.00 MiB -> 40.00 MiB, 1 -> 1 allocation)*"]
    result = pytester.runpytest("--oam-baseline", "-o", "oam_thresholds=memory.*=1%")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(lines)


def test_peak_holders_read_older_baselines_and_ignore_rounding() -> None:
    # Review finding: a baseline of the first version kept file names without folders and its
    # 20 largest groups; the cut was not recognised (only a list of the new cap was) and every
    # unchanged group outside it read as new growth. A cut is now told by the sizes adding up
    # to less than the peak, and sites match by file name and line.
    baseline = [_group(f"/old/t.py:{i}", 30 - i, op_type=None, kind="tensor") for i in range(25)]
    old_kept = [g.model_copy(update={"source": f"t.py:{i}"}) for i, g in enumerate(baseline[:20])]
    current = [*baseline[:24], _group("/new/tests/sub/t.py:24", 46, op_type=None, kind="tensor")]
    text, sites, _ = _peak_holders(PeakMemory(
        current_live=sorted(current, key=lambda g: -g.size_bytes), baseline_live=old_kept,
        current_peak_bytes=sum(g.size_bytes for g in current), baseline_peak_bytes=sum(g.size_bytes for g in baseline)))
    assert text == ("; at the allocated peak held more: tensor made at t.py:24 +46.00 MiB (new: 1 allocation, none "
                    "among the groups it kept at the baseline's peak)")
    assert sites == [("/new/tests/sub/t.py:24", 46.0 * MiB)]
    # 200 groups that add up to the peak are a whole list, not a cut one: growth among them is told
    many = [_group(f"t.py:{i}", 1) for i in range(200)]
    text, _, _ = _holders([*many[:199], _group("t.py:199", 3)], many)
    assert "held more: MatMul output at t.py:199 +2.00 MiB" in text
    # A difference of the allocator's 512 B rounding alone is not a change
    rounded = _group("t.py:1", 12).model_copy(update={"size_bytes": 12 * MiB + 512})
    text, _, _ = _holders([rounded, _group("t.py:2", 4)], [_group("t.py:1", 12)])
    assert text == ("; at the allocated peak held more: MatMul output at t.py:2 +4.00 MiB (new: 1 allocation, none at "
                    "the baseline's peak)")


def test_peak_holders_add_up_what_meets_under_one_key() -> None:
    # Two folders' layers.py:2 meet under one key on both sides: compared as one, no growth
    current = [_group("/p/enc/layers.py:2", 30), _group("/p/dec/layers.py:2", 10), _group("/p/t.py:5", 8)]
    baseline = [_group("enc/layers.py:2", 30), _group("dec/layers.py:2", 10), _group("t.py:5", 4)]
    text, _, _ = _holders(current, baseline)
    assert text == ("; at the allocated peak held more: MatMul output at t.py:5 +4.00 MiB (4.00 MiB -> 8.00 MiB, 1 -> 1 "
                    "allocation)")


def test_a_grown_workspace_gets_its_own_advice() -> None:
    from pytest_oam.compare import Verdict
    from pytest_oam.diagnosis import _memory_finding

    verdict = Verdict("memory.allocated_peak", 100.0 * MiB, 124.0 * MiB, 0.24, 0.05, "default", "regressed", unit="bytes")
    finding = _memory_finding(verdict, memory=PeakMemory(
        current_live=[_group("/p/t.py:9", 100, op_type="FlashAttention", kind="workspace")],
        baseline_live=[_group("t.py:9", 76, op_type="FlashAttention", kind="workspace")]))
    assert "held more: FlashAttention workspace at t.py:9 +24.00 MiB (76.00 MiB -> 100.00 MiB" in finding.advice[0]
    assert ": an op's workspace (the scratch memory CANN's kernel asks for) is sized by its shapes" in finding.advice[0]


def test_peak_sites_are_kept_relative_to_the_rootdir(pytester, monkeypatch) -> None:
    # Review findings: the where: lines showed the stored, rootdir-relative sites (or bare file
    # names) instead of paths from where pytest runs; and with the session's rootdir unused, a
    # test in a subfolder kept its bare file name.
    pytester.makeini("[pytest]\n")
    sub = pytester.mkpydir("tests").joinpath("sub")
    sub.mkdir()
    sub.joinpath("test_deep.py").write_text("""
import os

def work(npu):
    keep = [npu.tensor((1024, 1024)) for _ in range(4)]
    if os.environ.get("LEAK"):
        keep.append(npu.tensor((2048, 1024)))
    npu.add(keep[0], keep[0])

def test_deep(oam_profile):
    oam_profile.run(work, memory=True)
""")
    pytester.runpytest("--oam-save-baseline").assert_outcomes(passed=1)
    (baseline,) = (pytester.path / "baselines").iterdir()
    assert json.loads(baseline.read_text())["runs"][0]["memory_peak_live"][0]["source"] == "tests/sub/test_deep.py:5"
    monkeypatch.setenv("LEAK", "1")
    monkeypatch.chdir(sub)
    result = pytester.runpytest("--oam-baseline")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*where: test_deep.py:7 (4.00 MiB at the peak)",
                                 "*held more: tensor made at tests/sub/test_deep.py:7 +4.00 MiB (new: 1 allocation*"])
