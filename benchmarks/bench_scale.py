"""How simulation time grows with the card count: Llama-2-70B training steps from 64 to 1024 cards.

Run: ``python benchmarks/bench_scale.py``. Each layout is Megatron-style tensor x pipeline x
data parallel (tp = 8 inside one 910B server, pp = 8 stages of 10 layers, dp = cards / 64,
32 micro-batches of one 4096-token sequence in the 1F1B schedule), on ``ascend910b`` in bf16.
All ranks behave alike, so one rank is simulated whatever the card count: the card count
changes the collectives' groups and algorithms (data parallelism crosses servers over RoCE),
not the number of simulated ops. Times are wall-clock medians of a few runs in this one
process, printed side by side with the smallest job's as a ratio (the machines are shared and
noisy: read the ratios, not the absolute times). A 7B series on 8 to 1024 cards follows.
Not a test.
"""

from __future__ import annotations

import os
import statistics
import time

import simulator
from simulator.models import LLAMA2_7B, LLAMA2_70B, ParallelLayout, training_step

REPEATS = 3
TARGET_S = 1.0  # "a 1024-card Llama-2-70B step simulates in about a second" (issue 7)


def measure(config, layout: ParallelLayout, seq_len: int):
    times, profile = [], None
    for _ in range(REPEATS):
        start = time.perf_counter()
        profile = simulator.run(training_step, config, devices=layout.devices, hardware="ascend910b", dtype="bf16",
                                seq_len=seq_len, layout=layout)
        times.append(time.perf_counter() - start)
    return statistics.median(times), profile


def series(title: str, config, layouts: list[ParallelLayout], seq_len: int) -> list[tuple[int, float]]:
    print(title)
    print(f"{'cards':>6} {'tp x pp x dp':>13} {'micro':>6} {'ops':>7} {'step (s)':>9} {'tok/s/card':>11} "
          f"{'DP collective':>28} {'wall (s)':>9} {'x smallest':>11}")
    rows, first = [], None
    for layout in layouts:
        wall_s, profile = measure(config, layout, seq_len)
        first = first or wall_s
        dp_ops = [o for o in profile.ops if o.op_type in ("ReduceScatter", "AllReduce") and o.name.startswith("grads.")]
        algorithm = dp_ops[0].comm.algorithm if dp_ops and layout.data_parallel > 1 else "-"
        print(f"{layout.devices:>6} {layout.tensor_parallel:>4} x {layout.pipeline_parallel} x {layout.data_parallel:<3} "
              f"{layout.micro_batches:>6} {len(profile.ops):>7} {profile.step_time_s:>9.3f} "
              f"{profile.tokens_per_s / layout.devices:>11,.0f} {algorithm:>28} {wall_s:>9.3f} {wall_s / first:>11.2f}")
        rows.append((layout.devices, wall_s))
    return rows


def main() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    rows = series("Llama-2-70B, seq 4096, bf16, 910B servers (tp 8 x pp 8 x dp, 32 micro-batches)", LLAMA2_70B,
                  [ParallelLayout(8, dp, 1, 8, 32) for dp in (1, 2, 4, 8, 16)], 4096)
    cards, wall = rows[-1]
    growth = wall / rows[0][1]
    print(f"  {cards} cards: {wall:.3f} s of wall time against the {TARGET_S:.0f} s target "
          f"({'met' if wall <= TARGET_S else 'NOT met'}); {cards // rows[0][0]}x the cards cost {growth:.2f}x the time")
    print()
    series("Llama-2-7B, seq 4096, bf16, 910B servers (tp 8 x dp, 1 micro-batch)", LLAMA2_7B,
           [ParallelLayout(8, dp, 1) for dp in (1, 8, 32, 128)], 4096)


if __name__ == "__main__":
    main()
