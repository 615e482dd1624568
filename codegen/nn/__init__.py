"""gemmscape's linear layer in PyTorch, and the tools that tune and pick its kernels.

- ``codegen.nn.layer``: the layer itself (``Linear``, ``Kernels``, ``kernels_from``, ``replace_linear``;
  needs the ``torch`` extra).
- ``codegen.nn.tune``: a layer's or a model's GEMMs searched (``codegen tune-linear``, ``tune-model``).
- ``codegen.nn.bundle``: tuned kernels without the store (``codegen export --bundle``), and finding a
  layer's kernel in a bundle, a store or the families' built-in seeds.
- ``codegen.nn.step``: a layer's kernels picked by the train step's time (``codegen pick-step``).
- ``codegen.nn.sparse``: the layer with a block-sparse W (``BlockSparseLinear``; its weight gradient
  sampled at the kept blocks), and ``codegen.nn.pruned``: a model pruned to it (``codegen prune``)
  and its safetensors file (``load_pruned``).
- ``codegen.nn.semisparse``: the layer with a 2:4 structured-sparse W (``Sparse24Linear``; its forward
  on the sparse24 kernels, its backward on torch).

These sit above codegen's core (problem, spec, families, render, compile, engine, export, ...):
they use the search and the store, which the core never imports. Importing this package imports no
torch, so the command line takes ``tune`` and ``bundle`` on a machine without it; the layer's names
below load ``codegen.nn.layer`` (and torch) when first asked for: ``from codegen.nn import Linear``.
"""

from __future__ import annotations

__all__ = ["BlockSparseLinear", "Kernels", "Linear", "Sparse24Linear", "kernels_from", "load_pruned", "replace_linear"]
_SPARSE = ("BlockSparseLinear", "load_pruned")


def __getattr__(name: str):
    if name == "Sparse24Linear":
        from codegen.nn import semisparse

        return semisparse.Sparse24Linear
    if name in _SPARSE:
        from codegen.nn import sparse

        return getattr(sparse, name)
    if name in __all__:
        from codegen.nn import layer

        return getattr(layer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
