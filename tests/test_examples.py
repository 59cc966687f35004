"""The bundled suite passes against the committed baselines (the README's main job)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_oam.report import OamReport

ROOT = Path(__file__).resolve().parents[1]
#: Example tests that check performance properties over shapes and profile nothing for the gate.
SHAPE_PROPERTY_TESTS = ("test_flash_attention_reaches_30_percent_of_peak_on_910b",
                        "test_large_matmuls_stay_near_their_aligned_shape_class")


def test_examples_pass_against_committed_baselines(pytester: pytest.Pytester) -> None:
    shutil.copytree(ROOT / "examples", pytester.path / "examples")
    shutil.copytree(ROOT / "baselines", pytester.path / "baselines")
    # Only the examples' own files: a user's baselines may live in the same folder.
    committed = {p.name: p.read_bytes() for p in (pytester.path / "baselines").glob("examples_*.json")}
    # in a subprocess, as the README runs it (the PyTorch example imports torch, which cannot be
    # imported again in this process once an in-process run has dropped its modules)
    result = pytester.runpytest_subprocess("examples", "--oam-baseline", "--oam-report=report.json")
    report = OamReport.model_validate_json((pytester.path / "report.json").read_text())
    not_passing = {t.nodeid: t.status for t in report.tests if t.status != "pass"}
    assert not not_passing, (
        f"{not_passing}: the committed baselines no longer match the simulator; if the change "
        "is intended, bump simulator.__version__ and run `pytest examples --oam-save-baseline`"
    )
    outcomes = result.parseoutcomes()
    # Every profiled test has its committed baseline; the shape-property examples are not gated.
    assert len(report.tests) == len(committed) and "failed" not in outcomes
    assert outcomes.get("passed") == len(committed) + len(SHAPE_PROPERTY_TESTS)
    result.stdout.fnmatch_lines(["*test_llama2_7b_training_step*ascend910 x8*pass*MatMul*"])
    result.stdout.fnmatch_lines(["*test_llama2_7b_fsdp2_training_step*ascend910b x8*pass*MatMul*"])
    assert {p.name: p.read_bytes() for p in (pytester.path / "baselines").glob("examples_*.json")} == committed
