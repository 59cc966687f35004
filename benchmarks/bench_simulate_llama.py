"""How long simulating one Llama-2-7B training step on 8 x Ascend 910 takes.

Run: ``python benchmarks/bench_simulate_llama.py [--repeats N] [--memory]``. Pins itself to one
core where the OS allows, runs the simulation ``N`` times (default 15) in this one process, and
prints the times side by side with the 100 ms target as a ratio. ``--memory`` models device
memory too (``memory=True``). Not a test: the machines are shared and noisy.

Side by side with another copy of the simulator (before and after a change):
``python benchmarks/bench_simulate_llama.py --against /tmp/old_checkout [--rounds R]`` runs
fresh processes alternately, the other copy first (A B A B ..., ``R`` rounds, default 6), each
``--repeats`` simulations, and prints each side's median over all its runs (wall and CPU time)
and the ratio this checkout / the other. Make the other copy with ``git worktree add
/tmp/old_checkout HEAD`` (``git worktree remove`` it afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 0.100
REPEATS = 15
ROUNDS = 6
REPO = Path(__file__).resolve().parent.parent


def measure(repeats: int, memory: bool) -> dict:
    """Wall and CPU seconds of ``repeats`` simulations of the step, in this process."""
    import simulator
    from simulator.models import LLAMA2_7B, training_step

    wall_s, cpu_s = [], []
    profile = None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        profile = simulator.run(training_step, LLAMA2_7B, devices=8, seq_len=2048, hardware="ascend910", memory=memory)
        cpu_s.append(time.process_time() - start_cpu)
        wall_s.append(time.perf_counter() - start)
    return {"simulator": os.path.dirname(simulator.__file__), "ops": len(profile.ops), "wall_s": wall_s,
            "cpu_s": cpu_s, "step_time_s": profile.step_time_s, "tokens_per_s": profile.tokens_per_s}


def report(result: dict, memory: bool) -> None:
    wall_s = result["wall_s"]
    median = statistics.median(wall_s)
    label = ", memory modelled" if memory else ""
    print(f"Llama-2-7B training step, seq 2048, 8 x ascend910{label}: {result['ops']} op records")
    print(f"  simulator                 {result['simulator']}")
    print(f"  simulated step time       {result['step_time_s'] * 1e3:9.1f} ms "
          f"({result['tokens_per_s'] / 8:,.0f} tokens/s per card)")
    print(f"  wall time, first run      {wall_s[0] * 1e3:9.1f} ms")
    print(f"  wall time, median of {len(wall_s)}  {median * 1e3:9.1f} ms   (min {min(wall_s) * 1e3:.1f} ms)")
    print(f"  median / 100 ms target    {median / TARGET_S:9.2f}   ({'met' if median < TARGET_S else 'NOT met'})")


def side_by_side(other: Path, rounds: int, repeats: int, memory: bool) -> None:
    """Alternate fresh processes of the other copy (A) and this checkout (B); print the ratio B / A."""
    sides = {"A": other.resolve(), "B": REPO}
    runs: dict[str, dict[str, list[float]]] = {side: {"wall_s": [], "cpu_s": []} for side in sides}
    where = {}
    for i in range(rounds):
        for side, root in sides.items():
            cmd = [sys.executable, str(Path(__file__).resolve()), "--repeats", str(repeats), "--json"]
            if memory:
                cmd.append("--memory")
            env = {**os.environ, "PYTHONPATH": str(root)}
            done = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{side} ({root}) failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            where[side] = result["simulator"]
            for key in ("wall_s", "cpu_s"):
                runs[side][key] += result[key]
            print(f"  round {i + 1} {side}: median wall {statistics.median(result['wall_s']) * 1e3:6.1f} ms, "
                  f"cpu {statistics.median(result['cpu_s']) * 1e3:6.1f} ms", flush=True)
    print(f"A = {where['A']}\nB = {where['B']}")
    for key, label in (("wall_s", "wall"), ("cpu_s", "CPU")):
        a, b = statistics.median(runs["A"][key]), statistics.median(runs["B"][key])
        print(f"  {label:4} median of {len(runs['A'][key])} runs: A {a * 1e3:6.2f} ms, B {b * 1e3:6.2f} ms, "
              f"B / A = {b / a:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=REPEATS, help="Simulations per process")
    parser.add_argument("--memory", action="store_true", help="Model device memory (memory=True)")
    parser.add_argument("--against", type=Path, default=None,
                        help="Another copy of the repository to compare with, in alternating processes")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="With --against: processes per side")
    parser.add_argument("--json", action="store_true", help="Print the raw times as one JSON line")
    args = parser.parse_args()
    if args.against is not None:
        side_by_side(args.against, args.rounds, args.repeats, args.memory)
        return
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    result = measure(args.repeats, args.memory)
    if args.json:
        print(json.dumps(result))
    else:
        report(result, args.memory)


if __name__ == "__main__":
    main()
