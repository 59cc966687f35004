"""Collectives on the bundled servers: the 8-card AllReduce sweep of benchmarks/bench_allreduce.py."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

import simulator
from simulator.costs import OpSpec, collective_cost
from simulator.hardware import load_hardware

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


# -- algorithms across servers, Broadcast and AllToAll -------------------------------------------


B910 = load_hardware("ascend910b")


def _cost(kind: str, ranks: tuple[int, ...], numel: int = 1 << 26):
    return collective_cost(OpSpec(kind, ((numel,),), "fp16", (("ranks", ranks),)), B910)


def test_halving_doubling_across_a_power_of_two_of_servers() -> None:
    ic = B910.interconnect
    n = 16
    ranks = tuple(range(0, 8 * n, 8))  # one rank per server
    cost = _cost("AllReduce", ranks)
    nbytes = (1 << 26) * 2
    # launch + 2 passes x (log2(16) latencies + (n-1)/n of the data at RoCE speed) + reduction
    comm_s = 2 * (math.log2(n) * ic.roce_latency_s + (n - 1) / n * nbytes / (ic.roce_bandwidth_bytes_per_s
                                                                           * ic.link_efficiency_frac))
    assert cost.comm.algorithm == "halving-doubling-roce"
    assert B910.launch.kernel_launch_latency_s + comm_s < cost.duration_s < B910.launch.kernel_launch_latency_s \
        + comm_s * 1.05
    ring = _cost("AllReduce", tuple(range(0, 8 * 6, 8)))  # 6 servers: not a power of two
    assert ring.comm.algorithm == "ring-roce"
    assert _cost("AllToAll", ranks).comm.algorithm == "ring-roce"  # pairwise steps
    assert _cost("AllReduce", tuple(range(8 * n))).comm.algorithm == "hierarchical-halving-doubling-roce"


def test_broadcast_and_all_to_all() -> None:
    ranks = tuple(range(8))
    bcast, a2a = _cost("Broadcast", ranks), _cost("AllToAll", ranks)
    assert bcast.comm.busbw_bytes_per_s == pytest.approx(bcast.comm.algbw_bytes_per_s)  # nccl-tests: factor 1
    assert a2a.comm.busbw_bytes_per_s == pytest.approx(a2a.comm.algbw_bytes_per_s * 7 / 8)
    assert bcast.duration_s > a2a.duration_s  # two passes against one, same mesh

    def work(npu):
        x = npu.tensor((1024, 64))
        npu.broadcast(x, src=3)
        npu.all_to_all(x)

    assert [op.op_type for op in simulator.run(work, devices=8).ops] == ["Broadcast", "AllToAll"]

    def bad_src(npu):
        npu.broadcast(npu.tensor((8,)), src=5, ranks=[0, 1])

    with pytest.raises(ValueError, match=r"Broadcast: src 5 is not in the group \[0, 1\]"):
        simulator.run(bad_src, devices=8)

    def bad_split(npu):
        npu.all_to_all(npu.tensor((7, 2)), ranks=[0, 1])

    with pytest.raises(simulator.ShapeError, match="AllToAll: axis 0 of \\[7, 2\\] is not divisible by 2 ranks"):
        simulator.run(bad_split, devices=8)
