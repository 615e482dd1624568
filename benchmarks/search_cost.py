"""What a search costs per trial as it grows: a short and a long search of the same problem.

    python3 -m benchmarks.search_cost [--recording FILE] [--samplers cmaes tpe] [--budgets 200 1000]
                                      [--seed 0] [--no-store] [--out DIR]

A REPLAY, not a GPU measurement: each search is the real runner (``search.runner.run_search``)
over a ``ReplayMeasurer`` (answers from a sweep recorded on the H200), writing to a fresh SQLite
store (``--no-store``: none). With no compiler and no GPU in the loop, the wall time is the
runner's own cost: sampler, checks, store. The JSON gives, per sampler and budget, the wall time,
the run summary's time buckets (sample, check, store, compile wait, gpu: here the replay's
answers), and the long search's wall time over the short one's (the issue's target: at most the
ratio of the budgets, 5 for 1000 over 200, i.e. a cost per trial that stays flat). On a GPU every
trial adds its compile and measurement time to both, which this replay does not have.
Written to ``benchmarks/results/search-cost-<UTC date-time>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import tempfile
import time
import warnings
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_RECORDING = ROOT / "search" / "recordings" / "replay-simt-skinny-32x4096x4096-fp32.json"


def one(recording: Path, sampler: str, budget: int, seed: int, store: bool) -> dict:
    """One search; its wall time and the summary's accounting."""
    import optuna

    from search.measure import ReplayMeasurer
    from search.runner import run_search
    from store import Store

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="optuna")
    measurer = ReplayMeasurer(recording)
    with tempfile.TemporaryDirectory() as tmp:
        db = Store(f"sqlite:///{Path(tmp) / 'cost.db'}") if store else None
        started = time.perf_counter()
        s = run_search(measurer.problem, measurer.space, measurer, sampler=sampler, seed=seed, budget=budget,
                       store=db, progress=False, seeds=None)
        wall = time.perf_counter() - started
        if db is not None:
            db.close()
    return {"sampler": sampler, "budget": budget, "wall_s": wall, "evaluated": s.evaluated,
            "proposals": s.proposals, "sampler_proposals": s.sampler_proposals, "replaced": s.replaced,
            "valid_fraction": s.valid_fraction, "handover": s.handover, "stopped": s.stopped,
            "times_s": dict(s.times), "per_trial_ms": {k: 1000 * v / max(1, s.evaluated) for k, v in s.times.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recording", type=Path, default=DEFAULT_RECORDING, help="replay file (default: skinny)")
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
    rows, ratios = [], {}
    for sampler in args.samplers:
        pair = [one(args.recording, sampler, b, args.seed, not args.no_store) for b in (short, long_)]
        rows += pair
        ratios[sampler] = pair[1]["wall_s"] / pair[0]["wall_s"]
        print(f"{sampler}: {short} trials {pair[0]['wall_s']:.1f} s, {long_} trials {pair[1]['wall_s']:.1f} s "
              f"({ratios[sampler]:.2f}x; target <= {long_ / short:g}x); long: "
              + ", ".join(f"{k} {v:.1f} s" for k, v in pair[1]["times_s"].items()))
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    rec = json.loads(args.recording.read_text())["recorded"]
    doc = {"suite": "search-cost", "date": date,
           "measurement": "REPLAY on the CPU of a sweep recorded on a GPU: the runner's own cost per trial "
                          "(sampler, checks, store), no compile and no GPU in the loop",
           "recording": {"file": args.recording.name, "recorded": {k: rec.get(k) for k in ("where", "when", "how")}},
           "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                       "note": "no GPU used"},
           "versions": {p: metadata.version(p) for p in ("optuna", "sqlalchemy")},
           "command": " ".join(["python3 -m benchmarks.search_cost", *(sys.argv[1:] if argv is None else argv)]),
           "store": None if args.no_store else "fresh SQLite file", "budgets": [short, long_],
           "target_ratio": long_ / short, "wall_ratio": ratios, "runs": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"search-cost-{date.replace(':', '')}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
