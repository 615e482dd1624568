"""A linear layer whose W is 2:4 structured-sparse, on gemmscape's sparse24 kernels (the ``torch`` extra).

``Sparse24Linear`` keeps W [out, in] as its kept halves (codegen.sparse24): the parameter ``values``
[out, KP/2] holds the two kept values of each group of four along K (in order of K; KP is K padded
with zeros to whole 32 columns), and the buffer ``metadata`` (int32 [ceil(out/16), KP/32, 16], the
bits of ``codegen.sparse24.metadata_m16n8k32``) says where each lies; the state dict carries both,
with W's shape in the layer's extra state (checked when loaded). Which positions are kept is fixed
when the layer is made (``from_linear`` prunes by magnitude, two of every four); training changes
the kept values only, so the pruned weights stay zero by construction.

The forward Y = X·Wᵀ (+ b) runs gemmscape's ``sparse24`` kernel (``mma.sp``) for the problem's
shape with ``sparsity="2:4"``, looked up as for ``codegen.nn.Linear`` (``kernels``: a bundle folder,
a store or its URL, a ``SeedKernels``, a ``Kernels``) and launched with WC = ``values`` and WE =
``metadata``. Where there is no kernel (a CPU tensor, fp32 or another dtype, no kernel for the
problem, a verdict that says dense cuBLAS won, unless the ``Kernels`` run ours everywhere) torch
computes X·W_maskedᵀ from the dense W scattered from the kept halves, and the reason is logged once
per problem and device (logger ``gemmscape.nn``). Where the verdict said dense cuBLAS won an
inference forward (no autograd), the dense W is kept between calls while the values do not change,
so the layer runs as fast as the dense one would (with its memory).

The backward runs on torch: dX = dY·W on the dense masked W (cuBLAS; Wᵀ is not 2:4 along its own K,
so the sparse kernel cannot take it), and the gradient of ``values`` is dYᵀ·X gathered at the kept
positions (dense cuBLAS, then a gather): the pruned positions get no gradient. db = Σ dY. Nothing
waits on the host, so a captured CUDA graph replays the layer (call it once before capturing:
kernels compile on first use).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from codegen import sparse24
from codegen.nn.compressed import CompressedLinear
from codegen.nn.layer import DTYPES, _Compiled, _ready, kernels_from
from codegen.problem import Layout, Problem

__all__ = ["Sparse24Linear", "magnitude_positions"]

log = logging.getLogger("gemmscape.nn")

#: The sparsity the layer's problems name (codegen.problem.Problem.sparsity).
SPARSITY = "2:4"


def _metadata_shape(out_features: int, in_features: int) -> tuple[int, int, int]:
    kp = sparse24.padded_k(in_features)
    return (-(-out_features // sparse24.M16N8K32_ROWS), kp // sparse24.K_ALIGN, sparse24.M16N8K32_ROWS)


def _columns(positions: np.ndarray) -> np.ndarray:
    """The dense column of each kept value [out, KP/2] from its position in its group (int64)."""
    half = positions.shape[1]
    return (np.arange(half) // sparse24.KEEP * sparse24.GROUP)[None, :] + positions.astype(np.int64)


class _Sparse24Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, values, bias, layer):
        ctx.layer, ctx.has_bias = layer, bias is not None
        ctx.save_for_backward(x, values)
        return layer._forward(x, values, bias)

    @staticmethod
    def backward(ctx, grad_y):
        x, values = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        layer = ctx.layer
        grad_y = grad_y.contiguous()
        grad_x = grad_y @ layer._dense(values) if need_x else None
        grad_w = layer._gather(grad_y.t() @ x) if need_w else None
        grad_b = grad_y.sum(0) if need_b and ctx.has_bias else None
        return grad_x, grad_w, grad_b, None


class Sparse24Linear(CompressedLinear):
    """``nn.Linear`` with W [out_features, in_features] 2:4 sparse along in_features: ``values`` [out,
    KP/2] are the kept halves (the parameter), ``metadata`` their positions as the sparse kernels read
    them. A new layer keeps positions 0 and 1 of every group (``from_linear`` and ``from_dense`` choose
    by magnitude). ``kernels`` as for ``codegen.nn.Linear``; without one the forward runs torch."""

    STORED = "values"
    FUNCTION = _Sparse24Function

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 kernels=None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        kp = sparse24.padded_k(in_features)
        kw = {"device": device, "dtype": dtype}
        self.values = nn.Parameter(torch.empty((out_features, kp // 2), **kw))
        self.bias = nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        positions = np.tile(np.arange(sparse24.KEEP, dtype=np.uint8), (out_features, kp // sparse24.GROUP))
        self.register_buffer("metadata", self._words(positions, device))
        self._derive(positions)
        self.kernels = kernels_from(kernels)
        self.reset_parameters()

    # ---- the pattern ----------------------------------------------------------------------------------
    def _words(self, positions: np.ndarray, device) -> torch.Tensor:
        c = sparse24.Compressed(np.zeros(positions.shape, dtype=np.float32), positions, self.in_features)
        words = sparse24.metadata_m16n8k32(c).view(np.int32)
        return torch.as_tensor(np.ascontiguousarray(words), device=device)

    def _derive(self, positions: np.ndarray) -> None:
        """What the torch GEMMs need of the pattern (left out of the state dict): each kept value's
        dense column."""
        device = self.metadata.device
        self.register_buffer("columns", torch.as_tensor(_columns(positions), device=device), persistent=False)
        self._new_caches()

    def positions(self) -> np.ndarray:
        """Each kept value's place in its group of four (uint8 [out, KP/2], read from ``metadata``)."""
        words = self.metadata.detach().cpu().numpy().view(np.uint32)
        return sparse24.positions_from_m16n8k32(words, self.out_features)

    def mask(self) -> torch.Tensor:
        """W's kept positions (bool [out, in]): at most two of every group of four along in_features."""
        kp = sparse24.padded_k(self.in_features)
        m = torch.zeros((self.out_features, kp), dtype=torch.bool, device=self.columns.device)
        return m.scatter(1, self.columns, True)[:, : self.in_features]

    def get_extra_state(self) -> dict:
        return {"sparsity": SPARSITY, "shape": [self.out_features, self.in_features]}

    def set_extra_state(self, state: dict) -> None:
        """Loaded after ``values`` and ``metadata``: the state must be of this layer's shape, and its
        metadata a valid pattern (two distinct ascending positions per group)."""
        shape = [self.out_features, self.in_features]
        if state.get("sparsity") != SPARSITY or list(state.get("shape", ())) != shape:
            raise ValueError(f"the state dict is of a {state.get('sparsity')} W of shape {state.get('shape')}; this "
                             f"layer's W is {SPARSITY} of shape {shape} (out x in)")
        if tuple(self.metadata.shape) != _metadata_shape(*shape):
            raise ValueError(f"the metadata is {tuple(self.metadata.shape)}, not {_metadata_shape(*shape)} for W {shape}")
        positions = self.positions()
        if np.any(positions[:, 0::2] >= positions[:, 1::2]):
            raise ValueError("the metadata does not hold two distinct ascending positions in every group of four")
        self._derive(positions)

    def reset_parameters(self) -> None:
        """As ``nn.Linear`` for the kept values: uniform in ±1/sqrt(in_features); K's padding zero."""
        bound = 1.0 / self.in_features ** 0.5
        with torch.no_grad():
            self.values.uniform_(-bound, bound)
            self.values.copy_(self._gather(self._dense(self.values)))
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    # ---- conversions ----------------------------------------------------------------------------------
    @classmethod
    def from_linear(cls, layer: nn.Linear, *, kernels=None) -> Sparse24Linear:
        """``layer`` pruned to 2:4 by magnitude (codegen.sparse24.mask24: the two of each group of four
        along in_features of largest |w|), with their values; the bias shared."""
        w = layer.weight
        if w.is_meta:
            raise ValueError("the layer's weight is on the meta device: it has no values to prune")
        return cls.from_dense(w.detach(), layer.bias, mask=None, kernels=kernels)

    @classmethod
    def from_dense(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, *, mask=None,
                   kernels=None) -> Sparse24Linear:
        """A layer of W = ``weight`` [out, in] at ``mask`` (bool, W's shape, at most two of each group
        of four), by default W's 2:4 magnitude mask; ``bias`` (a Parameter is shared, a tensor
        copied, None for none)."""
        w = weight.detach()
        out, fin = w.shape
        if mask is None:  # on w's device: the magnitude mask's positions (codegen.sparse24.mask24, ties low)
            positions, weights = magnitude_positions(w), None
        else:
            host = w.float().cpu().numpy()
            mask = np.asarray(torch.as_tensor(mask).cpu(), dtype=bool)
            positions = sparse24.compress(host, mask).positions
            weights = torch.as_tensor(_kept(positions, mask, fin), device=w.device, dtype=w.dtype)
        new = cls(fin, out, bias is not None, device=w.device, dtype=w.dtype, kernels=kernels)
        new.metadata.copy_(new._words(positions, w.device))
        new._derive(positions)
        with torch.no_grad():
            kept = new._gather(w)
            new.values.copy_(kept if weights is None else kept * weights)
            if isinstance(bias, nn.Parameter):
                new.bias = bias
            elif bias is not None:
                new.bias.copy_(bias)
        return new

    @property
    def density(self) -> float:
        return sparse24.KEEP / sparse24.GROUP

    # ---- running --------------------------------------------------------------------------------------
    def problem(self, batch: int, dtype, bias: bool | None = None) -> Problem:
        """The forward GEMM of this layer at ``batch`` rows of ``dtype`` (a gemmscape DType or its
        name): what its kernel is looked up by (``codegen tune-model`` tunes it with the model's other layers,
        ``codegen search --sparsity 2:4`` alone)."""
        bias = self.bias is not None if bias is None else bias
        return Problem(batch, self.out_features, self.in_features, dtype, Layout.forward, bias, sparsity=SPARSITY,
                       density=self.density)

    def _gemm(self, batch: int, dtype: torch.dtype, weight_dtype: torch.dtype, device: torch.device,
              bias: bool) -> tuple[Problem, _Compiled] | None:
        key = (batch, dtype, weight_dtype, device, bias)
        if key in self._gemms:
            return self._gemms[key]
        got = None
        if dtype not in DTYPES or DTYPES[dtype].value not in ("bf16", "fp16") or weight_dtype != dtype or batch == 0:
            why = "an empty GEMM" if batch == 0 else f"gemmscape has no 2:4 {dtype} kernels with {weight_dtype} values"
            self.kernels.fallback(f"the 2:4 forward {batch}x{self.out_features}x{self.in_features}, {dtype}", str(device), why)
        else:
            problem = self.problem(batch, DTYPES[dtype], bias)
            compiled = self.kernels.kernel(problem, device)
            got = (problem, compiled) if compiled is not None else None
            if got is None and (self.kernels.used(problem, device) or "").startswith("torch: cuBLAS won"):
                self._cublas_won[key] = True
        self._gemms[key] = got
        return got

    def _forward(self, x: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None,
                 inference: bool = False) -> torch.Tensor:
        key = (x.shape[0], x.dtype, values.dtype, x.device, bias is not None)
        found = self._gemm(*key)
        if found is None or x.shape[1] != self.in_features:
            keep = inference and key in self._cublas_won
            return F.linear(x, self._kept_dense(values) if keep else self._dense(values), bias)
        problem, k = found
        y = torch.empty((problem.m, problem.n), dtype=x.dtype, device=x.device)
        k({"y": y, "x": _ready(x), "values": _ready(values), "bias": _ready(bias) if bias is not None else None,
           "metadata": self.metadata})
        return y

    def _dense(self, values: torch.Tensor) -> torch.Tensor:
        """W [out, in] from kept halves ``values`` (zeros elsewhere; differentiable in ``values``)."""
        kp = 2 * values.shape[1]
        return values.new_zeros((self.out_features, kp)).scatter(1, self.columns, values)[:, : self.in_features]

    def _gather(self, dense: torch.Tensor) -> torch.Tensor:
        """The kept halves of a dense [out, in] array (K's padding zero)."""
        kp = 2 * self.values.shape[1]
        return F.pad(dense, (0, kp - dense.shape[1])).gather(1, self.columns)

    def extra_repr(self) -> str:
        where = getattr(self.kernels.source, "location", None) or "none"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"sparsity={SPARSITY}, kernels={where}")


def magnitude_positions(w: torch.Tensor) -> np.ndarray:
    """The positions (uint8 [out, KP/2], ascending in each group) of the 2:4 magnitude mask of W
    [out, in] (``codegen.sparse24.mask24``: in each group of four along in, the two of largest |w|,
    equal magnitudes to the lower position, K's padding as zeros), ranked on W's own device."""
    if not bool(torch.isfinite(w).all()):
        raise ValueError("W has NaN or infinite values: its groups of four cannot be ranked by magnitude")
    out, fin = w.shape
    kp = sparse24.padded_k(fin)
    mags = F.pad(w.detach().abs().to(torch.float64 if w.dtype == torch.float64 else torch.float32), (0, kp - fin))
    order = torch.sort(-mags.reshape(out, kp // sparse24.GROUP, sparse24.GROUP), dim=2, stable=True).indices
    chosen = order[:, :, : sparse24.KEEP].sort(dim=2).values
    return chosen.reshape(out, kp // 2).to(torch.uint8).cpu().numpy()


def _kept(positions: np.ndarray, mask: np.ndarray, k: int) -> np.ndarray:
    """1 where a kept half is in ``mask`` (a position the mask keeps), 0 where it only fills its
    group (a group the mask keeps fewer than two of, or K's padding)."""
    n, half = positions.shape
    cols = _columns(positions)
    padded = np.zeros((n, 2 * half), dtype=bool)
    padded[:, :k] = mask
    return np.take_along_axis(padded, cols, axis=1).astype(np.float32)
