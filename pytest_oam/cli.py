"""The ``oam`` command: the Python API from a shell, for nightly jobs and quick looks.

    oam baseline create --model llama-7b --hardware "Ascend 910 x 8" -o baselines/llama-7b.json
    oam baseline show baselines/llama-7b.json
    oam collect --model llama-7b --focus FlashAttention -o current.json.gz
    oam compare baselines/llama-7b.json current.json.gz --threshold 5%
    oam validate

Exit codes follow pytest's spirit: 0 when nothing regressed, 1 when the comparison failed the
gate (regressed, missing ops, incomparable), 2 for bad usage or input (argparse's own code).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: Comparison statuses for which ``oam compare`` exits with EXIT_FAILED.

_EPILOG = """\
examples:
  oam baseline create --model llama-7b -o baselines/llama-7b.json
  oam collect --model llama-7b --focus FlashAttention -o current.json.gz
  oam compare baselines/llama-7b.json current.json.gz --threshold 5%
  oam replay .oam/records/FILE.oam.json.gz [--hardware ascend910b]
  oam cluster cluster_analysis_output/cluster_step_trace_time.csv   # slow ranks, pipeline bubble
  oam validate                     # the simulator against published Ascend figures
  oam validate --profile DIR       # ... and against a real torch_npu profile, kernel by kernel
  oam calibrate DIR -o my-910b.json   # fit a hardware file to your NPU's profiles

exit codes: 0 nothing regressed, 1 the comparison (or a validation case) failed, 2 bad usage or input.
docs: docs/cli.md (the oam command), docs/api.md (the Python API)."""


def _add_collect_options(parser: argparse.ArgumentParser, torch: bool = False) -> None:
    from .api import DEFAULT_HARDWARE, DEFAULT_STEPS

    group = parser.add_argument_group("workload")
    which = group.add_mutually_exclusive_group(required=True) if torch else group
    which.add_argument("--model", required=not torch, metavar="NAME",
                       help="model zoo name (see 'oam models'), e.g. llama-7b")
    if torch:
        which.add_argument("--torch", metavar="MODULE:FUNCTION",
                           help="capture your own torch step instead, e.g. train.py:train_step or "
                                "mypkg.train:train_step (PyTorch needed: pip install 'pytest-oam[torch]')")
        group.add_argument("--setup", metavar="MODULE:FUNCTION",
                           help="with --torch: called once first; its results are the step's first arguments")

    # --dataset, --max-seq-len and --seed default to None so that giving one with --torch is seen
    # (and refused); _zoo_defaults fills in their defaults for zoo models
    group.add_argument("--dataset", metavar="NAME",
                       help=f"sequence-length distribution each step draws from (default: {_ZOO_DEFAULTS['dataset']}); "
                            "'none' for a fixed --seq-len")
    group.add_argument("--seq-len", type=int, metavar="N",
                       help="sequence length of every step; only with --dataset none (default: 2048)")
    group.add_argument("--max-seq-len", type=int, metavar="N",
                       help=f"longest sequence a dataset draw may give (default: {_ZOO_DEFAULTS['max_seq_len']})")
    group.add_argument("--hardware", default=DEFAULT_HARDWARE, metavar="SPEC",
                       help="device and card count, e.g. 'Ascend 910 x 8' or ascend910b (default: %(default)r)")
    group.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                       help="steps to simulate (default: %(default)s)")
    group.add_argument("--seed", type=int, help=f"seed of the sequence-length draws (default: {_ZOO_DEFAULTS['seed']})")
    group.add_argument("--param", action="append", default=[], type=_param, metavar="KEY=VALUE",
                       help="a model parameter, e.g. block_size=64 or fusion=false (repeatable; "
                            "'oam models' lists them)")


_TRUE, _FALSE = ("true", "yes", "on"), ("false", "no", "off")


def _param(text: str) -> tuple[str, object]:
    """``KEY=VALUE``: true/yes/on and false/no/off are booleans, then integers, floats, text;
    the model checks each parameter's type, so ``fusion=maybe`` is an error, not true."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    value = value.strip()
    lowered = value.lower()
    if lowered in _TRUE or lowered in _FALSE:
        return key.strip(), lowered in _TRUE
    for kind in (int, float):
        try:
            return key.strip(), kind(value)
        except ValueError:
            pass
    return key.strip(), value


def _params(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """The ``--param`` pairs as a dict; a key given twice is an error, not the last one winning."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"--param {key} is given twice ({out[key]!r} and {value!r})")
        out[key] = value
    return out


def _output_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("-o", "--output", required=True, type=_output_path, metavar="FILE",
                        help=f"where to write the {what} (folders are created)")
    parser.add_argument("--force", action="store_true", help="overwrite FILE if it exists (refused otherwise)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _output_path(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("an output file name is required")
    return Path(text)


def _format_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text",
                        help="output format (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oam",
        description="pytest-oam outside pytest: make baselines, collect profiles of a simulated "
                    "Ascend run, and compare them with the plugin's gate and diagnosis.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from simulator import SIMULATOR_VERSION

    parser.add_argument("--version", action="version",
                        version=f"%(prog)s (pytest-oam) {__version__}, simulator {SIMULATOR_VERSION}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    baseline = commands.add_parser("baseline", help="create or show a baseline file",
                                   description="Create or show a baseline file (the plugin's format).")
    actions = baseline.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create", help="simulate a model and write its baseline",
        description="Simulate a model and write its baseline, loadable by the plugin and by "
                    "'oam compare'. An existing file is kept unless --force is given.")
    _add_collect_options(create)
    create.add_argument("--tag", help="a label stored in the file, e.g. v1.0-optimized")
    _output_option(create, "baseline")
    show = actions.add_parser("show", help="print a baseline's per-op statistics",
                              description="Print a baseline file's runs and per-op statistics.")
    show.add_argument("baseline", type=Path, metavar="BASELINE", help="a baseline file")
    _format_option(show)

    collect = commands.add_parser(
        "collect", help="simulate a model and write its profile",
        description="Simulate a model and write its full profile as JSON (gzip-compressed when "
                    "FILE ends in .gz).")
    _add_collect_options(collect, torch=True)
    collect.add_argument("--focus", metavar="OP",
                         help="keep full records only for this op type (or glob) and its neighbours; "
                              "summarise the rest")
    collect.add_argument("--context-ops", type=int, metavar="N",
                         help="neighbours kept before and after each --focus op (default: 5)")
    _output_option(collect, "profile")

    compare = commands.add_parser(
        "compare", help="compare a profile with a baseline",
        description="Compare CURRENT with BASELINE using the plugin's per-op limits and "
                    "diagnosis; exit 1 if the gate fails.")
    compare.add_argument("baseline", type=Path, metavar="BASELINE", help="a baseline file or a profile")
    compare.add_argument("current", type=Path, metavar="CURRENT", help="a profile (from 'oam collect') or a baseline file")
    compare.add_argument("--threshold", action="append", default=[], metavar="[OP=]LIMIT",
                         help="default per-op limit (5%% or 0.05; FlashAttention keeps the stricter 2%%), "
                              "or a limit for one op type or glob (MatMul=5%%); repeatable (default: 10%%)")
    compare.add_argument("--alpha", type=float, default=0.05, metavar="P",
                         help="significance level when both profiles have several steps: a change above its "
                              "limit counts only if a one-sided Mann-Whitney U test gives p < P (default: 0.05)")
    compare.add_argument("--min-delta-us", type=float, metavar="US",
                         help="smallest change in microseconds that counts (default: 20 for imported real "
                              "profiles, 0 for simulated ones)")
    _format_option(compare)

    commands.add_parser(
        "validate", help="compare the simulator with published Ascend figures, or (--profile) with a real "
                         "profile kernel by kernel", add_help=False,
        description="Simulate every case of simulator/validation/figures.json and print case, "
                    "hardware, published and simulated figure, error, tolerance and result; with --profile, "
                    "re-cost every kernel of a real torch_npu profile and compare.")
    calibrate = commands.add_parser(
        "calibrate", help="fit a hardware file to real torch_npu profiles of your NPU",
        description="Re-cost every kernel of real torch_npu profiles (Level1 or Level2 kernel_details.csv, as "
                    "'oam validate --profile' reads them) on the base spec, fit a time scale per simulator op type and "
                    "the host time per eager kernel (launch.host_dispatch_s), and write a complete hardware file with "
                    "the fit's provenance, for --oam-hardware FILE, hardware=\"FILE\" or oam validate --hardware FILE "
                    "(docs/calibrate.md).")
    calibrate.add_argument("profiles", nargs="+", type=Path, metavar="PROFILE",
                           help="a torch_npu output folder (*_ascend_pt) or its kernel_details.csv")
    calibrate.add_argument("-o", "--output", required=True, type=_output_path, metavar="FILE.json",
                           help="the hardware file to write (folders are created; an existing file is replaced only "
                                "if oam calibrate wrote it)")
    calibrate.add_argument("--hardware", metavar="BASE",
                           help="the spec to start from: a bundled name or a hardware file (default: the bundled spec "
                                "closest to the profiles' core counts, as oam validate --profile picks)")
    calibrate.add_argument("--min-kernels", type=_positive_int, default=None, metavar="N",
                           help="fewest kernels of an op type (and host gaps) to fit it; fewer keep the base's value "
                                "(default: 5)")
    _format_option(calibrate)
    sweep = commands.add_parser(
        "sweep", help="map an operator's efficiency over a grid of shapes",
        description="Simulate an operator over a grid of shapes and print its least efficient "
                    "shapes with the reason; --plot writes a line per dtype (one varying axis) or "
                    "a heat map (two).")
    sweep.add_argument("op", metavar="OP", help="MatMul (axes m, k, n) or FlashAttention (batch, heads, seq, head_dim)")
    sweep.add_argument("--axis", action="append", default=[], required=True, metavar="AXIS=VALUES",
                       help="an axis and its values: N, N,M,... or START:STOP:STEP (repeat for every axis)")
    sweep.add_argument("--dtype", action="append", default=[], help="dtype (repeatable; default fp16)")
    sweep.add_argument("--hardware", default="ascend910", help="device (default: %(default)s)")
    sweep.add_argument("--param", action="append", default=[], type=_param, metavar="KEY=VALUE",
                       help="an op attribute, e.g. block_size=64 or causal=true (repeatable)")
    sweep.add_argument("--top", type=_positive_int, default=10, metavar="N",
                       help="worst shapes listed (default: %(default)s)")
    sweep.add_argument("--plot", type=Path, metavar="FILE.png",
                       help="write the plot here: .png, .svg or .pdf (needs matplotlib; folders are created)")
    sweep.add_argument("--force", action="store_true", help="overwrite the plot file if it exists")
    _format_option(sweep)

    tune = commands.add_parser(
        "tune", help="run a tuning job file and print the best configurations",
        description="Run the tuning job in JOB (TOML or JSON: workload = \"module:function\", operator, metric, "
                    "constraint, max_iterations, seed, hardware, sampler, [space], [fixed]; see docs/tuning.md) and print "
                    "the best configurations and the improvement over the default; exit 1 if none is feasible. "
                    "--save records the tuned configuration in a knowledge base file.")
    tune.add_argument("job", type=Path, metavar="JOB")
    tune.add_argument("--top", type=_positive_int, default=5, metavar="N", help="configurations listed (default: 5)")
    tune.add_argument("--save", type=_output_path, metavar="KB.json",
                      help="record the tuned configuration of the job's operator in this knowledge base file "
                           "(created if missing; e.g. tuned/knowledge_base.json)")
    tune.add_argument("--replace", action="store_true",
                      help="with --save: replace an existing record of the same operator, shapes, dtype, hardware "
                           "and simulator version (refused otherwise)")
    _format_option(tune)

    replay = commands.add_parser(
        "replay", help="run the gate of a recorded test again, offline (records: pytest --oam-record)",
        description="Re-run the comparison and diagnosis of a test recorded by pytest --oam-record and print "
                    "the same report; with --hardware, re-simulate the recorded op sequence on other hardware.")
    replay.add_argument("record", type=Path, metavar="RECORD", help="a *.oam.json.gz file from --oam-record-dir")
    replay.add_argument("--hardware", metavar="NAME",
                        help="what-if: simulate the recorded ops on this hardware (e.g. ascend910b)")
    _format_option(replay)
    trace = commands.add_parser(
        "trace", help="write a profile as a Chrome/Perfetto trace",
        description="Write PROFILE (a profile from 'oam collect', or real profiler output: torch_npu or "
                    "msprof CSV, a Kineto or torch_npu trace) as a Trace Event Format file to open in "
                    "ui.perfetto.dev or chrome://tracing.")
    trace.add_argument("profile", type=Path, metavar="PROFILE")
    _output_option(trace, "trace (.json, or .json.gz)")

    cluster = commands.add_parser(
        "cluster", help="compare the ranks of a job: slow ranks and the pipeline bubble",
        description="Read every rank's step split (msprof-analyze's cluster_step_trace_time.csv, a folder holding "
                    "it, or a folder of torch_npu rank folders *_ascend_pt) and print the per-rank table, the "
                    "pipeline stage with the bubble and the slow ranks with why; exit 1 when a rank is slower than "
                    "the median of the other ranks of its stage by more than the threshold.")
    cluster.add_argument("path", type=Path, metavar="PATH",
                         help="cluster_step_trace_time.csv, or a folder with it or with rank folders")
    cluster.add_argument("--threshold", default="10%", metavar="LIMIT",
                         help="how far over the median of the others of its stage a rank's computing, communication, free or step time "
                              "may be, as a share of the stage's median step (default: %(default)s)")
    _format_option(cluster)

    commands.add_parser("models", help="list the model zoo, datasets and hardware",
                        description="List the names --model, --dataset and --hardware accept.")
    return parser


def _print(text: object = "", file=None) -> None:
    """``print`` for everything the commands write: text from data files (op names, test ids)
    loses its escape sequences and control characters, so it cannot colour or rewrite the
    terminal (fields that could forge a line are made one-line where they are formatted)."""
    from .format import terminal_safe

    print(terminal_safe(text, keep_newlines=True), file=file)


def _one_line(text: object) -> str:
    """A field from a data file on one line, terminal-safe."""
    from .format import terminal_safe

    return terminal_safe(text)


def _refuse_overwrite(path: Path, force: bool) -> None:
    if path.is_dir():  # even with --force: "[Errno 21] Is a directory" named a temporary file (newcomer)
        raise ValueError(f"-o {path}: is a folder; give a file name")
    if path.exists() and not force:
        raise ValueError(f"{path} exists; pass --force to overwrite it")


_ZOO_DEFAULTS = {"dataset": "wikitext-103", "max_seq_len": 4096, "seed": 0}


def _zoo_defaults(args: argparse.Namespace) -> None:
    """Fill in the zoo-model options not given (their parser default is None, see _add_collect_options)."""
    for name, default in _ZOO_DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, default)


def _dataset(text: str) -> str | None:
    return None if text.lower() == "none" else text


def _cmd_baseline_create(args: argparse.Namespace) -> int:
    from .api import ProfileBaseline

    if args.output.suffix == ".gz":
        raise ValueError(f"{args.output}: baseline files are plain JSON (reviewable in a diff); use a .json name")
    _refuse_overwrite(args.output, args.force)
    _zoo_defaults(args)
    baseline = ProfileBaseline.create(model=args.model, dataset=_dataset(args.dataset), hardware=args.hardware,
                                      tag=args.tag, steps=args.steps, seed=args.seed,
                                      max_seq_len=args.max_seq_len, seq_len=args.seq_len,
                                      params=_params(args.param))
    baseline.collect()
    baseline.save(args.output)
    run = baseline.run
    _print(f"wrote {args.output}: {args.model} on {run.hardware} x {run.devices}, {run.steps} steps, "
           f"{len(run.ops)} op types")
    return EXIT_OK


def _cmd_baseline_show(args: argparse.Namespace) -> int:
    from .api import ProfileFileError, load_any
    from .files.baseline import BaselineFile
    from .report.text import baseline_text

    file = load_any(args.baseline)
    if not isinstance(file, BaselineFile):
        raise ProfileFileError(f"{args.baseline}: is a profile, not a baseline file; 'oam compare' reads profiles")
    _print(file.model_dump_json(indent=2) if args.format == "json" else baseline_text(file, args.format))
    return EXIT_OK


def _cmd_collect(args: argparse.Namespace) -> int:
    from .api import collect_profile, save_profile

    _refuse_overwrite(args.output, args.force)
    if args.torch:
        from .torch_step import collect_torch

        profile = collect_torch(args.torch, args.setup, hardware=args.hardware, steps=args.steps,
                                given=_given_zoo_options(args))
        save_profile(profile, args.output)
        _print(f"wrote {args.output}: {profile.hardware} x {profile.devices}, {profile.steps} steps, "
               f"{len(profile.ops)} op records")
        return EXIT_OK
    if args.setup:
        raise ValueError("--setup goes with --torch (a zoo model needs no setup)")
    _zoo_defaults(args)
    profile = collect_profile(args.model, _dataset(args.dataset), hardware=args.hardware, steps=args.steps,
                              seed=args.seed, max_seq_len=args.max_seq_len, focus=args.focus,
                              context_ops=args.context_ops, seq_len=args.seq_len, params=_params(args.param))
    save_profile(profile, args.output)
    kept = f", {len(profile.op_summaries)} summaries" if profile.focus else ""
    _print(f"wrote {args.output}: {profile.hardware} x {profile.devices}, {profile.steps} steps, "
           f"{len(profile.ops)} op records{kept}")
    return EXIT_OK


def _given_zoo_options(args: argparse.Namespace) -> list[str]:
    """The zoo-model options given on the command line (meaningless with --torch)."""
    given = [f"--param {key}" for key, _ in args.param]
    given += [f"--{name.replace('_', '-')}" for name in _ZOO_DEFAULTS if getattr(args, name) is not None]
    if args.seq_len is not None:
        given.append("--seq-len")
    if args.focus is not None or args.context_ops is not None:
        given.append("--focus/--context-ops")
    return given


def _min_delta_s(min_delta_us: float) -> float:
    from simulator.units import S_PER_US

    if not min_delta_us >= 0 or min_delta_us == float("inf"):
        raise ValueError(f"--min-delta-us must be a finite number >= 0, got {min_delta_us:g}")
    return min_delta_us * S_PER_US  # not display: the option's microseconds into seconds


def _cmd_compare(args: argparse.Namespace) -> int:
    from .api import compare_profiles, load_any
    from .judge.compare import check_alpha
    from .judge.thresholds import parse_entry

    try:
        check_alpha(args.alpha)
    except ValueError as exc:
        raise ValueError(f"--alpha: {exc}") from None
    default, per_op = "10%", {}
    for entry in args.threshold:
        if "=" in entry:
            op, limit = parse_entry(entry)
            per_op[op] = limit
        else:
            default = entry
    report = compare_profiles(load_any(args.baseline), load_any(args.current), regression_threshold=default,
                              thresholds=per_op,
                              min_delta_s=None if args.min_delta_us is None else _min_delta_s(args.min_delta_us),
                              alpha=args.alpha)
    _print({"text": report.to_text, "json": report.to_json, "markdown": report.to_markdown}[args.format]())
    from .judge.status import GateStatus

    # regressed, missing-ops and incomparable fail (no-baseline cannot happen here)
    return EXIT_FAILED if GateStatus(report.status).fails(strict=True) else EXIT_OK


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibrate import DEFAULT_MIN_KERNELS, calibrate, calibration_text

    min_kernels = DEFAULT_MIN_KERNELS if args.min_kernels is None else args.min_kernels
    replaced = args.output.exists()  # calibrate() refuses anything but a file it wrote
    try:
        calibration = calibrate(args.profiles, args.output, args.hardware, min_kernels)
    except OSError as exc:  # the write: name -o, whatever the errno text says
        raise OSError(f"-o {args.output}: cannot write it: {exc.strerror or exc}") from None
    if args.format == "json":
        import json

        _print(json.dumps(calibration, indent=2, sort_keys=True))
    else:
        _print(calibration_text(calibration, args.output, "github" if args.format == "markdown" else "simple"))
        if replaced:  # the spec keeps its name: baselines made with the old figures now differ from it
            _print(f"replaced the earlier calibration in {args.output}: baselines saved with it were made with its "
                   "old figures and now compare against the new ones; save them again (--oam-save-baseline)")
    return EXIT_OK


def _cmd_sweep(args: argparse.Namespace) -> int:
    import json

    from .properties.perf import check_attrs
    from .properties.sweep import (
        check_plot,
        parse_axes,
        plot_sweep,
        run_sweep,
        worst_table,
    )

    axes = parse_axes(args.op, args.axis)
    dtypes = list(dict.fromkeys(args.dtype or ["fp16"]))
    attrs = check_attrs(args.op, _params(args.param))
    if args.plot:
        check_plot(args.plot, axes, dtypes, args.force)  # before the sweep, not after
    results = run_sweep(args.op, axes, dtypes, args.hardware, attrs)
    if args.format == "json":
        _print(json.dumps([{"shape": m.shape, "dtype": m.dtype, "time_s": m.time_s, "flop": m.flop,
                            "efficiency_frac": m.efficiency_frac, "findings": m.findings} for m in results], indent=2))
    else:
        _print(f"{args.op} on {results[0].hardware}: {len(results)} shapes; the {min(args.top, len(results))} "
               "least efficient:")
        _print(worst_table(results, args.top, "github" if args.format == "markdown" else "simple"))
    if args.plot:
        plot_sweep(results, axes, args.plot)
        _print(f"wrote {args.plot.resolve()}", file=sys.stderr if args.format == "json" else sys.stdout)
    return EXIT_OK


def _cmd_tune(args: argparse.Namespace) -> int:
    import json

    from .format import fmt_percent
    from .tuning.search import auto_tune, load_job, result_table

    options, target, space, workload = load_job(args.job)
    if args.replace and args.save is None:
        raise ValueError("--replace: replaces a knowledge base record only together with --save PATH")
    if args.save is not None:
        from .tuning.knowledge_base import KnowledgeBase

        if target.operator is None:
            raise ValueError(f"--save: {args.job} tunes the whole step; the knowledge base records an operator's "
                             "tuning (set operator in the job)")
        KnowledgeBase.load(args.save)  # a corrupt or foreign file stops us before any evaluation
    result = auto_tune(target=target, param_space=space, workload=workload, **options)
    saved = save_error = None
    if args.save is not None and result.best is not None:
        try:
            saved = result.save_to(args.save, replace=args.replace,
                                   workload=f"{workload.__module__}:{getattr(workload, '__name__', '?')}")
        except ValueError as exc:  # KnowledgeBaseError, TuneError: print the results all the same
            save_error = f"--save: nothing recorded: {exc}"
    if args.format == "json":
        _print(json.dumps({"best": result.best_params, "best_metrics": None if result.best is None else result.best.metrics,
                           "default_metrics": result.default.metrics, "improvement_frac": result.improvement_frac,
                           "unique_evaluations": result.unique_evaluations, "exhaustive": result.exhaustive,
                           "stopped_early": result.stopped_early, "infeasible": result.infeasible,
                           "closest": [{"params": t.params, "reason": t.reason} for t in result.closest],
                           "saved_to": None if saved is None else str(args.save)},
                          indent=2, default=str))
    else:
        how = "exhaustive" if result.exhaustive else "TPE" if result.sampler == "tpe" else result.sampler
        if result.stopped_early:
            how += (f", stopped early: no better configuration in the last {options['patience']} evaluations; "
                    "early_stopping = false in the job uses all of max_iterations")
        infeasible = f", {result.infeasible} infeasible" if result.infeasible else ""
        _print(f"{result.unique_evaluations} configurations evaluated ({how}){infeasible}; target: {target.metric}"
               + (f" of {target.operator}" if target.operator else "") + (f", {target.constraint}" if target.constraint else ""))
        _print(result_table(result, args.top, "github" if args.format == "markdown" else "simple"))
        if result.best is None:
            _print("no feasible configuration; the closest:")
            for t in result.closest:
                _print(f"  {_one_line(t.params)}: {_one_line(t.reason)}")
        elif result.improvement_frac is not None:
            improvement = fmt_percent(result.improvement_frac, 1, signed=True)
            _print(f"best: {result.best_params}, {improvement} over the default"
                   + ("" if result.default.feasible else f" (the default is infeasible: {result.default.reason})"))
        if saved is not None:
            _print(f"recorded in {args.save}: {saved.describe()}")
        elif args.save is not None and save_error is None:
            _print(f"nothing recorded in {args.save}: no feasible configuration")
    if save_error is not None:
        _print(f"oam tune: error: {_one_line(save_error)}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK if result.best is not None else EXIT_FAILED


def _cmd_replay(args: argparse.Namespace) -> int:
    import json

    from .gate.record import load_record, replay, what_if, what_if_table
    from .report.text import diagnosis_text

    record = load_record(args.record)
    if args.hardware:
        result = what_if(record, args.hardware)
        if args.format == "json":
            _print(json.dumps([{"run": i + 1, "recorded_hardware": old.hardware, "hardware": new.hardware,
                                "recorded_step_time_s": old.step_time_s, "step_time_s": new.step_time_s,
                                "op_time_s": {t: new.op_time_s(t) for t in new.op_types}}
                               for i, (old, new) in enumerate(result.runs)], indent=2))
            return EXIT_OK
        _print(f"{_one_line(record.nodeid)}: the recorded op sequence simulated on {args.hardware} "
               f"(simulator {result.runs[0][1].simulator_version}; allocation stalls as recorded)")
        _print(what_if_table(result, "github" if args.format == "markdown" else "simple"))
        return EXIT_OK
    outcome = replay(record)
    if args.format == "json":
        _print(json.dumps({"nodeid": record.nodeid, "test_outcome": record.test_outcome,
                           "same_as_recorded": outcome.same,
                           "differences": outcome.differences, "not_replayed_rules": outcome.not_replayed_rules,
                           "gate": outcome.report.model_dump(mode="json")}, indent=2))
    else:
        report = outcome.report
        _print(f"replay of {_one_line(record.nodeid)} (recorded {_one_line(record.created_utc)} with pytest-oam "
               f"{_one_line(record.pytest_oam_version)}, simulator {_one_line(record.simulator_version)}): "
               f"gate status {report.status}"
              + (", the gate FAILED" if report.failed else ", the gate passed")
              + ("; the test itself FAILED" if record.test_outcome == "failed" else ""))
        if outcome.failure_text:
            _print(outcome.failure_text)
        if report.diagnosis:
            _print("oam diagnosis:")
            _print(diagnosis_text(report.diagnosis, indent="    "))
        if outcome.not_replayed_rules:
            _print("not replayed (rules registered by a plugin): " + _one_line(", ".join(outcome.not_replayed_rules)))
        if outcome.same:
            _print("same verdicts and findings as recorded")
        else:
            _print("DIFFERS from the recorded result: " + _one_line("; ".join(outcome.differences)))
        if record.test_outcome == "failed":
            _print("note: the test itself failed when recorded (its own error, not the gate's); "
                   "the profiles above are what it ran before failing")
    failed = outcome.report.failed or record.test_outcome == "failed"
    return EXIT_FAILED if failed or not outcome.same else EXIT_OK


def _cmd_trace(args: argparse.Namespace) -> int:
    import gzip

    from simulator.profile import Profile

    from .api import ProfileFileError, load_any
    from .files.fileio import atomic_write_bytes
    from .report.trace import dump_chrome_trace

    _refuse_overwrite(args.output, args.force)
    profile = load_any(args.profile)
    if not isinstance(profile, Profile):
        raise ProfileFileError(f"{args.profile}: is a baseline file; a trace needs a profile (oam collect)")
    data = dump_chrome_trace(profile, name=str(args.profile)).encode("utf-8")
    atomic_write_bytes(args.output, gzip.compress(data, mtime=0) if args.output.suffix == ".gz" else data)
    _print(f"wrote {args.output}: {len(profile.ops)} ops; open it in https://ui.perfetto.dev")
    if profile.op_summaries:  # a focused profile keeps only per-step sums of the other ops: no slices
        left = sum(s.count for s in profile.op_summaries)
        left_s = sum(s.duration_s for s in profile.op_summaries)
        share = left_s / (left_s + sum(op.duration_s for op in profile.ops) or 1.0)
        _print(f"note: a focused profile (focus {profile.focus!r}): {left:,} other ops ({share:.0%} of the op time) "
               "are summarised per step and not in the trace; collect without --focus for the whole timeline")
    return EXIT_OK


def _cmd_cluster(args: argparse.Namespace) -> int:
    from .cluster import cluster_analysis, cluster_json, cluster_text
    from .judge.thresholds import ThresholdError, parse_limit

    try:
        threshold = parse_limit(args.threshold)
    except ThresholdError as exc:
        raise ThresholdError(f"--threshold: {exc}") from None
    analysis = cluster_analysis(args.path, threshold)
    _print(cluster_json(analysis) if args.format == "json"
           else cluster_text(analysis, "github" if args.format == "markdown" else "simple"))
    return EXIT_FAILED if analysis.slow_ranks else EXIT_OK


def _cmd_models(args: argparse.Namespace) -> int:
    from simulator.datasets import DATASETS
    from simulator.hardware import list_hardware

    from .api import MODEL_PARAMETERS, known_models

    _print("models:   " + ", ".join(known_models()))
    _print("parameters (--param KEY=VALUE):")
    for name, (kind, meaning) in sorted(MODEL_PARAMETERS.items()):
        _print(f"  {name} ({kind.__name__}): {meaning}")
    _print("datasets: " + ", ".join(sorted(DATASETS)) + ", none")
    _print("hardware: " + ", ".join(list_hardware()) + " (add ' x N' for N cards, e.g. 'Ascend 910 x 8')")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``oam`` command; returns the exit code."""
    from .files.baseline import BaselineError
    from .judge.thresholds import ThresholdError

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["validate"]:  # its options live with the validation itself
        from .kernel_replay import main as replay_main
        from .kernel_replay import profile_help, wants_profile

        if wants_profile(argv[1:]):  # a real profile, kernel by kernel
            return replay_main(argv[1:])
        if "--pipes" in argv[1:]:  # an option of the --profile form only
            print("oam validate: error: --pipes compares a real profile's units: give it with --profile DIR",
                  file=sys.stderr)
            return 2
        from simulator.validation import main as validate_main

        try:
            return validate_main(argv[1:])
        except SystemExit as exc:
            if exc.code == 0:  # its --help: the --profile form's options too
                _print("\n" + profile_help())
            raise
    args = parser.parse_args(argv)
    handler = {
        ("baseline", "create"): _cmd_baseline_create,
        ("baseline", "show"): _cmd_baseline_show,
        ("collect", None): _cmd_collect,
        ("compare", None): _cmd_compare,
        ("models", None): _cmd_models,
        ("sweep", None): _cmd_sweep,
        ("replay", None): _cmd_replay,
        ("trace", None): _cmd_trace,
        ("cluster", None): _cmd_cluster,
        ("tune", None): _cmd_tune,
        ("calibrate", None): _cmd_calibrate,
    }[(args.command, getattr(args, "action", None))]
    from simulator.allocator import (
        OutOfMemoryError,  # a RuntimeError: a workload or shape the card cannot hold
    )

    try:
        return handler(args)
    except (BaselineError, ThresholdError, ValueError, OSError, ImportError, OutOfMemoryError) as exc:  # TuneError is a ValueError
        _print(f"oam {args.command}: error: {_one_line(exc)}", file=sys.stderr)  # one line, whatever the file held
        return EXIT_USAGE


def console_main() -> None:
    """The ``oam`` console script: :func:`main`, stopping quietly when its output pipe closes
    (``oam validate | head``), as Unix tools do."""
    import signal

    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    console_main()
