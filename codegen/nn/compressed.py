"""What the layers holding a compressed W share (the optional ``torch`` extra): a block-sparse W
(``codegen.nn.sparse.BlockSparseLinear``, its kept blocks) and a 2:4 W (``codegen.nn.semisparse.
Sparse24Linear``, its kept halves). A subclass names the parameter holding W's kept values
(``STORED``) and its autograd Function (``FUNCTION``: ``apply(x, stored, bias, layer)``), and gives
``_dense(stored)`` (W [out, in], zeros where pruned, differentiable in ``stored``) and
``_forward(x, stored, bias, inference)``; this class runs the forward (autocast, leading dimensions,
no autograd where nothing needs a gradient), converts to ``nn.Linear``, switches kernels, and keeps a
dense W for inference where a verdict says dense cuBLAS beats ours."""

from __future__ import annotations

import torch
from torch import nn

from codegen.nn.layer import kernels_from

__all__ = ["CompressedLinear"]


class _Cache(dict):
    """A layer's GEMMs resolved so far (kernels loaded on a device): a copied or pickled layer starts
    with none and resolves its own."""

    def __deepcopy__(self, memo) -> _Cache:
        return _Cache()

    def __reduce__(self):
        return _Cache, ()


class CompressedLinear(nn.Module):
    """The base of the layers whose W is stored compressed (see the module)."""

    STORED: str
    FUNCTION: type[torch.autograd.Function]

    def _new_caches(self) -> None:
        """Forget what was resolved: the GEMMs by key, the keys whose verdict said dense cuBLAS beats
        ours, and the kept dense W (see ``_kept_dense``)."""
        self._gemms: dict[tuple, object] = _Cache()
        self._cublas_won: dict[tuple, bool] = _Cache()
        self._kept: dict[str, tuple] = _Cache()

    def use_kernels(self, kernels) -> CompressedLinear:
        """Run on ``kernels`` (as the constructor takes them) from now on: the GEMMs resolved so far are
        looked up again. Returns the layer."""
        self.kernels = kernels_from(kernels)
        for cache in (self._gemms, self._cublas_won, self._kept):
            cache.clear()
        return self

    def to_dense(self) -> nn.Linear:
        """An ``nn.Linear`` of the same W (zeros where pruned) and bias, as new parameters."""
        w = getattr(self, self.STORED).detach()
        dense = nn.Linear(self.in_features, self.out_features, self.bias is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            dense.weight.copy_(self.dense_weight())
            if self.bias is not None:
                dense.bias.copy_(self.bias)
        return dense

    def dense_weight(self) -> torch.Tensor:
        """W [out, in] as a dense tensor, zeros where pruned (differentiable in the stored values)."""
        return self._dense(getattr(self, self.STORED))

    # ---- running --------------------------------------------------------------------------------------
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x, stored, bias = input, getattr(self, self.STORED), self.bias
        kind = input.device.type
        if torch.is_autocast_enabled(kind):  # autocast: the GEMMs in the autocast dtype, then autocast off
            dtype = torch.get_autocast_dtype(kind)
            x, stored = x.to(dtype), stored.to(dtype)
            bias = bias.to(dtype) if bias is not None else None
            with torch.autocast(kind, enabled=False):
                return self._run(x, stored, bias)
        return self._run(x, stored, bias)

    def _run(self, x: torch.Tensor, stored: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        flat = x.dim() == 2
        x2 = x if flat else x.reshape(-1, self.in_features)
        if torch.is_grad_enabled() and (x.requires_grad or stored.requires_grad
                                        or (bias is not None and bias.requires_grad)):
            y = self.FUNCTION.apply(x2, stored, bias, self)
        else:  # nothing to differentiate: the forward GEMM without autograd's bookkeeping
            y = self._forward(x2, stored, bias, inference=True)
        return y if flat else y.reshape(*x.shape[:-1], self.out_features)

    def _kept_dense(self, stored: torch.Tensor) -> torch.Tensor:
        """W dense for an inference forward whose verdict says dense cuBLAS beats our kernel: made once
        and kept while the stored values are unchanged (the parameter's storage and version: an in-place
        update, an optimizer step or a loaded state dict makes it anew), so the layer then costs what the
        dense layer costs, and holds a dense W's memory. Made but not kept while a CUDA graph is being
        captured (the capture computes nothing until it is replayed): warm the layer up first."""
        p = getattr(self, self.STORED)
        if stored.data_ptr() != p.data_ptr() or stored.dtype != p.dtype or stored.shape != p.shape:
            return self._dense(stored)  # not the parameter itself (an autocast copy): nothing to key it by
        key = (p.data_ptr(), p._version, p.dtype, p.device)
        hit = self._kept.get("w")
        if hit is not None and hit[0] == key:
            return hit[1]
        with torch.no_grad():
            dense = self._dense(stored)
        if not (dense.is_cuda and torch.cuda.is_current_stream_capturing()):
            self._kept["w"] = (key, dense)
        return dense
