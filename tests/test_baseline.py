"""Baseline files: names, atomic writes, validation."""

from __future__ import annotations

import os

import pytest

import simulator
from pytest_oam.baseline import (
    BaselineError,
    BaselineFile,
    baseline_filename,
    dump_baseline,
    load_baseline,
    save_baseline,
)
from pytest_oam.compare import summarize


def make_baseline(nodeid: str = "t.py::test") -> BaselineFile:
    def work(npu):
        npu.matmul(npu.tensor((256, 256)), npu.tensor((256, 256)))

    return BaselineFile(nodeid=nodeid, runs=[summarize(simulator.run(work))])


NASTY_IDS = [
    "tests/test_a.py::test_x[a/b]",
    "tests/test_a.py::test_x[a_b]",
    "tests/test_a.py::test_x[A_B]",
    "tests/test_a.py::test_x[a::b]",
    "tests/test_a.py::test_x[日本語]",
    "tests/test_a.py::test_x[CON]",
    "tests/test_a.py::test_x[" + "x" * 300 + "]",
    "tests/test_a.py::test_x[" + "x" * 299 + "y]",
    "tests/test_a.py::Test::test_x[1-2]",
]


def test_file_names_are_portable_unique_and_short() -> None:
    names = [baseline_filename(n) for n in NASTY_IDS]
    assert len({n.lower() for n in names}) == len(names)  # unique even on case-insensitive disks
    for name in names:
        assert len(name.encode()) <= 255
        assert all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    assert baseline_filename(NASTY_IDS[0]) == baseline_filename(NASTY_IDS[0])


def test_round_trip_and_sorted_keys(tmp_path) -> None:
    path = tmp_path / "b" / baseline_filename("t.py::test")
    baseline = make_baseline()
    save_baseline(path, baseline)
    assert load_baseline(path, "t.py::test") == baseline
    text = path.read_text()
    assert text == dump_baseline(baseline) and text.endswith("\n")
    assert list(os.listdir(path.parent)) == [path.name]  # no temporary file left


def test_failed_write_leaves_old_file(tmp_path, monkeypatch) -> None:
    path = tmp_path / "b.json"
    save_baseline(path, make_baseline())
    before = path.read_bytes()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        save_baseline(path, make_baseline("other.py::test"))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["b.json"]


def test_writer_refuses_nan() -> None:
    bad = make_baseline().model_copy(update={"nodeid": "x"})
    run = bad.runs[0].model_copy(update={"step_time_s": float("nan")})
    with pytest.raises(ValueError):
        dump_baseline(bad.model_copy(update={"runs": [run]}))


def test_file_of_another_test_is_rejected(tmp_path) -> None:
    path = tmp_path / "b.json"
    save_baseline(path, make_baseline("a.py::test"))
    with pytest.raises(BaselineError, match=r"belongs to test 'a.py::test', not 'b.py::test'"):
        load_baseline(path, "b.py::test")


def test_missing_field_is_named(tmp_path) -> None:
    path = tmp_path / "b.json"
    path.write_text('{"schema_version": 1, "runs": []}')
    with pytest.raises(BaselineError, match=r"b.json: is not a valid baseline: nodeid: Field required"):
        load_baseline(path)
