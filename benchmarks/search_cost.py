"""What a search costs per trial as it grows: a short and a long search of the same problem.

    python3 -m benchmarks.search_cost [--recording FILE | --synthetic MxNxK] [--samplers cmaes tpe]
                                      [--budgets 200 1000] [--seed 0] [--no-store] [--out DIR]

By default a REPLAY, not a GPU measurement: each search is the real runner (``search.runner.run_search``)
over a ``ReplayMeasurer`` (answers from a sweep recorded on the H200), writing to a fresh SQLite
store (``--no-store``: none). With no compiler and no GPU in the loop, the wall time is the
runner's own cost: sampler, checks, store. The JSON gives, per sampler and budget, the wall time,
the run summary's time buckets (sample, check, store, compile wait, gpu: here the replay's
answers), and the long search's wall time over the short one's (the issue's target: at most the
ratio of the budgets, 5 for 1000 over 200, i.e. a cost per trial that stays flat). On a GPU every
trial adds its compile and measurement time to both, which this replay does not have.
Per window of 100 evaluated trials the JSON gives ms per trial of wall time and of each bucket. This
process's CPU time is given beside the wall time (on a machine other work shares, the wall time
of either search moves with that work; the CPU time less so). A search of 10 trials runs first,
untimed, so that one-off costs (imports, template loading) fall on neither search.

``--synthetic MxNxK``: instead of a recording, a SYNTHETIC measurer over the family's FULL space
(the recordings hold 864-4608 points; the full simt space has 25.7M, about a fifth valid), so that
late proposals meet what a long search on a GPU meets (neighbourhoods not recorded, more repeats).
It answers any valid point at once with a made-up TFLOP/s: a fixed, smooth function of the choice
indices (a seeded bowl per dimension plus a few pairwise terms) times 1 +- 2.5% noise keyed on the
kernel name. Validity is the family's real rules (the runner checks them as in any search), and the
source hash is the real rendered source's (as the GPU measurer gives it). Its figures say what the
runner costs, never how good a kernel or a sampler is. The file is then
``search-cost-synthetic-<UTC date-time>.json``, with ``"measurer": "synthetic ..."``.
Written to ``benchmarks/results/search-cost-<UTC date-time>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import platform
import random
import sys
import tempfile
import time
import warnings
import zlib
from collections import deque
from importlib import metadata
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_RECORDING = ROOT / "search" / "recordings" / "replay-simt-skinny-32x4096x4096-fp32.json"
WINDOW = 100  # evaluated trials per window of the per-trial cost


class SyntheticMeasurer:
    """SYNTHETIC, not a measurement: every valid point of the family's full space answered at once
    with a made-up TFLOP/s (see the module's docstring)."""

    def __init__(self, problem, family: str = "simt", seed: int = 12) -> None:
        from codegen.spec import DeviceLimits
        from search.space import space_for

        self.problem, self.space = problem, space_for(family, problem.dtype)
        self.arch = "sm_90"
        self.device = {"name": f"synthetic objective (benchmarks.search_cost, seed {seed}; no GPU)", "sm": self.arch}
        self.limits = DeviceLimits.for_arch(self.arch)
        rng = random.Random(seed)
        dims = self.space.dims
        self.centre = {n: rng.uniform(0, len(v) - 1) for n, v in dims.items()}
        self.weight = {n: rng.uniform(0.5, 2.0) for n in dims}
        self.pairs = [(a, b, rng.uniform(-1.5, 1.5)) for a, b in rng.sample(list(itertools.combinations(dims, 2)), 8)]
        self.pending: deque = deque()

    def tflops(self, spec) -> float:
        from search.space import point_of

        index = self.space.indices(point_of(spec))
        z = {n: (index[n] - self.centre[n]) / max(1, len(v) - 1) for n, v in self.space.dims.items()}
        f = sum(w * z[n] ** 2 for n, w in self.weight.items()) + sum(c * z[a] * z[b] for a, b, c in self.pairs)
        noise = zlib.crc32(spec.name.encode()) / 2**32 - 0.5
        return 45.0 * math.exp(-2.0 * f) * (1 + 0.05 * noise)

    def source_hash(self, spec) -> str | None:
        from codegen.render import render, source_hash

        try:
            return source_hash(render(spec))
        except ValueError:
            return None

    def submit(self, tag, spec) -> None:
        self.pending.append((tag, spec))

    def __len__(self) -> int:
        return len(self.pending)

    def next_done(self):
        from codegen.evaluate import blank_result
        from codegen.render import render, source_hash
        from search.measure import Done

        tag, spec = self.pending.popleft()
        tflops = self.tflops(spec)
        p = self.problem
        result = dict(blank_result("ok", "synthetic"), tflops=tflops, median_ms=2e-9 * p.m * p.n * p.k / tflops)
        source = render(spec)
        kernel = {"name": spec.name, "family": spec.family, "spec": spec.to_dict(), "arch": self.arch,
                  "source": source, "source_hash": source_hash(source)}
        return Done(tag, spec, result, kernel)

    def baselines(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class _Clocked:
    """The measurer, with the wall clock and the runner's time buckets read at each trial it hands back."""

    def __init__(self, measurer) -> None:
        self.measurer, self.times, self.marks = measurer, None, []

    def __getattr__(self, name):
        return getattr(self.measurer, name)

    def __len__(self) -> int:
        return len(self.measurer)

    def next_done(self):
        self.marks.append((time.perf_counter(), time.process_time(), dict(self.times)))
        return self.measurer.next_done()


def windows(marks: list, evaluated: int) -> list[dict]:
    """ms per evaluated trial, wall, this process's CPU time and per bucket, over each WINDOW trials
    (from one trial's hand-back to the next: the runner's work between two measurements)."""
    out = []
    for lo in range(0, min(len(marks), evaluated) - 1, WINDOW):
        hi = min(lo + WINDOW, len(marks) - 1)
        (t0, c0, b0), (t1, c1, b1) = marks[lo], marks[hi]
        out.append({"trials": [lo + 1, hi], "wall_ms": 1000 * (t1 - t0) / (hi - lo), "cpu_ms": 1000 * (c1 - c0) / (hi - lo),
                    **{f"{k}_ms": 1000 * (b1[k] - b0[k]) / (hi - lo) for k in b0}})
    return out


def one(measurer, sampler: str, budget: int, seed: int, store: bool, seeds) -> dict:
    """One search; its wall time, the summary's accounting and the cost per window of trials."""
    import optuna

    from search import runner
    from store import Store

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="optuna")
    clocked = _Clocked(measurer)

    class Timer(runner.Timer):  # hands the runner's time buckets to the clock
        def __init__(self, times) -> None:
            super().__init__(times)
            clocked.times = times

    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(runner, "Timer", Timer):
        db = Store(f"sqlite:///{Path(tmp) / 'cost.db'}") if store else None
        started, cpu = time.perf_counter(), time.process_time()
        s = runner.run_search(measurer.problem, measurer.space, clocked, sampler=sampler, seed=seed, budget=budget,
                              store=db, progress=False, seeds=seeds)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        if db is not None:
            db.close()
    return {"sampler": sampler, "budget": budget, "wall_s": wall, "cpu_s": cpu, "evaluated": s.evaluated,
            "proposals": s.proposals, "sampler_proposals": s.sampler_proposals, "replaced": s.replaced,
            "valid_fraction": s.valid_fraction, "handover": s.handover, "stopped": s.stopped,
            "best_tflops": s.best["tflops"] if s.best else None,
            "times_s": dict(s.times), "per_trial_ms": {k: 1000 * v / max(1, s.evaluated) for k, v in s.times.items()},
            "windows": windows(clocked.marks, s.evaluated)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recording", type=Path, default=DEFAULT_RECORDING, help="replay file (default: skinny)")
    ap.add_argument("--synthetic", metavar="MxNxK", help="a SYNTHETIC measurer over the full simt space (fp32) "
                    "of this problem instead of a recording; the family's seeds are tried first")
    ap.add_argument("--samplers", nargs="+", default=["cmaes", "tpe"], help="samplers (default cmaes tpe)")
    ap.add_argument("--budgets", nargs=2, type=int, default=[200, 1000], metavar=("SHORT", "LONG"),
                    help="the two budgets (default 200 1000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-store", action="store_true", help="no store (the sampler's and checks' cost alone)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON (default benchmarks/results/)")
    args = ap.parse_args(argv)
    short, long_ = args.budgets
    if not 1 <= short < long_:
        ap.error("--budgets SHORT LONG needs 1 <= SHORT < LONG")
    if args.synthetic:
        from codegen.problem import DType, Problem
        from search.space import seeds

        try:
            m, n, k = (int(v) for v in args.synthetic.lower().split("x"))
        except ValueError:
            ap.error(f"--synthetic {args.synthetic!r}: expected MxNxK, e.g. 1536x2560x1024")
        measurer, tried_first = SyntheticMeasurer(Problem(m, n, k, DType.fp32)), seeds("simt")
    else:
        from search.measure import ReplayMeasurer

        measurer, tried_first = ReplayMeasurer(args.recording), None
    rows, ratios, cpu_ratios = [], {}, {}
    for sampler in args.samplers:
        one(measurer, sampler, min(10, short), args.seed, not args.no_store, tried_first)  # warm-up (imports): not timed
        pair = [one(measurer, sampler, b, args.seed, not args.no_store, tried_first) for b in (short, long_)]
        rows += pair
        ratios[sampler] = pair[1]["wall_s"] / pair[0]["wall_s"]
        cpu_ratios[sampler] = pair[1]["cpu_s"] / pair[0]["cpu_s"]
        print(f"{sampler}: {short} trials {pair[0]['wall_s']:.1f} s, {long_} trials {pair[1]['wall_s']:.1f} s "
              f"({ratios[sampler]:.2f}x, CPU {cpu_ratios[sampler]:.2f}x; target <= {long_ / short:g}x); long: "
              + ", ".join(f"{k} {v:.1f} s" for k, v in pair[1]["times_s"].items()))
        for w in pair[1]["windows"]:
            print(f"  trials {w['trials'][0]}-{w['trials'][1]}: " + ", ".join(
                f"{k[:-3]} {v:.1f}" for k, v in w.items() if k.endswith("_ms") and k != "compile_wait_ms") + " ms/trial")
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if args.synthetic:
        measured = {"measurer": f"synthetic: made-up objective over the full simt fp32 space "
                                f"({measurer.space.size} points), the family's real validity rules and rendered "
                                f"sources; the family's seeds tried first",
                    "measurement": "SYNTHETIC on the CPU: the runner's own cost per trial (sampler, checks, store); "
                                   "no compile, no GPU, no real kernel timing",
                    "problem": measurer.problem.key}
    else:
        rec = json.loads(args.recording.read_text())["recorded"]
        measured = {"measurer": "replay",
                    "measurement": "REPLAY on the CPU of a sweep recorded on a GPU: the runner's own cost per trial "
                                   "(sampler, checks, store), no compile and no GPU in the loop",
                    "recording": {"file": args.recording.name,
                                  "recorded": {k: rec.get(k) for k in ("where", "when", "how")}}}
    doc = {"suite": "search-cost", "date": date, **measured,
           "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                       "note": "no GPU used"},
           "versions": {p: metadata.version(p) for p in ("optuna", "sqlalchemy")},
           "command": " ".join(["python3 -m benchmarks.search_cost", *(sys.argv[1:] if argv is None else argv)]),
           "store": None if args.no_store else "fresh SQLite file", "budgets": [short, long_],
           "target_ratio": long_ / short, "wall_ratio": ratios,
           "cpu_ratio": cpu_ratios, "window": WINDOW, "runs": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    kind = "synthetic-" if args.synthetic else ""
    path = args.out / f"search-cost-{kind}{date.replace(':', '')}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
