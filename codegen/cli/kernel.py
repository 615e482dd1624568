"""``codegen compile`` and ``codegen bench``: one kernel variant, compiled, or validated and timed."""

from __future__ import annotations

import argparse
import json
import sys

from codegen import families
from codegen.cli.checks import check_cache, check_store, one_line, open_store
from codegen.cli.errors import EXIT_FAILURE, EXIT_OK, UsageError
from codegen.cli.options import (
    Commands,
    add_family_arg,
    add_gpu_args,
    add_problem_args,
    add_spec_args,
    arch_name,
    describe_problem,
    printer,
    problem_from_args,
    problem_given,
    spec_from_args,
    spec_from_name,
)


def register(commands: Commands) -> None:
    p = commands.add("compile", "render and NVRTC-compile one variant (no GPU needed); print its resources")
    p.add_argument("name", nargs="?", help="kernel name (default: built from the options)")
    add_problem_args(p, required=False)
    add_family_arg(p, "of the variant options below")
    add_spec_args(p, commands.family)
    p.add_argument("--arch", type=arch_name, help="target, e.g. sm_90 (default: $GEMMSCAPE_ARCH, else the visible "
                   "GPU's, else sm_90)")
    p.add_argument("--source", action="store_true", help="print the CUDA source too (with --json: as \"source\")")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=cmd_compile, variant_family=commands.family)

    p = commands.add("bench", "validate and time one variant and the cuBLAS baseline on the GPU")
    add_problem_args(p)
    add_family_arg(p, "of the variant options below")
    add_spec_args(p, commands.family)
    add_gpu_args(p, timeout=60.0)
    p.add_argument("--no-baseline", action="store_true", help="skip cuBLAS (torch) timing")
    p.add_argument("--no-store", action="store_true", help="do not record the trial")
    p.add_argument("--json", action="store_true", help="JSON on stdout (the result line goes to stderr)")
    p.set_defaults(func=cmd_bench, variant_family=commands.family)


def cmd_compile(args: argparse.Namespace) -> int:
    from codegen.compile import CompileError, compile_source, default_arch
    from codegen.render import render

    problem = problem_from_args(args) if problem_given(args) else None
    spec = spec_from_name(args.name, args) if args.name else spec_from_args(args, problem)
    check_cache()
    arch = args.arch or default_arch()
    reasons = spec.check(problem)
    if reasons:
        raise UsageError(f"invalid variant {spec.name}: " + "; ".join(reasons))
    source = render(spec)
    if args.source and not args.json:
        print(source)
    try:
        result = compile_source(source, spec.name, arch, target=families.compile_target(spec, arch))
    except CompileError as e:  # the variant's own compile log: the answer, not a usage error
        print(e, file=sys.stderr)
        return EXIT_FAILURE
    except (RuntimeError, ImportError) as e:  # NVRTC or the CUDA headers cannot be used here
        raise UsageError(f"the compiler cannot run here: {one_line(e)}") from None
    if args.json:
        print(json.dumps({"name": spec.name, **result.meta(),
                          **({"problem": problem.to_dict()} if problem is not None else {}),
                          **({"source": source} if args.source else {})}, indent=2))
        return EXIT_OK
    target = families.compile_target(spec, arch)
    print(f"{spec.name}  {arch}{f' (-arch={target})' if target != arch else ''}  NVRTC {result.nvrtc_version}  {len(result.cubin)} B cubin"
          f"{'  (cached)' if result.cached else f'  {result.seconds:.2f} s'}")
    if problem is not None:
        print(f"  problem {describe_problem(problem)}")
    print(f"  threads {spec.threads}, dynamic shared memory {spec.smem_bytes} B")
    for fn, r in result.report.items():
        print(f"  {fn}: {r.get('registers')} registers, {r.get('stack', 0)} B stack, "
              f"spills {r.get('spill_stores', 0)}/{r.get('spill_loads', 0)} B (st/ld), {r.get('barriers', 0)} barriers")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    from codegen.evaluate import Evaluator

    problem = problem_from_args(args)
    spec = spec_from_args(args, problem)
    check_cache()
    if not args.no_store:
        check_store(args.db)  # before the GPU runs: a store that cannot take the trial is found now
    with Evaluator(arch=args.arch, baseline=not args.no_baseline, timeout_s=args.timeout) as ev:  # no GPU: NoGpu
        result, built = ev.evaluate(spec, problem)
        device, arch = ev.device(), ev.target_arch
    if not args.no_store:  # nothing measured is lost: the trial goes to the store (no search run)
        store = open_store(args.db)
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
    printer(args.json)(line)
    if args.json:
        print(json.dumps({"device": device, "problem": problem.to_dict(), "kernel": spec.name, "result": result}))
    return EXIT_OK if result["status"] == "ok" else EXIT_FAILURE

