"""What capturing a Hugging Face Llama-2-7B training step costs, against plain fake-tensor execution.

Run: ``python benchmarks/bench_torch_capture.py [--repeats N] [--layers L]``. Pins itself to one
core where the OS allows and, in this one process, alternates N times (default 5):

- plain: the step (forward with labels, backward, AdamW(foreach=True) step and zero_grad) run
  twice under PyTorch's ``FakeTensorMode`` alone: what any fake-tensor tool pays;
- capture: the same through :func:`simulator.run_torch`, which runs it twice too (a warm-up,
  then the simulated step: the recorder mapping each aten op, the simulation of each op,
  device memory following the storages).

Both build the model in the timed region (``setup``). Prints each side's median CPU and wall
time and the ratio capture / plain (target: at most 2), and the wall time of a whole
``run_torch`` of the step in a fresh process, imports included (target: under 30 s). Not a
test: the machines are shared and noisy.

Needs torch and transformers (``pip install '.[examples]'``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

RATIO_TARGET = 2.0
WHOLE_RUN_TARGET_S = 30.0


def make_setup(layers: int):
    def setup():
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.set_default_dtype(torch.bfloat16)
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers))  # Llama-2-7B shapes by default
        return model, torch.optim.AdamW(model.parameters(), foreach=True), torch.randint(0, 32000, (1, 4096))

    return setup


def train_step(model, opt, tokens):
    model(input_ids=tokens, labels=tokens).loss.backward()
    opt.step()
    opt.zero_grad()


#: run_torch runs the step once unsimulated first (its warm-up) and once simulated: plain
#: fake-tensor execution runs it as many times, so the ratio is what the recorder and the
#: simulation add.
STEP_RUNS = 2


def plain(setup) -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    before = torch.get_default_dtype()
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            arguments = setup()
            for _ in range(STEP_RUNS):
                train_step(*arguments)
    finally:
        torch.set_default_dtype(before)


def capture(setup) -> None:
    import simulator

    simulator.run_torch(train_step, setup=setup, hardware="ascend910b", warmup_steps=STEP_RUNS - 1, steps=1)


def timed(function, setup) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    function(setup)
    return time.process_time() - cpu, time.perf_counter() - wall


WHOLE_RUN = """
import sys, time
start = time.perf_counter()
sys.path.insert(0, {here!r})
import warnings
warnings.simplefilter("ignore")
from bench_torch_capture import make_setup, train_step
import simulator
simulator.run_torch(train_step, setup=make_setup({layers}), hardware="ascend910b")
print(time.perf_counter() - start)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=32, help="decoder layers (default: 32, Llama-2-7B)")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import warnings

    warnings.simplefilter("ignore")  # the unmapped-op warning of every capture
    setup = make_setup(args.layers)
    plain(setup), capture(setup)  # warm: imports, first-call caches
    sides = {"plain": plain, "capture": capture}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    wall: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, function in sides.items():
            c, w = timed(function, setup)
            cpu[name].append(c)
            wall[name].append(w)
    print(f"Llama-2-7B shapes, {args.layers} layers, 4096 tokens, AdamW: {args.repeats} alternating runs, one core")
    for name in sides:
        print(f"  {name:8s} CPU median {statistics.median(cpu[name]):6.2f} s   wall median "
              f"{statistics.median(wall[name]):6.2f} s")
    ratio = statistics.median(cpu["capture"]) / statistics.median(cpu["plain"])
    print(f"  capture / plain (CPU): {ratio:.2f}  (target <= {RATIO_TARGET:g}: {'met' if ratio <= RATIO_TARGET else 'NOT met'})")
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", WHOLE_RUN.format(here=here, layers=args.layers)],
                         capture_output=True, text=True, check=True)
    whole = float(out.stdout.strip().splitlines()[-1])
    print(f"  whole run in a fresh process (imports, setup, capture, simulation): {whole:.1f} s  "
          f"(target < {WHOLE_RUN_TARGET_S:g} s: {'met' if whole < WHOLE_RUN_TARGET_S else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
