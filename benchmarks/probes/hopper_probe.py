"""Probe of the Hopper family in one device call: is each variant right, and how fast against cuBLAS.

For a handful of points of the hopper space (small tiles to large), each in its own process (a
fault or a hang loses that point only), for bf16 and fp16: check, render and compile (NVRTC, sm_90a),
load, then on every shape run the kernel through gemmscape's own runtime (launch plan, tensor maps
encoded by ``codegen.cuda``, ``Engine.run_plan``) on fresh random inputs with the output poisoned
with NaN, and compare with a float64 reference computed on the GPU by torch: status, relative
error, and for a failure the stage it failed at, the CUDA error, the first unwritten or wrong
element with its value and reference and its block tile. Shapes: small odd ones (tails in M, N and
K, bias, K that breaks 16-byte rows through the pack prepass), then the timed layers 4096^3,
8192^3, 4096x11008x4096, 128x4096x4096, 32x4096x4096 and 4097x4095x4093, each validated first and then timed next to cuBLAS
(torch.matmul) with the runtime's harness: CUDA events, warm-up, L2 flushed before each repetition,
median of at least 20. A launch that does not finish within --hang-s is a hang: the point's
process reports where and exits. Prints a table last and writes everything to OUT/hopper_probe.json.

On the H200 (repo root, after ``source benchmarks/device/env.sh``):
    python3 -m benchmarks.probes.hopper_probe --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

#: Points of search/spaces/hopper.py, small tiles to large (labels for the table).
POINTS = [
    ("64x64 c1 s2", dict(bm=64, bn=64, stages=2, consumers=1, persistent=False, group_m=8, cluster=1, split_k=1)),
    ("128x128 c1 s4", dict(bm=128, bn=128, stages=4, consumers=1, persistent=False, group_m=8, cluster=1, split_k=1)),
    ("128x128 c2 s5 ps", dict(bm=128, bn=128, stages=5, consumers=2, persistent=True, group_m=8, cluster=1, split_k=1)),
    ("128x256 c2 s4", dict(bm=128, bn=256, stages=4, consumers=2, persistent=False, group_m=8, cluster=1, split_k=1)),
    ("128x256 c2 s4 ps", dict(bm=128, bn=256, stages=4, consumers=2, persistent=True, group_m=8, cluster=1, split_k=1)),
    ("256x128 c2 s4 ps", dict(bm=256, bn=128, stages=4, consumers=2, persistent=True, group_m=8, cluster=1, split_k=1)),
    ("128x192 c2 s4 ps", dict(bm=128, bn=192, stages=4, consumers=2, persistent=True, group_m=16, cluster=1, split_k=1)),
    # Thread-block cluster pairs along M sharing W's tile by TMA multicast.
    ("128x256 c2 s4 cl2", dict(bm=128, bn=256, stages=4, consumers=2, persistent=False, group_m=8, cluster=2, split_k=1)),
    ("128x256 c2 s4 ps cl2", dict(bm=128, bn=256, stages=4, consumers=2, persistent=True, group_m=8, cluster=2, split_k=1)),
    # Split-K for small batches (few output tiles).
    ("64x128 c1 s6 k4", dict(bm=64, bn=128, stages=6, consumers=1, persistent=False, group_m=4, cluster=1, split_k=4)),
    ("128x256 c2 s4 k8", dict(bm=128, bn=256, stages=4, consumers=2, persistent=False, group_m=8, cluster=1, split_k=8)),
    ("64x256 c1 s4 k8", dict(bm=64, bn=256, stages=4, consumers=1, persistent=False, group_m=4, cluster=1, split_k=8)),
    # X's fragments through registers (wgmma with A from registers): twins of points 3 and 4.
    ("128x256 c2 s4 ar", dict(bm=128, bn=256, stages=4, consumers=2, persistent=False, group_m=8, cluster=1, split_k=1,
                              a_regs=True)),
    ("128x256 c2 s4 ps ar", dict(bm=128, bn=256, stages=4, consumers=2, persistent=True, group_m=8, cluster=1, split_k=1,
                                 a_regs=True)),
]
#: (m, n, k, bias, timed): validated in this order; the timed ones are then measured against cuBLAS.
SHAPES = [
    (1, 8, 64, False, False),
    (130, 250, 72, True, False),
    (67, 45, 88, False, False),
    (67, 45, 91, True, False),  # K breaks 16-byte rows: the pack prepass
    (4096, 4096, 4096, False, True),
    (8192, 8192, 8192, False, True),
    (4096, 11008, 4096, False, True),
    (128, 4096, 4096, False, True),  # a small batch: few tiles, the ring's fill and drain show
    (32, 4096, 4096, False, True),  # batch 32: 16 tiles of 64 x 256 for 132 multiprocessors, unless K is split
    (4097, 4095, 4093, False, True),  # unaligned: cuBLAS falls off its fast path here
]
DTYPES = ("bf16", "fp16")
TIMING = {"reps_min": 20, "reps_max": 60, "target_ms": 60.0}


def shape_key(m: int, n: int, k: int, bias: bool) -> str:
    return f"{m}x{n}x{k}{'+b' if bias else ''}"


# ---- the point's own process -----------------------------------------------------------------------
def emit(**record) -> None:
    print(json.dumps(record), flush=True)


class TorchOperands:
    """One problem's operands as torch tensors on the GPU, in the shape codegen.engine.Operands has
    (``address``, ``tensor_map``), so ``Engine.run_plan`` launches on them unchanged."""

    device = "cuda"

    def __init__(self, problem, torch) -> None:
        from codegen.problem import DType

        self.problem, self.torch = problem, torch
        dt = {DType.bf16: torch.bfloat16, DType.fp16: torch.float16}[problem.dtype]
        m, n, k = problem.m, problem.n, problem.k
        rand = lambda *shape: (torch.rand(*shape, device=self.device) * 2 - 1).to(dt)  # noqa: E731  never zeros
        self.x, self.w = rand(m, k), rand(n, k)
        self.b = rand(n) if problem.bias else None
        self.y = torch.empty(m, n, dtype=dt, device=self.device)
        self.ws = None
        self.tensor_maps: dict = {}

    def address(self, name: str, plan):
        if name == "WS":
            if plan.workspace_bytes == 0:
                return None
            if self.ws is None or self.ws.numel() < plan.workspace_bytes:
                self.ws = self.torch.empty(plan.workspace_bytes, dtype=self.torch.uint8, device=self.device)
            return self.ws.data_ptr()
        t = {"X": self.x, "W": self.w, "B": self.b, "Y": self.y}.get(name)
        return t.data_ptr() if t is not None else None

    def tensor_map(self, arg, plan):
        from codegen.engine import Operands

        return Operands.tensor_map(self, arg, plan)  # the runtime's own encoding, over these tensors

    def reference(self):
        ref = self.x.double() @ self.w.double().t()
        return ref + self.b.double() if self.b is not None else ref


def compare(y, ref, spec, dtype) -> dict:
    """Status and evidence of an output against its float64 reference, computed on the GPU."""
    import torch

    yd = y.double()
    bad = ~torch.isfinite(yd)
    out: dict = {"nonfinite": int(bad.sum())}
    if out["nonfinite"]:
        r, c = divmod(int(torch.argmax(bad.flatten().to(torch.uint8))), y.shape[1])
        out.update(status="nan_or_inf", first_nonfinite=[r, c], tile=[r // spec.bm, c // spec.bn],
                   rows_with_nonfinite=int(bad.any(1).sum()), cols_with_nonfinite=int(bad.any(0).sum()),
                   evidence=f"{out['nonfinite']} of {y.numel()} outputs not finite (unwritten?), first at ({r}, {c}) "
                            f"in block tile ({r // spec.bm}, {c // spec.bn})")
        return out
    err = (yd - ref).abs()
    rel = float(torch.linalg.norm(yd - ref) / torch.linalg.norm(ref).clamp_min(1e-300))
    eps = {"bf16": 2.0**-8, "fp16": 2.0**-11}[dtype]
    rms = float(ref.pow(2).mean().sqrt())
    wrong = err > 8 * eps * (ref.abs() + rms)
    out.update(rel_error=rel, max_abs_error=float(err.max()), mismatches=int(wrong.sum()))
    if out["mismatches"]:
        r, c = divmod(int(torch.argmax(wrong.flatten().to(torch.uint8))), y.shape[1])
        out.update(first_mismatch=[r, c], got=float(yd[r, c]), want=float(ref[r, c]), tile=[r // spec.bm, c // spec.bn],
                   rows_with_mismatch=int(wrong.any(1).sum()), cols_with_mismatch=int(wrong.any(0).sum()))
    tol = {"bf16": 1e-2, "fp16": 2e-3}[dtype]
    if rel > tol:
        out.update(status="wrong_result", evidence=f"relative error {rel:.3g} > {tol:g}; first element off at "
                   f"{out.get('first_mismatch')}: {out.get('got')} vs {out.get('want')} (block tile {out.get('tile')})")
    else:
        out["status"] = "ok"
    return out


def wait(engine, deadline_s: float) -> None:
    """Until the stream is idle; a launch still running after ``deadline_s`` is a hang: say so and exit
    (the context cannot be saved)."""
    from cuda.bindings import driver

    from codegen.cuda import check

    start = time.monotonic()
    while True:
        err = driver.cuStreamQuery(engine.stream)[0]
        if err != driver.CUresult.CUDA_ERROR_NOT_READY:
            check((err,), "cuStreamQuery")
            return
        if time.monotonic() - start > deadline_s:
            emit(event="hang", seconds=deadline_s)
            os._exit(4)
        time.sleep(0.0005)


def child(point: dict, dtypes: list[str], hang_s: float, shapes: list) -> int:
    """Every (dtype, shape) of one point, one result line each; exit code 3 once the context is lost."""
    import torch

    from codegen.cuda import CudaError
    from codegen.engine import Engine, Failure
    from codegen.spec import DeviceLimits

    engine = Engine(0)
    info = engine.ctx.info
    limits = DeviceLimits(sm=int(info.sm[3:]), max_smem=info.max_smem_optin)
    emit(event="device", **info.to_dict(), torch=torch.__version__)
    modules: dict = {}
    for dtype in dtypes:
        for m, n, k, bias, timed in shapes:
            rec = {"event": "result", "dtype": dtype, "shape": shape_key(m, n, k, bias)}
            try:
                result = one_shape(engine, limits, modules, point, rec, (m, n, k, bias, timed), hang_s)
                emit(**rec, **result)
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


def one_shape(engine, limits, modules: dict, point: dict, rec: dict, shape: tuple, hang_s: float) -> dict:
    """Check, build (once per kernel), run on fresh inputs against float64, and if asked time it next
    to cuBLAS. ``rec`` gets the kernel and each stage as it starts (a stage line is printed too)."""
    import torch

    from codegen import sass
    from codegen.cuda import Module
    from codegen.evaluate import build
    from codegen.launch import plan
    from codegen.problem import DType, Problem
    from search.space import to_spec

    m, n, k, bias, timed = shape
    problem = Problem(m, n, k, DType(rec["dtype"]), bias=bias)
    spec = to_spec("hopper", point, problem)
    rec["kernel"] = spec.name

    def stage(name: str) -> None:
        rec["stage"] = name
        emit(event="stage", dtype=rec["dtype"], shape=rec["shape"], stage=name)

    stage("check")
    reasons = spec.check(problem, limits)
    if reasons:
        return {"status": "invalid", "evidence": "; ".join(reasons)}
    if spec.name not in modules:
        stage("compile")
        built = build(spec, problem, engine.ctx.info.sm, limits)
        if built.failure is not None:
            return {"status": built.failure["status"], "evidence": built.failure["evidence"][-1500:]}
        try:
            found = sass.opcodes(sass.disassemble(built.compiled.cubin), spec.name)
            sass_note = {key: found[key] for key in ("HGMMA", "UTMALDG", "USETMAXREG", "LDL", "STL")}
        except sass.SassError as e:
            sass_note = {"note": str(e)[:120]}
        emit(event="compiled", dtype=rec["dtype"], kernel=spec.name, options=built.compiled.options,
             report=built.compiled.report.get(spec.name, {}), sass=sass_note)
        stage("load")
        modules[spec.name] = Module(built.compiled.cubin)
    module = modules[spec.name]
    stage("inputs")
    ops = TorchOperands(problem, torch)
    ref = ops.reference()
    launch_plan = plan(spec, problem)
    stage("run")
    ops.y.fill_(float("nan"))
    if launch_plan.workspace_bytes:  # all-ones bytes: NaN as fp32 partial sums and as packed 16-bit rows
        ops.address("WS", launch_plan)
        ops.ws.fill_(255)
    torch.cuda.synchronize()
    engine.run_plan(module, launch_plan, ops)
    stage("wait")
    wait(engine, hang_s)
    stage("compare")
    verdict = compare(ops.y, ref, spec, rec["dtype"])
    del ref
    if verdict["status"] != "ok" or not timed:
        return verdict
    stage("time")
    ours = engine.time_calls(lambda: engine.run_plan(module, launch_plan, ops), **TIMING)
    wait(engine, hang_s)
    cublas = engine.time_calls(lambda: torch.matmul(ops.x, ops.w.t()), **TIMING)
    torch.cuda.synchronize()
    stats = {}
    for who, times in (("ours", ours), ("cublas", cublas)):
        t = sorted(times)
        stats.update({f"{who}_ms": t[len(t) // 2], f"{who}_p20": t[int(0.2 * (len(t) - 1))],
                      f"{who}_p80": t[int(0.8 * (len(t) - 1))], f"{who}_reps": len(t)})
    return {**verdict, **stats, "tflops": problem.flops / stats["ours_ms"] / 1e9,
            "cublas_tflops": problem.flops / stats["cublas_ms"] / 1e9, "ratio": stats["cublas_ms"] / stats["ours_ms"]}


# ---- the orchestrating process (no CUDA here) ----------------------------------------------------
def design_doc(doc: dict) -> dict:
    """The probe's timings in the benchmark-results format (suite ``hopper``): per timed shape and
    dtype, the fastest point that validated, cuBLAS from the same process, and every other point that
    validated under ``ours.others``. The points are the hand-picked POINTS: no search."""
    device = next((e for run in doc["runs"] for e in run["events"] if e.get("event") == "device"), {})
    nvrtc = next((e["options"] for run in doc["runs"] for e in run["events"] if e.get("event") == "compiled"), None)
    records = []
    for m, n, k, bias, timed in doc["shapes"]:
        if not timed:
            continue
        key = shape_key(m, n, k, bias)
        for dtype in sorted({d for run in doc["runs"] for d, _ in results_of(run)}):
            got = [(run["label"], r) for run in doc["runs"] for (d, s), r in results_of(run).items()
                   if d == dtype and s == key and r.get("status") == "ok" and "ours_ms" in r]
            if not got:
                continue
            label, best = min(got, key=lambda lr: lr[1]["ours_ms"])
            records.append({
                "problem": {"m": m, "n": n, "k": k, "dtype": dtype, "layout": "forward", "bias": bias,
                            "density": 1.0, "block": None},
                "ours": {"kernel": best.get("kernel"), "point": label, "median_ms": best["ours_ms"],
                         "p20_ms": best["ours_p20"], "p80_ms": best["ours_p80"], "reps": best["ours_reps"],
                         "tflops": best["tflops"], "rel_error": best["rel_error"],
                         "search": {"sampler": None, "selection": f"fastest of {len(got)} hand-picked points"},
                         "others": {lab: {"median_ms": r["ours_ms"], "tflops": r["tflops"]} for lab, r in got
                                    if lab != label}},
                "baselines": {"cublas": {"median_ms": best["cublas_ms"], "p20_ms": best["cublas_p20"],
                                         "p80_ms": best["cublas_p80"], "reps": best["cublas_reps"]}},
                "ratio": {"cublas": best["ratio"]}})
    from codegen.versions import versions

    return {"suite": "hopper", "date": doc["date"], "device": device.get("name", doc["device"]),
            "versions": {**versions(), "driver": device.get("driver"), "sm": device.get("sm"),
                         "torch": device.get("torch"), "nvrtc_options": nvrtc},
            "command": doc["command"], "timing": doc["timing"], "records": records}


def gpu_line() -> str:
    """nvidia-smi's line for the GPU (name, driver, clocks, temperature), or why there is none."""
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        return smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi failed: {e}"


def run_child(cmd: list[str], timeout: float) -> dict:
    """Run a probe's child process: its JSON-lines events, how it ended (done, crash, context_lost,
    hang, timeout), its exit code, the tail of its stderr and its seconds."""
    start = time.monotonic()
    timed_out = False
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        timed_out = True
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        rc = None
    events = []
    for line in out.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            events.append({"event": "text", "text": line[:300]})
    ending = ("timeout" if timed_out else "hang" if any(e.get("event") == "hang" for e in events)
              else "context_lost" if rc == 3 else "crash" if rc else "done")
    return {"events": events, "ending": ending, "exit_code": rc, "stderr_tail": err[-3000:],
            "seconds": round(time.monotonic() - start, 1)}


def run_point(label: str, point: dict, args, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.probes.hopper_probe", "--child", json.dumps(point), "--dtypes", *args.dtypes,
           "--hang-s", str(args.hang_s)]
    if args.quick:
        cmd.append("--quick")
    run = run_child(cmd, timeout)
    last = next((e for e in reversed(run["events"]) if e.get("event") == "stage"), None)
    return {"label": label, "point": point, "events": run["events"], "ending": run["ending"],
            "exit_code": run["exit_code"], "last_stage": last, "stderr_tail": run["stderr_tail"],
            "seconds": run["seconds"]}


def results_of(run: dict) -> dict:
    """(dtype, shape) -> the point's result record; where the process ended early, the shape it was on
    gets the ending as its status."""
    got = {(e["dtype"], e["shape"]): e for e in run["events"] if e.get("event") == "result"}
    last = run["last_stage"]
    if run["ending"] != "done" and last is not None and (last["dtype"], last["shape"]) not in got:
        got[(last["dtype"], last["shape"])] = {
            "status": run["ending"], "stage": last["stage"],
            "evidence": f"{run['ending']} at stage {last['stage']}" + (f"; stderr: {run['stderr_tail'][-400:]}"
                                                                         if run["ending"] == "crash" else "")}
    return got


def table(runs: list[dict], dtypes: list[str], shapes: list) -> str:
    lines = []
    keys = [shape_key(m, n, k, b) for m, n, k, b, _ in shapes]
    width = max(len(r["label"]) for r in runs) + 2
    lines.append("validation: status and relative error against float64 (pk: pack prepass)")
    lines.append(" " * width + "dtype " + " ".join(f"{key:>18s}" for key in keys))
    for run in runs:
        got = results_of(run)
        for dtype in dtypes:
            cells = []
            for key in keys:
                r = got.get((dtype, key))
                if r is None:
                    cells.append("-")
                elif r["status"] == "ok":
                    cells.append(f"ok {r['rel_error']:.1e}{' pk' if r.get('kernel', '').endswith('_pk') else ''}")
                else:
                    cells.append(r["status"][:18])
            lines.append(f"{run['label']:{width}s}{dtype:6s}" + " ".join(f"{c:>18s}" for c in cells))
    timed = [shape_key(m, n, k, b) for m, n, k, b, t in shapes if t]
    lines.append("")
    lines.append("timing: TFLOP/s, ours (ratio = cuBLAS median / ours; > 1 is faster than cuBLAS)")
    lines.append(" " * width + "dtype " + " ".join(f"{key:>20s}" for key in timed))
    for dtype in dtypes:
        base = {}
        for run in runs:
            for key in timed:
                r = results_of(run).get((dtype, key))
                if r and "cublas_tflops" in r:
                    base.setdefault(key, r["cublas_tflops"])
        lines.append(f"{'cuBLAS':{width}s}{dtype:6s}" + " ".join(
            f"{base[key]:>20.0f}" if key in base else f"{'-':>20s}" for key in timed))
        for run in runs:
            got = results_of(run)
            cells = []
            for key in timed:
                r = got.get((dtype, key))
                cells.append(f"{r['tflops']:.0f} ({r['ratio']:.2f})" if r and "tflops" in r
                             else (r["status"][:20] if r else "-"))
            lines.append(f"{run['label']:{width}s}{dtype:6s}" + " ".join(f"{c:>20s}" for c in cells))
    fails = []
    for run in runs:
        for (dtype, key), r in results_of(run).items():
            if r["status"] not in ("ok",):
                fails.append(f"  {run['label']} {dtype} {key}: {r['status']} at {r.get('stage', '?')}: "
                             f"{(r.get('evidence') or '').strip().splitlines()[-1][:400] if r.get('evidence') else ''}")
        if run["ending"] != "done":
            said = [line for line in run["stderr_tail"].splitlines() if line.strip()]
            fails.append(f"  {run['label']}: process ended with {run['ending']} (exit {run['exit_code']}) after "
                         f"{run['seconds']} s; last stage {run['last_stage']}"
                         + (f"; stderr: {said[-1][:300]}" if said else ""))
    if fails:
        lines += ["", "not ok:"] + fails
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.probes.hopper_probe", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "hopper-probe-out"), help="folder for hopper_probe.json")
    p.add_argument("--budget-s", type=float, default=170.0, help="stop starting points after this many seconds")
    p.add_argument("--point-timeout-s", type=float, default=80.0, help="seconds one point's process may take")
    p.add_argument("--hang-s", type=float, default=10.0, help="a launch still running after this is a hang")
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    p.add_argument("--points", nargs="+", type=int, help="indices into POINTS (default: all)")
    p.add_argument("--quick", action="store_true", help="validation shapes only, no timing (a first look)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    shapes = [s for s in SHAPES if not s[4]] if args.quick else SHAPES
    if args.child:
        return child(json.loads(args.child), args.dtypes, args.hang_s, shapes)

    start = time.monotonic()
    device = gpu_line()
    print(f"device: {device}", flush=True)
    chosen = [POINTS[i] for i in args.points] if args.points else POINTS
    runs = []
    for label, point in chosen:
        left = args.budget_s - (time.monotonic() - start)
        if left < 15:
            runs.append({"label": label, "point": point, "events": [], "ending": "skipped (budget)", "exit_code": None,
                         "last_stage": None, "stderr_tail": "", "seconds": 0})
            continue
        run = run_point(label, point, args, min(args.point_timeout_s, left))
        runs.append(run)
        got = results_of(run)
        oks = sum(r["status"] == "ok" for r in got.values())
        print(f"{label}: {run['ending']} in {run['seconds']} s, {oks}/{len(got)} ok"
              + "".join(f"; {d} {s} {r['status']}" for (d, s), r in got.items() if r["status"] != "ok"), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"probe": "hopper", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": device,
           "command": "python3 -m benchmarks.probes.hopper_probe " + " ".join(argv if argv is not None else sys.argv[1:]),
           "timing": TIMING, "shapes": shapes, "runs": runs, "seconds": round(time.monotonic() - start, 1)}
    (out / "hopper_probe.json").write_text(json.dumps(doc, indent=1) + "\n")
    if not args.quick:
        design = design_doc(doc)
        name = f"hopper-{design['device'].replace(' ', '_')}-{doc['date'].replace(':', '')}.json"
        (out / name).write_text(json.dumps(design, indent=1) + "\n")
    print()
    print(table(runs, args.dtypes, shapes))
    print(f"\n{len(runs)} points in {doc['seconds']} s; full records in {out / 'hopper_probe.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
