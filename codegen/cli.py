"""``codegen`` command line: compile, bench, search, sweep, export, results, app.

``--family NAME`` picks a kernel family (default simt); the variant options are that family's own,
built from its spec's fields (``codegen bench --family NAME --help`` lists them).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import MISSING
from pathlib import Path

from codegen import families
from codegen.problem import DType, Problem
from codegen.spec import KernelSpec

DEFAULT_FAMILY = "simt"


def add_problem_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--m", type=int, required=required, help="batch (rows of X and Y)")
    p.add_argument("--n", type=int, required=required, help="out features (rows of W)")
    p.add_argument("--k", type=int, required=required, help="in features")
    p.add_argument("--dtype", choices=[d.value for d in DType], default="fp32")
    p.add_argument("--bias", action="store_true", help="add b[N]")


def add_gpu_args(p: argparse.ArgumentParser, timeout: float) -> None:
    """Where results go and how kernels are built and run, for the commands that measure."""
    p.add_argument("--db", help="store URL (default: $GEMMSCAPE_DB, else a SQLite file)")
    p.add_argument("--arch", help="target, e.g. sm_90 (default: the visible GPU's)")
    p.add_argument("--timeout", type=float, default=timeout, help="seconds before a kernel counts as hung")


def add_family_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--family", choices=families.names(), default=None,
                   help=f"kernel family {what} (default {DEFAULT_FAMILY})")


def family_of_args(args: argparse.Namespace) -> str:
    return getattr(args, "family", None) or DEFAULT_FAMILY


def add_spec_args(p: argparse.ArgumentParser, family: str) -> None:
    """``--kernel`` and one option per variant field of ``family``'s spec (type from the field's
    default, choices from its metadata)."""
    g = p.add_argument_group(f"kernel variant ({family} family; unset options take the defaults shown)")
    g.add_argument("--kernel", metavar="NAME", help="a kernel name, e.g. from `codegen results`")
    for f in families.variant_fields(family):
        default = f.default if f.default is not MISSING else None
        flag = f"--{f.name.replace('_', '-')}"
        text = f.metadata.get("help", "")
        text = f"{text} (default {default})" if text else f"default {default}"
        if isinstance(default, bool):
            g.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
            continue
        choices = f.metadata.get("choices")
        g.add_argument(flag, dest=f.name, type=type(default) if default is not None else str, default=None,
                       choices=list(choices) if choices else None, help=text)


def check_family(spec: KernelSpec, args: argparse.Namespace) -> KernelSpec:
    """A kernel named on the command line must be of the family asked for, when one is."""
    asked = getattr(args, "family", None)
    if asked and spec.family != asked:
        raise ValueError(f"kernel {spec.name} is of the {spec.family} family, not {asked}; "
                         f"drop --family or name a {asked} kernel")
    return spec


def spec_from_args(args: argparse.Namespace, problem: Problem | None = None) -> KernelSpec:
    if args.kernel:
        spec = check_family(families.spec_from_name(args.kernel), args)
        if problem is not None and (spec.dtype, spec.bias) != (problem.dtype, problem.bias):
            raise SystemExit(f"codegen: kernel {spec.name} is for {spec.dtype.value}, bias={spec.bias}; "
                             f"the problem is {problem.dtype.value}, bias={problem.bias}")
        return spec
    family = family_of_args(args)
    values = {f.name: getattr(args, f.name) for f in families.variant_fields(family)
              if getattr(args, f.name, None) is not None}
    if problem is not None:
        values.update(dtype=problem.dtype, bias=problem.bias)
    else:
        values.update(dtype=DType(getattr(args, "dtype", "fp32")), bias=getattr(args, "bias", False))
    return families.get(family).Spec(**values)


def problem_from_args(args: argparse.Namespace) -> Problem:
    try:
        return Problem(args.m, args.n, args.k, DType(args.dtype), bias=args.bias)
    except ValueError as e:
        raise SystemExit(f"codegen: {e}") from None


# ---- commands -----------------------------------------------------------------------------------
def cmd_compile(args: argparse.Namespace) -> int:
    from codegen.compile import CompileError, compile_source, default_arch
    from codegen.render import render

    spec = check_family(families.spec_from_name(args.name), args) if args.name else spec_from_args(args)
    problem = problem_from_args(args) if args.m else None
    arch = args.arch or default_arch()
    reasons = spec.check(problem)
    if reasons:
        print(f"invalid: {spec.name}", *(f"  - {r}" for r in reasons), sep="\n", file=sys.stderr)
        return 2
    source = render(spec)
    if args.source:
        print(source)
    try:
        result = compile_source(source, spec.name, arch)
    except CompileError as e:
        print(e, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"name": spec.name, **result.meta()}, indent=2))
        return 0
    print(f"{spec.name}  {arch}  NVRTC {result.nvrtc_version}  {len(result.cubin)} B cubin"
          f"{'  (cached)' if result.cached else f'  {result.seconds:.2f} s'}")
    print(f"  threads {spec.threads}, dynamic shared memory {spec.smem_bytes} B")
    for fn, r in result.report.items():
        print(f"  {fn}: {r.get('registers')} registers, {r.get('stack', 0)} B stack, "
              f"spills {r.get('spill_stores', 0)}/{r.get('spill_loads', 0)} B (st/ld), {r.get('barriers', 0)} barriers")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from codegen.evaluate import Evaluator
    from codegen.worker import WorkerUnavailable

    problem = problem_from_args(args)
    spec = spec_from_args(args, problem)
    try:
        with Evaluator(arch=args.arch, baseline=not args.no_baseline, timeout_s=args.timeout) as ev:
            result, built = ev.evaluate(spec, problem)
            device, arch = ev.device(), ev.target_arch
    except WorkerUnavailable as e:
        print(f"codegen bench: {e}", file=sys.stderr)
        return 2
    if not args.no_store:  # nothing measured is lost: the trial goes to the store (no search run)
        store = _store(args.db)
        record = built.kernel_record()
        record.setdefault("arch", arch)
        store.kernel(record)
        store.add_trial(None, spec.name, record["arch"], problem, store.device(device), None, result, spec.to_dict(),
                        source_hash=record.get("source_hash"))
    line = f"{problem.key}  {spec.name}  {result['status']}"
    if result["status"] == "ok":
        line += (f"  {result['median_ms'] * 1e3:.1f} us (p20 {result['p20_ms'] * 1e3:.1f}, p80 {result['p80_ms'] * 1e3:.1f})"
                 f"  {result['tflops']:.2f} TFLOP/s  {result['gbps']:.0f} GB/s  err {result['rel_error']:.1e}")
        for name, base in result["baselines"].items():
            line += f"  | {name} {base['median_ms'] * 1e3:.1f} us, ratio {result['ratio'][name]:.2f}"
    else:
        line += f"  {result['evidence'].strip().splitlines()[-1] if result['evidence'].strip() else ''}"
    print(line)
    if args.json:
        print(json.dumps({"device": device, "problem": problem.to_dict(), "kernel": spec.name, "result": result}))
    return 0 if result["status"] == "ok" else 1


def _store(url: str | None, read_only: bool = False):
    from store import Store

    return Store(url, read_only=read_only)


def cmd_search(args: argparse.Namespace) -> int:
    from codegen.versions import versions
    from search.measure import GpuMeasurer, NoGpu, ReplayMeasurer
    from search.runner import run_search
    from search.space import seeds, space_for

    problem = problem_from_args(args)
    command = "codegen " + " ".join(sys.argv[1:])
    store = None
    if args.replay:
        measurer = ReplayMeasurer(args.replay, problem)
        space, space_name = measurer.space, "replay"
        if args.family and args.family != space.family:
            raise ValueError(f"{args.replay} records the {space.family} family, not {args.family}")
        print(f"replaying {args.replay}: recorded on {measurer.recorded['where']} at {measurer.recorded['when']}; "
              f"no GPU is used and nothing is stored", file=sys.stderr)
        if not measurer.hashes_known:
            print("note: this recording does not say which source each result measured (no source hashes); "
                  "its results are not tied to today's templates", file=sys.stderr)
    else:
        space_name = "restricted" if args.restricted else "full"
        space = space_for(family_of_args(args), problem.dtype, args.restricted)
        try:
            measurer = GpuMeasurer(problem, arch=args.arch, timeout_s=args.timeout, baseline=not args.no_baseline)
        except NoGpu as e:
            print(f"codegen search: {e}; to search recorded H200 measurements without a GPU use --replay FILE "
                  f"(see README)", file=sys.stderr)
            return 2
        store = _store(args.db)
    try:
        summary = run_search(problem, space, measurer, sampler=args.sampler, seed=args.seed, budget=args.budget,
                             space_name=space_name, store=store, lookahead=args.lookahead, progress=not args.quiet,
                             command=command, versions=versions(),
                             seeds=None if args.no_seeds else seeds(space.family))
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the run is marked ended; say how to resume
        print(f"codegen search: {e or 'interrupted'}", file=sys.stderr)
        return 130
    finally:
        measurer.close()
    best = summary.best
    print(f"{summary.study}: {summary.evaluated} of {summary.budget} trials evaluated "
          f"({summary.evaluated_now} now, {summary.proposals} proposals) in {summary.wall_s:.1f} s; {summary.stopped}")
    if summary.failures:
        print("  failures: " + ", ".join(f"{k} {v}" for k, v in summary.failures.most_common()))
    if best:
        ratio = best.get("ratio", {}).get("cublas")
        print(f"  best {best['kernel']}  {best['tflops']:.2f} TFLOP/s" + (f"  {ratio:.3f}x cuBLAS" if ratio else ""))
    if args.replay and measurer.best:
        print(f"  recorded best {measurer.best['kernel']}  {measurer.best['tflops']:.2f} TFLOP/s")
    if args.json:
        print(json.dumps({"study": summary.study, "evaluated": summary.evaluated, "wall_s": summary.wall_s,
                          "gpu_wait_s": summary.gpu_wait_s, "best": best, "failures": dict(summary.failures),
                          "history": summary.history, "stopped": summary.stopped}))
    return 0 if best else 1


def cmd_sweep(args: argparse.Namespace) -> int:
    from search.measure import GpuMeasurer, NoGpu
    from search.space import space_for
    from search.sweep import sweep

    problem = problem_from_args(args)
    try:
        measurer = GpuMeasurer(problem, arch=args.arch, timeout_s=args.timeout)
    except NoGpu as e:
        print(f"codegen sweep: {e}", file=sys.stderr)
        return 2
    try:
        doc = sweep(problem, space_for(family_of_args(args), problem.dtype, restricted=True), measurer,
                    store=_store(args.db),
                    command="codegen " + " ".join(sys.argv[1:]))
    finally:
        measurer.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=0) + "\n")
    ok = [r for r in doc["results"].values() if r["status"] == "ok"]
    print(f"{len(doc['results'])} kernels measured, {len(ok)} ok; wrote {args.out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from codegen.export import export_kernel, write_export

    store = _store(args.db, read_only=True)
    problem = problem_from_args(args) if args.m else None
    name = args.kernel
    if args.best:
        if problem is None:
            raise SystemExit("codegen export: --best needs --m, --n, --k (and --dtype, --bias)")
        rows = store.best(problem, family=args.family)
        if not rows:
            print(f"codegen export: no ok kernel stored for {problem.key} in {store.url}", file=sys.stderr)
            return 1
        name = rows[0]["kernel"]
    if not name:
        raise SystemExit("codegen export: give --best with a problem, or --kernel NAME")
    record = store.kernel_record(name)
    if record is not None and args.family and record["family"] != args.family:
        raise ValueError(f"kernel {name} is of the {record['family']} family, not {args.family}")
    try:
        texts = export_kernel(store, name, problem)
    except KeyError as e:
        print(f"codegen export: {e.args[0]}", file=sys.stderr)
        return 1
    cu, js = write_export(args.out, name, texts)
    print(f"wrote {cu} and {js}")
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    store = _store(args.db, read_only=True)
    rows = store.best(per_problem=args.top)
    if args.json:
        print(json.dumps(rows, default=str, indent=1))
        return 0
    if not rows:
        print(f"no results in {store.url} yet: run `codegen search` first")
        return 0
    head = f"{'problem':30s} {'kernel':62s} {'median us':>10s} {'TFLOP/s':>8s} {'GB/s':>7s} {'x cuBLAS':>8s}  device"
    print(head)
    for r in rows:
        ratio = f"{r['ratio_cublas']:.3f}" if r.get("ratio_cublas") else "-"
        print(f"{r['problem']:30s} {r['kernel']:62s} {r['median_ms'] * 1e3:10.1f} {r['tflops']:8.2f} "
              f"{r['gbps']:7.0f} {ratio:>8s}  {r['device']}")
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    from app.launch import run

    return run(args.db, args.port)


def build_parser(family: str = DEFAULT_FAMILY) -> argparse.ArgumentParser:
    """The parser, with ``family``'s variant options on compile and bench."""
    parser = argparse.ArgumentParser(prog="codegen", description="gemmscape: generate, check and time CUDA GEMM kernels "
                                     "for the linear layer Y = X·Wᵀ + b.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="render and NVRTC-compile one variant (no GPU needed); print its resources")
    p.add_argument("name", nargs="?", help="kernel name (else built from the options)")
    add_problem_args(p, required=False)
    add_family_arg(p, "of the variant options below")
    add_spec_args(p, family)
    p.add_argument("--arch", help="target, e.g. sm_90 (default: the visible GPU's, else sm_90)")
    p.add_argument("--source", action="store_true", help="print the CUDA source too")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("bench", help="validate and time one variant and the cuBLAS baseline on the GPU")
    add_problem_args(p)
    add_family_arg(p, "of the variant options below")
    add_spec_args(p, family)
    add_gpu_args(p, timeout=60.0)
    p.add_argument("--no-baseline", action="store_true", help="skip cuBLAS (torch) timing")
    p.add_argument("--no-store", action="store_true", help="do not record the trial")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("search", help="search the space with Optuna on the GPU (or over a recording with --replay)")
    add_problem_args(p)
    add_family_arg(p, "whose space is searched")
    p.add_argument("--sampler", default="tpe", choices=["tpe", "random", "grid", "cmaes", "gp"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=200, help="evaluated (compiled and run) trials, across resumed runs")
    p.add_argument("--restricted", action="store_true", help="search the restricted space (the one sweeps record)")
    p.add_argument("--replay", type=Path, metavar="FILE", help="answer from a recorded sweep: no GPU, nothing stored")
    p.add_argument("--no-seeds", action="store_true", help="do not try the family's known-good points first")
    add_gpu_args(p, timeout=30.0)
    p.add_argument("--lookahead", type=int, default=4, help="candidates compiling ahead of the GPU")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("sweep", help="measure every valid point of the restricted space; write a replay recording")
    add_problem_args(p)
    add_family_arg(p, "whose restricted space is swept")
    p.add_argument("--out", type=Path, required=True)
    add_gpu_args(p, timeout=30.0)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("export", help="write <name>.cu and <name>.json that run without gemmscape")
    add_problem_args(p, required=False)
    p.add_argument("--best", action="store_true", help="the fastest stored kernel for the problem")
    p.add_argument("--kernel", metavar="NAME")
    add_family_arg(p, "to export (with --best: the fastest of that family)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--db")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("results", help="the best kernels per problem")
    p.add_argument("--db")
    p.add_argument("--top", type=int, default=1, help="kernels per problem")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("app", help="the Streamlit dashboard on 127.0.0.1 (database opened read-only)")
    p.add_argument("--db")
    p.add_argument("--port", type=int, default=8501)
    p.set_defaults(func=cmd_app)
    return parser


def family_asked(argv: list[str] | None) -> str:
    """A first look at the command line for ``--family`` (the variant options depend on it)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--family")
    known, _ = pre.parse_known_args(sys.argv[1:] if argv is None else argv)
    return known.family if known.family in families.names() else DEFAULT_FAMILY


def main(argv: list[str] | None = None) -> int:
    args = build_parser(family_asked(argv)).parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"codegen: {e}", file=sys.stderr)
        return 2
