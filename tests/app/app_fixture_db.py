"""The app tests' fixture database, built through store's own API, and the pages to visit.

Every figure recorded here (times, rates, errors, baselines, ratios) is synthetic: made up for the
tests, never measured on any GPU, whatever the device rows are called.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from codegen.families.simt import Spec as SimtSpec
from codegen.families.tensorcore import Spec as TensorCoreSpec
from codegen.problem import DType, Problem
from codegen.render import render
from codegen.sparse import Pattern, problem_for
from store import Store
from store.records import recorded_device_name

H200 = {"name": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04", "nvrtc": "13.0"}
OTHER = {"name": "Test GPU 9000", "sm": "sm_80", "driver": "1.0", "nvrtc": "13.0"}
DENSE = Problem(1024, 1024, 1024)
SKINNY = Problem(32, 4096, 4096, dtype=DType.bf16, bias=True)
HOSTILE_EVIDENCE = "error: <script>alert('x')</script> expected ';'"


def source_of(spec) -> str:
    """The kernel's rendered source (so that export takes it; for the fixture's variants that are no
    valid kernel, a stub that export refuses) with a line the page must not read as HTML."""
    try:
        text = render(spec)
    except ValueError:
        text = f'extern "C" __global__ void {spec.name}(float* y) {{\n  y[0] = 1.0f;\n}}\n'
    return text + "// <b>not html</b>\n"


def hash_of(spec) -> str:
    return hashlib.sha256(source_of(spec).encode()).hexdigest()


#: Synthetic sparse results: (dtype, block) -> (density, speedup over dense cuBLAS, torch BSR's speedup).
SPARSE = {
    (DType.fp32, 32): ((0.1, 2.5, 1.6), (0.25, 1.4, 0.9), (0.5, 0.8, 0.5)),
    (DType.fp32, 64): ((0.0, 20.0, 8.0), (0.1, 3.0, 2.0), (0.25, 1.8, 1.2), (0.5, 1.1, 0.7)),
    (DType.fp16, 32): ((0.25, 1.2, 0.8), (0.5, 0.7, 0.4)),
}
#: Synthetic dense cuBLAS and cuSPARSELt 2:4 times (ms) of the sparse shape, per dtype (no 2:4 for fp32).
DENSE_MS = {DType.fp32: 1.0, DType.fp16: 0.5}
CUSPARSELT_MS = {DType.fp16: 0.35}
SPARSE_SHAPE = (2048, 2048, 2048)


def sparse_problem(dtype: DType, block: int, density: float) -> Problem:
    m, n, k = SPARSE_SHAPE
    return problem_for(m, Pattern.random(n, k, block, density, seed=block), dtype)


def ok(ms: float, problem: Problem, cublas_ms: float, **others: float) -> dict:
    """A synthetic ok result; ``others`` are more baselines' times (name -> ms)."""
    baselines = {"cublas": cublas_ms, **others}
    return {
        "status": "ok", "evidence": "", "median_ms": ms, "p20_ms": ms * 0.98, "p80_ms": ms * 1.03,
        "times_ms": [ms * f for f in (0.97, 0.98, 1.0, 1.01, 1.05)], "tflops": problem.flops / (ms * 1e-3) / 1e12,
        "gbps": problem.min_bytes / (ms * 1e-3) / 1e9, "rel_error": 2e-7,
        "baselines": {name: {"median_ms": t, "p20_ms": t, "p80_ms": t} for name, t in baselines.items()},
        "ratio": {name: t / ms for name, t in baselines.items()},
    }  # fmt: skip


def failed(status: str, evidence: str) -> dict:
    return {"status": status, "evidence": evidence, "median_ms": None, "times_ms": [], "baselines": {}, "ratio": {}}


def variant(i: int, dtype: DType = DType.fp32, bias: bool = False) -> SimtSpec:
    base = SimtSpec(dtype=dtype, bias=bias)
    return dataclasses.replace(base, pad=base.pad + i % 4, group_m=1 + i // 4)


def record(spec: SimtSpec, compiled: bool = True) -> dict:
    rec = {"name": spec.name, "family": "simt", "spec": spec.to_dict(), "arch": "sm_90"}
    if compiled:
        rec |= {"source": source_of(spec), "source_hash": hash_of(spec), "options": ["-arch=sm_90", "-std=c++17"], "log": "",
                "report": {spec.name: {"registers": 96, "stack": 0, "spill_stores": 0, "spill_loads": 0,
                                       "barriers": 1}}}  # fmt: skip
    return rec


def search(store: Store, dev: int, sampler: str, seed: int, statuses: dict[int, tuple[str, str]]) -> None:
    run = store.start_run(DENSE, dev, "simt", sampler, seed, 12, f"dense-{sampler}", {"gemmscape": "0.1.0"},
                          f"codegen search --sampler {sampler} --seed {seed}")  # fmt: skip
    for n in range(12):
        spec = variant((n * (seed + 1) + 5) % 12)  # runs meet the best kernel at different trials
        compiled = statuses.get(n, ("",))[0] != "invalid"
        store.kernel(record(spec, compiled=compiled))
        if n in statuses:
            result = failed(*statuses[n])
        else:
            result = ok(0.2 + 0.05 * (spec.pad % 4) + 0.01 * spec.group_m + 0.001 * seed, DENSE, 0.07)
        store.add_trial(run, spec.name, "sm_90", DENSE, dev, n, result, spec.to_dict(),
                        source_hash=hash_of(spec) if compiled else None)
    store.end_run(run)


def build(url: str, sparse: bool = True) -> None:
    store = Store(url)
    h200, other = store.device(H200), store.device(OTHER)
    search(store, h200, "tpe", 0, {3: ("compile_error", HOSTILE_EVIDENCE), 5: ("invalid", "pad breaks alignment")})
    search(store, h200, "random", 1, {2: ("timeout", "no answer in 30 s\nworker killed"),
                                      7: ("launch_out_of_resources", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")})  # fmt: skip
    bench = variant(0, DType.bf16, bias=True)
    store.kernel(record(bench))
    store.add_trial(None, bench.name, "sm_90", SKINNY, h200, None, ok(0.05, SKINNY, 0.019), bench.to_dict(),
                    source_hash=hash_of(bench))
    store.add_trial(None, bench.name, "sm_90", SKINNY, other, None, ok(0.08, SKINNY, 0.03), bench.to_dict(),
                    source_hash=hash_of(bench))
    for (dtype, block), points in SPARSE.items() if sparse else ():
        dense = DENSE_MS[dtype]
        semi = {"cusparselt": CUSPARSELT_MS[dtype]} if dtype in CUSPARSELT_MS else {}
        spec = variant(block // 32, dtype)
        store.kernel(record(spec))
        for density, speedup, torch_speedup in points:
            problem = sparse_problem(dtype, block, density)
            result = ok(dense / speedup, problem, dense, torch_bsr=dense / torch_speedup, **semi)
            store.add_trial(None, spec.name, "sm_90", problem, h200, None, result, spec.to_dict(),
                            source_hash=hash_of(spec))  # fmt: skip
    store.close()


#: A replayed search as a user met it: the device of a recording, kernels stored as a replay stores them
#: (the hash of the source measured, no source: today's templates render other source), invalid points.
REPLAY_FILE = "replay-simt-4096x4096x4096-fp32.json"
REPLAYED = dict(H200, name=recorded_device_name(H200["name"], "2026-11-30T08:00:00+00:00", REPLAY_FILE))
BIG = Problem(4096, 4096, 4096)
BIG_BF16 = Problem(4096, 4096, 4096, dtype=DType.bf16)
STALE = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4)  # the fastest; its measured source is not stored
UNHASHED = dataclasses.replace(STALE, group_m=2)  # from a recording older than source hashes
MATCHING = dataclasses.replace(STALE, group_m=4)  # measured with the source today's templates render
#: The tile sizes the replayed search tried: as text they sort 128, 256, 64.
TILES = (256, 64, 128)
REPLAY_EVALUATED, REPLAY_INVALID = 12, 3


def build_replayed(url: str) -> None:
    """A store like the one ``codegen search --replay`` leaves: 10 evaluated trials and 3 invalid points
    of a simt search on the recording's device, and a bf16 problem that a tensor-core kernel wins on a
    live H200 (2 trials)."""
    store = Store(url)
    dev = store.device(REPLAYED)
    run = store.start_run(BIG, dev, "simt", "tpe", 0, 10, "replay-big", {"gemmscape": "0.1.0"},
                          f"codegen search --replay {REPLAY_FILE}")  # fmt: skip
    tiled = [dataclasses.replace(SimtSpec(), bm=bm, group_m=g) for bm in TILES for g in (1, 2, 4)]
    points = [(STALE, 0.6), (UNHASHED, 0.9), (MATCHING, 0.95)]
    points += [(spec, 1.0 + 0.1 * i) for i, spec in enumerate(tiled[:7])]
    number = 0
    for spec, ms in points:
        measured = None if spec is UNHASHED else hashlib.sha256(
            (render(spec) if spec is MATCHING else f"// measured {spec.name}\n").encode()).hexdigest()
        store.kernel({"name": spec.name, "family": "simt", "spec": spec.to_dict(), "arch": "sm_90",
                      "source_hash": measured})  # fmt: skip
        store.add_trial(run, spec.name, "sm_90", BIG, dev, number, ok(ms, BIG, 0.5), spec.to_dict(),
                        source_hash=measured)
        number += 1
    for bk in (3, 5, 7):  # refused by the rules: never rendered
        spec = dataclasses.replace(SimtSpec(), bk=bk)
        store.kernel({"name": spec.name, "family": "simt", "spec": spec.to_dict(), "arch": "sm_90"})
        store.add_trial(run, spec.name, "sm_90", BIG, dev, number, failed("invalid", "bk breaks the rules"),
                        spec.to_dict(), source_hash=None)  # fmt: skip
        number += 1
    store.end_run(run)
    live = store.device(H200)
    for spec, ms in ((TensorCoreSpec(), 0.2), (SimtSpec(dtype=DType.bf16), 0.9)):
        store.kernel(record(spec) | {"family": spec.family})
        store.add_trial(None, spec.name, "sm_90", BIG_BF16, live, None, ok(ms, BIG_BF16, 0.3), spec.to_dict(),
                        source_hash=hash_of(spec))  # fmt: skip
    store.close()


MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"
PAGES = {
    "Overview": "pages/overview.py",
    "Trials": "pages/trials.py",
    "Search history": "pages/history.py",
    "Kernel": "pages/kernel.py",
    "Failures": "pages/failures.py",
    "Sparsity": "pages/sparsity.py",
}
