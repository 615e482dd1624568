"""Orchestrator side of one evaluation: check, render, compile, then ask the GPU worker.

Never touches CUDA itself. Every outcome is a result dict with a status (see STATUSES).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codegen import sparse
from codegen.compile import CompileError, CompileResult, compile_source, default_arch, nvrtc_version
from codegen.families import compile_target
from codegen.launch import plan
from codegen.problem import Layout, Problem
from codegen.render import render, source_hash
from codegen.spec import DeviceLimits, KernelSpec
from codegen.worker import GpuWorker

#: How an evaluation can end. compile_error: NVRTC refused the source (or its process died on it);
#: load_error: the driver would not load the cubin; launch_out_of_resources: registers, shared
#: memory or workspace beyond the device; runtime_error: a refused launch or a fault in the kernel;
#: context_lost: the context was already unusable; worker_crash: the worker process died.
STATUSES = (
    "ok", "invalid", "compile_error", "compile_timeout", "load_error", "launch_out_of_resources", "runtime_error",
    "context_lost", "timeout", "worker_crash", "wrong_result", "nan_or_inf",
)
#: Small shape, no side a multiple of any tile: every evaluation also runs it. A kernel that needs
#: 16-byte rows and refuses a side of it gets that side from PROBE_ALIGNED (multiples of 8, still no
#: multiple of any tile: K = PROBE_ALIGNED_K ends in a partial k-tile), as few sides as it takes.
PROBE = (67, 45, 91)
PROBE_ALIGNED = (72, 40, 88)
PROBE_ALIGNED_K = PROBE_ALIGNED[2]
DEFAULT_TIMING = {"reps_min": 20, "reps_max": 100, "target_ms": 100.0}


class InternalError(RuntimeError):
    """gemmscape's own code failed (render, plan, the worker's harness, the store): a bug, never
    a kernel's status. A search stops with it."""


def blank_result(status: str, evidence: str) -> dict:
    """A result dict with every field present and only the status and evidence set."""
    assert status in STATUSES
    return {"status": status, "evidence": evidence, "median_ms": None, "p20_ms": None, "p80_ms": None,
            "times_ms": [], "tflops": None, "gbps": None, "rel_error": None, "baselines": {}, "ratio": {}}


def probe_for(problem: Problem, spec: KernelSpec | None = None) -> Problem:
    """The odd-shape problem every evaluation of ``problem``'s kernels also runs (for a block-sparse
    W, on a small pattern with an empty block row: codegen.sparse.probe_pattern; a 2:4 W stays 2:4). Where ``spec``
    refuses PROBE, the first shape it takes with the fewest sides from PROBE_ALIGNED, K first (a
    kernel that reads 16-byte rows through TMA: X's in the forward layout, dY's and W's or X's, along
    M or N, in the backward ones); PROBE itself when it takes none."""

    def at(m: int, n: int, k: int) -> Problem:
        dense = Problem(m, n, k, problem.dtype, problem.layout, problem.bias, sparsity=problem.sparsity)
        if problem.sparse:  # the pattern is of the layer's W [out, in] (Problem.w_shape); the batch is the rest
            batch = k if problem.layout is Layout.grad_weight else m
            return sparse.problem_for(batch, sparse.probe_pattern(*dense.w_shape, problem.block), problem.dtype,
                                      problem.bias, problem.layout)
        return dense

    probe = at(*PROBE)
    if spec is None or not spec.check(probe):
        return probe
    for sides in ((2,), (0,), (1,), (0, 2), (1, 2), (0, 1), (0, 1, 2)):
        aligned = at(*(PROBE_ALIGNED[i] if i in sides else PROBE[i] for i in range(3)))
        if not spec.check(aligned):
            return aligned
    return probe


def patterns(*problems: Problem) -> dict:
    """The BSR patterns of the block-sparse problems among ``problems``, as plain data for the worker."""
    return {p.pattern: sparse.lookup(p).to_dict() for p in problems if p.sparse}


@dataclass
class Built:
    """A spec made ready for the GPU, or the reason it cannot be."""

    spec: KernelSpec
    source: str | None = None
    compiled: CompileResult | None = None
    failure: dict | None = None

    def kernel_record(self) -> dict:
        """The kernel as the store keeps it; identified by name, arch and the hash of its source."""
        rec = {"name": self.spec.name, "family": self.spec.family, "spec": self.spec.to_dict()}
        if self.source is not None:
            rec.update(source=self.source, source_hash=source_hash(self.source))
        if self.compiled is not None:
            c = self.compiled
            rec.update(source_hash=c.source_hash, arch=c.arch, options=c.options, report=c.report, log=c.log)
        return rec


def build(spec: KernelSpec, problem: Problem, arch: str, limits: DeviceLimits | None = None) -> Built:
    """Check, render and compile (CPU only; safe in a process pool)."""
    reasons = spec.check(problem, limits or DeviceLimits.for_arch(arch))
    if reasons:
        return Built(spec, failure=blank_result("invalid", "; ".join(reasons)))
    source = render(spec)
    try:
        compiled = compile_source(source, spec.name, arch, target=compile_target(spec, arch))
    except CompileError as e:
        return Built(spec, source, failure=blank_result("compile_error", e.log[-4000:]))
    return Built(spec, source, compiled)


@dataclass
class Evaluator:
    """Runs built kernels on one GPU through its worker and attaches the baseline."""

    arch: str | None = None
    timeout_s: float = 30.0
    prepare_timeout_s: float = 600.0
    baseline: bool = True
    timing: dict = field(default_factory=lambda: dict(DEFAULT_TIMING))
    ordinal: int = 0

    def __post_init__(self) -> None:
        self.worker = GpuWorker(self.ordinal)
        self._baselines: dict[Problem, dict] = {}
        self._prepared: set[tuple[Problem, int]] = set()

    def device(self) -> dict:
        """Name, sm, driver and NVRTC version of the GPU (starts the worker)."""
        if self.worker.info is None:
            self.worker.ensure()
        info = dict(self.worker.info)
        info["nvrtc"] = nvrtc_version()
        return info

    @property
    def target_arch(self) -> str:
        return self.arch or (self.device()["sm"] if self.worker.info else default_arch())

    def limits(self) -> DeviceLimits:
        info = self.device()
        base = DeviceLimits.for_arch(info["sm"])
        return DeviceLimits(sm=base.sm, max_smem=info["max_smem_optin"])

    def baselines(self, problem: Problem) -> dict:
        """Make the worker hold the problem's inputs and reference; time the baseline once per run."""
        self.worker.ensure()
        if (problem, self.worker.starts) not in self._prepared:
            reply = self.worker.request(
                {"op": "prepare", "problem": problem.to_dict(), "timing": self.timing, "patterns": patterns(problem),
                 "baseline": self.baseline and problem not in self._baselines},
                self.prepare_timeout_s,
            )
            if reply.get("bug"):
                raise InternalError(f"the GPU worker failed preparing {problem.key}:\n{reply['bug']}")
            if "baselines" not in reply:
                raise RuntimeError(f"could not prepare {problem.key} on the GPU: {reply.get('evidence')}")
            self._baselines.setdefault(problem, reply["baselines"])
            self._prepared.add((problem, self.worker.starts))
        return self._baselines[problem]

    def run(self, built: Built, problem: Problem) -> dict:
        if built.failure is not None:
            return built.failure
        baselines = self.baselines(problem)
        probe = probe_for(problem, built.spec)
        job = {
            "op": "evaluate",
            "cubin": built.compiled.cubin,
            "problem": problem.to_dict(),
            "plan": plan(built.spec, problem).to_dict(),
            "probe": probe.to_dict(),
            "probe_plan": plan(built.spec, probe).to_dict(),
            "patterns": patterns(probe),
            "timing": self.timing,
        }
        reply = self.worker.request(job, self.timeout_s)
        if reply.get("bug"):
            raise InternalError(f"the GPU worker's own code failed on {built.spec.name}:\n{reply['bug']}")
        if reply.get("status") != "ok":
            return blank_result(reply.get("status", "worker_crash"), reply.get("evidence", ""))
        result = blank_result("ok", "")
        result.update({k: reply[k] for k in ("median_ms", "p20_ms", "p80_ms", "times_ms", "tflops", "gbps", "rel_error")})
        named = {k: v for k, v in baselines.items() if isinstance(v, dict)}
        result["baselines"] = named
        result["ratio"] = {k: v["median_ms"] / result["median_ms"] for k, v in named.items()}
        return result

    def evaluate(self, spec: KernelSpec, problem: Problem) -> tuple[dict, Built]:
        built = build(spec, problem, self.target_arch, self.limits())
        return self.run(built, problem), built

    def close(self) -> None:
        self.worker.stop()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
