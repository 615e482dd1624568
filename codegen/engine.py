"""What a GPU worker does: load a cubin, validate it, time it, and time the baseline.

Runs only inside a worker process (codegen.worker); everything arrives as plain data.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from codegen import cuda, sparse
from codegen.cuda import Buffer, CudaError, Event, Module
from codegen.data import (
    NAN16,
    NAN32_HALVES,
    STORAGE,
    absolute,
    compare,
    dense_w,
    output_shapes,
    random_inputs,
    references,
    summarize,
)
from codegen.launch import LaunchPlan, TensorMapArg
from codegen.problem import DType, Layout, Problem

POINTERS = ("Y", "X", "W", "B", "WS", "CT", "RP", "CI", "DX", "DY", "DW", "DB", "WT", "BI", "WC", "WE")
FLUSH_BYTES = 256 << 20


class Failure(Exception):
    """An evaluation ended in a status other than ok."""

    def __init__(self, status: str, evidence: str, restart: bool = False) -> None:
        super().__init__(evidence)
        self.status, self.evidence, self.restart = status, evidence, restart


#: Launch-time errors that mean the kernel asked for more than the device gives.
RESOURCE_ERRORS = {"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "CUDA_ERROR_OUT_OF_MEMORY"}
#: Errors that mean our harness misused the driver (no such symbol, a stale handle): a bug.
HARNESS_ERRORS = {"CUDA_ERROR_NOT_FOUND", "CUDA_ERROR_INVALID_HANDLE", "CUDA_ERROR_INVALID_CONTEXT",
                  "CUDA_ERROR_NOT_INITIALIZED", "CUDA_ERROR_DEINITIALIZED"}


def launch_failure(e: CudaError, stage: str, symbol: str, smem: int) -> Exception:
    """What a CUDA error while getting (``stage`` "function") or launching ("launch") a kernel
    says: a poisoned context, the kernel's resources, a refused launch, or our own bug."""
    what = f"{stage} {symbol} ({smem} B dynamic shared memory): {e}"
    if e.sticky:
        return Failure("runtime_error", what, restart=True)
    if e.code in HARNESS_ERRORS:
        return RuntimeError(f"the harness misused the driver: {what}")  # a bug: the worker reports it as one
    if e.code in RESOURCE_ERRORS or (stage == "function" and e.code == "CUDA_ERROR_INVALID_VALUE"):
        return Failure("launch_out_of_resources", what)  # shared memory over the opt-in limit is refused here
    return Failure("runtime_error", f"launch refused: {what}")


def _semi_structured(F, x, w, b):
    """The timed call of ``F.linear`` on ``w`` (2:4 sparse already) as torch's semi-structured tensor
    on cuSPARSELt (not its CUTLASS kernels); torch refuses shapes cuSPARSELt cannot take."""
    from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured

    SparseSemiStructuredTensor._FORCE_CUTLASS = False
    w24 = to_sparse_semi_structured(w)
    return lambda: F.linear(x, w24, b)


class Operands:
    """One problem's inputs on host and device, and its output buffers (codegen.data.output_shapes:
    Y, dX, or dW and db, by layout)."""

    def __init__(self, problem: Problem, rng: np.random.Generator, with_reference: bool = True) -> None:
        self.problem = problem
        self.host = random_inputs(problem, rng)
        self.ref = references(problem, self.host) if with_reference else None
        self.scale = references(problem, absolute(problem, self.host)) if with_reference else None
        self.buffers: dict[str, Buffer] = {}
        for name, arr in self.host.items():
            self.buffers[name] = Buffer(arr.nbytes)
            self.buffers[name].upload(arr)
        self.outputs = output_shapes(problem)
        for name, shape in self.outputs.items():
            self.buffers[name] = Buffer(math.prod(shape) * problem.dtype.itemsize)
        self.workspace: Buffer | None = None
        self.counters: Buffer | None = None  # a plan's int32 tile counters (LaunchPlan.counters)
        self.tensor_maps: dict[tuple, object] = {}  # (TensorMapArg, address) -> its 128 encoded bytes

    def address(self, name: str, plan: LaunchPlan) -> int | None:
        if name == "WS":
            if plan.workspace_bytes == 0:
                return None
            if self.workspace is None or self.workspace.nbytes < plan.workspace_bytes:
                if self.workspace is not None:
                    self.workspace.free()
                self.workspace = Buffer(plan.workspace_bytes)
            return self.workspace.address
        if name == "CT":
            if plan.counters == 0:
                return None
            if self.counters is None or self.counters.nbytes < 4 * plan.counters:
                if self.counters is not None:
                    self.counters.free()
                self.counters = Buffer(4 * plan.counters)
            return self.counters.address
        buf = self.buffers.get(name)
        return buf.address if buf is not None else None  # no bias: a null pointer

    def tensor_map(self, arg: TensorMapArg, plan: LaunchPlan):
        """The 128 bytes of tensor map ``arg`` over its operand, encoded once per operand address."""
        base = self.address(arg.operand, plan)
        if base is None:
            raise RuntimeError(f"tensor map {arg.name} views operand {arg.operand}, which this problem does not have")
        key = (arg, base)
        if key not in self.tensor_maps:
            self.tensor_maps[key] = cuda.encode_tensor_map(arg.encoding(), base)
        return self.tensor_maps[key]

    @property
    def main_output(self) -> str:
        """The GEMM's own output (what a plan's ``zero_output`` zeroes)."""
        return next(iter(self.outputs))

    def poison(self, stream, plan: LaunchPlan | None = None) -> None:
        """Every output filled with NaN, and the plan's workspace too (float32 NaN), so that a partial sum
        or packed row a kernel leaves unwritten shows as NaN rather than as whatever memory held."""
        for name in self.outputs:
            self.buffers[name].fill16(NAN16.get(self.problem.dtype, NAN32_HALVES), stream)
        if plan is not None and plan.workspace_bytes:
            self.address("WS", plan)
            self.workspace.fill16(NAN32_HALVES, stream)
        if plan is not None and plan.counters:  # zero before the first launch, as the plan asks
            self.address("CT", plan)
            self.counters.zero(stream, 4 * plan.counters)

    def counters_left(self, plan: LaunchPlan) -> int:
        """How many of the plan's counters a run left other than zero (a plan must leave them zero)."""
        if not plan.counters:
            return 0
        host = self.counters.download(np.empty(self.counters.nbytes // 4, dtype=np.int32))
        return int(np.count_nonzero(host[: plan.counters]))

    def output(self, name: str | None = None) -> np.ndarray:
        name = name or self.main_output
        return self.buffers[name].download(np.empty(self.outputs[name], dtype=STORAGE[self.problem.dtype]))

    def free(self) -> None:
        for buf in list(self.buffers.values()) + [b for b in (self.workspace, self.counters) if b is not None]:
            buf.free()


class Engine:
    def __init__(self, ordinal: int = 0) -> None:
        self.ctx = cuda.Context(ordinal)
        self.stream = self.ctx.stream
        self.flush = Buffer(max(FLUSH_BYTES, 4 * self.ctx.info.l2_bytes))
        self.rng = np.random.default_rng()  # fresh seed in every worker
        self.operands: dict[Problem, Operands] = {}
        self.baselines: dict[Problem, dict] = {}
        self.events: tuple[Event, Event] | None = None

    # ---- running ------------------------------------------------------------------------------
    def run_plan(self, module: Module, plan: LaunchPlan, ops: Operands) -> None:
        p = ops.problem
        dims = {"M": p.m, "N": p.n, "K": p.k}
        if plan.zero_output:
            ops.buffers[ops.main_output].zero(self.stream)
        for step in plan.launches:
            args = [self._argument(a, plan, ops, dims) for a in step.args]
            try:
                func = module.function(step.symbol, step.smem)
            except CudaError as e:
                raise launch_failure(e, "function", step.symbol, step.smem) from e
            grid = step.grid_on(self.ctx.info.sms)  # persistent: its blocks per multiprocessor at most
            try:
                cuda.launch(func, grid, step.block, step.smem, self.stream, args, step.cluster)
            except CudaError as e:
                raise launch_failure(e, "launch", step.symbol, step.smem) from e

    @staticmethod
    def _argument(name: str, plan: LaunchPlan, ops: Operands, dims: dict):
        """One kernel argument as ctypes: a pointer, a dimension, or an encoded tensor map."""
        if name in POINTERS:
            return ctypes.c_void_p(ops.address(name, plan))
        if name in dims:
            return ctypes.c_int(dims[name])
        arg = plan.tensor_map(name)
        if arg is None:
            raise RuntimeError(f"kernel argument {name!r} is neither an operand, a dimension nor a tensor map of the plan")
        if arg.problems():  # the family planned a map TMA cannot take: our bug, not the kernel's
            raise RuntimeError(f"the plan's tensor map {name} cannot be encoded: {'; '.join(arg.problems())}")
        try:
            return ops.tensor_map(arg, plan)
        except CudaError as e:  # the driver refused the map (a plan that breaks TMA's rules): the kernel cannot run
            raise Failure("runtime_error", f"launch refused: tensor map {name}: {e}") from e

    def synchronize(self, what: str) -> None:
        try:
            self.ctx.synchronize()
        except CudaError as e:
            status = "timeout" if e.code == "CUDA_ERROR_LAUNCH_TIMEOUT" else "runtime_error"
            raise Failure(status, f"{what}: {e}", restart=e.sticky) from e

    def time_calls(self, fn, reps_min: int, reps_max: int, target_ms: float) -> list[float]:
        """Events around each call, L2 flushed before each; warm-up first."""
        for _ in range(2):
            fn()
        if self.events is None:  # one pair per engine: events are not freed by the garbage collector
            self.events = (Event(), Event())
        start, end = self.events
        start.record(self.stream)
        fn()
        end.record(self.stream)
        estimate = max(end.elapsed_ms(start), 1e-3)
        reps = int(min(reps_max, max(reps_min, math.ceil(target_ms / estimate))))
        times = []
        for _ in range(reps):
            self.flush.zero(self.stream)
            start.record(self.stream)
            fn()
            end.record(self.stream)
            times.append(end.elapsed_ms(start))
        return times

    # ---- requests -------------------------------------------------------------------------------
    def operands_for(self, problem: Problem) -> Operands:
        if problem not in self.operands:
            self.operands[problem] = Operands(problem, self.rng)
        return self.operands[problem]

    def prepare(self, problem: Problem, baseline: bool, timing: dict, patterns: dict | None = None) -> dict:
        """Inputs, float64 reference (cached per problem) and, if asked and torch is there, the
        baselines: cuBLAS, for a block-sparse W also torch's BSR matmul and 2:4 cuSPARSELt, for a 2:4
        W cuSPARSELt on the same W."""
        for d in (patterns or {}).values():
            sparse.register(sparse.Pattern.from_dict(d))
        self.operands_for(problem)
        if baseline and problem not in self.baselines:
            self.baselines[problem] = self._baselines(problem, timing)
        return self.baselines.get(problem, {})

    def _baselines(self, problem: Problem, timing: dict) -> dict:
        try:
            import torch
            import torch.nn.functional as F
        except ImportError:
            return {"note": "torch is not installed: no baselines"}
        # cuBLAS in the problem's own arithmetic: TF32 tensor cores for tf32, plain fp32 for fp32.
        torch.backends.cuda.matmul.allow_tf32 = problem.dtype is DType.tf32
        ops = self.operands[problem]
        tdtype = {DType.fp32: torch.float32, DType.tf32: torch.float32, DType.fp16: torch.float16,
                  DType.bf16: torch.bfloat16}[problem.dtype]

        def tensor(a: np.ndarray):
            t = torch.from_numpy(np.ascontiguousarray(a.view(np.int16) if problem.dtype is DType.bf16 else a))
            return t.cuda().view(tdtype) if problem.dtype is DType.bf16 else t.cuda()

        if problem.layout is Layout.forward:
            x, w = tensor(ops.host["X"]), tensor(dense_w(problem, ops.host))  # a sparse W expanded: dense cuBLAS
            b = tensor(ops.host["B"]) if problem.bias else None
            runs = {"cublas": lambda: lambda: F.linear(x, w, b)}  # name -> builder of the timed call
        else:  # what autograd runs for the layer's backward GEMM (and db)
            a = {name: tensor(arr) for name, arr in ops.host.items() if name in ("DY", "X", "W")}
            if problem.layout is Layout.grad_input:  # a block-sparse W expanded: dense cuBLAS
                w = tensor(dense_w(problem, ops.host))
                runs = {"cublas": lambda: lambda: a["DY"] @ w}
            elif problem.bias:
                runs = {"cublas": lambda: lambda: (a["DY"].t() @ a["X"], a["DY"].sum(0))}
            else:
                runs = {"cublas": lambda: lambda: a["DY"].t() @ a["X"]}
        notes = []
        if problem.sparse and problem.layout is Layout.forward:
            runs.update(self._sparse_runs(problem, torch, F, x, w, b, notes))
        elif problem.structured:  # cuBLAS above multiplies the same W dense (its pruned half zero)
            runs["cusparselt"] = lambda: _semi_structured(F, x, w, b)
        out: dict = {}
        for name, make in runs.items():
            try:
                fn = make()
                torch.cuda.synchronize()
                times = self.time_calls(fn, **timing)
                torch.cuda.synchronize()
            except Exception as e:  # a baseline torch cannot run here is a note, not a failure
                notes.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                continue
            stats = summarize(times, problem)
            out[name] = {k: stats[k] for k in ("median_ms", "p20_ms", "p80_ms")}
        if notes:
            out["note"] = "; ".join(notes)
        return out

    @staticmethod
    def _sparse_runs(problem: Problem, torch, F, x, w, b, notes: list) -> dict:
        """Builders of what a user would run instead on a block-sparse W: torch's BSR matmul on the
        same W (``W.to_sparse_bsr((B, B)) @ Xᵀ``, which gives Yᵀ) and, for 16-bit types, 2:4
        semi-structured sparsity through cuSPARSELt (``F.linear`` on a 2:4-pruned W of the same
        shape: half of W kept whatever the block density)."""
        runs = {}
        bs = problem.block

        def bsr():
            w_bsr = w.to_sparse_bsr((bs, bs))
            xt = x.t()
            return (lambda: (w_bsr @ xt).t() + b) if b is not None else (lambda: w_bsr @ xt)

        if problem.n % bs or problem.k % bs:
            notes.append(f"torch_bsr: needs N and K multiples of the block {bs}")
        else:
            runs["torch_bsr"] = bsr
        if problem.dtype in (DType.fp16, DType.bf16):
            def semi_structured():
                keep = torch.tensor([1, 1, 0, 0], dtype=w.dtype, device=w.device).repeat(problem.n, problem.k // 4)
                return _semi_structured(F, x, torch.rand_like(w) * keep, b)

            runs["cusparselt"] = semi_structured
        return runs

    def evaluate(self, job: dict) -> dict:
        for d in job.get("patterns", {}).values():
            sparse.register(sparse.Pattern.from_dict(d))
        problem = Problem.from_dict(job["problem"])
        try:
            module = Module(job["cubin"])
        except CudaError as e:  # the cubin compiled; the driver would not load it (arch, image, memory)
            raise Failure("context_lost" if e.sticky else "load_error", f"module load: {e}", e.sticky) from e
        try:
            # Odd-shape probe with fresh inputs: catches tail bugs the main shape can hide.
            probe = Problem.from_dict(job["probe"])
            probe_ops = Operands(probe, self.rng)
            try:
                self._validate(module, LaunchPlan.from_dict(job["probe_plan"]), probe_ops, f"probe {probe.key}")
            finally:
                probe_ops.free()
            ops = self.operands_for(problem)
            plan = LaunchPlan.from_dict(job["plan"])
            rel = self._validate(module, plan, ops, problem.key)

            def run() -> None:
                self.run_plan(module, plan, ops)

            times = self.time_calls(run, **job["timing"])
            self.synchronize("timing")
            return {"status": "ok", "evidence": "", "rel_error": rel, "times_ms": times, **summarize(times, problem)}
        finally:
            module.unload()

    def _validate(self, module: Module, plan: LaunchPlan, ops: Operands, what: str) -> float | None:
        """Every output and the workspace poisoned with NaN, the plan run, each output checked against
        float64; the relative error of the GEMM's own output."""
        ops.poison(self.stream, plan)
        self.run_plan(module, plan, ops)
        self.synchronize(what)
        left = ops.counters_left(plan)
        if left:  # the next launch would start from them: every later run computes garbage
            raise Failure("wrong_result", f"{what}: {left} of {plan.counters} tile counters left non-zero after the launch")
        errors = {}
        for name in ops.outputs:
            status, evidence, errors[name] = compare(ops.problem, ops.output(name), ops.ref[name], ops.scale[name])
            if status != "ok":
                label = f" {name}" if len(ops.outputs) > 1 else ""
                raise Failure(status, f"{what}{label}: {evidence}")
        return errors[ops.main_output]
