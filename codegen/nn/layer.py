"""gemmscape's tuned kernels as a PyTorch layer (the optional ``torch`` extra).

``Linear`` is an ``nn.Linear`` whose forward and backward run the kernels tuned for its shape:
the forward GEMM Y = X·Wᵀ (+ b), and in backward dX = dY·W (layout grad_input) and dW = dYᵀ·X
with db = Σ dY (layout grad_weight). Each is looked up by shape, dtype, layout and device in a
bundle (``codegen export --bundle``) or a store, compiled once with NVRTC, loaded with the driver
API and launched on torch's current stream; workspace comes from torch's allocator, an output
that must start at zero is zeroed on the stream, and a kernel's tile counters (a split-K summed by
its last split) are allocated and zeroed once, when it is loaded. Nothing waits on the host, so a captured CUDA
graph replays it. A GEMM with no tuned kernel, or whose kernel's verdict says cuBLAS won
(codegen.nn.verdict; unless ``ours_everywhere``), runs torch's own op instead, and the reason is
logged once per problem and device (logger ``gemmscape.nn``); a call whose GEMMs all run torch's op
is plain ``F.linear``.

Which tensor each kernel argument names, per layout (the kernels' own convention, from their
manifests' argument names): forward Y=y, X=x, W=weight, B=bias; grad_input DX=dX, DY=dY, W=weight;
grad_weight DW=dW, DY=dY, X=x, and DB = db (its own kernel) where the problem has a bias.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from codegen.launch import launched_grid
from codegen.nn.bundle import Bundle, KernelFile, SeedKernels, StoreKernels
from codegen.problem import DType, Layout, Problem, linear_problems

__all__ = ["Kernels", "Linear", "kernels_from", "replace_linear"]

log = logging.getLogger("gemmscape.nn")

DTYPES = {torch.float32: DType.fp32, torch.float16: DType.fp16, torch.bfloat16: DType.bf16}
POINTER_ARGS = ("Y", "X", "W", "B", "DX", "DY", "DW", "DB", "WS", "CT", "RP", "CI", "WT", "BI", "WC", "WE")
#: A kernel argument's array per layout (codegen.launch.LAYOUT_SLOTS names them) -> the tensor it is here.
#: A block-sparse W's kernels also take its BSR arrays (codegen.nn.sparse): W's row pointers RP and
#: block columns CI, and for grad_input Wᵀ's blocks WT with Wᵀ's RP and CI (or W's own blocks with Wᵀ's RP and
#: CI and BI, each of Wᵀ's kept blocks' index among W's). A 2:4 W's forward kernel
#: takes its kept halves WC and their metadata WE (codegen.nn.semisparse).
OPERANDS = {
    Layout.forward: {"Y": "y", "X": "x", "W": "weight", "B": "bias", "RP": "indptr", "CI": "indices",
                     "WC": "values", "WE": "metadata"},
    Layout.grad_input: {"DX": "grad_x", "DY": "grad_y", "W": "weight", "WT": "weight_t", "RP": "t_indptr",
                        "CI": "t_indices", "BI": "t_order"},
    Layout.grad_weight: {"DW": "grad_weight", "DY": "grad_y", "X": "x", "DB": "grad_bias", "RP": "indptr",
                         "CI": "indices"},
}
#: The GEMM's own output per layout (zeroed first where the plan says so).
OUTPUT = {Layout.forward: "y", Layout.grad_input: "grad_x", Layout.grad_weight: "grad_weight"}


class _Step:
    """One launch of a kernel, prepared once: what does not depend on the call's tensors (dims as
    ctypes ints, the grid with its persistent cap, block, shared memory, the pointer array over the
    argument values) is fixed; a call fills the pointer slots (``pointers``: index, role) and the tensor
    maps' slots (``maps``: index, argument name, encoding) and launches."""

    __slots__ = ("func", "grid", "cluster", "block", "smem", "args", "params", "address", "pointers", "maps")

    def __init__(self, func, step: dict, problem: Problem, sms: int, kernel: str) -> None:
        dims = {"M": problem.m, "N": problem.n, "K": problem.k}
        roles = OPERANDS[problem.layout]
        self.func, self.block, self.smem = func, tuple(step["block"]), step["dynamic_smem_bytes"]
        self.cluster = tuple(step.get("cluster", (1, 1, 1)))  # a thread-block cluster launch when not (1, 1, 1)
        self.grid = launched_grid(step["grid_for_problem"], int(step.get("persistent") or 0), self.cluster, sms)
        self.args: list = []
        self.pointers: list[tuple[int, str | None]] = []  # (slot, the tensor's role, "WS", "CT" or None: no such tensor)
        self.maps: list[tuple[int, str, dict]] = []  # (slot, argument name, encoding)
        for i, arg in enumerate(step["args"]):
            name = arg["name"]
            if "tensor_map" in arg:
                self.maps.append((i, name, arg["tensor_map"]))
                self.args.append(None)  # the map over this call's operand
            elif name in dims:
                self.args.append(ctypes.c_int(dims[name]))
            elif name in POINTER_ARGS:
                self.pointers.append((i, name if name in ("WS", "CT") else roles.get(name)))
                self.args.append(ctypes.c_void_p())
            else:
                raise _Unusable(f"{kernel}: kernel argument {name!r} is not one codegen.nn knows for the "
                                f"{problem.layout.value} layout")
        self.params = (ctypes.c_void_p * max(len(self.args), 1))(
            *[ctypes.addressof(a) if a is not None else None for a in self.args])
        self.address = ctypes.addressof(self.params)


class _Compiled:
    """One tuned kernel, compiled and loaded on one device; launched from its manifest."""

    def __init__(self, file: KernelFile, problem: Problem, device: torch.device) -> None:
        from codegen import cuda
        from codegen.compile import compile_source
        from codegen.families import compile_target, spec_from_dict

        self.cuda = cuda
        self.manifest, self.problem, self.device = file.manifest, problem, device
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm_{major}{minor}"
        spec = spec_from_dict(self.manifest["spec"])
        compiled = compile_source(file.source, self.manifest["name"], arch, target=compile_target(spec, arch))
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count
        with torch.cuda.device(device):
            self.ctx = _context(device.index)
            self.module = cuda.Module(compiled.cubin)
            self.functions = [self.module.function(k["symbol"], k["dynamic_smem_bytes"]) for k in self.manifest["kernels"]]
        self.workspace = int(self.manifest["workspace_bytes"])
        self.zero_first = bool(self.manifest["zero_output_first"])
        self.counters = self._counters(int(self.manifest.get("counters", 0)))
        self.maps: dict[tuple[str, int], object] = {}
        self.prepare()

    def _counters(self, n: int) -> torch.Tensor | None:
        """The kernel's tile counters (CT), zeroed once here and left zero by every launch. Launches
        on one stream run one after the other; two streams running this kernel at once would share
        them, so a layer on two streams at once needs a Kernels of its own per stream."""
        if not n:
            return None
        if torch.cuda.is_current_stream_capturing():  # zeroed only when the graph replays: not yet usable
            raise _Unusable("its tile counters must be allocated outside CUDA graph capture: call the layer once "
                            "before capturing")
        counters = torch.zeros(n, dtype=torch.int32, device=self.device)
        torch.cuda.current_stream(self.device).synchronize()
        return counters

    def prepare(self) -> None:
        """Fix per launch step what no call changes (``_Step``), and the names of the arguments."""
        name = self.manifest["name"]
        self.steps = [_Step(func, step, self.problem, self.sms, name)
                      for step, func in zip(self.manifest["kernels"], self.functions, strict=True)]
        self.arg_names = frozenset(a["name"] for step in self.manifest["kernels"] for a in step["args"])
        self.output = OUTPUT[self.problem.layout]
        self.index = self.device.index or 0
        self.streams: dict[int, object] = {}  # stream handle -> its driver wrapper
        self.lock = threading.Lock()  # the steps' argument values are shared: one launch at a time fills them

    def __call__(self, tensors: dict[str, torch.Tensor | None], stream: torch.cuda.Stream | None = None):
        """Launch the manifest's kernels on ``tensors`` (by role), on torch's current stream, or on
        ``stream`` after it waits for the current one (which zeroes the output and allocates the
        workspace first). Returns the workspace tensor (None without one): with ``stream`` the
        caller keeps it until the current stream has waited for ``stream``, since it belongs to
        the current stream's memory pool."""
        if self.zero_first:
            tensors[self.output].zero_()
        ws = torch.empty(self.workspace, dtype=torch.uint8, device=self.device) if self.workspace else None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
            handle = stream.cuda_stream
        else:
            handle = _current_stream(self.index)
        stream = self.streams.get(handle)
        if stream is None:
            if len(self.streams) > 64:
                self.streams.clear()
            stream = self.streams[handle] = self.cuda.driver.CUstream(handle)
        previous = _make_current(self.ctx)
        try:
            self._launch(tensors, ws, stream)
        finally:
            if previous is not None:  # the thread had another device's context current: give it back
                _make_current(previous)
        return ws

    def _launch(self, tensors: dict, ws: torch.Tensor | None, stream) -> None:
        cuda = self.cuda
        with self.lock:
            for step in self.steps:
                args, params = step.args, step.params
                for i, role in step.pointers:
                    t = ws if role == "WS" else self.counters if role == "CT" else tensors.get(role) if role else None
                    args[i].value = t.data_ptr() if t is not None else None
                for i, name, enc in step.maps:
                    base = self._map_base(enc["operand"], tensors, ws)
                    if base is None:
                        raise RuntimeError(f"{self.manifest['name']}: tensor map {name} views {enc['operand']}, "
                                           f"which this call does not have")
                    key = (name, base)
                    tmap = self.maps.get(key)
                    if tmap is None:
                        if len(self.maps) > 64:
                            self.maps.clear()
                        tmap = self.maps[key] = cuda.encode_tensor_map(enc, base)
                    args[i] = tmap
                    params[i] = ctypes.addressof(tmap)
                cuda.launch_prepared(step.func, step.grid, step.block, step.smem, stream, step.address, step.cluster)

    def _map_base(self, name: str, tensors: dict, ws: torch.Tensor | None) -> int | None:
        if name == "WS":
            return ws.data_ptr() if ws is not None else None
        role = OPERANDS[self.problem.layout].get(name)
        t = tensors.get(role) if role else None
        return t.data_ptr() if t is not None else None


class _Unusable(Exception):
    """A kernel was found but cannot run here; the message says why (a fallback reason)."""


_contexts: dict[int, object] = {}
_lock = threading.Lock()


def _context(ordinal: int):
    """The device's primary context (the one torch uses), retained once."""
    from codegen.cuda import check, driver

    with _lock:
        if ordinal not in _contexts:
            check(driver.cuInit(0), "cuInit")
            dev = check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
            _contexts[ordinal] = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        ctx = _contexts[ordinal]
    _make_current(ctx)
    return ctx


def _make_current(ctx):
    """Make ``ctx`` current on this thread (autograd runs backward on a thread of its own); returns
    the context it replaced (None: it was current already, or none was). One cuCtxGetCurrent when it
    is current already."""
    from codegen.cuda import check, driver

    err, current = driver.cuCtxGetCurrent()
    if not err and current == ctx:
        return None
    current = check((err, current), "cuCtxGetCurrent")
    if int(current) == int(ctx):
        return None
    check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return current if int(current) else None


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(index: int) -> int:
    """The handle of torch's current stream on device ``index``."""
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


class Kernels:
    """Where tuned kernels come from (a ``Bundle`` or ``StoreKernels``), the kernels compiled so
    far, and the fallbacks already reported.

    ``ours_everywhere`` (off by default): run a tuned kernel wherever one is found, also where its
    verdict says cuBLAS won (codegen.nn.verdict); off, such a GEMM runs torch's op, and the reason
    ("cuBLAS won (ratio r at margin m, timing t)") is logged once and reported by ``fallbacks`` and
    ``used``. A kernel never compared with cuBLAS (winner unknown: no baseline measured, a bundle from
    before verdicts, the families' seeds) runs, as it did before verdicts; the first is logged once,
    and ``unjudged`` lists them all.

    ``overlap_backward`` (off by default): a backward pass that runs both dX and dW on tuned kernels
    launches dW on a side stream of its own, so the two GEMMs share the GPU; off, they run one after
    the other on torch's current stream. Which is faster depends on the dtype and on eager calls or
    CUDA graphs (the streams' events cost the host): benchmarks/results/linear-NVIDIA_H200-*.json,
    the records with ``ours.backward``."""

    def __init__(self, source, *, overlap_backward: bool = False, ours_everywhere: bool = False) -> None:
        self.source = source
        self.overlap_backward = overlap_backward
        self.ours_everywhere = ours_everywhere
        self._side: dict[int, torch.cuda.Stream] = {}  # device index -> the backward's side stream
        self._compiled: dict[tuple[Problem, str], _Compiled | str] = {}
        self._gemms: dict[tuple, tuple[Problem, _Compiled] | None] = {}  # a call's GEMM -> its kernel (_gemm())
        self._plans: dict[tuple, bool] = {}  # a call's GEMMs -> whether any runs ours (_runs_ours())
        self._calls: dict[tuple, bool] = {}  # a layer call's key -> the same (Linear.forward)
        self._said: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.fallbacks: dict[tuple[str, str], str] = {}  # (problem key, device) -> reason, for inspection
        self.kept: set[tuple] = set()  # layers replace_linear left to torch (in, out, dtype, bias), said once
        self.unjudged: dict[tuple[str, str], str] = {}  # (problem key, device) -> why ours runs unjudged

    def __deepcopy__(self, memo) -> Kernels:  # a copied model shares the loaded kernels
        return self

    def __getstate__(self) -> dict:  # pickled (torch.save of a model): the settings only, kernels load anew
        return {"source": self.source, "overlap_backward": self.overlap_backward,
                "ours_everywhere": self.ours_everywhere}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["source"], overlap_backward=state.get("overlap_backward", False),
                      ours_everywhere=state.get("ours_everywhere", False))

    def side_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The stream a backward pass launches dW on, one per device, made once (a captured CUDA
        graph forks onto it and joins back)."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        stream = self._side.get(index)
        if stream is None:
            with self._lock:
                stream = self._side.setdefault(index, torch.cuda.Stream(device=index))
        return stream

    def kernel(self, problem: Problem, device: torch.device) -> _Compiled | None:
        """The compiled kernel for ``problem`` on ``device``, or None (a fallback, reported once)."""
        where = str(device)
        key = (problem, where)
        got = self._compiled.get(key)
        if got is None:
            with self._lock:
                got = self._compiled.get(key)
                if got is None:
                    got = self._compiled[key] = self._load(problem, device)
        if isinstance(got, str):
            self._fallback(problem, where, got)
            return None
        return got

    def _load(self, problem: Problem, device: torch.device) -> _Compiled | str:
        if device.type != "cuda":
            return f"the tensors are on {device.type}; gemmscape kernels run on CUDA GPUs"
        if self.source is None:
            return "no bundle or store was given"
        name = torch.cuda.get_device_name(device)
        found = self.source.find(problem, name)
        if isinstance(found, str):
            return found
        if not self.ours_everywhere:
            verdict = getattr(found, "verdict", None)
            if verdict is not None and verdict.winner == "cublas":
                return verdict.reason()
            if verdict is None or verdict.winner != "ours":
                self._unjudged(problem, str(device), verdict.note if verdict is not None and verdict.note
                               else f"{getattr(found, 'origin', 'its source')} holds no verdict")
        try:
            return _Compiled(found, problem, device)
        except _Unusable as e:
            return f"{found.manifest.get('name')} from {found.origin}: {e}"
        except Exception as e:  # a kernel that does not build or load here: say so, run torch's op
            return f"{found.manifest.get('name')} from {found.origin} cannot be built or loaded here: {type(e).__name__}: {e}"

    def used(self, problem: Problem, device: torch.device | str) -> str | None:
        """What ran ``problem`` on ``device`` so far: the kernel's name, "torch: <reason>", or None
        (not asked yet). A bare ``cuda`` means the current CUDA device, as a tensor made there says."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        got = self._compiled.get((problem, str(device)))
        if got is None:
            return None
        return f"torch: {got}" if isinstance(got, str) else got.manifest["name"]

    def _unjudged(self, problem: Problem, device: str, why: str) -> None:
        """Ours runs ``problem`` with no verdict against cuBLAS: listed, and the first one logged."""
        first = not self.unjudged
        self.unjudged[(problem.key, device)] = why
        if first:
            log.warning("gemmscape: %s on %s runs gemmscape's kernel without a verdict against cuBLAS (%s); "
                        "so does any other such GEMM, said once (Kernels.unjudged lists them)", problem.key, device, why)

    def _fallback(self, problem: Problem, device: str, reason: str) -> None:
        self.fallback(problem.key, device, reason)

    def fallback(self, what: str, device: str, reason: str) -> None:
        """Torch runs ``what`` (a problem's key, or a call no problem describes) on ``device``: said once
        in the log, kept in ``fallbacks``."""
        key = (what, device)
        with self._lock:
            if key in self._said:
                return
            self._said.add(key)
            self.fallbacks[key] = reason
        log.warning("gemmscape: %s on %s runs torch's op instead: %s", what, device, reason)


def kernels_from(source, *, ours_everywhere: bool | None = None) -> Kernels:
    """A ``Kernels`` from a bundle folder (or its index.json), a ``Bundle``, a store, a store URL
    (``sqlite:///...``), a ``SeedKernels`` (untuned built-in seeds), anything with that ``find``,
    or a ``Kernels`` (returned as is, unless ``ours_everywhere`` is given and differs from its own:
    then a new one over the same source). ``ours_everywhere`` (default False): see ``Kernels``."""
    if isinstance(source, Kernels):
        if ours_everywhere is None or bool(ours_everywhere) == source.ours_everywhere:
            return source
        return Kernels(source.source, overlap_backward=source.overlap_backward, ours_everywhere=bool(ours_everywhere))
    everywhere = bool(ours_everywhere)
    if source is None:
        return Kernels(None, ours_everywhere=everywhere)
    if isinstance(source, Bundle | StoreKernels | SeedKernels):
        return Kernels(source, ours_everywhere=everywhere)
    if isinstance(source, str) and "://" in source:
        from store import Store

        return Kernels(StoreKernels(Store(source, read_only=True)), ours_everywhere=everywhere)
    if isinstance(source, str | Path):
        return Kernels(Bundle(source), ours_everywhere=everywhere)
    if hasattr(source, "best") and hasattr(source, "kernel_record"):
        return Kernels(StoreKernels(source), ours_everywhere=everywhere)
    if callable(getattr(source, "find", None)):
        return Kernels(source, ours_everywhere=everywhere)
    raise TypeError(f"kernels come from a bundle folder, a Bundle, a store or a store URL, not {type(source).__name__}")


# ---- the GEMMs, each a tuned kernel or torch's op ------------------------------------------------
def _ready(t: torch.Tensor) -> torch.Tensor:
    """Contiguous and 16-byte aligned, as the kernels read rows."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _problems(kernels: Kernels, m: int, k: int, n: int, dtype: torch.dtype, weight_dtype: torch.dtype,
              device: torch.device, bias: bool, layout: Layout) -> dict[Layout, Problem] | None:
    """The three GEMMs of a layer [k -> n] at m rows, x of ``dtype`` and weight of ``weight_dtype``; None
    (a fallback, reported once) where gemmscape has no kernels of this kind at all."""
    ours = DTYPES.get(dtype)
    why = None
    if ours is None or weight_dtype != dtype:
        what = f"{dtype}" if weight_dtype == dtype else f"{dtype} with {weight_dtype}"
        why = f"gemmscape has no {what} kernels"
    elif 0 in (m, n, k):
        why = "an empty GEMM"
    if why is None:
        return linear_problems(m, k, n, ours, bias)
    key = (f"{m}x{n}x{k}_{str(dtype).removeprefix('torch.')}_{layout.value}", str(device))
    with kernels._lock:
        if key in kernels._said:
            return None
        kernels._said.add(key)
        kernels.fallbacks[key] = why
    log.warning("gemmscape: %s on %s runs torch's op instead: %s", key[0], key[1], why)
    return None


_UNSEEN = object()


def _gemm(kernels: Kernels, layout: Layout, batch: int, in_features: int, out_features: int, dtype: torch.dtype,
         weight_dtype: torch.dtype, device: torch.device, bias: bool) -> tuple[Problem, _Compiled] | None:
    """The ``layout`` GEMM of a layer [in_features -> out_features] at ``batch`` rows: its problem and
    compiled kernel, or None (torch's op runs; the reason is logged once). Resolved once per shape,
    dtypes, bias and device, then read from a dict."""
    key = (layout, batch, in_features, out_features, dtype, weight_dtype, bias, device)
    got = kernels._gemms.get(key, _UNSEEN)
    if got is _UNSEEN:
        got = None
        problems = _problems(kernels, batch, in_features, out_features, dtype, weight_dtype, device, bias, layout)
        if problems is not None:
            compiled = kernels.kernel(problems[layout], device)
            got = (problems[layout], compiled) if compiled is not None else None
        kernels._gemms[key] = got
    return got


def _runs_ours(kernels: Kernels, batch: int, in_features: int, out_features: int, dtype: torch.dtype,
               weight_dtype: torch.dtype, device: torch.device, bias: bool, grad: bool) -> bool:
    """Whether a call runs any GEMM on ours: the forward's, and with ``grad`` the backward's too
    (each resolved by ``_gemm``, so fallbacks are reported as always). False: the layer calls
    F.linear itself, as nn.Linear does. Resolved once per call shape, then read from a dict."""
    key = (grad, batch, in_features, out_features, dtype, weight_dtype, bias, device)
    got = kernels._plans.get(key)
    if got is None:
        layouts = (Layout.forward, Layout.grad_input, Layout.grad_weight) if grad else (Layout.forward,)
        got = any([_gemm(kernels, layout, batch, in_features, out_features, dtype, weight_dtype, device, bias)
                   is not None for layout in layouts])  # a list: every GEMM resolved, each fallback said
        kernels._plans[key] = got
    return got


def linear_forward(kernels: Kernels, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Y = x·weightᵀ (+ bias) for a 2-D x."""
    found = _gemm(kernels, Layout.forward, x.shape[0], weight.shape[1], weight.shape[0], x.dtype, weight.dtype,
                 x.device, bias is not None)
    if found is None or x.shape[1] != weight.shape[1]:
        return F.linear(x, weight, bias)
    problem, k = found
    x, weight = _ready(x), _ready(weight)
    bias = _ready(bias) if bias is not None else None
    y = torch.empty((problem.m, problem.n), dtype=x.dtype, device=x.device)
    k({"y": y, "x": x, "weight": weight, "bias": bias})
    return y


def linear_grad_input(kernels: Kernels, grad_y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """dX = dY·weight."""
    found = _gemm(kernels, Layout.grad_input, grad_y.shape[0], weight.shape[1], weight.shape[0], grad_y.dtype,
                 weight.dtype, grad_y.device, False)
    if found is None or grad_y.shape[1] != weight.shape[0]:
        return grad_y @ weight
    problem, k = found
    grad_y, weight = _ready(grad_y), _ready(weight)
    grad_x = torch.empty((problem.m, problem.n), dtype=grad_y.dtype, device=grad_y.device)
    k({"grad_x": grad_x, "grad_y": grad_y, "weight": weight})
    return grad_x


def linear_grad_weight(kernels: Kernels, grad_y: torch.Tensor, x: torch.Tensor, bias: bool,
                       stream: torch.cuda.Stream | None = None):
    """dW = dYᵀ·x, and db = Σ_batch dY when the layer has a bias: (dW, db, held). With ``stream``
    a tuned kernel runs there, after it waits for the current stream, and ``held`` lists what the
    caller keeps alive until the current stream has waited for ``stream`` (every tensor it reads
    or writes; all come from the current stream's pool); else ``held`` is None (torch's op ran, on the current
    stream)."""
    found = _gemm(kernels, Layout.grad_weight, grad_y.shape[0], x.shape[1], grad_y.shape[1], grad_y.dtype, x.dtype,
                 grad_y.device, bias)
    if found is None or grad_y.shape[0] != x.shape[0]:
        return grad_y.t() @ x, (grad_y.sum(0) if bias else None), None
    problem, k = found
    grad_y, x = _ready(grad_y), _ready(x)
    grad_w = torch.empty((problem.m, problem.n), dtype=x.dtype, device=x.device)
    writes_db = bias and not k.arg_names.isdisjoint(("B", "DB"))
    grad_b = torch.empty((problem.m,), dtype=x.dtype, device=x.device) if writes_db else None
    ws = k({"grad_weight": grad_w, "grad_y": grad_y, "x": x, "grad_bias": grad_b}, stream)
    held = (grad_y, x, ws) if stream is not None else None
    if bias and grad_b is None:  # the kernel computes dW only: db from torch, on the current stream
        grad_b = grad_y.sum(0)
    return grad_w, grad_b, held


class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, kernels):
        ctx.kernels, ctx.has_bias = kernels, bias is not None
        ctx.save_for_backward(x, weight)
        return linear_forward(kernels, x, weight, bias)

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x = grad_w = grad_b = None
        grad_y = grad_y.contiguous()
        kernels = ctx.kernels
        need_dw = need_w or (need_b and ctx.has_bias)
        # Both GEMMs to run: dW on the side stream (when a tuned kernel runs it), dX meanwhile here,
        # then this stream waits for dW; until then ``held`` keeps what dW uses out of the allocator.
        side = kernels.side_stream(grad_y.device) if need_x and need_dw and grad_y.is_cuda and kernels.overlap_backward \
            else None
        held = None
        # On one stream dX goes first, right after the forward: after dW its kernel shared DRAM with
        # the write-back of dW's output and ran slower than alone, and so did the step (profiled:
        # benchmarks/NOTES.md, "2026-12-02 (seventh session)" and the eighth session's device notes).
        if need_x and side is None:
            grad_x = linear_grad_input(kernels, grad_y, weight)
        if need_dw:
            grad_w, grad_b, held = linear_grad_weight(kernels, grad_y, x, ctx.has_bias, side)
        if need_x and side is not None:
            grad_x = linear_grad_input(kernels, grad_y, weight)
        if held is not None:
            torch.cuda.current_stream(grad_y.device).wait_stream(side)
            del held
        return grad_x, grad_w if need_w else None, grad_b if need_b else None, None


class Linear(nn.Linear):
    """``nn.Linear`` on gemmscape's tuned kernels (``kernels``: a bundle folder, a store, a store
    URL or a ``Kernels``; ``ours_everywhere``: see ``Kernels``). Same parameters, state dict and
    initialisation as ``nn.Linear``. A call none of whose GEMMs runs ours (cuBLAS won, or no kernel)
    is ``F.linear`` itself, with no autograd Function of ours: it runs exactly as nn.Linear does."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 kernels=None, ours_everywhere: bool | None = None) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.kernels = kernels_from(kernels, ours_everywhere=ours_everywhere)

    @classmethod
    def from_linear(cls, layer: nn.Linear, kernels, *, ours_everywhere: bool | None = None) -> Linear:
        """A gemmscape Linear sharing ``layer``'s parameters (an optimizer holding them still works)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = layer.in_features, layer.out_features
        new.weight = layer.weight
        new.bias = layer.bias
        new.kernels = kernels_from(kernels, ours_everywhere=ours_everywhere)
        new.train(layer.training)
        return new

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x, weight, bias = input, self.weight, self.bias
        kind = "cuda" if x.is_cuda else x.device.type
        autocast = torch.is_autocast_enabled(kind)
        dtype = torch.get_autocast_dtype(kind) if autocast else x.dtype
        grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                            or (bias is not None and bias.requires_grad))
        # Whether this call runs any GEMM on ours, read from a dict keyed by what decides it (cheap: the
        # all-torch path below must cost what nn.Linear's call costs), resolved once per key.
        key = (x.shape, dtype, weight.shape, weight.dtype, x.get_device(), autocast, grad, bias is None)
        ours = self.kernels._calls.get(key)
        if ours is None:
            ours = self.kernels._calls[key] = x.dim() > 0 and x.shape[-1] == self.in_features and _runs_ours(
                self.kernels, x.numel() // self.in_features, self.in_features, self.out_features, dtype,
                dtype if autocast else weight.dtype, x.device, bias is not None, grad)
        if not ours:
            return F.linear(x, weight, bias)  # all on torch: nn.Linear's own call (autocast and all)
        if autocast:  # our GEMMs in the autocast dtype, then autocast off
            x, weight = x.to(dtype), weight.to(dtype)
            bias = bias.to(dtype) if bias is not None else None
            with torch.autocast(kind, enabled=False):
                return self._run(x, weight, bias)
        return self._run(x, weight, bias)

    def _run(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        flat = x.dim() == 2
        x2 = x if flat else x.reshape(-1, self.in_features)
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad)):
            y = _LinearFunction.apply(x2, weight, bias, self.kernels)
        else:  # nothing to differentiate: the forward GEMM without autograd's bookkeeping
            y = linear_forward(self.kernels, x2, weight, bias)
        return y if flat else y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        where = getattr(self.kernels.source, "location", None) or "none"
        return f"{super().extra_repr()}, kernels={where}"


def replace_linear(model: nn.Module, kernels, *, ours_everywhere: bool | None = None) -> nn.Module:
    """Swap every ``nn.Linear`` in ``model`` (in place) for a gemmscape ``Linear`` sharing its
    parameters, all with one ``Kernels`` from ``kernels`` (see ``kernels_from``; ``ours_everywhere``:
    see ``Kernels``). A layer for which a bundle holds GEMMs and cuBLAS won every one of them stays
    torch's ``nn.Linear`` (said once in the log), unless ``ours_everywhere``. A block-sparse layer
    (``codegen.nn.sparse.BlockSparseLinear``, e.g. of a pruned model) runs on the same kernels from
    then on, and so does a 2:4 layer (``codegen.nn.semisparse.Sparse24Linear``). Returns ``model``; a
    model that is itself an ``nn.Linear`` comes back as a new ``Linear``."""
    from codegen.nn.semisparse import Sparse24Linear
    from codegen.nn.sparse import BlockSparseLinear

    shared = kernels_from(kernels, ours_everywhere=ours_everywhere)
    if isinstance(model, nn.Linear) and not isinstance(model, Linear):
        return Linear.from_linear(model, shared)
    if isinstance(model, BlockSparseLinear | Sparse24Linear):
        return model.use_kernels(shared)
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and not isinstance(child, Linear):
            if not _cublas_won_all(shared, child):
                setattr(model, name, Linear.from_linear(child, shared))
        else:
            replace_linear(child, shared)
    return model


def _cublas_won_all(kernels: Kernels, layer: nn.Linear) -> bool:
    """Whether ``layer`` is best left to torch: the bundle says cuBLAS won each of its GEMMs."""
    source = kernels.source
    dtype = DTYPES.get(layer.weight.dtype)
    if kernels.ours_everywhere or not isinstance(source, Bundle) or dtype is None:
        return False
    bias = layer.bias is not None
    if not source.cublas_won_all(layer.in_features, layer.out_features, dtype.value, bias):
        return False
    said = (layer.in_features, layer.out_features, dtype.value, bias)
    if said not in kernels.kept:
        kernels.kept.add(said)
        log.warning("gemmscape: nn.Linear(%d, %d, %s%s) stays torch's: cuBLAS won every GEMM %s holds for it",
                    layer.in_features, layer.out_features, dtype.value, ", bias" if bias else "", source.location)
    return True
