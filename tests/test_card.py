"""The hardware figures the diagnosis quotes come from the card's spec (simulator/hardware/*.json),
not from numbers in pytest_oam/judge (issue 21): change the spec, and the finding changes."""

from __future__ import annotations

import pytest

import simulator
from pytest_oam.judge import card
from pytest_oam.judge.compare import summarize
from pytest_oam.judge.explain import PeakMemory, _peak_holders
from pytest_oam.judge.rules import run_rules
from simulator.hardware import list_hardware, load_hardware
from simulator.profile import LiveMemory
from simulator.units import MiB

SPEC = load_hardware("ascend910")


def with_figures(dma_alignment: int | None = None, block: int | None = None):
    """The 910 spec with another DMA alignment or allocator block."""
    spec = SPEC
    if dma_alignment is not None:
        spec = spec.model_copy(update={"dma": spec.dma.model_copy(update={"min_efficient_transfer_bytes": dma_alignment})})
    if block is not None:
        spec = spec.model_copy(update={"allocator": spec.allocator.model_copy(update={"min_block_bytes": block})})
    return spec


def test_the_bundled_specs_share_the_figures_a_real_profile_gets() -> None:
    # torch_npu's kMinBlockSize and msprof-analyze's 512 B alignment, in both hardware files
    assert {load_hardware(n).allocator.min_block_bytes for n in list_hardware()} == {512}
    assert {load_hardware(n).dma.min_efficient_transfer_bytes for n in list_hardware()} == {512}
    assert (card.allocator_block_bytes(None), card.dma_alignment_bytes(None)) == (512, 512)
    assert card.dma_alignment_bytes(with_figures(dma_alignment=1000)) == 1000


def test_specs_that_disagree_give_no_figure_to_a_real_profile(monkeypatch) -> None:
    monkeypatch.setattr(card, "bundled_specs", lambda: (SPEC, with_figures(dma_alignment=1024)))
    assert card.dma_alignment_bytes(None) is None
    assert card.allocator_block_bytes(None) == 512  # the allocator's still agree


def test_comm_share_counts_sizes_against_the_cards_dma_alignment() -> None:
    def unaligned(npu):
        npu.all_reduce(npu.tensor((64 << 20,)))  # 128 MiB = 134,217,728 B: a multiple of 512, not of 1000
        npu.all_reduce(npu.tensor((1000,)))  # 2,000 B: a multiple of 1000, not of 512
        npu.matmul(npu.tensor((4096, 4096)), npu.tensor((4096, 4096)))

    profile = simulator.run(unaligned, hardware="ascend910", devices=8)

    def described(spec, **thresholds):
        (found,) = [f for f in run_rules(profile, spec, thresholds={"comm-share": thresholds} if thresholds else None)
                    if f.rule_id == "comm-share"]
        return found.description

    assert "1 message sizes not a multiple of 512 B" in described(SPEC)
    assert "1 message sizes not a multiple of 1000 B" in described(with_figures(dma_alignment=1000))
    # a project's own alignment (oam_rule_thresholds comm-share.align_bytes) still wins
    assert "2 message sizes not a multiple of 3000 B" in described(SPEC, align_bytes=3000)


def _group(source: str, size_bytes: int) -> LiveMemory:
    return LiveMemory(op_type="MatMul", kind="output", source=source, size_bytes=size_bytes, count=1)


@pytest.mark.parametrize(("block", "told"), [(512, True), (1024, False)])
def test_peak_memory_ignores_the_cards_allocator_rounding(block, told) -> None:
    # 12 MiB + 1000 B now against 12 MiB: more than one 512 B block per allocation, less than
    # one 1024 B block
    memory = PeakMemory(current_live=[_group("t.py:1", 12 * MiB + 1000)], baseline_live=[_group("t.py:1", 12 * MiB)],
                        rounding_bytes=card.allocator_block_bytes(with_figures(block=block)))
    text, _, _ = _peak_holders(memory)
    assert ("held more: MatMul output at t.py:1" in text) is told


def test_the_gate_takes_the_allocator_rounding_from_the_runs_card() -> None:
    run = summarize(simulator.run(lambda npu: npu.matmul(npu.tensor((64, 64)), npu.tensor((64, 64))), hardware="ascend910"))
    assert PeakMemory.of(run, run, hardware=with_figures(block=1024)).rounding_bytes == 1024
    assert PeakMemory.of(run, run).rounding_bytes == 512  # no spec: the bundled specs' figure
