"""gemmscape's tuned kernels as a PyTorch layer (the optional ``torch`` extra).

``Linear`` is an ``nn.Linear`` whose forward and backward run the kernels tuned for its shape:
the forward GEMM Y = X·Wᵀ (+ b), and in backward dX = dY·W (layout grad_input) and dW = dYᵀ·X
with db = Σ dY (layout grad_weight). Each is looked up by shape, dtype, layout and device in a
bundle (``codegen export --bundle``) or a store, compiled once with NVRTC, loaded with the driver
API and launched on torch's current stream; workspace comes from torch's allocator and an output
that must start at zero is zeroed on the stream. Nothing waits on the host, so a captured CUDA
graph replays it. A GEMM with no tuned kernel runs torch's own op instead, and the reason is
logged once per problem and device (logger ``gemmscape.nn``).

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

from codegen.bundle import Bundle, KernelFile, SeedKernels, StoreKernels
from codegen.launch import launched_grid
from codegen.problem import DType, Layout, Problem, linear_problems

__all__ = ["Kernels", "Linear", "kernels_from", "replace_linear"]

log = logging.getLogger("gemmscape.nn")

DTYPES = {torch.float32: DType.fp32, torch.float16: DType.fp16, torch.bfloat16: DType.bf16}
POINTER_ARGS = ("Y", "X", "W", "B", "DX", "DY", "DW", "DB", "WS")
#: A kernel argument's array per layout (codegen.launch.LAYOUT_SLOTS names them) -> the tensor it is here.
OPERANDS = {
    Layout.forward: {"Y": "y", "X": "x", "W": "weight", "B": "bias"},
    Layout.grad_input: {"DX": "grad_x", "DY": "grad_y", "W": "weight"},
    Layout.grad_weight: {"DW": "grad_weight", "DY": "grad_y", "X": "x", "DB": "grad_bias"},
}
#: The GEMM's own output per layout (zeroed first where the plan says so).
OUTPUT = {Layout.forward: "y", Layout.grad_input: "grad_x", Layout.grad_weight: "grad_weight"}


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
        self.maps: dict[tuple[str, int], object] = {}

    def __call__(self, tensors: dict[str, torch.Tensor | None]) -> None:
        """Launch the manifest's kernels on ``tensors`` (by role), on torch's current stream."""
        driver = self.cuda.driver
        p = self.problem
        out = tensors[OUTPUT[p.layout]]
        if self.zero_first:
            out.zero_()
        ws = torch.empty(self.workspace, dtype=torch.uint8, device=self.device) if self.workspace else None
        stream = driver.CUstream(torch.cuda.current_stream(self.device).cuda_stream)
        dims = {"M": p.m, "N": p.n, "K": p.k}
        previous = _make_current(self.ctx)
        try:
            self._launch(tensors, ws, stream, dims)
        finally:
            if previous is not None:  # the thread had another device's context current: give it back
                _make_current(previous)

    def _launch(self, tensors: dict, ws: torch.Tensor | None, stream, dims: dict) -> None:
        cuda, p = self.cuda, self.problem
        for step, func in zip(self.manifest["kernels"], self.functions, strict=True):
            args = []
            for arg in step["args"]:
                name = arg["name"]
                if "tensor_map" in arg:
                    enc = arg["tensor_map"]
                    base = self._pointer(enc["operand"], tensors, ws)
                    if base is None:
                        raise RuntimeError(f"{self.manifest['name']}: tensor map {name} views {enc['operand']}, "
                                           f"which this call does not have")
                    key = (name, base)
                    if key not in self.maps:
                        if len(self.maps) > 64:
                            self.maps.clear()
                        self.maps[key] = cuda.encode_tensor_map(enc, base)
                    args.append(self.maps[key])
                elif name in dims:
                    args.append(ctypes.c_int(dims[name]))
                elif name in POINTER_ARGS:
                    args.append(ctypes.c_void_p(self._pointer(name, tensors, ws)))
                else:
                    raise RuntimeError(f"{self.manifest['name']}: kernel argument {name!r} is not one codegen.nn "
                                       f"knows for the {p.layout.value} layout")
            cluster = tuple(step.get("cluster", (1, 1, 1)))
            grid = launched_grid(step["grid_for_problem"], bool(step.get("persistent")), cluster, self.sms)
            cuda.launch(func, grid, step["block"], step["dynamic_smem_bytes"], stream, args, cluster)

    def _pointer(self, name: str, tensors: dict, ws: torch.Tensor | None) -> int | None:
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
    the context it replaced (None: it was current already, or none was)."""
    from codegen.cuda import check, driver

    current = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(current) == int(ctx):
        return None
    check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return current if int(current) else None


class Kernels:
    """Where tuned kernels come from (a ``Bundle`` or ``StoreKernels``), the kernels compiled so
    far, and the fallbacks already reported."""

    def __init__(self, source) -> None:
        self.source = source
        self._compiled: dict[tuple[Problem, str], _Compiled | str] = {}
        self._said: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.fallbacks: dict[tuple[str, str], str] = {}  # (problem key, device) -> reason, for inspection

    def __deepcopy__(self, memo) -> Kernels:  # a copied model shares the loaded kernels
        return self

    def __getstate__(self) -> dict:  # pickled (torch.save of a model): the source only, kernels load anew
        return {"source": self.source}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["source"])

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
        try:
            return _Compiled(found, problem, device)
        except _Unusable as e:
            return f"{found.manifest.get('name')} from {found.origin}: {e}"
        except Exception as e:  # a kernel that does not build or load here: say so, run torch's op
            return f"{found.manifest.get('name')} from {found.origin} cannot be built or loaded here: {type(e).__name__}: {e}"

    def used(self, problem: Problem, device: torch.device | str) -> str | None:
        """What ran ``problem`` on ``device`` so far: the kernel's name, "torch: <reason>", or None
        (not asked yet)."""
        got = self._compiled.get((problem, str(device)))
        if got is None:
            return None
        return f"torch: {got}" if isinstance(got, str) else got.manifest["name"]

    def _fallback(self, problem: Problem, device: str, reason: str) -> None:
        key = (problem.key, device)
        if key not in self._said:
            self._said.add(key)
            self.fallbacks[key] = reason
            log.warning("gemmscape: %s on %s runs torch's op instead: %s", problem.key, device, reason)


def kernels_from(source) -> Kernels:
    """A ``Kernels`` from a bundle folder (or its index.json), a ``Bundle``, a store, a store URL
    (``sqlite:///...``), a ``SeedKernels`` (untuned built-in seeds), anything with that ``find``,
    or a ``Kernels`` (returned as is)."""
    if isinstance(source, Kernels):
        return source
    if source is None:
        return Kernels(None)
    if isinstance(source, Bundle | StoreKernels | SeedKernels):
        return Kernels(source)
    if isinstance(source, str) and "://" in source:
        from store import Store

        return Kernels(StoreKernels(Store(source, read_only=True)))
    if isinstance(source, str | Path):
        return Kernels(Bundle(source))
    if hasattr(source, "best") and hasattr(source, "kernel_record"):
        return Kernels(StoreKernels(source))
    if callable(getattr(source, "find", None)):
        return Kernels(source)
    raise TypeError(f"kernels come from a bundle folder, a Bundle, a store or a store URL, not {type(source).__name__}")


# ---- the GEMMs, each a tuned kernel or torch's op ------------------------------------------------
def _ready(t: torch.Tensor) -> torch.Tensor:
    """Contiguous and 16-byte aligned, as the kernels read rows."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _problems(kernels: Kernels, x: torch.Tensor, weight: torch.Tensor, bias: bool,
              layout: Layout) -> dict[Layout, Problem] | None:
    """The layer's three GEMMs for 2-D ``x`` [batch, in] and ``weight`` [out, in]; None (a fallback,
    reported once) where gemmscape has no kernels of this kind at all."""
    dtype = DTYPES.get(x.dtype)
    why = None
    if dtype is None or weight.dtype != x.dtype:
        what = f"{x.dtype}" if weight.dtype == x.dtype else f"{x.dtype} with {weight.dtype}"
        why = f"gemmscape has no {what} kernels"
    elif 0 in (x.shape[0], weight.shape[0], weight.shape[1]):
        why = "an empty GEMM"
    if why is None:
        return linear_problems(x.shape[0], weight.shape[1], weight.shape[0], dtype, bias)
    key = (f"{x.shape[0]}x{weight.shape[0]}x{weight.shape[1]}_{str(x.dtype).removeprefix('torch.')}_{layout.value}",
           str(x.device))
    with kernels._lock:
        if key in kernels._said:
            return None
        kernels._said.add(key)
        kernels.fallbacks[key] = why
    log.warning("gemmscape: %s on %s runs torch's op instead: %s", key[0], key[1], why)
    return None


def linear_forward(kernels: Kernels, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Y = x·weightᵀ (+ bias) for a 2-D x."""
    problems = _problems(kernels, x, weight, bias is not None, Layout.forward)
    if problems is None:
        return F.linear(x, weight, bias)
    problem = problems[Layout.forward]
    k = kernels.kernel(problem, x.device)
    if k is None:
        return F.linear(x, weight, bias)
    x, weight = _ready(x), _ready(weight)
    bias = _ready(bias) if bias is not None else None
    y = torch.empty((problem.m, problem.n), dtype=x.dtype, device=x.device)
    k({"y": y, "x": x, "weight": weight, "bias": bias})
    return y


def linear_grad_input(kernels: Kernels, grad_y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """dX = dY·weight."""
    problems = _problems(kernels, grad_y, weight, False, Layout.grad_input)
    if problems is None:
        return grad_y @ weight
    problem = problems[Layout.grad_input]
    k = kernels.kernel(problem, grad_y.device)
    if k is None:
        return grad_y @ weight
    grad_y, weight = _ready(grad_y), _ready(weight)
    grad_x = torch.empty((problem.m, problem.n), dtype=grad_y.dtype, device=grad_y.device)
    k({"grad_x": grad_x, "grad_y": grad_y, "weight": weight})
    return grad_x


def linear_grad_weight(kernels: Kernels, grad_y: torch.Tensor, x: torch.Tensor,
                       bias: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """dW = dYᵀ·x, and db = Σ_batch dY when the layer has a bias."""
    weight_like = torch.empty((grad_y.shape[1], x.shape[1]), dtype=x.dtype, device="meta")  # the shape of dW

    def torch_op():
        return grad_y.t() @ x, (grad_y.sum(0) if bias else None)

    problems = _problems(kernels, grad_y, weight_like, bias, Layout.grad_weight)
    if problems is None:
        return torch_op()
    problem = problems[Layout.grad_weight]
    k = kernels.kernel(problem, grad_y.device)
    if k is None:
        return torch_op()
    grad_y, x = _ready(grad_y), _ready(x)
    grad_w = torch.empty((problem.m, problem.n), dtype=x.dtype, device=x.device)
    names = {a["name"] for step in k.manifest["kernels"] for a in step["args"]}
    writes_db = bias and bool(names & {"B", "DB"})
    grad_b = torch.empty((problem.m,), dtype=x.dtype, device=x.device) if writes_db else None
    k({"grad_weight": grad_w, "grad_y": grad_y, "x": x, "grad_bias": grad_b})
    if bias and grad_b is None:  # the kernel computes dW only: db from torch
        grad_b = grad_y.sum(0)
    return grad_w, grad_b


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
        if need_x:
            grad_x = linear_grad_input(ctx.kernels, grad_y, weight)
        if need_w or (need_b and ctx.has_bias):
            grad_w, grad_b = linear_grad_weight(ctx.kernels, grad_y, x, ctx.has_bias)
        return grad_x, grad_w if need_w else None, grad_b if need_b else None, None


class Linear(nn.Linear):
    """``nn.Linear`` on gemmscape's tuned kernels (``kernels``: a bundle folder, a store, a store
    URL or a ``Kernels``). Same parameters, state dict and initialisation as ``nn.Linear``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 kernels=None) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.kernels = kernels_from(kernels)

    @classmethod
    def from_linear(cls, layer: nn.Linear, kernels) -> Linear:
        """A gemmscape Linear sharing ``layer``'s parameters (an optimizer holding them still works)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = layer.in_features, layer.out_features
        new.weight = layer.weight
        new.bias = layer.bias
        new.kernels = kernels_from(kernels)
        new.train(layer.training)
        return new

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x, weight, bias = input, self.weight, self.bias
        kind = input.device.type
        if torch.is_autocast_enabled(kind):  # autocast: our GEMMs in the autocast dtype, then autocast off
            dtype = torch.get_autocast_dtype(kind)
            x, weight = x.to(dtype), weight.to(dtype)
            bias = bias.to(dtype) if bias is not None else None
            with torch.autocast(kind, enabled=False):
                return self._run(x, weight, bias)
        return self._run(x, weight, bias)

    def _run(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        lead = x.shape[:-1]
        y = _LinearFunction.apply(x.reshape(-1, self.in_features), weight, bias, self.kernels)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        where = getattr(self.kernels.source, "location", None) or "none"
        return f"{super().extra_repr()}, kernels={where}"


def replace_linear(model: nn.Module, kernels) -> nn.Module:
    """Swap every ``nn.Linear`` in ``model`` (in place) for a gemmscape ``Linear`` sharing its
    parameters, all with one ``Kernels`` from ``kernels`` (see ``kernels_from``). Returns ``model``;
    a model that is itself an ``nn.Linear`` comes back as a new ``Linear``."""
    shared = kernels_from(kernels)
    if isinstance(model, nn.Linear) and not isinstance(model, Linear):
        return Linear.from_linear(model, shared)
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and not isinstance(child, Linear):
            setattr(model, name, Linear.from_linear(child, shared))
        else:
            replace_linear(child, shared)
    return model
