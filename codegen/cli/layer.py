"""The linear layer's commands: ``codegen tune-linear`` and ``codegen tune-model`` tune a layer's or
a model's GEMMs (codegen.nn.tune) and with ``--bundle`` write the store's kernels as a bundle with
their verdicts against cuBLAS (codegen.nn.verdict; forward GEMMs of few rows judged again in engine
timing, codegen.nn.timing); ``codegen pick-step`` picks a tuned layer's kernels by the train step's
time into a bundle (codegen.nn.step, codegen.nn.bundle)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from codegen import families
from codegen.cli.checks import check_cache, check_store, check_writable, open_store
from codegen.cli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, Failure, UsageError
from codegen.cli.options import DEFAULT_DTYPE, Commands, add_db_arg, add_gpu_args, positive_int, take_recorded
from codegen.cli.search import read_recording, search_seeds
from codegen.nn.verdict import ENGINE_MAX_M, MARGIN
from codegen.problem import DType, Layout
from search import DEFAULT_SAMPLER, SAMPLERS


def register(commands: Commands) -> None:
    p = commands.add("tune-linear", "tune the three GEMMs of one linear layer (forward, grad_input, grad_weight)")
    add_shape_args(p)
    p.add_argument("--dtype", choices=[d.value for d in DType], default=None,
                   help=f"element type (default: {DEFAULT_DTYPE}; with --replay, the recording's)")
    p.add_argument("--bias", action="store_true", help="the layer has a bias (forward adds b, grad_weight gives db; "
                   "with --replay: as the recording)")
    add_tune_args(p)
    p.set_defaults(func=cmd_tune_linear)

    p = commands.add("pick-step", "pick a tuned layer's three kernels by the train step's time (CUDA graph replays), "
                     "into a bundle; needs torch and a GPU")
    add_shape_args(p)
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32", help="element type")
    p.add_argument("--bias", action="store_true", help="the layer has a bias")
    p.add_argument("--bundle", type=Path, required=True, metavar="DIR",
                   help="folder to write the bundle to (the layer's picks; the store's own pick for any other problem)")
    p.add_argument("--candidates", type=positive_int, default=12,
                   help="stored kernels tried per GEMM, fastest alone first")
    p.add_argument("--reps", type=positive_int, default=30, help="timed graph replays per step tried")
    p.add_argument("--quiet", action="store_true", help="no line per step tried")
    p.add_argument("--verdict-step", action="store_true",
                   help="also judge each picked GEMM against torch's op inside the train step (the step with it on "
                        "ours against the step with it on torch's op) and record that verdict (timing train_step) "
                        "in the bundle, where it decides over the search's cold single calls")
    add_margin_arg(p)
    add_db_arg(p)
    p.set_defaults(func=cmd_pick_step)

    p = commands.add("tune-model", "tune every linear layer of a PyTorch model (nn.Linear, block-sparse, 2:4; "
                     "identical shapes once); needs torch")
    p.add_argument("model", metavar="MODEL", help="FILE.py:FACTORY (called with no arguments) or a module saved "
                   "whole with torch.save (.pt/.pth)")
    p.add_argument("--batch", type=positive_int, required=True, nargs="+",
                   help="rows of X (tokens per step) for every layer; several: the layers at each")
    p.add_argument("--dtype", choices=[d.value for d in DType], default=None,
                   help="element type (default: each layer's weight dtype)")
    p.add_argument("--pruned", type=Path, metavar="FILE", default=None,
                   help="a pruned model of MODEL written by `codegen prune`: the layers it prunes to blocks are tuned "
                        "as their block-sparse GEMMs on the file's patterns (forward, grad_input, sampled grad_weight), "
                        "those it prunes to 2:4 as their 2:4 forward alone (fp16 or bf16; their backward runs on "
                        "torch), the others as dense (default: none)")
    p.add_argument("--layers", metavar="REGEX", default=None,
                   help="tune only the linear layers whose qualified name this regular expression matches (re.search) "
                        "(default: every one)")
    add_tune_args(p)
    p.set_defaults(func=cmd_tune_model)


def add_shape_args(p: argparse.ArgumentParser) -> None:
    """The layer's shape, as tune-linear and pick-step take it: --batch, --in, --out."""
    p.add_argument("--batch", type=positive_int, required=True, help="rows of X (tokens per step)")
    p.add_argument("--in", dest="in_features", type=positive_int, required=True, metavar="IN", help="in features")
    p.add_argument("--out", dest="out_features", type=positive_int, required=True, metavar="OUT",
                   help="out features")


def add_tune_args(p: argparse.ArgumentParser) -> None:
    """What tune-linear and tune-model share with ``codegen search``, and --layout."""
    p.add_argument("--layout", choices=[layout.value for layout in Layout], action="append", default=None,
                   help="tune only this GEMM of each layer; repeat it for several (default: all three, and a 2:4 "
                        "layer's forward alone, its backward on torch; inference needs forward alone)")
    p.add_argument("--family", choices=families.names(), action="append", default=None,
                   help="kernel family whose space is searched; repeat it for several (each GEMM is searched in "
                        "each; the store keeps all and a bundle takes the fastest). default: every family that fits "
                        "the GEMM, as codegen search takes them: fp32 simt; fp16 and bf16 hopper (sm_90) and "
                        "tensorcore, and direct for a block-sparse W; hopper_sp24 (sm_90) and sparse24 for a 2:4 W; tf32 "
                        "tensorcore. A family that does not compute a GEMM (a dense one for a 2:4 W) skips it")
    p.add_argument("--budget", type=positive_int, default=200, help="evaluated trials per GEMM and family")
    p.add_argument("--sampler", default=DEFAULT_SAMPLER, choices=list(SAMPLERS),
                   help=f"sampler (default {DEFAULT_SAMPLER}, as codegen search)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed")
    p.add_argument("--restricted", action="store_true", help="search the restricted space")
    p.add_argument("--no-warm-start", action="store_true", help="start from the family's built-in seeds only")
    p.add_argument("--replay", type=Path, metavar="FILE",
                   help="answer from a recorded sweep, no GPU: only the GEMM it recorded is tuned, the others "
                        "are skipped (default: none, measure on the GPU)")
    add_gpu_args(p, timeout=30.0)
    p.add_argument("--no-store", action="store_true", help="do not record the trials")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip cuBLAS (torch) timing (a bundle's verdicts are then unknown: codegen.nn runs ours)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_verdict_args(p)


def margin_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"a margin lies in [0, 1), got {text}")
    return value


def add_margin_arg(p: argparse.ArgumentParser) -> None:
    """The noise margin a bundle's verdicts are judged at (codegen.nn.verdict.MARGIN)."""
    p.add_argument("--margin", type=margin_value, default=MARGIN,
                   help="noise margin of the verdicts: ours wins a GEMM only where cuBLAS's median over ours "
                        "exceeds 1 + MARGIN (a tie goes to cuBLAS)")


def add_verdict_args(p: argparse.ArgumentParser) -> None:
    """--bundle, --margin and --no-engine-verdict, as tune-linear and tune-model take them."""
    p.add_argument("--bundle", type=Path, metavar="DIR", default=None,
                   help="after tuning, write the store's kernels as a bundle (as `codegen export --bundle`) with "
                        "each GEMM's verdict against cuBLAS; forward GEMMs of at most "
                        f"{ENGINE_MAX_M} rows are judged again in engine timing on this GPU (default: none)")
    add_margin_arg(p)
    p.add_argument("--no-engine-verdict", action="store_true",
                   help="with --bundle: keep the search's cold single-call verdicts, no engine timing")



def cmd_tune_linear(args: argparse.Namespace) -> int:
    from codegen.nn.tune import LayerShape, layer_problems

    gpu_unless_replay(args)
    if args.replay:  # the recording gives the dtype (and the bias) its GEMM was measured with
        recorded = read_recording(args.replay).problem
        take_recorded(args, args.replay, recorded.key, {
            "dtype": ("--dtype", recorded.dtype.value),
            **({"bias": ("--bias", recorded.bias)} if recorded.layout is not Layout.grad_input else {})})
    shape = LayerShape(args.batch, args.in_features, args.out_features, DType(args.dtype or DEFAULT_DTYPE), args.bias)
    layouts = asked_layouts(args)
    print(f"layer {shape.describe()}: {', '.join(layouts[:-1]) + ' and ' if len(layouts) > 1 else ''}{layouts[-1]} "
          f"GEMM{'s' if len(layouts) > 1 else ''}", file=sys.stderr)
    problems = {p: v for p, v in layer_problems({shape: ["layer"]}).items() if p.layout.value in layouts}
    return run_tuning(args, problems)


def asked_layouts(args: argparse.Namespace) -> list[str]:
    """The GEMMs of each layer --layout asks for (all three when not given), in the layer's order."""
    asked = set(args.layout or [layout.value for layout in Layout])
    return [layout.value for layout in Layout if layout.value in asked]


def cmd_pick_step(args: argparse.Namespace) -> int:
    """``codegen pick-step``: a layer's three kernels picked by the train step's time (codegen.nn.step),
    written as a bundle with the timings beside its index (step-pick.json)."""
    import datetime as dt

    dtype = DType(args.dtype)
    if dtype not in (DType.fp32, DType.fp16, DType.bf16):
        raise UsageError(f"--dtype {dtype.value}: pick-step runs the layer in torch, whose dtypes are fp32, fp16, bf16")
    from codegen.worker import NoGpu, require_gpu

    require_gpu()
    try:
        import torch
    except ImportError:
        raise UsageError("pick-step times the layer's train step in torch: install the torch extra "
                         "(pip install 'gemmscape[torch]')") from None
    if not torch.cuda.is_available():
        raise NoGpu(f"torch {torch.__version__} sees no CUDA GPU" + ("" if torch.version.cuda else
                                                                       " (a CPU-only build of torch)"))
    from codegen.export import export_kernel
    from codegen.nn import step as steps
    from codegen.nn.bundle import Bundle, pick_stored, write_bundle
    from codegen.versions import versions

    check_writable(args.bundle, "--bundle", folder=True)
    store = open_store(args.db, read_only=True)
    device = torch.cuda.get_device_name()
    step = steps.Step(args.batch, args.in_features, args.out_features, dtype, args.bias)
    try:
        found = steps.pick(store, step, device, args.candidates, args.reps,
                           progress=(lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr)))
    except ValueError as e:
        raise Failure(str(e)) from None
    by_key = {step.problems[lay].key: row for lay, row in found["chosen"].items()}

    def choose(st, problem, rows):  # the step's choice for the layer's GEMMs, the store's own for any other
        row = by_key.get(problem.key)
        if row is None or row["device"] != rows[0]["device"]:
            return pick_stored(st, problem, rows)
        return (row, *export_kernel(st, row["kernel"], problem, arch=row["arch"], source_hash=row["source_hash"],
                                    device_id=row["device_id"]))

    index = write_bundle(store, args.bundle, choose=choose, margin=args.margin)
    judged = {}
    if args.verdict_step:
        judged = steps.judge(step, found["files"], args.reps, margin=args.margin)
        bundle = Bundle(args.bundle)
        for lay, (verdict, status) in judged.items():
            if verdict is not None:
                bundle.set_verdict(step.problems[lay], device, verdict)
            print(f"{lay.value:11s} in the step against torch's op: "
                  + (verdict.describe() if verdict is not None else f"no verdict ({status})"), file=sys.stderr)
        bundle.save()
        index = bundle.index
    doc = {"suite": "step_pick", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "device": device,
           "versions": {**versions(), "torch": torch.__version__}, "command": "codegen " + " ".join(sys.argv[1:]),
           "layer": {"batch": args.batch, "in": args.in_features, "out": args.out_features, "dtype": dtype.value,
                     "bias": args.bias},
           "timing": {"reps": args.reps, "rounds": 5, "l2_flush_bytes": steps.FLUSH_BYTES,
                      "note": "CUDA-event-timed graph replays of forward + autograd.grad, the L2 flushed before each"},
           "chosen": {lay.value: r["kernel"] for lay, r in found["chosen"].items()},
           "store_pick": {lay.value: r["kernel"] for lay, r in found["store_pick"].items()},
           "final": found["final"], "trials": found["trials"],
           "verdicts": {lay.value: (v.to_dict() if v is not None else {"status": st}) for lay, (v, st) in judged.items()}}
    (args.bundle / "step-pick.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    fin = found["final"]
    for lay, row in found["chosen"].items():
        print(f"{lay.value:11s} {row['kernel']}" + ("" if row["id"] == found["store_pick"][lay]["id"] else
                                                   f"  (the store's pick: {found['store_pick'][lay]['kernel']})"))
    print(f"train step {fin['chosen']['median_us']:.1f} us (range {fin['chosen']['min_us']:.1f}-"
          f"{fin['chosen']['max_us']:.1f}) against {fin['store_pick']['median_us']:.1f} us with the store's pick; "
          f"wrote {len(index['kernels'])} kernels and {args.bundle / 'index.json'}")
    return EXIT_OK


def cmd_tune_model(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError("tune-model reads a PyTorch model: pip install 'gemmscape[torch]'") from None
    from codegen.nn.tune import SPARSE24_BACKWARD, Sparse24Shape, SparseShape, layer_problems, linear_layers, load_model

    gpu_unless_replay(args)
    batches = list(dict.fromkeys(args.batch))
    pruned = read_pruned_patterns(args.pruned) if args.pruned is not None else None
    try:
        model = load_model(args.model)
        shapes = {}
        for batch in batches:
            shapes.update(linear_layers(model, batch, DType(args.dtype) if args.dtype else None, pruned=pruned,
                                        layers=args.layers))
    except ValueError as e:
        raise UsageError(f"{args.model}: {e}") from None
    if not shapes:
        raise Failure(f"{args.model} has no nn.Linear layer")
    layers = sum(len(v) for v in shapes.values()) // len(batches)
    sparse_layers = sum(len(v) for s, v in shapes.items() if isinstance(s, SparseShape)) // len(batches)
    names24 = list(dict.fromkeys(n for s, v in shapes.items() if isinstance(s, Sparse24Shape) for n in v))
    kinds = [f"{n} with a {what} W" for n, what in ((sparse_layers, "block-sparse"), (len(names24), "2:4")) if n]
    at = f"batch {batches[0]}" if len(batches) == 1 else f"batches {', '.join(map(str, batches))}"
    print(f"{layers} linear layer{'s' if layers != 1 else ''}" + (f" ({', '.join(kinds)})" if kinds else "")
          + f", {len(shapes)} distinct shape{'s' if len(shapes) != 1 else ''} at {at}:", file=sys.stderr)
    for shape, names in shapes.items():
        print(f"  {shape.describe()}: {_shown(names)}", file=sys.stderr)
    layouts = asked_layouts(args)
    backward = [lay for lay in layouts if lay != Layout.forward.value]
    if names24 and backward:  # said once: a 2:4 layer has its forward GEMM alone
        print(f"the 2:4 layer{'s' if len(names24) != 1 else ''} {_shown(names24)}: {' and '.join(backward)} not "
              f"tuned, {SPARSE24_BACKWARD}", file=sys.stderr)
    problems = {p: v for p, v in layer_problems(shapes).items() if p.layout.value in layouts}
    if not problems:
        raise UsageError(f"--layout {', '.join(layouts)}: no GEMM to tune: the layers chosen are 2:4, whose backward "
                         f"runs on torch (tune their forward)")
    return run_tuning(args, problems)


def _shown(names: list[str]) -> str:
    """Layer names as a listing shows them: the first four, then how many in all."""
    return ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")


def read_pruned_patterns(path: Path) -> dict:
    """``--pruned``: the file's pruned layers and their patterns (codegen.nn.pruned.read_patterns); a
    file that is not one is a usage error."""
    try:
        import safetensors  # noqa: F401
    except ImportError:
        raise UsageError("--pruned reads a safetensors file: pip install safetensors") from None
    from codegen.nn.pruned import PruneError, read_patterns

    if not path.is_file():
        raise UsageError(f"--pruned {path}: no such file (write one with `codegen prune MODEL ... --out FILE`)")
    try:
        return read_patterns(path)
    except PruneError as e:
        raise UsageError(f"--pruned {e}") from None


def gpu_unless_replay(args: argparse.Namespace) -> None:
    """Without --replay the GEMMs are measured: no GPU is said first (codegen.worker.NoGpu), before
    anything is printed or the store is opened (and created)."""
    if not args.replay:
        from codegen.worker import require_gpu

        require_gpu()


def run_tuning(args: argparse.Namespace, problems: dict) -> int:
    """Tune ``problems`` (Problem -> layer names) as tune-linear and tune-model ask; a summary table."""
    from codegen.nn.tune import tune
    from codegen.versions import versions
    from search.measure import ReplayError, ReplayMeasurer

    asked = args.family  # None: every family that fits each GEMM (codegen.nn.tune.families_for)
    space_name = "restricted" if args.restricted else "full"
    seeding = argparse.Namespace(no_seeds=False, no_warm_start=args.no_warm_start, sampler=args.sampler, seed=args.seed)
    results_skipped = []
    if args.replay:
        try:
            recorded = ReplayMeasurer(args.replay)
        except ReplayError as e:
            raise UsageError(str(e)) from None
        if asked and set(asked) != {recorded.space.family}:
            raise UsageError(f"{args.replay} records the {recorded.space.family} family, not "
                             f"{', '.join(dict.fromkeys(asked))}")
        space_name = "replay"
        for p in [p for p in problems if p != recorded.problem]:
            print(f"skip {p.key}: {args.replay} records {recorded.problem.key}", file=sys.stderr)
            results_skipped.append(p)
        problems = {p: v for p, v in problems.items() if p == recorded.problem}

        def make_measurer(problem):
            return ReplayMeasurer(args.replay, problem)
    else:
        check_cache()
        from search.parallel import gpu_measurer

        def make_measurer(problem):
            return gpu_measurer(problem, None, arch=args.arch, timeout_s=args.timeout, baseline=not args.no_baseline)
    if args.bundle is not None:
        if args.no_store:
            raise UsageError("--bundle writes the store's kernels: drop --no-store")
        check_writable(args.bundle, "--bundle", folder=True)
    if not args.no_store:
        check_store(args.db)
    store = None if args.no_store else open_store(args.db)

    def seeds_for(problem, space, measurer, store):
        return search_seeds(seeding, problem, space, space_name, measurer, store)

    try:
        results = tune(problems, list(dict.fromkeys(asked)) if asked else None, make_measurer, budget=args.budget, store=store, sampler=args.sampler,
                       seed=args.seed, restricted=args.restricted, progress=not args.quiet,
                       say=lambda line: print(line, file=sys.stderr), seeds_for=seeds_for,
                       command="codegen " + " ".join(sys.argv[1:]), versions=versions(),
                       space=recorded.space if args.replay else None)
    except KeyboardInterrupt as e:
        print(f"codegen {args.command}: {e or 'interrupted'}", file=sys.stderr)
        if args.bundle is not None and store is not None:  # what was stored so far, without engine timing
            args.no_engine_verdict = True
            try:
                write_verdict_bundle(args, store, list(problems), replayed=bool(args.replay))
            except Exception as e2:  # noqa: BLE001  (the interruption is what to report)
                print(f"codegen {args.command}: no bundle written: {type(e2).__name__}: {e2}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(tuning_table(results, results_skipped))
    tuned = any(r.summary is not None and r.summary.best for r in results)
    if store is not None and tuned and args.bundle is None:
        print(f"stored in {store.location}: `codegen export --bundle DIR` writes them for codegen.nn", file=sys.stderr)
    if args.bundle is not None and tuned:
        write_verdict_bundle(args, store, list(problems), replayed=bool(args.replay))
    return EXIT_OK if tuned else EXIT_FAILURE


def write_verdict_bundle(args: argparse.Namespace, store, problems: list, replayed: bool) -> None:
    """``--bundle``: the store's kernels as a bundle with their verdicts (codegen.nn.bundle.write_bundle),
    the forward GEMMs of few rows judged again in engine timing unless that cannot run here or is
    declined; a table of the verdicts of ``problems`` (the GEMMs tuned now)."""
    from codegen.nn.bundle import Bundle, verdict_summary, write_bundle
    from codegen.nn.timing import judge_in_engine_timing

    index = write_bundle(store, args.bundle, margin=args.margin)
    for s in index["skipped"]:
        print(f"skipped {s['problem']} on {s['device']}: {s['reason']}", file=sys.stderr)
    bundle = Bundle(args.bundle)
    for e in bundle.entries:  # a block-sparse GEMM is timed on its pattern: each known here, from the store
        if e["problem"].get("block") and e["problem"].get("pattern"):
            store.pattern(e["problem"]["pattern"], register=True)
    why = engine_unavailable(args, replayed)
    if why is None:
        judge_in_engine_timing(bundle, margin=args.margin, say=lambda line: print(line, file=sys.stderr))
        bundle = Bundle(args.bundle)
    elif any(p.layout is Layout.forward and p.m <= ENGINE_MAX_M for p in problems):
        print(f"no engine timing ({why}): the forward GEMMs of at most {ENGINE_MAX_M} rows keep their cold "
              f"single-call verdicts, where a win of ours is unknown (codegen.nn runs ours, and says so)",
              file=sys.stderr)
    print(verdict_table(bundle.entries, {p.key for p in problems}))
    counts = verdict_summary(bundle.index)
    print(f"wrote {len(bundle.entries)} kernels and {args.bundle / 'index.json'}: ours won {counts['ours']}, "
          f"cuBLAS {counts['cublas']}, unknown {counts['unknown']} (margin {args.margin:g})")


def engine_unavailable(args: argparse.Namespace, replayed: bool) -> str | None:
    """Why engine timing cannot judge here (None: it can)."""
    if args.no_engine_verdict:
        return "--no-engine-verdict"
    if replayed:
        return "tuned from a recording, no GPU"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    return None


def verdict_table(entries: list[dict], keys: set[str]) -> str:
    """One line per bundle entry whose problem is in ``keys``: problem, device, kernel, verdict."""
    from codegen.nn.verdict import Verdict
    from codegen.problem import Problem

    lines = [f"{'problem':34s} {'kernel':62s} verdict"]
    for e in entries:
        if e["key"] not in keys:
            continue
        v = Verdict.from_dict(e.get("verdict"), Problem.from_dict(e["problem"]))
        lines.append(f"{e['key']:34s} {e['kernel'][:62]:62s} {v.describe() if v else 'unknown (no verdict)'}")
    return "\n".join(lines)


def tuning_table(results: list, not_recorded: list | None = None) -> str:
    """One line per GEMM and family searched: layout, problem, the best kernel or why none, and what it
    serves; where several families ran a GEMM, ``*`` marks the fastest (what a bundle takes)."""
    fastest: dict = {}
    for r in results:
        best = r.summary.best if r.summary is not None else None
        if best and best["tflops"] > fastest.get(r.problem, (None, -1.0))[1]:
            fastest[r.problem] = (r, best["tflops"])
    several = {p for p in fastest
               if sum(r.problem == p and r.summary is not None and bool(r.summary.best) for r in results) > 1}
    lines = [f"{'layout':12s} {'problem':34s} {'best kernel':62s} {'TFLOP/s':>8s} {'x cuBLAS':>8s}  layers"]
    for r in results:
        layers = ", ".join(dict.fromkeys(r.layers))
        best = r.summary.best if r.summary is not None else None
        if best:
            ratio = best.get("ratio", {}).get("cublas")
            mark = " *" if r.problem in several and fastest[r.problem][0] is r else ""
            lines.append(f"{r.problem.layout.value:12s} {r.problem.key:34s} {best['kernel']:62s} "
                         f"{best['tflops']:8.2f} {(f'{ratio:.3f}' if ratio else '-'):>8s}  {layers}{mark}")
        else:
            why = f"skipped ({r.family}): {r.skipped}" if r.skipped and r.family else \
                f"skipped: {r.skipped}" if r.skipped else f"no ok kernel: {r.summary.stopped}"
            lines.append(f"{r.problem.layout.value:12s} {r.problem.key:34s} {why[:62]:62s} {'-':>8s} {'-':>8s}  {layers}")
    for p in not_recorded or []:
        lines.append(f"{p.layout.value:12s} {p.key:34s} {'skipped: not in the recording':62s} {'-':>8s} {'-':>8s}")
    return "\n".join(lines)

