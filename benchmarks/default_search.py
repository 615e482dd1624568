"""The default search on a GPU: what ``codegen search`` finds with no ``--family``, against cuBLAS and
against searching one family alone with the same budget.

Two questions, each answered by real ``codegen search`` processes, every one into a store file of its
own so that none reuses another's measurements:

- ``target``: the default search of ``--target`` (``--target-budget`` trials over every family that
  fits) against cuBLAS, timed beside it in the same run;
- for each ``--held-out`` shape (shapes that no family's seeds were chosen on): the default search with
  ``--budget`` trials, and a search of each of ``--families`` alone with the same budget; the default
  search's best as a share of the best single-family search's best.

    python3 -m benchmarks.default_search run --dir DIR [--deadline-s 520]
    python3 -m benchmarks.default_search report --dir DIR [--out benchmarks/results]

``run`` resumes across device calls (benchmarks.steps); ``report`` reads the searches' ``--json``
summaries and writes ``default-search-<device>-<date of the last step>.json`` (DESIGN.md's format; the
searches time one call at a time with L2 flushed: ``"timing": "cold_single"``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from benchmarks.steps import Planned, load_steps, run_steps

RESULTS = Path(__file__).resolve().parent / "results"
TARGET = "2048x6144x4096"
HELD_OUT = ("1536x2560x1024", "768x5120x2048")
FAMILIES = ("hopper", "tensorcore")
THRESHOLD = 0.97


def dims(shape: str) -> tuple[int, int, int]:
    m, n, k = (int(v) for v in shape.split("x"))
    return m, n, k


def search_args(shape: str, dtype: str, budget: int, db: Path, family: str | None, replay: Path | None) -> tuple:
    m, n, k = dims(shape)
    args = ["-m", "codegen", "search", "--m", str(m), "--n", str(n), "--k", str(k), "--dtype", dtype,
            "--budget", str(budget), "--db", f"sqlite:///{db.resolve()}", "--no-warm-start", "--quiet", "--json"]
    args += ["--family", family] if family else []
    args += ["--replay", str(replay)] if replay else []
    return tuple(args)


def plan(args: argparse.Namespace) -> list[Planned]:
    d, replay = args.dir, args.replay
    steps = [Planned("target", search_args(args.target, args.dtype, args.target_budget, d / "target.db", None,
                                           replay[0] if replay else None),
                     {"shape": args.target, "budget": args.target_budget, "family": None})]
    for i, shape in enumerate(args.held_out):
        letter = chr(ord("A") + i)
        rec = replay[1 + i] if replay else None
        for family in (None, *args.families):
            name = f"{letter}-{family or 'default'}"
            steps.append(Planned(name, search_args(shape, args.dtype, args.budget, d / f"{name}.db", family, rec),
                                 {"shape": shape, "budget": args.budget, "family": family}))
    return steps


def _kernel(best: dict | None) -> dict | None:
    if not best:
        return None
    return {k: best.get(k) for k in ("kernel", "family", "median_ms", "p20_ms", "p80_ms", "tflops", "gbps")}


def _problem(shape: str, dtype: str) -> dict:
    m, n, k = dims(shape)
    return {"m": m, "n": n, "k": k, "dtype": dtype, "layout": "forward", "bias": False, "density": 1.0, "block": None}


def _search(summary: dict, budget: int, family: str | None) -> dict:
    return {"sampler": summary.get("sampler"), "budget": budget, "evaluated": summary.get("evaluated"),
            "families": "every family that fits (the default)" if family is None else [family],
            "seeded": summary.get("seeded"), "wall_s": summary.get("wall_s"),
            "family_bests": {f: {"evaluated": s.get("evaluated"), "best": _kernel(s.get("best"))}
                             for f, s in (summary.get("families") or {}).items()}}


def records(args: argparse.Namespace, steps: list[dict]) -> list[dict]:
    ended = {s["step"]: s for s in steps if s["rc"] == 0 and s.get("summary")}
    out = []
    target = ended.get("target")
    if target:
        best = target["summary"]["best"] or {}
        ratio = (best.get("ratio") or {}).get("cublas")
        out.append({"problem": _problem(args.target, args.dtype), "role": "the default search against cuBLAS",
                    "timing": "cold_single",
                    "ours": {**(_kernel(best) or {}), "search": _search(target["summary"], args.target_budget, None)},
                    "baselines": best.get("baselines") or {}, "ratio": best.get("ratio") or {},
                    "targets": {"ratio_cublas_at_least": THRESHOLD, "met": bool(ratio and ratio >= THRESHOLD)}})
    for i, shape in enumerate(args.held_out):
        letter = chr(ord("A") + i)
        default = ended.get(f"{letter}-default")
        singles = {f: ended.get(f"{letter}-{f}") for f in args.families}
        if default is None or not all(singles.values()):
            continue
        best = default["summary"]["best"] or {}
        alone = {f: s["summary"]["best"] for f, s in singles.items()}
        top = max((b for b in alone.values() if b), key=lambda b: b["tflops"], default=None)
        share = round(best["tflops"] / top["tflops"], 4) if best.get("tflops") and top else None
        out.append({"problem": _problem(shape, args.dtype), "role": "held out: no family's seeds were chosen on it",
                    "timing": "cold_single",
                    "ours": {**(_kernel(best) or {}), "search": _search(default["summary"], args.budget, None)},
                    "single_family": {f: {**(_kernel(b) or {}), "search": _search(singles[f]["summary"], args.budget, f)}
                                      for f, b in alone.items()},
                    "baselines": best.get("baselines") or {}, "ratio": best.get("ratio") or {},
                    "targets": {"of_best_single_family": share, "best_single_family": top and top.get("family"),
                                "at_least": THRESHOLD, "met": bool(share and share >= THRESHOLD)}})
    return out


def versions(db: Path) -> dict:
    """The versions a store's first run recorded (gemmscape, NVRTC, driver, torch)."""
    from store import Store

    with Store(f"sqlite:///{db}", read_only=True) as store:
        runs = store.runs()
    return (runs[0]["versions"] or {}) if runs else {}


def cmd_report(args: argparse.Namespace) -> int:
    import json

    steps = load_steps(args.dir)
    recs = records(args, steps)
    if not recs:
        print(f"default_search report: no finished search in {args.dir}", file=sys.stderr)
        return 1
    first = next(s for s in steps if s["rc"] == 0 and s.get("summary"))
    device = (first["summary"].get("device") or {}).get("name", "unknown")
    last = max(s["started"] for s in steps)[:19]
    doc = {"suite": "default-search", "date": min(s["started"] for s in steps)[:19] + "Z", "device": device,
           "versions": {**versions(args.dir / f"{first['step']}.db"),
                        **{k: v for k, v in (first["summary"].get("device") or {}).items() if k in ("nvrtc", "driver")}},
           "command": "python3 -m benchmarks.default_search run (steps in `steps`), then report",
           "timing": "cold_single",
           "settings": {"target": args.target, "target_budget": args.target_budget, "held_out": args.held_out,
                        "budget": args.budget, "families": args.families, "dtype": args.dtype,
                        "threshold": THRESHOLD, "stores": "one SQLite file per search, none warm-started",
                        "replay": [str(p) for p in args.replay] if args.replay else None},
           "steps": [{k: s.get(k) for k in ("step", "rc", "started", "wall_s", "command")} for s in steps],
           "records": recs}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"default-search-{device.replace(' ', '_')}-{last[:10]}T{last[11:19].replace(':', '')}Z.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    for r in recs:
        p, o, t = r["problem"], r["ours"], r["targets"]
        print(f"{p['m']}x{p['n']}x{p['k']} {p['dtype']}: {o.get('kernel')} ({o.get('family')}) {o.get('tflops') or 0:.1f} "
              f"TFLOP/s, x cuBLAS {(r['ratio'] or {}).get('cublas')}; targets {t}")
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "report"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, required=True, help="the stores and steps.jsonl (carried between calls)")
        p.add_argument("--target", default=TARGET, help="MxNxK of the search held to cuBLAS")
        p.add_argument("--target-budget", type=int, default=60)
        p.add_argument("--held-out", nargs="*", default=list(HELD_OUT), help="MxNxK shapes of the family comparison")
        p.add_argument("--budget", type=int, default=200)
        p.add_argument("--families", nargs="*", default=list(FAMILIES), help="families searched alone")
        p.add_argument("--dtype", default="bf16")
        p.add_argument("--replay", type=Path, nargs="+", default=None,
                       help="one recording for the target, then one per held-out shape: no GPU (tests)")
    sub.choices["run"].add_argument("--deadline-s", type=float, default=520.0)
    sub.choices["report"].add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.replay and len(args.replay) != 1 + len(args.held_out):
        ap.error("--replay takes one recording for the target and one per held-out shape")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run_steps(args.dir, plan(args), args.deadline_s, "default_search") if args.cmd == "run" else cmd_report(args)


if __name__ == "__main__":
    sys.exit(main())
