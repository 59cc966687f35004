"""Collectives on the bundled servers: the 8-card AllReduce sweep of benchmarks/bench_allreduce.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "bench_allreduce", Path(__file__).parents[1] / "benchmarks" / "bench_allreduce.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.mark.parametrize("hardware", ["ascend910", "ascend910b"])
def test_allreduce_sweep_approaches_but_never_exceeds_the_mesh(hardware) -> None:
    rows = bench.sweep(hardware)
    limit = bench.mesh_limit_bytes_per_s(hardware)
    busbw = [bus for _, _, _, bus, _ in rows]
    assert all(b <= limit * (1 + 1e-9) for b in busbw)
    assert busbw == sorted(busbw)  # more bytes never lower bandwidth
    # Small messages are latency-bound: 1 KiB and 4 KiB take nearly the same time.
    (_, t1, *_), (_, t4, *_) = rows[0], rows[1]
    assert t4 < 1.1 * t1
    # Large messages approach the limit where the mesh is the bottleneck (the 910B's one
    # 8-card mesh); the 910A's two 4-card meshes are joined by PCIe, which caps it lower.
    if hardware == "ascend910b":
        assert busbw[-1] > 0.95 * limit


def test_the_benchmark_prints_both_servers(capsys) -> None:
    bench.main()
    out = capsys.readouterr().out
    assert "8-card AllReduce on ascend910 " in out and "8-card AllReduce on ascend910b" in out
    assert "1,024 MiB" in out and "busbw (GB/s)" in out
