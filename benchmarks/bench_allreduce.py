"""An 8-card AllReduce sweep, 1 KiB to 1 GiB, on both bundled servers, as hccl_test reports it:
time, algorithm bandwidth (bytes / time) and bus bandwidth (algbw * 2 (n - 1) / n).

    python benchmarks/bench_allreduce.py

The HCCS mesh limit per card is the hardware data's link bandwidth times the links of a full
mesh of its HCCS group, at the links' efficiency; large messages approach it, small ones are
latency-bound. Times are the simulator's, not a measurement.
"""

from __future__ import annotations

from tabulate import tabulate

from simulator.costs import OpSpec, op_cost
from simulator.hardware import load_hardware

SIZES = [1 << p for p in range(10, 31, 2)]  # 1 KiB .. 1 GiB


def sweep(hardware: str, cards: int = 8) -> list[tuple[int, float, float, float, str]]:
    """(bytes, seconds, algbw bytes/s, busbw bytes/s, algorithm) per message size (fp16)."""
    hw = load_hardware(hardware)
    rows = []
    for size in SIZES:
        cost = op_cost(OpSpec("AllReduce", ((size // 2,),), "fp16", (("ranks", tuple(range(cards))),)), hw)
        rows.append((size, cost.duration_s, cost.comm.algbw_bytes_per_s, cost.comm.busbw_bytes_per_s,
                     cost.comm.algorithm))
    return rows


def mesh_limit_bytes_per_s(hardware: str) -> float:
    """Per-card bandwidth of a full HCCS mesh of the card's group, at the links' efficiency."""
    ic = load_hardware(hardware).interconnect
    return (ic.hccs_group_size - 1) * ic.hccs_link_bandwidth_bytes_per_s * ic.link_efficiency_frac


def main() -> None:
    for hardware in ("ascend910", "ascend910b"):
        limit = mesh_limit_bytes_per_s(hardware)
        print(f"\n8-card AllReduce on {hardware} (HCCS mesh limit per card {limit / 1e9:.1f} GB/s)")
        print(tabulate(
            [(f"{size / 1024:,.0f} KiB" if size < 1 << 20 else f"{size / (1 << 20):,.0f} MiB", f"{t * 1e6:,.1f}",
              f"{alg / 1e9:.2f}", f"{bus / 1e9:.2f}", name) for size, t, alg, bus, name in sweep(hardware)],
            headers=("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "algorithm"),
            colalign=("right", "right", "right", "right", "left")))


if __name__ == "__main__":
    main()
