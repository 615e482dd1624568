"""Turn a device search session into a committed result: best found per search run against cuBLAS
and against the exhaustive best of a recorded sweep, with each search's end-to-end wall time.

    python3 -m benchmarks.probes.search_report --db sqlite:///h200.db --sweep FILE --log search.log [--out DIR]

Reads the store written by `codegen search` on the device, the sweep recording, and the device
log (for end-to-end wall times, which include process start and compiling); writes
``search-<device>-<date>.json`` in the format of DESIGN.md with a ``search`` block per record.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from codegen.problem import Problem
from store import Store

RESULTS = Path(__file__).resolve().parents[1] / "results"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--sweep", type=Path, required=True)
    ap.add_argument("--log", type=Path, required=True, help="device log with the searches' --json lines")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    store = Store(args.db, read_only=True)
    sweep = json.loads(args.sweep.read_text())
    ok = {n: r for n, r in sweep["results"].items() if r["status"] == "ok"}
    exhaustive_name = min(ok, key=lambda n: ok[n]["median_ms"])
    walls = [int(w) for w in re.findall(r"end-to-end wall: (\d+) s", args.log.read_text())]
    summaries = [json.loads(line) for line in args.log.read_text().splitlines() if line.startswith("{")]
    device = store.devices()[0]
    records = []
    for run, summary, wall in zip(store.runs(), summaries, walls, strict=True):
        best = store.trials(run_id=run["id"], kernel_name=summary["best"]["kernel"])[0]
        problem = Problem.from_dict(best)
        records.append({
            "problem": {**problem.to_dict(), "density": 1.0, "block": None},
            "ours": {"kernel": best["kernel"], "median_ms": best["median_ms"], "p20_ms": best["p20_ms"],
                     "p80_ms": best["p80_ms"], "tflops": best["tflops"], "gbps": best["gbps"],
                     "search": {"sampler": run["sampler"], "budget": run["budget"], "space": run["study_name"].split(":")[2].split("-")[-1],
                                "evaluated": summary["evaluated"], "end_to_end_wall_s": wall,
                                "search_wall_s": round(summary["wall_s"], 1),
                                "gpu_waited_for_compiles_s": round(summary["gpu_wait_s"], 2),
                                "command": run["command"]}},
            "baselines": best["baselines"],
            "ratio": best["ratio"],
            "exhaustive_best_of_restricted_space": {
                "kernel": exhaustive_name, "median_ms": ok[exhaustive_name]["median_ms"],
                "tflops": ok[exhaustive_name]["tflops"], "recording": str(args.sweep.name),
                "found_over_exhaustive": ok[exhaustive_name]["median_ms"] / best["median_ms"],
            },
        })  # fmt: skip
    date = summaries and store.runs()[0]["started"][:19] + "Z"
    doc = {
        "suite": "search",
        "date": date,
        "device": device["name"],
        "versions": {**store.runs()[0]["versions"], "nvrtc": device["nvrtc"], "driver": device["driver"]},
        "command": "bash benchmarks/device/search.sh (then python3 -m benchmarks.probes.search_report)",
        "note": "exhaustive best from the sweep recorded in a separate device call of the same session",
        "records": records,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"search-{re.sub(r'[^A-Za-z0-9]+', '_', device['name'])}-{date.replace(':', '')}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
