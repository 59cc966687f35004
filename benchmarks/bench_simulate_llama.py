"""How long simulating one Llama-2-7B training step on 8 x Ascend 910 takes.

Run: ``python benchmarks/bench_simulate_llama.py``. Pins itself to one core where the OS
allows, runs the simulation several times in this one process, and prints the times side by
side with the 100 ms target as a ratio. Not a test: the machines are shared and noisy.
"""

from __future__ import annotations

import os
import statistics
import time

import simulator
from simulator.models import LLAMA2_7B, training_step

TARGET_S = 0.100
REPEATS = 15


def main() -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    times = []
    profile = None
    for _ in range(REPEATS):
        start = time.perf_counter()
        profile = simulator.run(training_step, LLAMA2_7B, devices=8, seq_len=2048, hardware="ascend910")
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(f"Llama-2-7B training step, seq 2048, 8 x ascend910: {len(profile.ops)} op records")
    print(f"  simulated step time       {profile.step_time_s * 1e3:9.1f} ms ({profile.tokens_per_s / 8:,.0f} tokens/s per card)")
    print(f"  wall time, first run      {times[0] * 1e3:9.1f} ms")
    print(f"  wall time, median of {REPEATS}  {median * 1e3:9.1f} ms   (min {min(times) * 1e3:.1f} ms)")
    print(f"  median / 100 ms target    {median / TARGET_S:9.2f}   ({'met' if median < TARGET_S else 'NOT met'})")


if __name__ == "__main__":
    main()
