"""TPE against random search on a large tuning space: how close does each get to the best
configuration in a budget of 50 unique evaluations?

    python benchmarks/bench_tune.py              # about 3 minutes the first time
    python benchmarks/bench_tune.py --seeds 3    # fewer seeds, for a quick look

The workload is the attention of one Llama-2-7B layer in training on one Ascend 910 card
(batch 1, 32 heads of 128, 4096 tokens, causal): FlashAttention forward and backward, each with
its own tiling, as CANN's FlashAttentionScore and FlashAttentionScoreGrad kernels have. The
space is every tiling the simulator's kernels accept by type: block_size a multiple of 16 from
16 to 512, pipeline_stages 1 to 8, fused or not, for each of the two kernels: 32 x 8 x 2 squared
= 262,144 configurations, all of which change the simulated time (tilings whose blocks do not
fit in L1 are infeasible trials). The target is the step's throughput in tokens per second.

The best known configuration comes from evaluating the whole space (cached in a file under the
system's temporary folder, keyed by the simulator version and the space). Then, for each seed,
``auto_tune`` runs with its default TPE sampler (independent TPE, ``multivariate=False``: see
``pytest_oam.tune._search`` for why), with ``multivariate=True`` (Optuna 5's default, which models
the parameters jointly) and with the random sampler, each with ``max_iterations=50`` unique
evaluations and no early stopping; the table gives each one's gap to the best known throughput
and whether it is within 2%. Times are the simulator's, not a measurement of hardware.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from pytest_oam import OptimizationTarget, ParameterSpace, auto_tune

BUDGET = 50
WITHIN_FRAC = 0.02
SEQ_LEN, HEADS, HEAD_DIM = 4096, 32, 128
TARGET = OptimizationTarget(metric="throughput_tokens_per_s")
#: name -> (sampler, sampler_options) compared against each other.
SEARCHES = {
    "TPE": ("tpe", {}),
    "TPE multivariate": ("tpe", {"multivariate": True}),
    "random": ("random", {}),
}


def attention_layer(npu, fwd_block_size=128, fwd_pipeline_stages=2, fwd_fusion=True,
                    bwd_block_size=128, bwd_pipeline_stages=2, bwd_fusion=True):
    """FlashAttention forward and backward of one Llama-2-7B layer, each with its own tiling."""
    npu.set_tokens_per_step(SEQ_LEN)
    q = npu.tensor((1, HEADS, SEQ_LEN, HEAD_DIM))
    npu.flash_attention(q, q, q, block_size=fwd_block_size, pipeline_stages=fwd_pipeline_stages,
                        fusion=fwd_fusion, causal=True)
    npu.flash_attention_grad(q, q, q, q, block_size=bwd_block_size, pipeline_stages=bwd_pipeline_stages,
                             fusion=bwd_fusion, causal=True)


def space() -> ParameterSpace:
    out = ParameterSpace()
    for kernel in ("fwd", "bwd"):
        out.add_int(f"{kernel}_block_size", 16, 512, 16)
        out.add_int(f"{kernel}_pipeline_stages", 1, 8)
        out.add_boolean(f"{kernel}_fusion")
    return out


def best_known(cache_dir: Path) -> dict:
    """The exhaustive optimum of :func:`space`: best throughput (tokens/s), its configuration,
    and how many configurations are feasible and within 2% of it. Cached in ``cache_dir``."""
    import simulator

    key = hashlib.sha256(json.dumps([simulator.SIMULATOR_VERSION, repr(space().params), SEQ_LEN, HEADS, HEAD_DIM,
                                     TARGET.metric]).encode()).hexdigest()[:16]
    path = cache_dir / f"oam_bench_tune_{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    from pytest_oam.tune import _measure

    grid = space()
    run_kwargs = {"hardware": "ascend910", "devices": 1, "steps": 1}
    default = _measure(TARGET, attention_layer, {}, run_kwargs).metrics[TARGET.metric]
    values, best, best_params = [], 0.0, None
    for params in grid.grid():  # one at a time, keeping only the metric: 262,144 Trials are big
        trial = _measure(TARGET, attention_layer, params, run_kwargs)
        if trial.feasible:
            value = trial.metrics[TARGET.metric]
            values.append(value)
            if value > best:
                best, best_params = value, params
    known = {"best_throughput_tokens_per_s": best, "best_params": best_params, "configurations": int(grid.size),
             "feasible": len(values), "within_2pct": sum(v >= best * (1 - WITHIN_FRAC) for v in values),
             "default_throughput_tokens_per_s": default}
    path.write_text(json.dumps(known, indent=2, sort_keys=True))
    return known


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="TPE against random search on a 262,144-configuration space")
    parser.add_argument("--seeds", type=int, default=10, help="seeds per search (default: %(default)s)")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="where the exhaustive optimum is cached (default: %(default)s)")
    args = parser.parse_args(argv)
    import optuna

    started = time.perf_counter()
    known = best_known(args.cache_dir)
    exhaustive_s = time.perf_counter() - started
    best = known["best_throughput_tokens_per_s"]
    print(f"space: {known['configurations']:,} configurations, {known['feasible']:,} feasible, "
          f"{known['within_2pct']:,} within 2% of the best ({known['within_2pct'] / known['configurations']:.4%})")
    print(f"best known: {best:,.0f} tokens/s with {known['best_params']}; the default gives "
          f"{known['default_throughput_tokens_per_s']:,.0f} tokens/s")
    print(f"exhaustive evaluation (or its cache): {exhaustive_s:.1f} s; Optuna {optuna.__version__}")

    gaps: dict[str, list[float]] = {name: [] for name in SEARCHES}
    rows = []
    search_started = time.perf_counter()
    for seed in range(args.seeds):
        row: list[object] = [seed]
        for name, (sampler, options) in SEARCHES.items():
            result = auto_tune(target=TARGET, param_space=space(), workload=attention_layer, max_iterations=BUDGET,
                               early_stopping=False, seed=seed, sampler=sampler, sampler_options=options)
            if result.unique_evaluations != BUDGET:
                raise RuntimeError(f"{name}, seed {seed}: {result.unique_evaluations} unique evaluations, not {BUDGET}")
            found = result.best.metrics[TARGET.metric] if result.best is not None else 0.0
            gap = (best - found) / best
            gaps[name].append(gap)
            row += [f"{gap * 100:.3f}", "yes" if gap <= WITHIN_FRAC else "no"]
        rows.append(row)
    medians = {name: statistics.median(values) for name, values in gaps.items()}
    rows.append(["median", *[v for name in SEARCHES for v in
                             (f"{medians[name] * 100:.3f}", "yes" if medians[name] <= WITHIN_FRAC else "no")]])
    rows.append(["within 2%", *[v for name in SEARCHES for v in
                                (f"{sum(g <= WITHIN_FRAC for g in gaps[name])}/{args.seeds}", "")]])
    headers = ["seed", *[h for name in SEARCHES for h in (f"{name} gap %", "<= 2%")]]
    print(f"\nbest found in {BUDGET} unique evaluations, gap to the best known throughput:")
    print(tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True))
    wins = sum(t < r for t, r in zip(gaps["TPE"], gaps["random"], strict=True))
    print(f"\nTPE (auto_tune's default) beats random on {wins}/{args.seeds} seeds; median gap "
          f"{medians['TPE'] * 100:.2f}% against {medians['random'] * 100:.2f}%")
    print(f"searches: {time.perf_counter() - search_started:.1f} s; total: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
