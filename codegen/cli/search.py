"""``codegen search`` and ``codegen sweep``: one problem's space searched with Optuna, or a narrowed
space measured point by point into a replay recording. ``search_seeds``, ``say_seeds`` and
``read_recording`` also serve tune-linear and tune-model (codegen.cli.layer)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from codegen import families
from codegen.cli.checks import check_cache, check_store, check_writable, open_store
from codegen.cli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, UsageError
from codegen.cli.options import (
    Commands,
    add_family_arg,
    add_gpu_args,
    add_problem_args,
    describe_problem,
    family_of_args,
    positive_int,
    printer,
    problem_from_args,
    problem_from_recording,
)
from codegen.problem import Problem
from search import DEFAULT_SAMPLER, GPU_LOOKAHEAD, SAMPLERS


def register(commands: Commands) -> None:
    p = commands.add("search", "search the space with Optuna on the GPU (or over a recording with --replay)")
    add_problem_args(p, replay=True)
    p.add_argument("--family", choices=families.names(), action="append", default=None,
                   help="kernel family to search; repeat it for several (default: every family that fits the "
                        "problem on the GPU, with one budget over them: fp32 simt; fp16 and bf16 hopper (sm_90) "
                        "and tensorcore, and direct for a block-sparse W; tf32 tensorcore)")
    p.add_argument("--sampler", default=DEFAULT_SAMPLER, choices=list(SAMPLERS),
                   help=f"sampler (default {DEFAULT_SAMPLER}, chosen on the replay recordings: see README)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed")
    p.add_argument("--budget", type=positive_int, default=200,
                   help="evaluated (compiled and run) trials, across resumed runs and over every family searched")
    p.add_argument("--restricted", action="store_true", help="search the restricted space (the one sweeps record)")
    p.add_argument("--replay", type=Path, metavar="FILE",
                   help="answer from a recorded sweep, no GPU; its problem is the search's (the problem options "
                        "may be left out); trials are stored under a device named as a recording (default: none, "
                        "measure on the GPU)")
    p.add_argument("--no-warm-start", action="store_true",
                   help="do not start from the store's best kernels for the nearest problems (same family, dtype "
                        "and GPU); try only the family's built-in seeds first")
    p.add_argument("--no-seeds", action="store_true",
                   help="try no known points first: neither the store's (warm start) nor the family's built-in seeds")
    add_gpu_args(p, timeout=30.0)
    p.add_argument("--no-store", action="store_true", help="do not record the trials")
    p.add_argument("--lookahead", type=positive_int, default=GPU_LOOKAHEAD,
                   help="candidates compiling ahead of the GPU; search.GPU_LOOKAHEAD says why this many")
    p.add_argument("--gpus", metavar="all|0,1,...", default=None,
                   help="measure on these GPUs, one worker each, over one study (default: GPU 0)")
    p.add_argument("--no-baseline", action="store_true", help="skip cuBLAS (torch) timing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="JSON on stdout (the summary lines go to stderr)")
    p.set_defaults(func=cmd_search)

    p = commands.add("sweep", "measure every valid point of a narrowed space; write a replay recording")
    add_problem_args(p)
    add_family_arg(p, "whose narrowed space is swept")
    p.add_argument("--space", default="restricted", metavar="NAME",
                   help="which narrowing of the family's space: restricted (default) or one of its larger "
                        "NARROWINGS (simt: skinny; tensorcore: large)")
    p.add_argument("--max-seconds", type=float, default=None, metavar="S",
                   help="start no kernel after S seconds; the recording then says it is partial (default: none, "
                        "every valid kernel)")
    p.add_argument("--resume", type=Path, default=None, metavar="FILE",
                   help="a partial recording of the same problem and space: keep its results (where the source "
                        "is unchanged) and measure the rest into --out (default: none)")
    p.add_argument("--out", type=Path, required=True, metavar="FILE",
                   help="the recording to write (a new file)")
    add_gpu_args(p, timeout=30.0)
    p.set_defaults(func=cmd_sweep)


def search_seeds(args: argparse.Namespace, problem: Problem, space, space_name: str, measurer, store):
    """What a search tries first (search.warm.Seeding): nothing with --no-seeds; the family's
    built-in seeds with --no-warm-start or --no-store; else the store's best kernels for the
    nearest problems (warm start). A study that has started already is resumed: no seeds."""
    from search import warm
    from search.runner import study_name

    if args.no_seeds:
        return warm.no_seeds("no seeds (--no-seeds)")
    name = study_name(problem, space.family, space_name, args.sampler, args.seed, measurer.device.get("name", "?"))
    if warm.study_started(store, name):
        return warm.resumed(name)
    if args.no_warm_start or store is None:
        found = warm.builtin_seeds(problem, space, measurer.limits)
        flag = "--no-warm-start" if args.no_warm_start else "--no-store: no history to start from"
        return warm.Seeding(found, "built-in" if found else "none", f"the family's built-in seeds ({flag})")
    return warm.warm_seeds(store, problem, space, measurer.device, limits=measurer.limits)


def say_seeds(say, seeding, quiet: bool) -> None:
    """The seeds a search tries first: a count with --quiet, else one line per seed."""
    n, mine = len(seeding.seeds), seeding.from_history
    if seeding.source in ("none", "resumed"):
        say(seeding.note)
        return
    count = f"{n} seed{'s' if n != 1 else ''}" + (f" ({mine} from the store, {n - mine} built-in)" if mine else "")
    if quiet:
        say(f"seeds: {count}")
        return
    dropped = len(seeding.dropped)
    say(f"seeds: {count}; {seeding.note}" + (f"; {dropped} left out (not points of this space, or invalid here)"
                                            if dropped else ""))
    for seed in seeding.seeds:
        say(f"  seed {seed.describe()}")


def cmd_search(args: argparse.Namespace) -> int:
    from codegen.versions import versions
    from search.portfolio import Member, portfolio_space_name, run_portfolio

    say = printer(args.json)
    recording = read_recording(args.replay) if args.replay else None
    if recording is not None:
        problem = problem_from_recording(args, recording.problem, args.replay)
    elif args.m is None:
        raise UsageError("the following arguments are required: --m (or --replay FILE, whose recording gives the "
                         "problem)")
    else:
        problem = problem_from_args(args)
    command = "codegen " + " ".join(sys.argv[1:])
    _check_sampler(args)
    if recording is not None:
        measurer, spaces, space_name, store = _replayed(args, recording)
    else:
        measurer, spaces, space_name, store = _measured(args, problem)
    member_space = portfolio_space_name(space_name, [s.family for s in spaces])
    try:
        if len(spaces) > 1:
            say(f"families: {', '.join(s.family for s in spaces)}, one budget of {args.budget} trials over them "
                f"(--family narrows it)")
        members, seedings = [], {}
        for space in spaces:
            seeding = seedings[space.family] = search_seeds(args, problem, space, member_space, measurer, store)
            say_seeds(say if len(spaces) == 1 else (lambda line, f=space.family: say(f"{f} {line}")), seeding,
                      args.quiet)
            members.append(Member(space.family, space, seeding.points))
    except BaseException:
        measurer.close()
        raise
    try:
        summary = run_portfolio(problem, members, measurer, sampler=args.sampler, seed=args.seed, budget=args.budget,
                                space_name=space_name, store=store, lookahead=args.lookahead,
                                progress=not args.quiet, command=command, versions=versions())
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the runs are marked ended; say how to resume
        print(f"codegen search: {e or 'interrupted'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        measurer.close()
    _report(say, args, problem, summary, measurer, store, seedings)
    return EXIT_OK if summary.best else EXIT_FAILURE


def _check_sampler(args: argparse.Namespace) -> None:
    """A sampler that cannot run here (the gp sampler without torch and scipy) is a usage error."""
    from search import samplers

    why = samplers.missing(args.sampler)
    if why:
        raise UsageError(f"the {args.sampler} sampler {why}: pip install 'gemmscape[{args.sampler}]', "
                         f"or pick another --sampler")


def read_recording(path: Path):
    """The recording of --replay, read (a ReplayMeasurer, whose ``problem`` gives the problem options
    left out); one that cannot be read is a usage error."""
    from search.measure import ReplayError, ReplayMeasurer

    try:
        return ReplayMeasurer(path)
    except ReplayError as e:
        raise UsageError(str(e)) from None


def _replayed(args: argparse.Namespace, measurer) -> tuple:
    """A search over a recording (--replay, read by ``read_recording``), no GPU: its measurer, the
    recorded family's space (in a list), the space name and the store."""
    space = measurer.space
    if args.family and set(args.family) != {space.family}:
        raise UsageError(f"{args.replay} records the {space.family} family, not {', '.join(args.family)}")
    store = None if args.no_store else open_store(args.db)
    where = (f"trials stored in {store.location} under the device \"{measurer.device['name']}\""
             if store is not None else "nothing stored (--no-store)")
    print(f"replaying {args.replay}: recorded on {measurer.recorded['where']} at {measurer.recorded['when']}; "
          f"no GPU is used; {where}", file=sys.stderr)
    if not measurer.hashes_known:
        print("note: this recording does not say which source each result measured (no source hashes); "
              "its results are not tied to today's templates", file=sys.stderr)
    return measurer, [space], "replay", store


def _families_here(args: argparse.Namespace, problem: Problem, limits) -> list:
    """The spaces searched: the families asked for (--family), else every family that fits the
    problem on this device (search.fit); a family asked for that cannot compute the problem is a
    usage error."""
    from search.fit import chosen, fitting

    fits = fitting(problem, limits, args.family, restricted=args.restricted)
    if args.family:
        for fit in fits:
            if fit.space is None:
                raise UsageError(f"the {fit.family} family generates no kernel for {problem.key}: {fit.why}")
    spaces = [f.space for f in chosen(fits)]
    if not spaces:
        raise UsageError(f"no kernel family generates a kernel for {problem.key} here: "
                         + "; ".join(f"{f.family}: {f.why}" for f in fits))
    return spaces


def _measured(args: argparse.Namespace, problem: Problem) -> tuple:
    """A search on the GPU (those of --gpus): its measurer, the families' spaces, the space name and
    the store."""
    from search.parallel import gpu_measurer

    space_name = "restricted" if args.restricted else "full"
    _families_here(args, problem, None)  # what no GPU can change is refused before one is used
    check_cache()
    if not args.no_store:
        check_store(args.db)
    try:  # no GPU: NoGpu, said by codegen.cli.main as for every command that needs one
        measurer = gpu_measurer(problem, args.gpus, arch=args.arch, timeout_s=args.timeout,
                                baseline=not args.no_baseline)
    except ValueError as e:  # --gpus naming GPUs that are not there, or of different models
        raise UsageError(str(e)) from None
    try:
        spaces = _families_here(args, problem, measurer.limits)
        store = None if args.no_store else open_store(args.db)
    except BaseException:
        measurer.close()
        raise
    return measurer, spaces, space_name, store


def _report(say, args: argparse.Namespace, problem: Problem, summary, measurer, store, seedings: dict) -> None:
    """The search's summary lines (to stderr with --json) and with --json its JSON document."""
    best = summary.best
    say(f"{summary.study}: {summary.evaluated} of {summary.budget} trials evaluated "
        f"({summary.evaluated_now} now, {summary.proposals} proposals) in {summary.wall_s:.1f} s; {summary.stopped}")
    if problem.sparse or problem.structured:
        say(f"  problem {describe_problem(problem)}")
    for line in summary.describe():
        say(f"  {line}")
    if summary.failures:
        say("  failures: " + ", ".join(f"{k} {v}" for k, v in summary.failures.most_common()))
    if best:
        ratio = best.get("ratio", {}).get("cublas")
        say(f"  best {best['kernel']}  {best['tflops']:.2f} TFLOP/s" + (f"  {ratio:.3f}x cuBLAS" if ratio else "")
            + (f"  ({best['family']} family)" if len(summary.families) > 1 else ""))
    workers = measurer.worker_report() if hasattr(measurer, "worker_report") else None
    if workers:
        per = zip(workers["gpus"], workers["measured"], strict=True)
        say("  measured by: " + ", ".join(f"worker {i} (GPU {g}) {n}" for i, (g, n) in enumerate(per)))
    if args.replay and measurer.best:
        say(f"  recorded best {measurer.best['kernel']}  {measurer.best['tflops']:.2f} TFLOP/s")
    if args.replay and store is not None:
        say(f"  stored under \"{measurer.device['name']}\": `codegen results`, `codegen export --best ...` and "
            f"`codegen app` show them, marked as a recording")
    if args.json:
        one = next(iter(seedings.values()))
        print(json.dumps({"study": summary.study, "device": measurer.device, "recorded": bool(args.replay),
                          "store": store.location if store is not None else None,
                          "evaluated": summary.evaluated, "wall_s": summary.wall_s,
                          "gpu_wait_s": summary.gpu_wait_s, "best": best, "failures": dict(summary.failures),
                          "history": summary.history, "stopped": summary.stopped,
                          "seeds": one.to_dict() if len(seedings) == 1 else {f: x.to_dict() for f, x in seedings.items()},
                          "sampler": args.sampler, "seeded": summary.seeded, "handover": summary.handover,
                          "family": best["family"] if best else None,
                          "families": {f: {"study": s.study, "evaluated": s.evaluated, "best": s.best,
                                           "stopped": s.stopped} for f, s in summary.families.items()},
                          "proposals": {"all": summary.proposals, "sampler": summary.sampler_proposals,
                                        "valid": summary.valid_proposals, "new": summary.new_proposals,
                                        "replaced": summary.replaced, "valid_fraction": summary.valid_fraction},
                          "times_s": summary.times, "workers": workers}))


def cmd_sweep(args: argparse.Namespace) -> int:
    from search.measure import GpuMeasurer
    from search.space import narrowings, space_for

    problem = problem_from_args(args)
    family = family_of_args(args, problem)
    if args.space not in narrowings(family):
        raise UsageError(f"--space {args.space}: the {family} family's narrowings are "
                         f"{', '.join(narrowings(family))}")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out} already exists; a sweep does not overwrite a recording: remove it or "
                         f"choose another name")
    check_writable(args.out, "--out", folder=False)
    try:
        space = space_for(family, problem.dtype, restricted=args.space, block=problem.block,
                          layout=problem.layout, sparsity=problem.sparsity)
    except ValueError as e:
        raise UsageError(str(e)) from None
    check_cache()
    check_store(args.db)
    earlier = None
    if args.resume is not None:
        try:
            earlier = json.loads(args.resume.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"--resume {args.resume}: cannot read it as a recording ({e})") from None
        if not isinstance(earlier, dict) or earlier.get("problem") != problem.to_dict() or \
                earlier.get("space") != space.to_dict():
            raise UsageError(f"--resume {args.resume} is not a recording of {problem.key} over the "
                             f"{args.space} space")
    measurer = GpuMeasurer(problem, arch=args.arch, timeout_s=args.timeout)  # no GPU: NoGpu (codegen.cli.main)
    from search.sweep import sweep

    try:
        doc = sweep(problem, space, measurer,
                    store=open_store(args.db), command="codegen " + " ".join(sys.argv[1:]), space_name=args.space,
                    max_seconds=args.max_seconds, resume=earlier)
    finally:
        measurer.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=0) + "\n")
    ok = [r for r in doc["results"].values() if r["status"] == "ok"]
    print(f"{len(doc['results'])} kernels measured, {len(ok)} ok; wrote {args.out}")
    return EXIT_OK

