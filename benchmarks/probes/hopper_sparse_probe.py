"""Probe of the Hopper family's block-sparse W in one device call: right, and how fast against dense
cuBLAS and torch's BSR matmul, in the same process.

Hand-picked points of the hopper space (no search), one child process per group of jobs (a fault or
a hang loses the job it happened on; the orchestrator starts a fresh child for the jobs left, while
the budget lasts). Per problem (bf16, 4096^3 at densities 0.05, 0.1, 0.25, 0.5 for blocks 64 and 32,
then 16; 32x4096x4096 at density 0.1): a random pattern, X, the kept blocks and the masked dense W
made on the GPU; every point is run through gemmscape's own runtime (launch plan, tensor maps
encoded by ``codegen.cuda``, ``Engine.run_plan``) with the output poisoned with NaN and compared with
the float64 product of X and the masked dense W (``hopper_probe.compare``), then timed with the
runtime's harness (CUDA events, L2 flushed before each repetition), next to dense cuBLAS
(``torch.matmul`` on the dense W) and torch BSR (``W.to_sparse_bsr((b, b)) @ X^T``), each timed once
per problem in the same process. A launch still running after --hang-s is a hang. Writes the raw
events to OUT/hopper_sparse_probe.json and the results format (``design_doc``) to
OUT/hopper_sparse-<device>-<date>.json, and prints a table.

On the H200 (repo root, after ``source benchmarks/device/env.sh``), about 45 s:
    python3 -m benchmarks.probes.hopper_sparse_probe --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.probes.hopper_probe import TIMING, compare, emit, gpu_line, run_child, wait

#: Points of the sparse hopper space (search/spaces/hopper.py, block > 0): labels for the table.
POINTS = [
    ("128 c2 s8 ps", dict(bm=128, stages=8, consumers=2, grid="ranges", group_m=8, ctas=1, swap=False)),
    ("256 c2 s5 ps", dict(bm=256, stages=5, consumers=2, grid="ranges", group_m=8, ctas=1, swap=False)),
    ("256 c2 s4", dict(bm=256, stages=4, consumers=2, grid="plain", group_m=8, ctas=1, swap=False)),
    ("128 c2 s4 o2", dict(bm=128, stages=4, consumers=2, grid="plain", group_m=8, ctas=2, swap=False)),
    ("128 c1 s4 o2", dict(bm=128, stages=4, consumers=1, grid="plain", group_m=8, ctas=2, swap=False)),
    ("64 c1 s8", dict(bm=64, stages=8, consumers=1, grid="plain", group_m=8, ctas=1, swap=False)),
    ("128 c2 s4 psg o2", dict(bm=128, stages=4, consumers=2, grid="grouped", group_m=8, ctas=2, swap=False)),
    ("128 c1 s4 psg o2", dict(bm=128, stages=4, consumers=1, grid="grouped", group_m=8, ctas=2, swap=False)),
    ("256 c2 s4 psg sw", dict(bm=256, stages=4, consumers=2, grid="grouped", group_m=8, ctas=1, swap=True)),
    ("256 c1 s4 psg sw", dict(bm=256, stages=4, consumers=1, grid="grouped", group_m=8, ctas=1, swap=True)),
    ("128 c1 s4 psg o2 sw", dict(bm=128, stages=4, consumers=1, grid="grouped", group_m=8, ctas=2, swap=True)),
    ("64 c1 s8 sw", dict(bm=64, stages=8, consumers=1, grid="plain", group_m=8, ctas=1, swap=True)),
    ("64 c1 s8 psg sw", dict(bm=64, stages=8, consumers=1, grid="grouped", group_m=8, ctas=1, swap=True)),
    ("256 c2 s5 psg g1", dict(bm=256, stages=5, consumers=2, grid="grouped", group_m=1, ctas=1, swap=False)),
    ("256 c2 s5 psg g1 sw", dict(bm=256, stages=5, consumers=2, grid="grouped", group_m=1, ctas=1, swap=True)),
    ("128 c1 s4 psg o2 g1", dict(bm=128, stages=4, consumers=1, grid="grouped", group_m=1, ctas=2, swap=False)),
]
#: Points tried for block 16 (four times the k-tiles of block 64 for the same work: deep rings).
POINTS_16 = [0, 1, 3]
#: Points tried for block 64 only: persistent grids of two blocks per multiprocessor in grouped order
#: (their balanced-range twins, "ps o2", were slower than the plain grid: hopper_sparse-...T034713Z.json;
#: grouped ones were faster than both at densities 0.05-0.25: ...T055650Z.json), and swapped operands
#: (W's block as wgmma's A, X's rows as its N: ``swap`` needs blocks of 64), and grouped order with
#: ``group_m`` 1 (the tiles in flight share one m-tile of X), which a search at density 0.1 found first
#: (codegen search, budget 40, H200 2026-12-02: 40.7 us for 256 c2 s5 against 41.7 for the probe's best).
POINTS_64_ONLY = [6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
#: Points tried at batch 32 (one m-tile: a 64-row tile wastes least, two per SM hide latency), the
#: last two only there.
POINTS_SMALL_M = [0, 3, 5, 11, 12]
SMALL_M_ONLY = [5, 11, 12]
DENSITIES = (0.05, 0.1, 0.25, 0.5)
#: Densities at batch 32 (``--small-m-densities``: several show the time a kernel takes before its work).
SMALL_M_DENSITIES = (0.1,)
#: Blocks in the order they are probed; the budget may leave out the last.
BLOCKS = (64, 32, 16)
DTYPE = "bf16"
#: The random pattern's seed (``--pattern-seeds``: several, to see how much the pattern moves a time).
PATTERN_SEED = 7


def problems(blocks=BLOCKS, seeds=(PATTERN_SEED,), small_m=SMALL_M_DENSITIES) -> list[tuple[int, int, int, int, float, int]]:
    """(m, n, k, block, density, pattern seed) in probing order; ``small_m``: the densities at batch 32."""
    out = []
    for block in blocks:
        for seed in seeds:
            out += [(4096, 4096, 4096, block, d, seed) for d in DENSITIES]
            out += [(32, 4096, 4096, block, d, seed) for d in small_m]
    return out


def jobs(blocks=BLOCKS, seeds=(PATTERN_SEED,), small_m=SMALL_M_DENSITIES) -> list[dict]:
    """Every (point, problem) to run, grouped by problem so baselines are timed once per problem."""
    out = []
    for m, n, k, block, density, seed in problems(blocks, seeds, small_m):
        for i, (label, point) in enumerate(POINTS):
            if (block == 16 and i not in POINTS_16) or (m < 128 and i not in POINTS_SMALL_M) or (
                    m >= 128 and i in SMALL_M_ONLY) or (block != 64 and i in POINTS_64_ONLY):
                continue
            out.append({"id": len(out), "label": label, "point": point, "m": m, "n": n, "k": k, "block": block,
                        "density": density, "seed": seed})
    return out


def problem_key(job: dict) -> str:
    return f"{job['m']}x{job['n']}x{job['k']} b{job['block']} d{job['density']} p{job.get('seed', PATTERN_SEED)}"


# ---- the child process -------------------------------------------------------------------------------
class SparseOperands:
    """One block-sparse problem's operands as torch tensors on the GPU, in the shape the runtime's
    Operands has (``address``, ``tensor_map``): X, the kept blocks W[nnzb, b, b] (zero past N and K),
    RP and CI, Y; and the masked dense W the baselines and the reference use."""

    device = "cuda"

    def __init__(self, problem, pattern, torch) -> None:
        self.problem, self.torch = problem, torch
        dt = torch.bfloat16 if problem.dtype.value == "bf16" else torch.float16
        m, n, k, b = problem.m, problem.n, problem.k, pattern.block
        rand = lambda *shape: (torch.rand(*shape, device=self.device) * 2 - 1).to(dt)  # noqa: E731  never zeros
        rows, cols = pattern.block_rows, pattern.block_cols
        mask = torch.from_numpy(pattern.mask()).to(self.device)
        full = rand(rows * b, cols * b)
        full[n:], full[:, k:] = 0, 0  # the padding of the edge blocks
        full *= mask.repeat_interleave(b, 0).repeat_interleave(b, 1).to(dt)
        self.w_dense = full[:n, :k].contiguous()
        self.blocks = full.view(rows, b, cols, b).permute(0, 2, 1, 3)[mask].contiguous()  # row-major BSR order
        self.rp = torch.from_numpy(pattern.indptr).to(self.device)
        self.ci = torch.from_numpy(pattern.indices).to(self.device)
        self.x = rand(m, k)
        self.b = rand(n) if problem.bias else None
        self.y = torch.empty(m, n, dtype=dt, device=self.device)
        self.tensor_maps: dict = {}

    def address(self, name: str, plan):
        t = {"X": self.x, "W": self.blocks, "B": self.b, "Y": self.y, "RP": self.rp, "CI": self.ci}.get(name)
        return t.data_ptr() if t is not None else None

    def tensor_map(self, arg, plan):
        from codegen.engine import Operands

        return Operands.tensor_map(self, arg, plan)  # the runtime's own encoding, over these tensors

    def reference(self):
        ref = self.x.double() @ self.w_dense.double().t()
        return ref + self.b.double() if self.b is not None else ref


def _stats(prefix: str, times: list[float]) -> dict:
    t = sorted(times)
    return {f"{prefix}_ms": t[len(t) // 2], f"{prefix}_p20": t[int(0.2 * (len(t) - 1))],
            f"{prefix}_p80": t[int(0.8 * (len(t) - 1))], f"{prefix}_reps": len(t)}


def child(todo: list[dict], hang_s: float, torch_bsr: bool) -> int:
    """Run ``todo`` in order, one result line each (``id``); exit code 3 once the context is lost."""
    import torch

    from codegen import sass, sparse
    from codegen.cuda import CudaError, Module
    from codegen.engine import Engine, Failure
    from codegen.evaluate import build
    from codegen.launch import plan
    from codegen.problem import DType
    from codegen.spec import DeviceLimits
    from search.space import to_spec

    engine = Engine(0)
    info = engine.ctx.info
    limits = DeviceLimits(sm=int(info.sm[3:]), max_smem=info.max_smem_optin)
    emit(event="device", **info.to_dict(), torch=torch.__version__)
    modules: dict = {}
    current = None  # (problem key, operands, reference, baselines)
    for job in todo:
        rec = {"event": "result", "id": job["id"]}
        emit(event="stage", id=job["id"], stage="start")
        try:
            key = problem_key(job)
            if current is None or current[0] != key:
                current = None
                torch.cuda.empty_cache()
                pattern = sparse.Pattern.random(job["n"], job["k"], job["block"], job["density"],
                                                 seed=job.get("seed", PATTERN_SEED))
                problem = sparse.problem_for(job["m"], pattern, DType(DTYPE))
                ops = SparseOperands(problem, pattern, torch)
                base = {"nnzb": pattern.nnzb, "density": pattern.density, "pattern": pattern.hash}
                base.update(_stats("cublas", engine.time_calls(lambda o=ops: torch.matmul(o.x, o.w_dense.t()), **TIMING)))
                if torch_bsr:
                    try:
                        w_bsr, xt = ops.w_dense.to_sparse_bsr((job["block"],) * 2), ops.x.t()
                        base.update(_stats("torch_bsr", engine.time_calls(lambda a=w_bsr, b=xt: a @ b, **TIMING)))
                    except Exception as e:  # torch without a BSR path for this dtype: a note, not a failure
                        base["torch_bsr_note"] = f"{type(e).__name__}: {str(e)[:200]}"
                torch.cuda.synchronize()
                current = (key, problem, ops, ops.reference(), base)
            _, problem, ops, ref, base = current
            spec = to_spec("hopper", job["point"], problem)
            rec.update(kernel=spec.name, **base)
            reasons = spec.check(problem, limits)
            if reasons:
                emit(**rec, status="invalid", evidence="; ".join(reasons))
                continue
            if spec.name not in modules:
                built = build(spec, problem, info.sm, limits)
                if built.failure is not None:
                    emit(**rec, status=built.failure["status"], evidence=built.failure["evidence"][-1500:])
                    continue
                try:
                    found = sass.opcodes(sass.disassemble(built.compiled.cubin), spec.name)
                    rec["sass"] = {k: found[k] for k in ("HGMMA", "UTMALDG", "LDL", "STL")}
                except sass.SassError as e:
                    rec["sass"] = {"note": str(e)[:120]}
                modules[spec.name] = Module(built.compiled.cubin)
            module, launch_plan = modules[spec.name], plan(spec, problem)
            emit(event="stage", id=job["id"], stage="run")
            ops.y.fill_(float("nan"))
            torch.cuda.synchronize()
            engine.run_plan(module, launch_plan, ops)
            wait(engine, hang_s)
            verdict = compare(ops.y, ref, spec, DTYPE)
            if verdict["status"] == "ok":
                emit(event="stage", id=job["id"], stage="time")
                verdict.update(_stats("ours", engine.time_calls(
                    lambda f=module, p=launch_plan, o=ops: engine.run_plan(f, p, o), **TIMING)))
                wait(engine, hang_s)
                verdict["tflops"] = problem.flops / verdict["ours_ms"] / 1e9  # the kept blocks' work
            emit(**rec, **verdict)
        except Failure as e:
            emit(**rec, status=e.status, evidence=e.evidence[-1500:])
            if e.restart:
                emit(event="context_lost")
                return 3
        except CudaError as e:
            emit(**rec, status="context_lost" if e.sticky else "runtime_error", evidence=str(e))
            if e.sticky:
                emit(event="context_lost")
                return 3
    return 0


# ---- the orchestrating process (no CUDA here) ----------------------------------------------------------
def run_jobs(todo: list[dict], args, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.probes.hopper_sparse_probe", "--child", json.dumps(todo), "--hang-s",
           str(args.hang_s)] + ([] if args.torch_bsr else ["--no-torch-bsr"])
    return {"jobs": [j["id"] for j in todo], **run_child(cmd, timeout)}


def results(runs: list[dict], todo: list[dict]) -> dict[int, dict]:
    """Job id -> its result; the job a child stopped on gets the child's ending as its status."""
    got: dict[int, dict] = {}
    for run in runs:
        for e in run["events"]:
            if e.get("event") == "result":
                got[e["id"]] = e
        if run["ending"] != "done":
            started = [e["id"] for e in run["events"] if e.get("event") == "stage"]
            if started and started[-1] not in got:
                got[started[-1]] = {"id": started[-1], "status": run["ending"],
                                    "evidence": f"{run['ending']} ({run['stderr_tail'][-300:]})"}
    return got


def design_doc(doc: dict) -> dict:
    """The probe in the benchmark-results format (suite ``hopper_sparse``): per problem, the fastest
    point that validated, dense cuBLAS and torch BSR from the same process, the other points under
    ``ours.others``."""
    got = results(doc["runs"], doc["jobs"])
    device = next((e for run in doc["runs"] for e in run["events"] if e.get("event") == "device"), {})
    records = []
    keys = list(dict.fromkeys(problem_key(j) for j in doc["jobs"]))
    for key in keys:
        mine = [j for j in doc["jobs"] if problem_key(j) == key]
        ok = [(j, got[j["id"]]) for j in mine if got.get(j["id"], {}).get("status") == "ok" and "ours_ms" in got[j["id"]]]
        if not ok:
            continue
        job, best = min(ok, key=lambda jr: jr[1]["ours_ms"])
        baselines = {"cublas": {k: best[f"cublas_{k}"] for k in ("ms", "p20", "p80", "reps")}}
        if "torch_bsr_ms" in best:
            baselines["torch_bsr"] = {k: best[f"torch_bsr_{k}"] for k in ("ms", "p20", "p80", "reps")}
        baselines = {name: {"median_ms": v["ms"], "p20_ms": v["p20"], "p80_ms": v["p80"], "reps": v["reps"]}
                     for name, v in baselines.items()}
        records.append({
            "problem": {"m": job["m"], "n": job["n"], "k": job["k"], "dtype": DTYPE, "layout": "forward",
                        "bias": False, "density": best["density"], "block": job["block"], "nnzb": best["nnzb"],
                        "pattern_seed": job.get("seed", PATTERN_SEED), "pattern": best.get("pattern")},
            "ours": {"kernel": best["kernel"], "point": job["label"], "median_ms": best["ours_ms"],
                     "p20_ms": best["ours_p20"], "p80_ms": best["ours_p80"], "reps": best["ours_reps"],
                     "tflops": best["tflops"], "rel_error": best["rel_error"],
                     "search": {"sampler": None, "selection": f"fastest of {len(ok)} hand-picked points"},
                     "others": {j["label"]: {"median_ms": r["ours_ms"]} for j, r in ok if j is not job}},
            "baselines": baselines,
            "ratio": {name: v["median_ms"] / best["ours_ms"] for name, v in baselines.items()},
        })
    from codegen.versions import versions

    return {"suite": "hopper_sparse", "date": doc["date"], "device": device.get("name", doc["device"]),
            "versions": {**versions(), "driver": device.get("driver"), "sm": device.get("sm"),
                         "torch": device.get("torch")},
            "command": doc["command"], "timing": TIMING, "records": records}


def table(doc: dict) -> str:
    got = results(doc["runs"], doc["jobs"])
    lines = [f"{'problem':30s} {'point':20s} {'status':14s} {'ours us':>9s} {'cuBLAS us':>10s} {'x cuBLAS':>9s} "
             f"{'BSR us':>9s} {'x BSR':>7s} {'rel err':>8s}"]
    for job in doc["jobs"]:
        r = got.get(job["id"])
        status = r["status"] if r else "not run"
        row = f"{problem_key(job):30s} {job['label']:20s} {status[:14]:14s}"
        if r and "ours_ms" in r:
            bsr = r.get("torch_bsr_ms")
            row += (f" {r['ours_ms'] * 1e3:9.1f} {r['cublas_ms'] * 1e3:10.1f} {r['cublas_ms'] / r['ours_ms']:9.2f} "
                    + (f"{bsr * 1e3:9.1f} {bsr / r['ours_ms']:7.2f}" if bsr else f"{'-':>9s} {'-':>7s}")
                    + f" {r['rel_error']:8.1e}")
        elif r and r.get("evidence"):
            row += "  " + r["evidence"].strip().splitlines()[-1][:110]
        lines.append(row)
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.probes.hopper_sparse_probe", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "hopper-sparse-probe-out"), help="folder for the JSON files")
    p.add_argument("--budget-s", type=float, default=50.0, help="start no child after this many seconds (a child is stopped then too)")
    p.add_argument("--hang-s", type=float, default=5.0, help="a launch still running after this is a hang")
    p.add_argument("--blocks", nargs="+", type=int, default=list(BLOCKS), choices=BLOCKS, help="sparse block sizes")
    p.add_argument("--pattern-seeds", nargs="+", type=int, default=[PATTERN_SEED], metavar="S",
                   help=f"seeds of the random patterns, each a problem of its own (default {PATTERN_SEED})")
    p.add_argument("--small-m-densities", nargs="+", type=float, default=list(SMALL_M_DENSITIES), metavar="D",
                   help="densities of the 32x4096x4096 problems (default 0.1)")
    p.add_argument("--no-torch-bsr", dest="torch_bsr", action="store_false", help="skip the torch BSR baseline")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.budget_s <= 0 or args.hang_s <= 0:
        p.error("--budget-s and --hang-s must be positive")
    if min(args.pattern_seeds) < 0:
        p.error("--pattern-seeds must be non-negative")
    if not all(0 < d <= 1 for d in args.small_m_densities):
        p.error("--small-m-densities must lie in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        return child(json.loads(args.child), args.hang_s, args.torch_bsr)
    start = time.monotonic()
    device = gpu_line()
    print(f"device: {device}", flush=True)
    todo = jobs(tuple(args.blocks), tuple(args.pattern_seeds), tuple(args.small_m_densities))
    runs: list[dict] = []
    left = list(todo)
    while left:
        remaining = args.budget_s - (time.monotonic() - start)
        if remaining < 8:
            break
        run = run_jobs(left, args, remaining)
        runs.append(run)
        done = results(runs, todo)
        before, left = len(left), [j for j in left if j["id"] not in done]
        print(f"child: {run['ending']} in {run['seconds']} s, {len(done)}/{len(todo)} jobs reported", flush=True)
        if run["ending"] == "timeout" or len(left) == before:  # out of time, or a child that cannot start
            break
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"probe": "hopper_sparse", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": device,
           "command": "python3 -m benchmarks.probes.hopper_sparse_probe " + " ".join(argv if argv is not None else sys.argv[1:]),
           "timing": TIMING, "jobs": todo, "runs": runs, "seconds": round(time.monotonic() - start, 1)}
    (out / "hopper_sparse_probe.json").write_text(json.dumps(doc, indent=1) + "\n")
    design = design_doc(doc)
    name = f"hopper_sparse-{design['device'].replace(' ', '_')}-{doc['date'].replace(':', '')}.json"
    (out / name).write_text(json.dumps(design, indent=1) + "\n")
    print()
    print(table(doc))
    print(f"\n{len(todo)} jobs in {doc['seconds']} s; {out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
