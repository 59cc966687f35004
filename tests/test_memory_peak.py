"""What held device memory at the allocated peak: the profile's ``memory_peak``, the baseline's
``memory_peak_live`` and the diagnosis of a regressed peak that compares them."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from pytest_oam.compare import portable_site, summarize
from pytest_oam.diagnosis import _peak_holders
from simulator.profile import LiveMemory
from simulator.units import MiB


def _workload(npu):
    x = npu.tensor((1024, 1024))  # line 19: 2 MiB (fp16)
    q = npu.tensor((1, 32, 4096, 128))  # line 20: 32 MiB
    o = npu.flash_attention(q, q, q, causal=True)  # line 21
    npu.flash_attention_grad(q, q, q, o, causal=True)  # line 22
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
        "FlashAttentionGrad", "workspace", site + "22")
    live = {(g.op_type, g.kind, g.source): (g.size_bytes, g.count) for g in peak.live}
    assert live == {
        ("FlashAttentionGrad", "workspace", site + "22"): (peak.reached_by.size_bytes, 1),
        ("FlashAttentionGrad", "output", site + "22"): (3 * 33_554_944, 3),
        (None, "tensor", site + "20"): (33_554_944, 1),
        ("FlashAttention", "output", site + "21"): (33_554_944, 1),
        (None, "tensor", site + "19"): (2 * MiB + 512, 1),
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
    assert any(g.size_bytes >= peak.reached_by.size_bytes for g in peak.live)


def test_no_memory_peak_without_memory_tracking() -> None:
    assert simulator.run(_workload).memory_peak is None


def test_baseline_keeps_peak_holders_without_folders() -> None:
    run = summarize(simulator.run(_workload, hardware="ascend910b", memory=True))
    sources = [g.source for g in run.memory_peak_live]
    assert sources[0] == "test_memory_peak.py:22" and all("/" not in s for s in sources)
    assert json.loads(run.model_dump_json())["memory_peak_live"][0]["kind"] == "workspace"


def test_portable_site() -> None:
    assert portable_site("/a/b/test_x.py:12 (in /venv/site-packages/simulator/models/llama.py:379)") == (
        "test_x.py:12 (in llama.py:379)")
    assert portable_site("C:\\work\\m.py:3") == "m.py:3"
    assert (portable_site("<stdin>:1"), portable_site(None)) == ("<stdin>:1", None)


class _Peak:
    def __init__(self, live):
        self.memory_peak = simulator.profile.MemoryPeak(step=0, time_s=0.0, allocated_bytes=sum(g.size_bytes for g in live),
                                                        reached_by=live[0].model_copy(update={"count": 1}), live=live)


def _group(source, mib, count=1, op_type="MatMul", kind="output"):
    return LiveMemory(op_type=op_type, kind=kind, source=source, size_bytes=mib * MiB, count=count)


def test_peak_holders_match_a_moved_line_and_name_new_holders() -> None:
    baseline = [_group("model.py:10", 32), _group("model.py:40", 8, kind="tensor", op_type=None)]
    # Line 10 moved to 12 (code edited above it) and grew; line 44 is new in the same file.
    current = _Peak([_group("/ck/model.py:12", 128, 4), _group("/ck/model.py:44", 16, op_type=None, kind="tensor"),
                     _group("/ck/model.py:40", 8, op_type=None, kind="tensor")])  # largest first, as profiles hold them
    text, sites = _peak_holders(current, baseline)
    assert ("held more: MatMul outputs at model.py:12 +96.00 MiB (32.00 MiB -> 128.00 MiB, 1 -> 4 allocations); "
            "tensor made at model.py:44 +16.00 MiB (16.00 MiB in 1 allocation, none at the baseline's peak)") in text
    assert sites == [("/ck/model.py:12", 128.0 * MiB), ("/ck/model.py:44", 16.0 * MiB)]
    # An older baseline without the holders: the largest ones now
    text, sites = _peak_holders(current, None)
    assert "the most was held by MatMul outputs at model.py:12: 128.00 MiB; tensor made at model.py:44: 16.00 MiB" in text
    # Nothing grew: said so, no sites
    text, sites = _peak_holders(_Peak([_group("/ck/model.py:10", 32)]), baseline)
    assert "no call site held more than in the baseline's peak" in text and sites == []
