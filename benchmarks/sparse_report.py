"""When sparsity pays: the sparsity suite's results as tables, break-even densities and targets.

    python3 -m benchmarks.sparse_report [RESULT.json ...] [--out FILE.json] [--markdown]

Reads the ``sparse`` suite's result files (default: every ``benchmarks/results/sparse-<device>-*.json``
of a searched run) and, for each shape, dtype, block size and density, takes the best kernel and
the baselines timed beside it in the same run (the later file wins where two measured the same
problem). Computes, per shape, dtype and block, the density below which our kernel beats dense
cuBLAS (and torch's BSR matmul), interpolated between measured densities, and checks issue 11's
targets with the best block size at each density (ours against the baseline's best). Nothing is measured here: every figure comes
from the files named in the output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.sparsity import break_even

RESULTS = Path(__file__).resolve().parent / "results"
BASELINES = ("cublas", "torch_bsr", "cusparselt")
#: Issue 11's targets at 4096³ (and one at batch 32): (m, dtype, baseline, densities, least ratio);
#: at each density our fastest block size is held against the baseline's fastest.
TARGETS = [
    (4096, "bf16", "cublas", (0.1,), 4.0),
    (4096, "bf16", "cublas", (0.25,), 2.0),
    (4096, "bf16", "cublas", (0.5,), 1.1),
    (4096, "bf16", "torch_bsr", (0.1, 0.25, 0.5), 3.0),
    (4096, "fp32", "cublas", (0.1,), 6.0),
    (4096, "fp32", "torch_bsr", (0.1,), 1.2),
    (32, "bf16", "cublas", (0.1,), 3.0),
]


def default_files() -> list[Path]:
    return sorted(p for p in RESULTS.glob("sparse-*.json") if not p.name.startswith(("sparse-hand", "sparse-report")))


def points(files: list[Path]) -> dict[tuple, dict]:
    """(m, n, k, dtype, block, nominal density) -> the best kernel's record, later files first."""
    out: dict[tuple, dict] = {}
    for path in files:
        doc = json.loads(path.read_text())
        for rec in doc["records"]:
            p, ours = rec["problem"], rec.get("ours")
            if not p.get("block") or not ours:
                continue
            key = (p["m"], p["n"], p["k"], p["dtype"], p["block"], round(p["density"], 2))
            out[key] = {"density": p["density"], "pattern": p["pattern"], "kernel": ours["kernel"],
                        "ours_ms": ours["median_ms"], "range_ms": [ours["p20_ms"], ours["p80_ms"]],
                        "baselines_ms": {b: v["median_ms"] for b, v in rec.get("baselines", {}).items()
                                         if isinstance(v, dict)},
                        "search": {k: ours.get("search", {}).get(k) for k in ("sampler", "budget", "evaluated",
                                                                               "gain_over_best_seed")},
                        "file": path.name}
    return out


def report(files: list[Path]) -> dict:
    pts = points(files)
    groups: dict[tuple, list] = {}
    for (m, n, k, dtype, block, d), rec in sorted(pts.items()):
        groups.setdefault((m, n, k, dtype, block), []).append((d, rec))
    even = []
    for (m, n, k, dtype, block), recs in groups.items():
        row = {"shape": f"{m}x{n}x{k}", "dtype": dtype, "block": block}
        for base in ("cublas", "torch_bsr"):
            pairs = [(rec["density"], rec["baselines_ms"][base] / rec["ours_ms"]) for _, rec in recs
                     if base in rec["baselines_ms"]]
            density, note = break_even(pairs)
            row[f"break_even_vs_{base}"] = density
            row[f"note_vs_{base}"] = note
        even.append(row)
    targets = []
    for m, dtype, base, densities, least in TARGETS:
        for d in densities:
            recs = [(key[4], rec) for key, rec in pts.items() if key[0] == m and key[3] == dtype and key[5] == d]
            theirs = [rec["baselines_ms"][base] for _, rec in recs if base in rec["baselines_ms"]]
            target = {"m": m, "dtype": dtype, "baseline": base, "density": d, "target": least}
            if not recs or not theirs:
                targets.append({**target, "ratio": None, "met": None})
                continue
            # best against best: our fastest block size against the baseline's fastest (for dense
            # cuBLAS, its fastest measurement among the runs)
            block, ours = min(recs, key=lambda br: br[1]["ours_ms"])
            ratio = min(theirs) / ours["ours_ms"]
            targets.append({**target, "ratio": round(ratio, 3), "block": block, "kernel": ours["kernel"],
                            "ours_ms": ours["ours_ms"], "baseline_ms": min(theirs), "met": ratio >= least})
    table = [{"shape": f"{m}x{n}x{k}", "dtype": dtype, "block": block, "density": round(rec["density"], 4),
              **{k2: v for k2, v in rec.items() if k2 != "density"}}
             for (m, n, k, dtype, block, _), rec in sorted(pts.items())]
    return {"derived_from": [p.name for p in files], "break_even": even, "targets": targets, "points": table}


def markdown(doc: dict) -> str:
    lines = ["| shape | dtype | block | density | ours ms | cuBLAS ms | torch BSR ms | cuSPARSELt 2:4 ms | vs cuBLAS | vs BSR |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in doc["points"]:
        b = p["baselines_ms"]

        def ms(name: str, b: dict = b) -> str:
            return f"{b[name]:.3f}" if name in b else "-"

        ratio = {n: f"{b[n] / p['ours_ms']:.2f}" if n in b else "-" for n in ("cublas", "torch_bsr")}
        lines.append(f"| {p['shape']} | {p['dtype']} | {p['block']} | {p['density']:g} | {p['ours_ms']:.3f} | "
                     f"{ms('cublas')} | {ms('torch_bsr')} | {ms('cusparselt')} | {ratio['cublas']} | {ratio['torch_bsr']} |")
    lines += ["", "| shape | dtype | block | break-even density vs cuBLAS | vs torch BSR |", "| --- | --- | --- | --- | --- |"]
    for e in doc["break_even"]:
        def cell(base: str, e: dict = e) -> str:
            d = e[f"break_even_vs_{base}"]
            note = e[f"note_vs_{base}"]
            if d is None:
                return note
            return f"> {d:g} (faster at every measured density)" if note.startswith("faster") else f"{d:.3g}"

        lines.append(f"| {e['shape']} | {e['dtype']} | {e['block']} | {cell('cublas')} | {cell('torch_bsr')} |")
    lines += ["", "| target (baseline ms ÷ ours) | density | our best block | ratio | met |",
              "| --- | --- | --- | --- | --- |"]
    for t in doc["targets"]:
        lines.append(f"| M={t['m']} {t['dtype']} vs {t['baseline']} ≥ {t['target']:g} | {t['density']:g} | "
                     f"{t.get('block', '-')} | {t['ratio']} | {'yes' if t['met'] else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help="sparse suite result files (default: all committed)")
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = parser.parse_args(argv)
    files = args.files or default_files()
    if not files:
        parser.error("no sparse suite results found")
    doc = report(files)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(doc) if args.markdown else json.dumps(doc["targets"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
