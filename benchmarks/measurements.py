"""The figures of docs/measurements.md and README's headline table, generated from the committed JSON.

    python3 -m benchmarks.measurements             # rewrite the generated tables in place
    python3 -m benchmarks.measurements --check     # exit 1 (and say which) when one is out of date

Every table lies in its file between two marker comments, ``<!-- measurements:NAME begin ... -->``
and ``<!-- measurements:NAME end -->``; the prose around them is written by hand, the tables only
here, from the result files in benchmarks/results/ (read, never changed). So a figure cannot drift
from the file it came from: tests/test_docs.py regenerates both files and compares them byte for
byte with what is committed.

Every row names its JSON file, the device, the date of the run and the timing method:

- ``cold_single``: one call at a time between CUDA events, the L2 cache flushed before each
  repetition (median of 20-100 repetitions with p20/p80). Records that name no method are of this
  kind: before records carried ``"timing": "cold_single"`` or ``"engine"``, every suite and probe
  (``benchmarks.run``, ``benchmarks.probes.*``) timed single calls with L2 flushed, and their
  top-level ``"timing"`` holds only that harness's repetition settings. Old files are read as they
  are, not rewritten.
- ``cold_single (eager)`` / ``cold_single (CUDA graph)``: ``benchmarks.linear_train``'s records,
  whose own ``"timing"`` says whether the layer's calls ran eagerly or as one captured graph; each
  call or replay is timed alone after an L2 flush.
- ``engine``: many distinct weight copies (together far past L2) called back to back in one CUDA
  graph, time per call (``benchmarks.engine``, ``benchmarks.sparse24``'s decode rows; the method
  for claims at small batches).
- ``eager (whole model)``: ``benchmarks.model``'s records, a whole model's prefill or train step
  called eagerly between CUDA events, warm, the dense model and ours in alternating rounds;
  ``benchmarks.sparse_model``'s too (a pruned model against its dense twin), and ``graph (whole
  model)`` its decode steps replayed as one captured CUDA graph each, ``eager (one layer)`` its one
  pruned layer's train step; its engine-timed sparse GEMMs are ``engine``. Its records whose problem
  has ``scope`` "decoder layers ..." timed the decoder layers alone (no embedding, no LM head):
  ``graph (decoder layers)``, ``eager (decoder layers)``.
- ``quality (held-out bits/byte)``: ``benchmarks.sparse_quality``'s records, no timing at all: the
  held-out bits per byte of a model, dense, pruned and fine-tuned.

A table of ``WHEN_MEASURED`` stands on its page only once a result file of its kind is committed:
the first run of this command after that puts its section (heading, prose, markers) on the page,
before the heading named there, and fills it as any other.

A result file may carry a ``caveat`` (what its figures must be read with): it is printed under
the file's table.

Times are medians in µs with their range as recorded: p20-p80 where the record has them, else
min-max (marked). Ratios are the baseline's median over ours, both timed in the same run: above 1
means ours is faster.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: The files holding generated tables, and the path from each to benchmarks/results/ for links.
TARGETS = {"README.md": "benchmarks/results", "docs/measurements.md": "../benchmarks/results"}
BEGIN = re.compile(r"<!-- measurements:([a-z0-9-]+) begin[^>]*-->\n")
END = "<!-- measurements:{name} end -->"

BASELINE_NAMES = {"cublas": "cuBLAS", "torch_bsr": "torch BSR", "cusparselt": "cuSPARSELt 2:4",
                  "torch_linear": "nn.Linear"}


# ---- reading records -----------------------------------------------------------------------------
@functools.cache
def _load(results: Path, name: str) -> dict:
    path = results / name
    if not path.is_file():
        raise FileNotFoundError(f"benchmarks.measurements: {path} is named by a table but does not exist")
    return json.loads(path.read_text())


def timing_of(doc: dict, record: dict) -> str:
    """The timing method of ``record`` in ``doc`` (see the module: records naming none are cold_single)."""
    own = record.get("timing")
    if doc.get("suite") == "sparse-quality":
        return "quality (held-out bits/byte)"
    if doc.get("suite") == "model" or (doc.get("suite") == "sparse_model" and own != "engine"):
        prob = record.get("problem", {})
        scope = ("one layer" if prob.get("layer") else
                 "decoder layers" if str(prob.get("scope", "")).startswith("decoder layers") else "whole model")
        return f"{own} ({scope})"
    if own in ("cold_single", "engine"):
        return own
    if own == "eager":
        return "cold_single (eager)"
    if own == "cuda_graph":
        return "cold_single (CUDA graph)"
    top = doc.get("timing")
    if isinstance(top, str) and top in ("cold_single", "engine"):
        return top
    if isinstance(top, dict) and top.get("method") in ("cold_single", "engine"):
        return top["method"]
    return "cold_single"  # older records: the single-call, L2-flushed harness (see the module)


def find(results: Path, name: str, **match) -> dict:
    """The one record of file ``name`` whose problem has the ``match`` fields (``timing``: the record's own)."""
    doc = _load(results, name)
    found = []
    for record in doc["records"]:
        problem = record["problem"]
        ok = True
        for key, want in match.items():
            have = record.get("timing") if key == "timing" else problem.get(key)
            if key == "density" and have is not None:
                ok &= abs(have - want) < 0.01
            else:
                ok &= have == want
        if ok:
            found.append(record)
    if len(found) != 1:
        raise LookupError(f"benchmarks.measurements: {len(found)} records of {name} match {match}, not one")
    return found[0]


# ---- formatting ----------------------------------------------------------------------------------
def us(ms: float | None) -> str:
    """A time in µs, to about four significant digits."""
    if ms is None:
        return "–"
    v = ms * 1e3
    return f"{v:.0f}" if v >= 1000 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def timed(stats: dict) -> str:
    """Median µs with its recorded range: p20–p80, else min–max (marked)."""
    if stats.get("p20_ms") is not None and stats.get("p80_ms") is not None:
        return f"{us(stats['median_ms'])} ({us(stats['p20_ms'])}–{us(stats['p80_ms'])})"
    if stats.get("min_ms") is not None and stats.get("max_ms") is not None:
        return f"{us(stats['median_ms'])} (min–max {us(stats['min_ms'])}–{us(stats['max_ms'])})"
    return us(stats.get("median_ms"))


def times(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}×"


def shape(problem: dict) -> str:
    m, n, k = problem["m"], problem["n"], problem["k"]
    return f"{m}³" if m == n == k else f"{m}×{n}×{k}"


def source(doc: dict, record: dict, name: str, base: str) -> list[str]:
    """The cells every row ends with: timing method, device and date, JSON file."""
    return [timing_of(doc, record), f"{doc['device']}, {doc['date'][:10]}", f"[`{name}`]({base}/{name})"]


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


TAIL = ["timing", "device, date", "JSON"]


def compared(results: Path, base: str, rows: list[tuple[str, str, dict]], baseline: str = "cublas",
             kernel: bool = False) -> str:
    """One row per (label, file, match): ours against ``baseline``, both median (range) in µs."""
    name_b = BASELINE_NAMES[baseline]
    header = ["problem", *(["kernel"] if kernel else []), "ours µs, median (p20–p80)",
              f"{name_b} µs, median (p20–p80)", f"{name_b} ÷ ours", *TAIL]
    out = []
    for label, name, match in rows:
        doc, record = _load(results, name), find(results, name, **match)
        out.append([label, *([f"`{record['ours']['kernel']}`"] if kernel else []), timed(record["ours"]),
                    timed(record["baselines"][baseline]), times(record["ratio"].get(baseline)),
                    *source(doc, record, name, base)])
    return table(header, out)


# ---- the tables ----------------------------------------------------------------------------------
HOPPER = "hopper-NVIDIA_H200-2026-12-02T074734Z.json"
HOPPER_SPLIT = "hopper-NVIDIA_H200-2026-12-02T033856Z.json"
TENSORCORE = "tensorcore-NVIDIA_H200-2026-12-01T043328Z.json"
SIMT_100 = "simt5-NVIDIA_H200-2026-11-30T151518Z.json"
SIMT_200 = "simt5-NVIDIA_H200-2026-11-30T150525Z.json"
SPARSE_BF16 = "sparse-NVIDIA_H200-2026-12-04T161150Z.json"
SPARSE_FP32 = "sparse-NVIDIA_H200-2026-12-01T063544Z.json"
SPARSE_REPORT = "sparse-report-NVIDIA_H200-2026-12-04.json"
SPARSE24 = "sparse24-NVIDIA_H100_80GB_HBM3-2026-12-06T101316Z.json"  # its decode records (engine timing)
SPARSE24_PREFILL = "sparse24-NVIDIA_H100_80GB_HBM3-2026-12-06T135648Z.json"
SEARCH_TARGETS = "search-targets-NVIDIA_H200-2026-12-02T073139Z.json"
SEARCH_QUALITY = "search-quality-2026-12-04T034542Z.json"
LAYER = (("linear-NVIDIA_H200-2026-12-04T031613Z.json", "fp32", 32),
         ("linear-NVIDIA_H200-2026-12-04T031630Z.json", "bf16", 32),
         ("linear-NVIDIA_H200-2026-12-02T032213Z.json", "bf16", 4096))

CUBE = {"m": 4096, "n": 4096, "k": 4096}
BIG = {"m": 8192, "n": 8192, "k": 8192}
ODD = {"m": 4097, "n": 4095, "k": 4093}


def headline(results: Path, base: str) -> str:
    rows = [
        ("dense bf16 4096³, Hopper family", HOPPER, {**CUBE, "dtype": "bf16"}),
        ("dense bf16 8192³, Hopper family", HOPPER, {**BIG, "dtype": "bf16"}),
        ("unaligned bf16 4097×4095×4093, Hopper family (pack prepass)", HOPPER, {**ODD, "dtype": "bf16"}),
        ("block-sparse W, bf16 4096³, blocks of 64, density 0.1", SPARSE_BF16,
         {**CUBE, "dtype": "bf16", "block": 64, "density": 0.1}),
        ("block-sparse W, bf16 4096³, blocks of 64, density 0.25", SPARSE_BF16,
         {**CUBE, "dtype": "bf16", "block": 64, "density": 0.25}),
        ("2:4 W, bf16 4096³, Hopper 2:4 family (searched)", SPARSE24_PREFILL, {**CUBE, "dtype": "bf16"}),
        ("2:4 W, bf16 2048×14336×4096, Hopper 2:4 family (searched)", SPARSE24_PREFILL,
         {"m": 2048, "n": 14336, "k": 4096, "dtype": "bf16"}),
        ("2:4 W, bf16 16×4096×14336 (decode), mma.sp family's seed", SPARSE24,
         {"m": 16, "n": 4096, "k": 14336, "dtype": "bf16"}),
        ("dense fp32 4096³ on CUDA cores, SIMT family (searched)", SIMT_100, {**CUBE, "dtype": "fp32"}),
        ("unaligned fp32 4097×4095×4093, SIMT family (searched)", SIMT_100, {**ODD, "dtype": "fp32"}),
    ]
    return compared(results, base, rows)


def hopper(results: Path, base: str) -> str:
    doc = _load(results, HOPPER)
    rows = [(f"{r['problem']['dtype']} {shape(r['problem'])}", HOPPER, {**{k: r["problem"][k] for k in "mnk"},
                                                                      "dtype": r["problem"]["dtype"]})
            for r in doc["records"]]
    rows += [(f"bf16 {m}×4096×4096, split-K", HOPPER_SPLIT, {"m": m, "n": 4096, "k": 4096, "dtype": "bf16"})
             for m in (128, 32)]
    return compared(results, base, rows, kernel=True)


def tensorcore(results: Path, base: str) -> str:
    doc = _load(results, TENSORCORE)
    rows = [(f"{r['problem']['dtype']} {shape(r['problem'])}", TENSORCORE,
             {**{k: r["problem"][k] for k in "mnk"}, "dtype": r["problem"]["dtype"]}) for r in doc["records"]]
    return compared(results, base, rows, kernel=True)


def simt(results: Path, base: str) -> str:
    rows = [(f"fp32 {shape(p)}", name, {**p, "dtype": "fp32"}) for name, p in (
        (SIMT_100, CUBE), (SIMT_100, {"m": 1000, "n": 1000, "k": 1000}), (SIMT_100, ODD),
        (SIMT_200, {"m": 128, "n": 4096, "k": 4096}), (SIMT_200, {"m": 32, "n": 4096, "k": 4096}),
        (SIMT_200, {"m": 1, "n": 4096, "k": 4096}))]
    return compared(results, base, rows, kernel=True)


def _sparse(results: Path, base: str, name: str) -> str:
    doc = _load(results, name)
    baselines = [b for b in BASELINE_NAMES if all(b in (r.get("ratio") or {}) for r in doc["records"])]
    header = ["problem", "block", "density", "kernel", "ours µs, median (p20–p80)", "cuBLAS µs (dense)",
              *(f"{BASELINE_NAMES[b]} ÷ ours" for b in baselines), *TAIL]
    rows = []
    for r in sorted(doc["records"], key=lambda r: (-r["problem"]["m"], r["problem"]["block"], r["problem"]["density"])):
        p = r["problem"]
        rows.append([f"{p['dtype']} {shape(p)}", str(p["block"]), f"{p['density']:.2f}", f"`{r['ours']['kernel']}`",
                     timed(r["ours"]), us(r["baselines"]["cublas"]["median_ms"]),
                     *(times(r["ratio"].get(b)) for b in baselines), *source(doc, r, name, base)])
    return table(header, rows)


def sparse_bf16(results: Path, base: str) -> str:
    return _sparse(results, base, SPARSE_BF16)


def sparse_fp32(results: Path, base: str) -> str:
    return _sparse(results, base, SPARSE_FP32)


def sparse_break_even(results: Path, base: str) -> str:
    report = _load(results, SPARSE_REPORT)
    docs = [_load(results, f) for f in report["derived_from"]]
    devices = ", ".join(sorted({d["device"] for d in docs}))
    dates = sorted({d["date"][:10] for d in docs})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    methods = ", ".join(sorted({timing_of(d, r) for d in docs for r in d["records"]}))

    def density(value: float, note: str) -> str:
        return f"above {value:g} (faster at every density measured)" if note.startswith("faster") else f"{value:.3f}"

    rows = [[f"{b['dtype']} {shape(dict(zip('mnk', map(int, b['shape'].split('x')), strict=True)))}", str(b["block"]),
             density(b["break_even_vs_cublas"], b["note_vs_cublas"]),
             density(b["break_even_vs_torch_bsr"], b["note_vs_torch_bsr"]),
             methods, f"{devices}, {when}", f"[`{SPARSE_REPORT}`]({base}/{SPARSE_REPORT})"]
            for b in sorted(report["break_even"], key=lambda b: (b["dtype"], -int(b["shape"].split("x")[0]), b["block"]))]
    return table(["problem", "block", "break-even density vs dense cuBLAS", "vs torch BSR", *TAIL], rows)


def layer(results: Path, base: str) -> str:
    header = ["layer (batch × 4096 → 4096, bias)", "step", "ours µs, median (p20–p80)",
              "nn.Linear µs, median (p20–p80)", "nn.Linear ÷ ours", "kernels (forward, grad_input, grad_weight)", *TAIL]
    rows = []
    for name, dtype, batch in LAYER:
        doc = _load(results, name)
        for r in doc["records"]:
            p = r["problem"]
            gemms = r["ours"].get("gemms") or {}
            rows.append([f"{dtype}, batch {batch}", "forward" if p["layout"] == "forward" else "forward + backward",
                         timed(r["ours"]), timed(r["baselines"]["torch_linear"]), times(r["ratio"].get("torch_linear")),
                         ", ".join(f"`{gemms[g]}`" for g in ("forward", "grad_input", "grad_weight") if g in gemms),
                         *source(doc, r, name, base)])
    return table(header, rows)


def search_targets(results: Path, base: str) -> str:
    doc = _load(results, SEARCH_TARGETS)
    rows = []
    for r in doc["records"]:
        short = [r["short_searches"][f"seed{s}"]["of_long_best"] for s in doc["settings"]["seeds"]]
        ordered = sorted(short)
        warm = (r.get("targets") or {}).get("warm_start")
        rows.append([f"fp32 {shape(r['problem'])} ({r['role'].split(':')[0]})",
                     f"{r['ours']['tflops']:.2f} TFLOP/s, {times(r['ratio']['cublas'])} cuBLAS",
                     f"{r['seeded_short_search']['of_long_best']:.3f}",
                     " / ".join(f"{v:.3f}" for v in short) + f" (median {ordered[len(ordered) // 2]:.3f})",
                     "–" if not warm else f"{warm['of_long_best']:.3f}; 97% at trial {warm['trials_to_97pct_of_long_best']}",
                     *source(doc, r, SEARCH_TARGETS, base)])
    big, small = doc["settings"]["big"], doc["settings"]["small"]
    header = [f"problem ({doc['settings']['family']} family, full space)", f"best of a {big}-trial search (seeded)",
              f"its first {small} trials: share of that best",
              f"unseeded {small}-trial searches, seeds {'/'.join(str(s) for s in doc['settings']['seeds'])}: share",
              f"warm start from the other shapes' store, {doc['settings']['warm']} trials: share", *TAIL]
    return table(header, rows)


def search_quality(results: Path, base: str) -> str:
    from benchmarks import search_quality as sq

    doc = _load(results, SEARCH_QUALITY)
    return (f"From [`{SEARCH_QUALITY}`]({base}/{SEARCH_QUALITY}) ({doc['device']}: no GPU timing of its own, "
            f"every figure below counts trials).\n\n" + sq.markdown(doc))


def caveats(results: Path, files: list[str], base: str) -> str:
    """The ``caveat`` a result file carries (what its figures must be read with), one line per file."""
    lines = [f"- [`{name}`]({base}/{name}): {_load(results, name)['caveat']}" for name in files
             if _load(results, name).get("caveat")]
    return ("\n" + "\n".join(lines) + "\n") if lines else ""


def sparse_label(problem: dict) -> str:
    """How a block-sparse W is named in a row ("" for a dense one)."""
    return f", blocks of {problem['block']} at density {problem['density']:g}" if problem.get("block") else ""


def engine(results: Path, base: str) -> str:
    files = sorted(p.name for p in results.glob("engine-*.json"))
    files += sorted(p.name for p in results.glob("sparse_model-*.json")
                    if any(r.get("timing") == "engine" for r in _load(results, p.name)["records"]))
    if not files:
        return ("No engine-timed result is committed yet: `python3 -m benchmarks.engine` writes "
                "`benchmarks/results/engine-<device>-<date>.json`, and this table lists its records.\n")
    rows = []
    for name in files:
        doc = _load(results, name)
        for r in (r for r in doc["records"] if doc["suite"] != "sparse_model" or r.get("timing") == "engine"):
            rows.append([f"{r['problem']['dtype']} {shape(r['problem'])}{sparse_label(r['problem'])}",
                         f"`{r['ours'].get('ran')}`",
                         timed(r["ours"]), timed(r["baselines"]["cublas"]), times(r["ratio"].get("cublas")),
                         *source(doc, r, name, base)])
    return table(["problem", "ran", "ours µs per call, median (p20–p80)", "cuBLAS µs per call", "cuBLAS ÷ ours",
                  *TAIL], rows) + caveats(results, files, base)


def model(results: Path, base: str) -> str:
    files = sorted(p.name for p in results.glob("model-*.json")) + sorted(
        p.name for p in results.glob("sparse_model-*.json"))
    if not files:
        return ("No whole-model result is committed yet: `python3 -m benchmarks.model` writes "
                "`benchmarks/results/model-<device>-<date>.json`, and this table lists its records.\n")
    rows = []
    for name in files:
        doc = _load(results, name)
        for r in (r for r in doc["records"] if "phase" in r["problem"]):
            p, gemms = r["problem"], r["ours"].get("gemms", {})
            ran = f"{len(gemms.get('ours', {}))} ours, {len(gemms.get('torch', {}))} torch"
            rows.append([f"{p['model']}, {p['layers']} layer{'s' if p['layers'] != 1 else ''}"
                         f"{' (' + p['layer'] + ')' if p.get('layer') else ''}, {p['dtype']}, {p['phase']} "
                         f"{p['batch']}×{p['tokens']}{sparse_label(p)}",
                         ran, checked(r["ours"].get("check", {})), us_ms(r["ours"]), us_ms(r["baselines"]["dense"]),
                         times(r["ratio"].get("dense")),
                         *source(doc, r, name, base)])
            if q := r.get("back_to_back"):  # the same train steps issued back to back, as a training loop does
                tail = source(doc, r, name, base)
                rows.append([rows[-1][0] + ", back to back", ran, rows[-1][2], us_ms(q["ours"]), us_ms(q["dense"]),
                             times(q.get("ratio_dense")), f"{tail[0]}, {q['steps_per_sample']} steps a sample",
                             *tail[1:]])
    return table(["model, phase", "GEMMs", "logits", "ours ms, median (p20–p80)", "nn.Linear ms", "nn.Linear ÷ ours",
                  *TAIL], rows) + caveats(results, files, base)


def checked(check: dict) -> str:
    """The output check of a model record: benchmarks.model's one check of the logits, or
    benchmarks.sparse_model's checks by output (each with ``ok``)."""
    parts = [c for c in check.values() if isinstance(c, dict)] or [check]
    if all(c.get("bit_identical") for c in parts):
        return "bit-identical"
    worst = max(c.get("max_abs_diff") or 0.0 for c in parts)
    failed = any(c.get("ok") is False for c in parts)
    return f"max diff {worst:.3g}" + (" (failed)" if failed else "") if "ok" in parts[0] else f"max diff {worst}"


def us_ms(stats: dict) -> str:
    """Median ms with its p20–p80 range."""
    return f"{stats['median_ms']:.3f} ({stats['p20_ms']:.3f}–{stats['p80_ms']:.3f})"


def default_search(results: Path, base: str) -> str:
    rows = []
    for name in sorted(p.name for p in results.glob("default-search-*.json")):
        doc = _load(results, name)
        for r in doc["records"]:
            o, t, s = r["ours"], r["targets"], r["ours"]["search"]
            alone = ", ".join(f"{f} {v['tflops']:.0f}" for f, v in r.get("single_family", {}).items())
            rows.append([f"{r['problem']['dtype']} {shape(r['problem'])}", f"{s['budget']}", f"`{o['kernel']}`",
                         f"{o['tflops']:.0f}", times(r["ratio"].get("cublas")), alone or "–",
                         f"{t['of_best_single_family']:.3f}" if t.get("of_best_single_family") else "–",
                         *source(doc, r, name, base)])
    return table(["problem", "budget", "the default search's best", "TFLOP/s", "cuBLAS ÷ ours",
                  "each family alone, same budget (TFLOP/s)", "of the best family alone", *TAIL], rows)


def sparse_quality(results: Path, base: str) -> str:
    """benchmarks.sparse_quality's files: per pattern (block-sparse: block and density; 2:4) the dense
    model's held-out bits/byte, one-shot, fine-tuned, and the dense model fine-tuned with the same
    tokens (the control). A record's pattern is its problem's ``sparsity`` ("block", "2:4", "none"),
    or, in files from before 2:4 rows, "block" where it has a block."""
    from benchmarks.sparse_quality import sparsity_of

    files = sorted(p.name for p in results.glob(QUALITY_FILES))
    if not files:
        return "No result of `python3 -m benchmarks.sparse_quality` is committed.\n"
    rows = []
    for name in files:
        doc = _load(results, name)
        m, tokens = doc["model"], doc["tokens"]
        what = f"{m['layers']}×{m['width']} byte GPT, {count(tokens['pretrain'])} tokens"
        by: dict = {}
        for r in doc["records"]:
            p = r["problem"]
            by.setdefault((sparsity_of(p), p["block"], p["density"]), {})[p["phase"]] = r
        control = by.get(("none", None, 1.0), {}).get("fine-tuned")
        order = {"block": 0, "2:4": 1}
        for (sparsity, block, density), phases in sorted(by.items(), key=lambda kv: (order.get(kv[0][0], 2),
                                                                                      -(kv[0][1] or 0), -kv[0][2])):
            if sparsity not in order:
                continue
            one, tuned = phases.get("one-shot"), phases.get("fine-tuned")
            gemms = (tuned or {}).get("ours", {}).get("gemms")
            pattern = f"blocks of {block}" if sparsity == "block" else sparsity
            rows.append([what, pattern, f"{density:.2f}", f"{doc['dense']['bits_per_byte']:.4f}", bits(one),
                         bits(tuned), bits(control), count(tokens["finetune_per_config"]),
                         f"{gemms['ours']} / {gemms['torch']}" if gemms else "–", *source(doc, one or tuned, name, base)])
    return table(["model, pretraining", "pattern", "density of the MLP layers", "dense bits/byte", "one-shot",
                  "fine-tuned", "dense fine-tuned alike", "fine-tune tokens", "fine-tune GEMMs ours / torch", *TAIL],
                 rows) + caveats(results, files, base)


def count(tokens: int) -> str:
    """A token count in M (k below 100k)."""
    return f"{tokens / 1e6:.3g}M" if tokens >= 100_000 else f"{tokens / 1e3:.3g}k"


def bits(record: dict | None) -> str:
    """A record's held-out bits/byte, or what stopped it."""
    if record is None:
        return "–"
    ours = record["ours"]
    if ours["status"] == "skipped" or ours.get("bits_per_byte") is None:
        return f"– ({ours['status']})"
    cut = f" (cut short at {count(ours['finetune']['tokens'])} tokens)" if ours["status"] == "cut_short" else ""
    return f"{ours['bits_per_byte']:.4f}{cut}"


TABLES: dict[str, Callable[[Path, str], str]] = {
    "headline": headline, "hopper": hopper, "tensorcore": tensorcore, "simt": simt, "sparse-bf16": sparse_bf16,
    "sparse-fp32": sparse_fp32, "sparse-break-even": sparse_break_even, "layer": layer,
    "search-targets": search_targets, "search-quality": search_quality, "engine": engine, "model": model,
    "default-search": default_search,
}

QUALITY_FILES = "sparse-quality-*.json"
SPARSE24_FILES = "sparse24-*.json"


def sparse24(results: Path, base: str) -> str:
    """benchmarks.sparse24's files: per record ours (the search's best, or the engine phase's kernel)
    against cuBLAS on the dense masked W and cuSPARSELt on the same 2:4 W, prefill (cold_single)
    records of every file first, then the engine ones, each in file order. A record without a
    cuSPARSELt time shows "–"; its ``note`` (why) is listed under the table."""
    files = sorted(p.name for p in results.glob(SPARSE24_FILES))
    if not files:
        return "No result of `python3 -m benchmarks.sparse24` is committed.\n"
    rows, notes = [], []
    for kind in ("cold_single", "engine"):
        for name in files:
            doc = _load(results, name)
            for r in (r for r in doc["records"] if r.get("timing", "cold_single") == kind):
                p, base_of, ratio = r["problem"], r.get("baselines") or {}, r.get("ratio") or {}
                label = f"{p['dtype']} {shape(p)}, {p.get('sparsity', '2:4')}"
                rows.append([label, f"`{r['ours'].get('kernel')}`", timed(r["ours"]),
                             *(timed(base_of[b]) if isinstance(base_of.get(b), dict) else "–"
                               for b in ("cublas", "cusparselt")),
                             times(ratio.get("cublas")), times(ratio.get("cusparselt")), *source(doc, r, name, base)])
                said = [str(r["note"])] if r.get("note") else []
                if (r.get("check") or {}).get("ok") is False:
                    said.append("the output check failed, no ratio")
                notes += [f"- {label} ({kind}), [`{name}`]({base}/{name}): {'; '.join(said)}"] if said else []
    text = table(["problem", "kernel", "ours µs, median (p20–p80)", "cuBLAS µs (dense masked W), median (p20–p80)",
                  "cuSPARSELt µs, median (p20–p80)", "cuBLAS ÷ ours", "cuSPARSELt ÷ ours", *TAIL], rows)
    return text + ("\n" + "\n".join(notes) + "\n" if notes else "") + caveats(results, files, base)


@dataclass(frozen=True)
class WhenMeasured:
    """A table its page carries only once a result file matching ``files`` is committed: ``section``
    (heading and prose) and its markers go before the line ``before`` of ``page`` (at the end without it)."""

    make: Callable[[Path, str], str]
    files: str
    page: str
    before: str
    section: str


WHEN_MEASURED: dict[str, WhenMeasured] = {
    "sparse24": WhenMeasured(sparse24, SPARSE24_FILES, "docs/measurements.md", "### Sparsity: quality", """\
### 2:4 sparse W

A W pruned 2:4 (two kept of every four along K, density 0.5) on gemmscape's 2:4 kernels, against
the two ways to run it elsewhere, both timed in the same run on the same pruned W: cuBLAS on the W
dense with its pruned half zero, and cuSPARSELt through torch's semi-structured tensor
(`to_sparse_semi_structured`, then `F.linear`). The prefill-shaped rows (`cold_single`) are the
best kernel of a short `codegen search --sparsity 2:4` per shape and dtype (the budget is in the
JSON's settings), it and both baselines timed one call at a time with L2 flushed. The decode-shaped
rows (`engine`: 1 to 64 rows through a layer) are `Sparse24Linear`'s forward on the 2:4 family's
built-in kernels in engine timing (copies of W together past L2, called back to back in one CUDA
graph), cuSPARSELt's calls captured alike. A ratio is the baseline's median over ours: above 1,
ours is faster. `python3 -m benchmarks.sparse24` measures it (`benchmarks/device/sparse24.sh` on a
lent GPU); where cuSPARSELt could not run a shape, its cells read "–" and the reason is listed
under the table.
"""),
    "sparse-quality": WhenMeasured(sparse_quality, QUALITY_FILES, "docs/measurements.md",
                                   "## The linear layer (`codegen.nn`) against `nn.Linear`", """\
### Sparsity: quality

What pruning costs in quality, and what fine-tuning under the pattern wins back: the held-out bits
per byte (lower is better) of a small byte-level GPT trained from scratch on Python's standard
library sources (a share of the files held out: every 20th by default), its MLP layers pruned by block magnitude to
`BlockSparseLinear` ("blocks of B") or 2:4 by magnitude to `Sparse24Linear` (two kept of every four
along in_features, "2:4"), measured at once (one-shot) and after fine-tuning with the pattern fixed,
the same tokens for every pattern and density. "Dense fine-tuned alike" is the dense model trained on
those same tokens: the fine-tuned rows' fair comparison. `python3 -m benchmarks.sparse_quality`
measures it (`benchmarks/device/sparse_quality.sh` on a lent GPU); its JSON also holds the wall time
of each fine-tune and the check that every pruned weight stayed zero.
"""),
}


def tables(results: Path = RESULTS) -> dict[str, Callable[[Path, str], str]]:
    """The tables the pages carry with the result files in ``results``: every one of ``TABLES``, and
    those of ``WHEN_MEASURED`` whose files are there."""
    return {**TABLES, **{name: w.make for name, w in WHEN_MEASURED.items() if any(results.glob(w.files))}}


def place(text: str, page: str, results: Path = RESULTS) -> str:
    """``text`` of ``page`` (its path from the root) with the section of each ``WHEN_MEASURED`` table
    of that page whose files are in ``results`` and whose markers it lacks put in, empty, to be filled."""
    for name, w in WHEN_MEASURED.items():
        if w.page != page or f"<!-- measurements:{name} begin" in text or not any(results.glob(w.files)):
            continue
        block = (f"{w.section}\n<!-- measurements:{name} begin (generated by python3 -m benchmarks.measurements "
                 f"from benchmarks/results/; do not edit) -->\n{END.format(name=name)}\n\n")
        at = text.find(f"\n{w.before}\n")
        text = text.rstrip("\n") + "\n\n" + block.rstrip("\n") + "\n" if at < 0 else text[:at + 1] + block + text[at + 1:]
    return text


# ---- filling the files ---------------------------------------------------------------------------
def fill(text: str, base: str, results: Path = RESULTS) -> str:
    """``text`` with every generated table between its markers made anew (links relative by ``base``)."""
    out, pos = [], 0
    for begin in BEGIN.finditer(text):
        if begin.start() < pos:
            continue
        name = begin.group(1)
        known = {**TABLES, **{n: w.make for n, w in WHEN_MEASURED.items()}}
        if name not in known:
            raise KeyError(f"benchmarks.measurements: no table named {name!r} (known: {', '.join(known)})")
        end = text.find(END.format(name=name), begin.end())
        if end < 0:
            raise ValueError(f"benchmarks.measurements: the table {name!r} has no end marker")
        out += [text[pos:begin.end()], known[name](results, base)]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m benchmarks.measurements", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is out of date")
    ap.add_argument("--root", type=Path, default=ROOT, help="the tree whose README.md and docs/ are filled")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the result files (default benchmarks/results/)")
    args = ap.parse_args(argv)
    stale = []
    for rel, base in TARGETS.items():
        path = args.root / rel
        old = path.read_text()
        new = fill(place(old, rel, args.results), base, args.results)
        if new != old:
            stale.append(rel)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"benchmarks.measurements: out of date: {', '.join(stale)} (run python3 -m benchmarks.measurements)",
              file=sys.stderr)
        return 1
    for rel in stale:
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
