"""``codegen`` command line: compile, bench, search, export, results, app."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import MISSING, fields

from codegen.problem import DType, Problem
from codegen.spec import SimtSpec

SPEC_FIELDS = [f for f in fields(SimtSpec) if f.name not in ("dtype", "bias")]


def add_problem_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--m", type=int, required=required, help="batch (rows of X and Y)")
    p.add_argument("--n", type=int, required=required, help="out features (rows of W)")
    p.add_argument("--k", type=int, required=required, help="in features")
    p.add_argument("--dtype", choices=[d.value for d in DType], default="fp32")
    p.add_argument("--bias", action="store_true", help="add b[N]")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("kernel variant (SIMT family; unset options take the defaults shown)")
    g.add_argument("--kernel", metavar="NAME", help="a kernel name, e.g. from `codegen results`")
    for f in SPEC_FIELDS:
        default = f.default if f.default is not MISSING else None
        kind = str if f.name == "reduce" else int
        g.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=None, help=f"default {default}")


def spec_from_args(args: argparse.Namespace, problem: Problem | None = None) -> SimtSpec:
    if args.kernel:
        spec = SimtSpec.from_name(args.kernel)
        if problem is not None and (spec.dtype, spec.bias) != (problem.dtype, problem.bias):
            raise SystemExit(f"codegen: kernel {spec.name} is for {spec.dtype.value}, bias={spec.bias}; "
                             f"the problem is {problem.dtype.value}, bias={problem.bias}")
        return spec
    values = {f.name: getattr(args, f.name) for f in SPEC_FIELDS if getattr(args, f.name) is not None}
    if problem is not None:
        values.update(dtype=problem.dtype, bias=problem.bias)
    else:
        values.update(dtype=DType(getattr(args, "dtype", "fp32")), bias=getattr(args, "bias", False))
    return SimtSpec(**values)


def problem_from_args(args: argparse.Namespace) -> Problem:
    try:
        return Problem(args.m, args.n, args.k, DType(args.dtype), bias=args.bias)
    except ValueError as e:
        raise SystemExit(f"codegen: {e}") from None


# ---- commands -----------------------------------------------------------------------------------
def cmd_compile(args: argparse.Namespace) -> int:
    from codegen.compile import CompileError, compile_source, default_arch
    from codegen.render import render

    spec = SimtSpec.from_name(args.name) if args.name else spec_from_args(args)
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
            device = ev.device()
    except WorkerUnavailable as e:
        print(f"codegen bench: {e}", file=sys.stderr)
        return 2
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codegen", description="gemmscape: generate, check and time CUDA GEMM kernels "
                                     "for the linear layer Y = X·Wᵀ + b.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="render and NVRTC-compile one variant (no GPU needed); print its resources")
    p.add_argument("name", nargs="?", help="kernel name (else built from the options)")
    add_problem_args(p, required=False)
    add_spec_args(p)
    p.add_argument("--arch", help="target, e.g. sm_90 (default: the visible GPU's, else sm_90)")
    p.add_argument("--source", action="store_true", help="print the CUDA source too")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("bench", help="validate and time one variant and the cuBLAS baseline on the GPU")
    add_problem_args(p)
    add_spec_args(p)
    p.add_argument("--arch")
    p.add_argument("--no-baseline", action="store_true", help="skip cuBLAS (torch) timing")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a kernel counts as hung")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"codegen: {e}", file=sys.stderr)
        return 2
