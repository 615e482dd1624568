"""The app tests' fixture database, built through store's own API, and the pages to visit."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

from codegen.families.simt import Spec as SimtSpec
from codegen.problem import DType, Problem
from store import Store

H200 = {"name": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04", "nvrtc": "13.0"}
OTHER = {"name": "Test GPU 9000", "sm": "sm_80", "driver": "1.0", "nvrtc": "13.0"}
DENSE = Problem(1024, 1024, 1024)
SKINNY = Problem(32, 4096, 4096, dtype=DType.bf16, bias=True)
HOSTILE_EVIDENCE = "error: <script>alert('x')</script> expected ';'"
SOURCE = 'extern "C" __global__ void k(float* y) {\n  // <b>not html</b>\n  y[0] = 1.0f;\n}\n'
SOURCE_HASH = hashlib.sha256(SOURCE.encode()).hexdigest()


@dataclass(frozen=True)
class SparseProblem(Problem):
    """Stands in for the block-sparse problem type until codegen has one."""

    density: float = 1.0
    block: int | None = None

    @property
    def key(self) -> str:
        return f"{super().key}_d{self.density:g}_b{self.block}"


def ok(ms: float, problem: Problem, cublas_ms: float) -> dict:
    tflops = problem.flops * getattr(problem, "density", 1.0) / (ms * 1e-3) / 1e12
    return {
        "status": "ok", "evidence": "", "median_ms": ms, "p20_ms": ms * 0.98, "p80_ms": ms * 1.03,
        "times_ms": [ms * f for f in (0.97, 0.98, 1.0, 1.01, 1.05)], "tflops": tflops,
        "gbps": problem.min_bytes / (ms * 1e-3) / 1e9, "rel_error": 2e-7,
        "baselines": {"cublas": {"median_ms": cublas_ms, "p20_ms": cublas_ms, "p80_ms": cublas_ms}},
        "ratio": {"cublas": cublas_ms / ms},
    }  # fmt: skip


def failed(status: str, evidence: str) -> dict:
    return {"status": status, "evidence": evidence, "median_ms": None, "times_ms": [], "baselines": {}, "ratio": {}}


def variant(i: int, dtype: DType = DType.fp32, bias: bool = False) -> SimtSpec:
    base = SimtSpec(dtype=dtype, bias=bias)
    return dataclasses.replace(base, pad=base.pad + i % 4, group_m=1 + i // 4)


def record(spec: SimtSpec, compiled: bool = True) -> dict:
    rec = {"name": spec.name, "family": "simt", "spec": spec.to_dict(), "arch": "sm_90"}
    if compiled:
        rec |= {"source": SOURCE, "source_hash": SOURCE_HASH, "options": ["-arch=sm_90", "-std=c++17"], "log": "",
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
                        source_hash=SOURCE_HASH if compiled else None)
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
                    source_hash=SOURCE_HASH)
    store.add_trial(None, bench.name, "sm_90", SKINNY, other, None, ok(0.08, SKINNY, 0.03), bench.to_dict(),
                    source_hash=SOURCE_HASH)
    for block, speedups in () if not sparse else ((32, (2.5, 1.4, 0.8)), (64, (3.0, 1.8, 1.1))):
        for density, speedup in zip((0.1, 0.25, 0.5), speedups, strict=True):
            problem = SparseProblem(2048, 2048, 2048, density=density, block=block)
            spec = variant(block // 32)
            store.add_trial(None, spec.name, "sm_90", problem, h200, None, ok(1.0 / speedup, problem, 1.0),
                            spec.to_dict(), source_hash=SOURCE_HASH)  # fmt: skip
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
