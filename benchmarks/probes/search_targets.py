"""Issue 12's targets on a GPU: does a 200-trial search find what a 1000-trial one finds, and does a
warm start from other shapes' searches get there within 30 trials?

Per shape (A, B, C, ...; the first is the shape development used, fp32 4096^3; the others were used
by no development run) the plan runs real ``codegen search`` processes, each into its own store
file so that no run reuses another's measurements (the runner reuses a stored result of the same
problem, device and source):

- ``<L>-warm``: before the shape's own searches, a copy of ``hist.db`` (which then holds only the
  other shapes' long searches) is searched for ``--warm`` trials with the default warm start;
- ``<L>-<big>``: the reference, seed 0, ``--big`` trials, ``--no-warm-start`` (so the family's
  built-in seeds come first, as in a default search on a fresh store), into ``hist.db``;
- ``<L>-<small>-s<seed>``: ``--small`` trials, ``--no-seeds`` (nothing tried first: a seed near the
  optimum would make any sampler look good), for each of ``--seeds``, each into a store of its own.

So the short searches are held to the strongest reference this plan has: unseeded against seeded.

    python3 -m benchmarks.probes.search_targets run --dir DIR --deadline-s 520
    python3 -m benchmarks.probes.search_targets report --dir DIR [--out benchmarks/results]

``run`` works through the plan in order and records each step in ``DIR/steps.jsonl``; a step that
ended (budget reached) is not run again, so the plan resumes across device calls when ``DIR`` is
carried from one to the next. At the deadline the search running is sent SIGTERM (it stores what it
measured and marks its run ended) and resumes next time. ``report`` reads the stores and writes
``search-targets-<device>-<date of the last step>.json`` (DESIGN.md's results format, with a ``targets`` block).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.steps import Planned, load_steps, run_steps

RESULTS = Path(__file__).resolve().parents[1] / "results"
#: The development shape first, then two that no development run used.
SHAPES = ("4096x4096x4096", "1536x2560x1024", "768x5120x2048")
THRESHOLD = 0.97


@dataclass(frozen=True)
class Step:
    name: str
    shape: str
    seed: int
    budget: int
    db: str  # file name in DIR
    seeding: str  # "warm" (the default warm start), "built-in" (--no-warm-start) or "none" (--no-seeds)
    copy_from: str | None = None  # the store this one starts as a copy of (made once, before the first run)


def plan(shapes: list[str], big: int, small: int, seeds: list[int], warm: int) -> list[Step]:
    steps = []
    for i, shape in enumerate(shapes):
        letter = chr(ord("A") + i)
        if i > 0 and warm:
            steps.append(Step(f"{letter}-warm", shape, 0, warm, f"{letter}-warm.db", "warm", copy_from="hist.db"))
        steps.append(Step(f"{letter}-{big}", shape, 0, big, "hist.db", "built-in"))
        steps += [Step(f"{letter}-{small}-s{s}", shape, s, small, f"{letter}-s{s}.db", "none") for s in seeds]
    return steps


def dims(shape: str) -> tuple[int, int, int]:
    m, n, k = (int(v) for v in shape.split("x"))
    return m, n, k


def command(step: Step, d: Path, args: argparse.Namespace) -> list[str]:
    m, n, k = dims(step.shape)
    cmd = [sys.executable, "-m", "codegen", "search", "--m", str(m), "--n", str(n), "--k", str(k),
           "--dtype", args.dtype, "--family", args.family, "--sampler", args.sampler, "--seed", str(step.seed),
           "--budget", str(step.budget), "--db", f"sqlite:///{(d / step.db).resolve()}", "--quiet", "--json"]
    cmd += {"warm": [], "built-in": ["--no-warm-start"], "none": ["--no-seeds"]}[step.seeding]
    if args.replay:
        cmd += ["--replay", str(args.replay[args.shapes.index(step.shape)])]
    return cmd


def cmd_run(args: argparse.Namespace) -> int:
    d = args.dir
    steps = plan(args.shapes, args.big, args.small, args.seeds, args.warm)
    planned = [Planned(s.name, tuple(command(s, d, args)[1:]),
                       {"shape": s.shape, "seed": s.seed, "budget": s.budget, "db": s.db, "seeding": s.seeding})
               for s in steps]
    copies = {s.name: s for s in steps if s.copy_from}

    def copy_store(step: Planned) -> None:
        s = copies.get(step.name)
        if s is not None and not (d / s.db).exists() and (d / s.copy_from).exists():
            shutil.copyfile(d / s.copy_from, d / s.db)

    return run_steps(d, planned, args.deadline_s, "search_targets", before=copy_store)


# ---- report ---------------------------------------------------------------------------------------
def evaluated(store, shape: str, dtype: str, seed: int) -> tuple[list[dict], list[dict]]:
    """The evaluated trials (not ``invalid``) of the study of ``shape`` with ``seed`` in ``store``, in
    the order they were measured, and the study's runs."""
    key = f"{shape}_{dtype}_forward"
    runs = [r for r in store.runs() if (r["study_name"] or "").split(":")[1:2] == [key]
            and (r["study_name"] or "").split(":")[4:5] == [f"seed{seed}"]]
    trials = []
    for run in sorted(runs, key=lambda r: r["id"]):
        trials += [t for t in store.trials(run_id=run["id"]) if t["status"] != "invalid"]
    return trials, runs


def best_of(trials: list[dict]) -> dict | None:
    ok = [t for t in trials if t["status"] == "ok" and t["tflops"]]
    return max(ok, key=lambda t: t["tflops"]) if ok else None


def trials_to(trials: list[dict], tflops: float) -> int | None:
    """Evaluated trials until one reached ``tflops`` (1-based), or None."""
    return next((i + 1 for i, t in enumerate(trials) if t["status"] == "ok" and (t["tflops"] or 0) >= tflops), None)


def kernel_summary(t: dict) -> dict:
    return {"kernel": t["kernel"], "median_ms": t["median_ms"], "p20_ms": t["p20_ms"], "p80_ms": t["p80_ms"],
            "tflops": t["tflops"], "gbps": t["gbps"]}


def seeded(steps: list[dict], name: str) -> int:
    """Seeds the step's search tried first (they come before the sampler's proposals): from its
    summary, or for a part that was interrupted (no summary) from the count it printed first."""
    counts = []
    for s in steps:
        if s["step"] == name:
            said = re.search(r"^seeds: (\d+) seed", s.get("stderr_tail") or "", re.M)
            counts.append(max((s.get("summary") or {}).get("seeded") or 0, int(said.group(1)) if said else 0))
    return max(counts or [0])


def seeded_gain(trials: list[dict], n_seeds: int) -> dict:
    """How many seeds came first and what the search added over the best of them."""
    seed_best, best = best_of(trials[:n_seeds]), best_of(trials)
    return {"seeds_tried_first": n_seeds,
            "gain_over_best_seed": round(best["tflops"] / seed_best["tflops"], 4) if seed_best and best else None}


def walls(steps: list[dict], name: str) -> float | None:
    parts = [s["wall_s"] for s in steps if s["step"] == name]
    return round(sum(parts), 1) if parts and any(s["rc"] == 0 for s in steps if s["step"] == name) else None


def cmd_report(args: argparse.Namespace) -> int:
    from store import Store

    d = args.dir
    steps = load_steps(d)
    if not steps:
        print(f"search_targets report: {d}/steps.jsonl holds no step", file=sys.stderr)
        return 2
    records, device, versions, seen = [], None, {}, []
    for i, shape in enumerate(args.shapes):
        letter = chr(ord("A") + i)
        hist = d / "hist.db"
        if not hist.exists():
            break
        with Store(f"sqlite:///{hist}", read_only=True) as store:
            long_trials, long_runs = evaluated(store, shape, args.dtype, 0)
            if not long_trials:
                continue
            device = device or store.devices()[0]["name"]
            versions = long_runs[0]["versions"] or versions
        long_trials = long_trials[:args.big]
        best_long = best_of(long_trials)
        if best_long is None:
            continue
        prefix = best_of(long_trials[:args.small])
        default_short = {"what": f"the first {args.small} evaluated trials of the seeded {args.big}-trial search: what "
                                 f"`codegen search --budget {args.small}` does on a fresh store (built-in seeds first)",
                         "best": kernel_summary(prefix) if prefix else None,
                         "of_long_best": round(prefix["tflops"] / best_long["tflops"], 4) if prefix else None}
        short, short_walls = {}, {}
        for s in args.seeds:
            path = d / f"{letter}-s{s}.db"
            if path.exists():
                with Store(f"sqlite:///{path}", read_only=True) as store:
                    short[s] = evaluated(store, shape, args.dtype, s)[0][:args.small]
                short_walls[s] = walls(steps, f"{letter}-{args.small}-s{s}")
        runs_short = {}
        for s, trials in short.items():
            b = best_of(trials)
            runs_short[f"seed{s}"] = {
                "evaluated": len(trials), "best": kernel_summary(b) if b else None,
                "of_long_best": round(b["tflops"] / best_long["tflops"], 4) if b else None,
                "trials_to_97pct_of_long_best": trials_to(trials, THRESHOLD * best_long["tflops"]),
                "seeds_tried_first": seeded(steps, f"{letter}-{args.small}-s{s}"), "wall_s": short_walls.get(s),
            }
        fractions = [r["of_long_best"] for r in runs_short.values() if r["of_long_best"] is not None]
        long_wall = walls(steps, f"{letter}-{args.big}")
        other_walls = [w for w in short_walls.values() if w]
        warm = None
        warm_db = d / f"{letter}-warm.db"
        if warm_db.exists():
            with Store(f"sqlite:///{warm_db}", read_only=True) as store:
                w_trials = evaluated(store, shape, args.dtype, 0)[0][:args.warm]
                others = sorted({p["key"] for p in store.problems()} - {f"{shape}_{args.dtype}_forward"})
            wb = best_of(w_trials)
            step = next((s for s in steps if s["step"] == f"{letter}-warm" and s["rc"] == 0), None)
            warm = {"store_held": others, "evaluated": len(w_trials), "best": kernel_summary(wb) if wb else None,
                    "of_long_best": round(wb["tflops"] / best_long["tflops"], 4) if wb else None,
                    "trials_to_97pct_of_long_best": trials_to(w_trials, THRESHOLD * best_long["tflops"]),
                    "seeds": (step or {}).get("summary", {}) and step["summary"].get("seeds")}
        m, n, k = dims(shape)
        seen.append(shape)
        seeds_long = seeded(steps, f"{letter}-{args.big}")
        records.append({
            "problem": {"m": m, "n": n, "k": k, "dtype": args.dtype, "layout": "forward", "bias": False,
                        "density": 1.0, "block": None},
            "role": "development shape" if i == 0 else "held out: no development run used it",
            "ours": {**kernel_summary(best_long),
                     "search": {"sampler": args.sampler, "budget": args.big, "seed": 0, "space": "full",
                                "evaluated": len(long_trials), "warm_start": False, "wall_s": long_wall,
                                **seeded_gain(long_trials, seeds_long)}},
            "baselines": best_long["baselines"], "ratio": best_long["ratio"],
            "short_searches": runs_short,
            "seeded_short_search": default_short,
            "targets": {
                "short_searches_are": "unseeded (--no-seeds); the long reference is seeded",
                f"median_{args.small}_trial_of_{args.big}_trial_best": round(statistics.median(fractions), 4) if fractions else None,
                "met_97pct": bool(fractions) and statistics.median(fractions) >= THRESHOLD,
                f"wall_{args.big}_over_{args.small}": round(long_wall / statistics.median(other_walls), 2)
                if long_wall and other_walls else None,
                "warm_start": warm,
                "warm_start_met_97pct_within": args.warm if warm and warm["of_long_best"] and warm["of_long_best"] >= THRESHOLD else None,
            },
        })  # fmt: skip
    if not records:
        print(f"search_targets report: no completed long search in {d}", file=sys.stderr)
        return 1
    date = min(s["started"] for s in steps)[:19].replace("+00:00", "") + "Z"
    last = max(s["started"] for s in steps)[:19].replace("+00:00", "") + "Z"  # names the file: more steps, a new file
    doc = {"suite": "search-targets", "date": date, "last_step_started": last, "device": device, "versions": versions,
           "command": "python3 -m benchmarks.probes.search_targets run (steps in `steps`), then report",
           "settings": {"shapes": seen, "big": args.big, "small": args.small, "seeds": args.seeds, "warm": args.warm,
                        "family": args.family, "sampler": args.sampler, "threshold": THRESHOLD,
                        "stores": "one SQLite file per run (hist.db: the long searches; <L>-s<seed>.db; <L>-warm.db, "
                                  "a copy of hist.db made before the shape's own long search)",
                        "replay": [str(p) for p in args.replay] if args.replay else None},
           "steps": [{k: s[k] for k in ("step", "rc", "started", "wall_s", "command")} for s in steps],
           "records": records}
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"search-targets-{(device or 'unknown').replace(' ', '_')}-{last[:10]}T{last[11:19].replace(':', '')}Z.json"
    path = args.out / name
    path.write_text(json.dumps(doc, indent=1) + "\n")
    for r in records:
        t = r["targets"]
        print(f"{r['problem']['m']}x{r['problem']['n']}x{r['problem']['k']}: best {r['ours']['tflops']:.2f} TFLOP/s "
              f"({r['ours']['kernel']}); unseeded {args.small}-trial median "
              f"{t[f'median_{args.small}_trial_of_{args.big}_trial_best']} of it, seeded {r['seeded_short_search']['of_long_best']}; wall ratio "
              f"{t[f'wall_{args.big}_over_{args.small}']}; warm "
              f"{(t['warm_start'] or {}).get('of_long_best')}")
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "report"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, required=True, help="the stores and steps.jsonl (carried between calls)")
        p.add_argument("--shapes", nargs="+", default=list(SHAPES), help="MxNxK, the development shape first")
        p.add_argument("--dtype", default="fp32")
        p.add_argument("--family", default="simt")
        p.add_argument("--sampler", default="local")
        p.add_argument("--big", type=int, default=1000)
        p.add_argument("--small", type=int, default=200)
        p.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2],
                       help="seeds of the short unseeded searches (none: only the warm starts and references)")
        p.add_argument("--warm", type=int, default=30)
        p.add_argument("--replay", type=Path, nargs="+", default=None,
                       help="one recording per shape: the searches answer from them, no GPU (tests)")
    sub.choices["run"].add_argument("--deadline-s", type=float, default=520.0)
    sub.choices["report"].add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return cmd_run(args) if args.cmd == "run" else cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
