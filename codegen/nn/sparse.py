"""A linear layer whose W is block-sparse, on gemmscape's kernels (the optional ``torch`` extra).

``BlockSparseLinear`` keeps W [out, in] as its BSR form (codegen.sparse): the parameter ``blocks``
[nnzb, block, block] holds the kept blocks, each row-major, in the pattern's order (the zero padding
of the last block row and column stays zero), the buffers ``indptr`` and ``indices`` (int32) say
where they lie, and the pattern's hash travels in the state dict too (its extra state, checked when
loaded). Its three GEMMs run gemmscape's block-sparse kernels: the forward Y = X·Wᵀ (+ b), dX = dY·W
(read as Wᵀ in BSR, whose blocks are the kept ones permuted and transposed on the fly) and dW = dYᵀ·X
sampled at the kept blocks, so the blocks that are not kept get no gradient and stay zero by
construction; db = Σ dY comes from the kernel where it writes it, else from torch. A GEMM with no
kernel (no tuned one for the problem, a CPU tensor, another dtype, a kernel whose verdict says dense
cuBLAS won, unless the ``Kernels`` run ours everywhere) runs torch instead, computing the
same thing from the blocks (a dense W scattered from them, dW gathered at them), and the reason is
logged once per problem and device (logger ``gemmscape.nn``). Where the verdict said dense cuBLAS
won an inference forward (no autograd), the dense W is kept between calls while the blocks do not
change, so the layer runs as fast as the dense one would (with its memory). Nothing waits on the host, so a
captured CUDA graph replays it (call the layer once before capturing: kernels compile on first use).

Kernels come as for ``codegen.nn.Linear`` (``kernels``: a bundle folder, a store or its URL, a
``SeedKernels``, a ``Kernels``); they are compiled and launched by ``codegen.nn.layer``'s machinery,
with the BSR arrays passed by name: forward W=blocks, RP=indptr, CI=indices; grad_input WT=the
blocks of Wᵀ, RP and CI of Wᵀ; grad_weight DW=the gradient of blocks, RP=indptr, CI=indices.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from codegen import sparse
from codegen.nn.compressed import CompressedLinear
from codegen.nn.layer import DTYPES, _Compiled, _ready, kernels_from
from codegen.problem import Layout, Problem

__all__ = ["BlockSparseLinear", "blocks_to_dense", "dense_to_blocks", "load_pruned"]

log = logging.getLogger("gemmscape.nn")

# ---- the GEMMs on torch, from the blocks ---------------------------------------------------------------
def blocks_to_dense(blocks: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, shape: tuple[int, int],
                    block: int) -> torch.Tensor:
    """W [out, in] with ``blocks`` at block rows ``rows`` and block columns ``cols``, zeros elsewhere
    (differentiable in ``blocks``)."""
    out, fin = shape
    br, bc = -(-out // block), -(-fin // block)
    grid = blocks.new_zeros((br, bc, block, block)).index_put((rows, cols), blocks)
    return grid.permute(0, 2, 1, 3).reshape(br * block, bc * block)[:out, :fin]


def dense_to_blocks(dense: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, block: int) -> torch.Tensor:
    """The blocks of a dense [out, in] array at block rows ``rows`` and columns ``cols`` (padding zero)."""
    out, fin = dense.shape
    br, bc = -(-out // block), -(-fin // block)
    padded = F.pad(dense, (0, bc * block - fin, 0, br * block - out))
    return padded.reshape(br, block, bc, block).permute(0, 2, 1, 3)[rows, cols]


class _BlockSparseFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, blocks, bias, layer):
        ctx.layer, ctx.has_bias = layer, bias is not None
        ctx.save_for_backward(x, blocks)
        return layer._forward(x, blocks, bias)

    @staticmethod
    def backward(ctx, grad_y):
        x, blocks = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_y = grad_y.contiguous()
        layer = ctx.layer
        grad_x = layer._grad_input(grad_y, blocks) if need_x else None
        grad_w = grad_b = None
        if need_w or (need_b and ctx.has_bias):
            grad_w, grad_b = layer._grad_weight(grad_y, x, ctx.has_bias)
        return grad_x, grad_w if need_w else None, grad_b if need_b else None, None


class BlockSparseLinear(CompressedLinear):
    """``nn.Linear`` with W [out_features, in_features] block-sparse on ``pattern`` (a
    codegen.sparse.Pattern of W's shape): only the kept blocks are parameters (``blocks``) and
    receive gradients. ``kernels`` as for ``codegen.nn.Linear``; without one every GEMM runs torch."""

    STORED = "blocks"
    FUNCTION = _BlockSparseFunction

    def __init__(self, in_features: int, out_features: int, pattern: sparse.Pattern, bias: bool = True, device=None,
                 dtype=None, *, kernels=None) -> None:
        super().__init__()
        if (pattern.n, pattern.k) != (out_features, in_features):
            raise ValueError(f"the pattern is of a {pattern.n}x{pattern.k} W; the layer's W is "
                             f"{out_features}x{in_features} (out x in)")
        self.in_features, self.out_features, self.block = in_features, out_features, pattern.block
        kw = {"device": device, "dtype": dtype}
        self.blocks = nn.Parameter(torch.empty((pattern.nnzb, pattern.block, pattern.block), **kw))
        self.bias = nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        self.register_buffer("indptr", torch.as_tensor(pattern.indptr, device=device))
        self.register_buffer("indices", torch.as_tensor(pattern.indices, device=device))
        self._derive(pattern)
        self.kernels = kernels_from(kernels)
        self.reset_parameters()

    # ---- the pattern ----------------------------------------------------------------------------------
    def _derive(self, pattern: sparse.Pattern) -> None:
        """What the GEMMs need of the pattern beyond indptr and indices (buffers left out of the state
        dict): each kept block's block row, and Wᵀ's BSR structure with its blocks' order in W's."""
        device = self.indptr.device
        self._pattern = pattern
        rows = np.repeat(np.arange(pattern.block_rows), pattern.row_counts)
        t = pattern.transpose()
        self.register_buffer("rows", torch.as_tensor(rows, dtype=torch.long, device=device), persistent=False)
        self.register_buffer("cols", self.indices.long(), persistent=False)
        self.register_buffer("t_indptr", torch.as_tensor(t.indptr, device=device), persistent=False)
        self.register_buffer("t_indices", torch.as_tensor(t.indices, device=device), persistent=False)
        self.register_buffer("t_order", torch.as_tensor(pattern.transpose_order(), device=device), persistent=False)
        self._new_caches()

    @property
    def pattern(self) -> sparse.Pattern:
        """W's pattern of kept blocks (codegen.sparse.Pattern)."""
        return self._pattern

    @property
    def pattern_hash(self) -> str:
        return self._pattern.hash

    @property
    def density(self) -> float:
        return self._pattern.density

    def get_extra_state(self) -> dict:
        return {"pattern": self.pattern_hash, "block": self.block, "shape": [self.out_features, self.in_features]}

    def set_extra_state(self, state: dict) -> None:
        """Loaded after ``indptr`` and ``indices``: they must make the pattern the state names."""
        pattern = sparse.Pattern(self.out_features, self.in_features, self.block, self.indptr.cpu().numpy(),
                                 self.indices.cpu().numpy())
        if state.get("pattern") != pattern.hash or state.get("block") != self.block:
            raise ValueError(f"the state dict's indptr and indices make pattern {pattern.hash} of blocks of "
                             f"{self.block}, but it names pattern {state.get('pattern')} of blocks of {state.get('block')}")
        self._derive(pattern)

    def reset_parameters(self) -> None:
        """As ``nn.Linear``: uniform in ±1/sqrt(in_features), the blocks' padding zero."""
        bound = 1.0 / self.in_features ** 0.5
        with torch.no_grad():
            self.blocks.uniform_(-bound, bound)
            self.blocks.copy_(self._zero_padding(self.blocks))
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    def _zero_padding(self, blocks: torch.Tensor) -> torch.Tensor:
        dense = blocks_to_dense(blocks, self.rows, self.cols, (self.out_features, self.in_features), self.block)
        return dense_to_blocks(dense, self.rows, self.cols, self.block)

    # ---- conversions ----------------------------------------------------------------------------------
    @classmethod
    def from_linear(cls, layer: nn.Linear, density: float, block: int, *, kernels=None) -> BlockSparseLinear:
        """``layer`` pruned by block magnitude (codegen.sparse.prune_blocks): the ``round(density x
        blocks)`` blocks of W of largest Frobenius norm kept, with their values; the bias shared."""
        w = layer.weight
        if w.is_meta:
            raise ValueError("the layer's weight is on the meta device: it has no values to prune")
        pattern, kept = sparse.prune_blocks(w.detach().float().cpu().numpy(), block, density)
        return cls.from_blocks(layer.in_features, layer.out_features, pattern, torch.from_numpy(kept),
                               layer.bias, kernels=kernels, dtype=w.dtype, device=w.device)

    @classmethod
    def from_blocks(cls, in_features: int, out_features: int, pattern: sparse.Pattern, blocks: torch.Tensor,
                    bias: torch.Tensor | None, *, kernels=None, dtype=None, device=None) -> BlockSparseLinear:
        """A layer of these values: ``blocks`` [nnzb, block, block] on ``pattern``, ``bias`` (a
        Parameter is shared, a tensor copied, None for none)."""
        dtype = dtype or blocks.dtype
        new = cls(in_features, out_features, pattern, bias is not None, device=device, dtype=dtype, kernels=kernels)
        with torch.no_grad():
            new.blocks.copy_(new._zero_padding(blocks.to(device=new.blocks.device, dtype=dtype)))
            if isinstance(bias, nn.Parameter):
                new.bias = bias
            elif bias is not None:
                new.bias.copy_(bias)
        return new

    # ---- running --------------------------------------------------------------------------------------
    def _gemm(self, layout: Layout, batch: int, dtype: torch.dtype, weight_dtype: torch.dtype, device: torch.device,
              bias: bool) -> tuple[Problem, _Compiled] | None:
        """The ``layout`` GEMM at ``batch`` rows: its problem and kernel, or None (torch runs it; the
        reason is logged once). Resolved once per batch, dtypes, bias and device."""
        key = (layout, batch, dtype, weight_dtype, device, bias)
        if key in self._gemms:
            return self._gemms[key]
        got = None
        if dtype not in DTYPES or weight_dtype != dtype or batch == 0:
            why = "an empty GEMM" if batch == 0 else f"gemmscape has no {dtype} kernels with {weight_dtype} blocks"
            self.kernels.fallback(f"{layout.value} of {self!r} at batch {batch}, {dtype}", str(device), why)
        else:
            problem = self.problem(layout, batch, DTYPES[dtype], bias)
            compiled = self.kernels.kernel(problem, device)
            got = (problem, compiled) if compiled is not None else None
            if got is None and (self.kernels.used(problem, device) or "").startswith("torch: cuBLAS won"):
                self._cublas_won[key] = True
        self._gemms[key] = got
        return got

    def problem(self, layout: Layout | str, batch: int, dtype, bias: bool | None = None) -> Problem:
        """The ``layout`` GEMM of this layer at ``batch`` rows of ``dtype`` (a gemmscape DType or its
        name), its pattern registered here (codegen.sparse.problem_for): what tuning it searches and
        what its kernels are looked up by. ``bias`` defaults to the layer's (never in grad_input)."""
        layout = Layout(layout)
        bias = (self.bias is not None if bias is None else bias) and layout is not Layout.grad_input
        return sparse.problem_for(batch, self._pattern, dtype, bias, layout)

    def problems(self, batch: int, dtype=None) -> dict[Layout, Problem]:
        """The three GEMMs of this layer at ``batch`` rows (``dtype``: default the blocks')."""
        dtype = dtype or DTYPES[self.blocks.dtype]
        return {layout: self.problem(layout, batch, dtype) for layout in Layout}

    def _forward(self, x: torch.Tensor, blocks: torch.Tensor, bias: torch.Tensor | None,
                 inference: bool = False) -> torch.Tensor:
        key = (Layout.forward, x.shape[0], x.dtype, blocks.dtype, x.device, bias is not None)
        found = self._gemm(*key)
        if found is None or x.shape[1] != self.in_features:
            keep = inference and key in self._cublas_won
            return F.linear(x, self._kept_dense(blocks) if keep else self._dense(blocks), bias)
        problem, k = found
        y = torch.empty((problem.m, problem.n), dtype=x.dtype, device=x.device)
        k({"y": y, "x": _ready(x), "weight": _ready(blocks), "bias": _ready(bias) if bias is not None else None,
           "indptr": self.indptr, "indices": self.indices})
        return y

    def _grad_input(self, grad_y: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        found = self._gemm(Layout.grad_input, grad_y.shape[0], grad_y.dtype, blocks.dtype, grad_y.device, False)
        if found is None:
            return grad_y @ self._dense(blocks)
        problem, k = found
        # Wᵀ's blocks in its BSR order, for the kernels that read them (Hopper's reads W's own blocks in place)
        weight_t = blocks.index_select(0, self.t_order).transpose(1, 2).contiguous() if "WT" in k.arg_names else None
        grad_x = torch.empty((problem.m, problem.n), dtype=grad_y.dtype, device=grad_y.device)
        k({"grad_x": grad_x, "grad_y": _ready(grad_y), "weight_t": weight_t, "weight": _ready(blocks),
           "t_indptr": self.t_indptr, "t_indices": self.t_indices, "t_order": self.t_order})
        return grad_x

    def _grad_weight(self, grad_y: torch.Tensor, x: torch.Tensor, bias: bool):
        """The gradient of ``blocks`` (dW at the kept blocks only) and, with a bias, db."""
        found = self._gemm(Layout.grad_weight, grad_y.shape[0], grad_y.dtype, x.dtype, grad_y.device, bias)
        if found is None:
            grad_w = dense_to_blocks(grad_y.t() @ x, self.rows, self.cols, self.block)
            return grad_w, grad_y.sum(0) if bias else None
        problem, k = found
        grad_w = torch.empty((problem.nnzb, self.block, self.block), dtype=x.dtype, device=x.device)
        writes_db = bias and "DB" in k.arg_names
        grad_b = torch.empty((problem.m,), dtype=x.dtype, device=x.device) if writes_db else None
        k({"grad_weight": grad_w, "grad_y": _ready(grad_y), "x": _ready(x), "grad_bias": grad_b,
           "indptr": self.indptr, "indices": self.indices})
        if bias and grad_b is None:  # the kernel computes dW only: db from torch
            grad_b = grad_y.sum(0)
        return grad_w, grad_b

    def _dense(self, blocks: torch.Tensor) -> torch.Tensor:
        return blocks_to_dense(blocks, self.rows, self.cols, (self.out_features, self.in_features), self.block)

    def extra_repr(self) -> str:
        where = getattr(self.kernels.source, "location", None) or "none"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"block={self.block}, density={self.density:.4g}, pattern={self.pattern_hash}, kernels={where}")


def load_pruned(model: nn.Module, path, *, kernels=None) -> nn.Module:
    """``model`` with the layers a pruned-model file names (``codegen prune``) replaced, in place, by
    ``BlockSparseLinear`` layers of the file's patterns and values (codegen.nn.pruned.load_pruned)."""
    from codegen.nn.pruned import load_pruned as load

    return load(model, path, kernels=kernels)
