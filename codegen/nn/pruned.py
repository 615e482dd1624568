"""A model pruned to block-sparse or 2:4 W, and its file (the optional ``torch`` extra, with safetensors).

``prune_model`` replaces, in place, the ``nn.Linear`` layers of a model whose qualified names match
a regular expression by ``BlockSparseLinear`` layers pruned by block magnitude (codegen.sparse.prune_blocks),
or, with ``pattern="2:4"``, by ``Sparse24Linear`` layers pruned to two of every four along K by
magnitude (codegen.sparse24.mask24).
``save_pruned`` writes the model's weights as one safetensors file: every tensor of its state dict,
a pruned layer's W as ``NAME.blocks`` [nnzb, block, block] with its BSR structure ``NAME.indptr``
and ``NAME.indices`` (int32), and in the file's metadata, under ``gemmscape.pruned``, a JSON object
naming each pruned layer with its block, W's shape [out, in], density, kept blocks and pattern hash
(``format`` is ``gemmscape-pruned/1``). A 2:4 layer's W is ``NAME.values`` [out, KP/2] (its kept
halves) with ``NAME.metadata`` (int32, their positions as the sparse kernels read them), and its
description is ``{"sparsity": "2:4", "shape", "density": 0.5, "bias"}`` (no ``block``).
``load_pruned`` puts such a file back into the model it came from: each pruned layer (an
``nn.Linear`` there) becomes a ``BlockSparseLinear`` of the file's pattern and values, or a
``Sparse24Linear`` of its kept values and metadata, and every other tensor is loaded as it is.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import torch
from torch import nn

from codegen import sparse
from codegen.nn.layer import kernels_from
from codegen.nn.semisparse import Sparse24Linear
from codegen.nn.sparse import BlockSparseLinear

__all__ = ["FORMAT", "PruneError", "load_model_weights", "load_pruned", "prune_model", "pruned_layers", "read_patterns",
           "save_pruned", "select_linears", "sparse24_layers"]

FORMAT = "gemmscape-pruned/1"
META_KEY = "gemmscape.pruned"
#: The structured patterns ``prune_model`` takes besides blocks.
PATTERNS = ("2:4",)


class PruneError(ValueError):
    """What is asked cannot be pruned, written or read; the message is one line."""


def select_linears(model: nn.Module, layers: str | None = None) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` layers of ``model`` by qualified name ("" for a model that is one), those whose
    name ``layers`` matches (``re.search``) when given; a PruneError when none is left."""
    try:
        regex = re.compile(layers) if layers is not None else None
    except re.error as e:
        raise PruneError(f"--layers {layers!r} is not a regular expression: {e}") from None
    found = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    chosen = {name: m for name, m in found.items() if regex is None or regex.search(name)}
    if not chosen:
        names = ", ".join(n or "(model)" for n in list(found)[:8]) + (", ..." if len(found) > 8 else "")
        raise PruneError(f"--layers {layers!r} matches no nn.Linear layer of the model (its layers: {names})" if found
                         else "the model has no nn.Linear layer")
    return chosen


def _check(layers: dict[str, nn.Linear], density: float, block: int) -> None:
    if not 0.0 < density <= 1.0:
        raise PruneError(f"the density must lie in (0, 1] (the fraction of W's blocks kept), got {density!r}")
    if block not in sparse.BLOCKS:
        raise PruneError(f"the block must be one of {', '.join(map(str, sparse.BLOCKS))}, got {block!r}")
    for name, layer in layers.items():
        if block > min(layer.out_features, layer.in_features):
            raise PruneError(f"a block of {block} does not fit layer {name or '(model)'}, whose W is "
                             f"{layer.out_features}x{layer.in_features}: take a smaller --block or leave it out "
                             f"with --layers")
        if layer.weight.is_meta:
            raise PruneError(f"layer {name or '(model)'} has no weights (the meta device): build the model with them")


def _replace(model: nn.Module, name: str, layer: nn.Module) -> nn.Module:
    """``model`` with its submodule ``name`` replaced by ``layer`` (``layer`` itself for "")."""
    if not name:
        return layer
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, layer)
    return model


def prune_model(model: nn.Module, density: float | None, block: int | None, layers: str | None = None, *,
                kernels=None, pattern: str | None = None) -> nn.Module:
    """Every ``nn.Linear`` of ``model`` whose name ``layers`` matches (all without it) replaced in
    place by a ``BlockSparseLinear`` keeping the ``round(density x blocks)`` blocks of W of largest
    norm. Returns ``model`` (a new layer where the model is itself an ``nn.Linear``). PruneError
    (nothing replaced) for a density outside (0, 1], a block not in codegen.sparse.BLOCKS or larger
    than a chosen layer's W, or no layer chosen. With ``pattern="2:4"`` (density and block None) each
    becomes a ``Sparse24Linear`` (codegen.nn.semisparse) keeping two of every four along K by magnitude."""
    chosen = select_linears(model, layers)
    shared = kernels_from(kernels)  # one source for every layer: a fallback is logged once, not once per layer
    if pattern is not None:
        if pattern not in PATTERNS:
            raise PruneError(f"the pattern is one of {', '.join(PATTERNS)} (or blocks: --density and --block), "
                             f"not {pattern!r}")
        if density is not None or block is not None:
            raise PruneError(f"a {pattern} pattern keeps half of each W by itself: drop --density and --block")
        for name, layer in chosen.items():
            if layer.weight.is_meta:
                raise PruneError(f"layer {name or '(model)'} has no weights (the meta device): build the model with them")
        for name, layer in chosen.items():
            model = _replace(model, name, Sparse24Linear.from_linear(layer, kernels=shared))
        return model
    if density is None or block is None:
        raise PruneError("a block-sparse prune needs both --density and --block (or --pattern 2:4)")
    _check(chosen, density, block)
    for name, layer in chosen.items():
        model = _replace(model, name, BlockSparseLinear.from_linear(layer, density, block, kernels=shared))
    return model


def pruned_layers(model: nn.Module) -> dict[str, BlockSparseLinear]:
    """The ``BlockSparseLinear`` layers of ``model`` by qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, BlockSparseLinear)}


def sparse24_layers(model: nn.Module) -> dict[str, Sparse24Linear]:
    """The ``Sparse24Linear`` layers of ``model`` by qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, Sparse24Linear)}


def _describe(layer: BlockSparseLinear | Sparse24Linear) -> dict:
    if isinstance(layer, Sparse24Linear):
        return {"sparsity": "2:4", "shape": [layer.out_features, layer.in_features], "density": layer.density,
                "bias": layer.bias is not None}
    return {"block": layer.block, "shape": [layer.out_features, layer.in_features], "density": layer.density,
            "nnzb": layer.pattern.nnzb, "pattern": layer.pattern_hash, "bias": layer.bias is not None}


def save_pruned(model: nn.Module, path, metadata: dict[str, str] | None = None) -> dict:
    """Write ``model``'s weights and its pruned layers' patterns to the safetensors file ``path``
    (through a temporary file in its folder: nothing is left at ``path`` on error). Returns the
    pruned layers' descriptions (the metadata's ``gemmscape.pruned``)."""
    from safetensors.torch import save_file

    tensors, storages = {}, set()
    for key, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor):
            continue  # a layer's extra state (BlockSparseLinear: its pattern, written below)
        t = value.detach().to("cpu").contiguous()
        where = t.untyped_storage().data_ptr()
        tensors[key] = t.clone() if where in storages else t  # tied weights: each name gets its own copy
        storages.add(where)
    layers = {name: _describe(layer) for name, layer in {**pruned_layers(model), **sparse24_layers(model)}.items()}
    meta = {**(metadata or {}), "format": FORMAT, META_KEY: json.dumps(layers)}
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a file opened for writing would be (the temporary one is private)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return layers


def read_pruned(path) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors of a pruned-model file and its pruned layers' descriptions; PruneError if it is not one."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (OSError, SafetensorError) as e:
        raise PruneError(f"cannot read {path} as a safetensors file: {e}") from None
    if meta.get("format") != FORMAT or META_KEY not in meta:
        raise PruneError(f"{path} is not a pruned model written by `codegen prune` (format {FORMAT})")
    return tensors, json.loads(meta[META_KEY])


#: safetensors' dtype names -> gemmscape's (codegen.problem.DType values).
_FILE_DTYPES = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}


def read_patterns(path) -> dict[str, tuple[sparse.Pattern | str, dict]]:
    """Each layer a pruned-model file prunes: name -> (its pattern, its description from the file's
    metadata with ``dtype``: its stored values' element type, a codegen.problem.DType value, or the
    file's own name of one gemmscape has no kernels for). A block-sparse layer's pattern is a
    codegen.sparse.Pattern; a 2:4 layer's is its sparsity, the text "2:4" (its W's shape is the
    description's ``shape``, [out, in]). Reads the metadata and the BSR index arrays only, not the
    weights (what ``codegen tune-model --pruned`` needs). PruneError: not such a file, or a damaged
    one."""
    from safetensors import SafetensorError, safe_open

    out = {}
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT or META_KEY not in meta:
                raise PruneError(f"{path} is not a pruned model written by `codegen prune` (format {FORMAT})")
            keys = set(f.keys())
            for name, info in json.loads(meta[META_KEY]).items():
                if info.get("sparsity"):  # a 2:4 layer: no block pattern (its problem names the sparsity)
                    names = [f"{_at(name)}{t}" for t in ("values", "metadata")]
                    if info["sparsity"] not in PATTERNS or not all(n in keys for n in names) \
                            or len(info.get("shape", ())) != 2:
                        raise PruneError(f"{path}: layer {name or '(model)'} is {info['sparsity']} but lacks its "
                                         f"shape or one of {', '.join(names)}, or gemmscape does not know the "
                                         f"pattern (a damaged file)")
                    held = f.get_slice(names[0]).get_dtype()
                    out[name] = (info["sparsity"], {**info, "dtype": _FILE_DTYPES.get(held, held)})
                    continue
                names = [f"{_at(name)}{t}" for t in ("indptr", "indices", "blocks")]
                if not all(n in keys for n in names) or len(info.get("shape", ())) != 2:
                    raise PruneError(f"{path}: layer {name or '(model)'} lacks its shape or one of "
                                     f"{', '.join(names)} (a damaged file)")
                out_f, in_f = info["shape"]
                pattern = sparse.Pattern(out_f, in_f, info["block"], f.get_tensor(names[0]).numpy(),
                                         f.get_tensor(names[1]).numpy())
                if pattern.hash != info.get("pattern"):
                    raise PruneError(f"{path}: the indptr and indices of layer {name or '(model)'} are not its "
                                     f"pattern {info.get('pattern')} (a damaged file)")
                held = f.get_slice(names[2]).get_dtype()
                out[name] = (pattern, {**info, "dtype": _FILE_DTYPES.get(held, held)})
    except (OSError, SafetensorError, ValueError, KeyError, TypeError) as e:
        if isinstance(e, PruneError):
            raise
        raise PruneError(f"cannot read {path} as a pruned model: {type(e).__name__}: {e}") from None
    return out


def load_pruned(model: nn.Module, path, *, kernels=None) -> nn.Module:
    """``model`` (as built for the pruned file's weights: the same layers, weights maybe on the meta
    device) with each layer the file prunes replaced by a ``BlockSparseLinear`` of its pattern and
    values, and every other tensor of the file loaded. Returns the model (a new layer where the model
    is itself the pruned ``nn.Linear``); PruneError where the file does not fit it."""
    tensors, layers = read_pruned(path)
    shared = kernels_from(kernels)
    for name, info in layers.items():
        out, fin = info["shape"]
        old = model.get_submodule(name) if name else model
        if not isinstance(old, nn.Linear | BlockSparseLinear | Sparse24Linear) or \
                (old.out_features, old.in_features) != (out, fin):
            raise PruneError(f"{path} prunes layer {name or '(model)'} of W {out}x{fin}, which the model does not have "
                             f"as a linear layer of that shape")
        if info.get("sparsity"):
            model = _replace(model, name, _load24(path, name, info, tensors, old, shared))
            continue
        pattern = sparse.Pattern(out, fin, info["block"], tensors[f"{_at(name)}indptr"].numpy(),
                                 tensors[f"{_at(name)}indices"].numpy())
        if pattern.hash != info["pattern"]:
            raise PruneError(f"{path}: the indptr and indices of layer {name or '(model)'} are not its pattern "
                             f"{info['pattern']} (a damaged file)")
        bias = tensors.get(f"{_at(name)}bias")
        device = old.blocks.device if isinstance(old, BlockSparseLinear) else \
            old.values.device if isinstance(old, Sparse24Linear) else old.weight.device
        model = _replace(model, name, BlockSparseLinear.from_blocks(
            fin, out, pattern, tensors[f"{_at(name)}blocks"], bias, kernels=shared,
            device="cpu" if device.type == "meta" else device))
    meta = any(t.is_meta for t in model.state_dict().values() if isinstance(t, torch.Tensor))
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=meta)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise PruneError(f"{path} does not fit the model: " + "; ".join(
            f"{what} {', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}"
            for what, keys in (("missing", missing), ("not in the model", unexpected)) if keys))
    return model


def _load24(path, name: str, info: dict, tensors: dict, old: nn.Module, kernels) -> Sparse24Linear:
    """The 2:4 layer ``name`` of a pruned-model file, its metadata checked (the values and the bias
    are loaded with the rest of the state dict)."""
    out, fin = info["shape"]
    values, metadata = tensors.get(f"{_at(name)}values"), tensors.get(f"{_at(name)}metadata")
    if info["sparsity"] not in PATTERNS or values is None or metadata is None:
        raise PruneError(f"{path}: layer {name or '(model)'} is {info['sparsity']} but lacks its values or metadata, "
                         f"or gemmscape does not know the pattern (a damaged file)")
    device = next((p.device for p in old.parameters() if p.device.type != "meta"), torch.device("cpu"))
    layer = Sparse24Linear(fin, out, bool(info.get("bias")), device=device, dtype=values.dtype, kernels=kernels)
    try:
        if metadata.shape != layer.metadata.shape or values.shape != layer.values.shape:
            raise ValueError(f"values {tuple(values.shape)} and metadata {tuple(metadata.shape)} are not those of a "
                             f"2:4 W {out}x{fin}")
        layer.metadata.copy_(metadata)
        layer.set_extra_state(layer.get_extra_state())  # checks the metadata and derives the kept columns
    except ValueError as e:
        raise PruneError(f"{path}: layer {name or '(model)'}: {e} (a damaged file)") from None
    return layer


def _at(name: str) -> str:
    return f"{name}." if name else ""


def load_model_weights(target: str) -> nn.Module:
    """The model ``target`` names, with its weights (codegen.nn.tune.load_model, the factory called as
    it is, not on the meta device). ValueError saying what is wrong."""
    from codegen.nn.tune import load_model

    return load_model(target, weights=True)
