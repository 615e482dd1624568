"""What a model pruned to ``BlockSparseLinear`` or ``Sparse24Linear`` layers ran and kept, for
benchmarks.sparse_quality (needs torch): which of its GEMMs ran gemmscape's kernels and which torch's
op, whether its pruned blocks (or pruned halves of each group of four) stayed zero through
fine-tuning, and whether our kernels compute what torch computes from the same kept values.
"""

from __future__ import annotations

import copy
import logging

import torch
import torch.nn.functional as F

from codegen import sparse24
from codegen.nn.layer import DTYPES, kernels_from
from codegen.nn.pruned import pruned_layers, sparse24_layers
from codegen.nn.semisparse import Sparse24Linear
from codegen.problem import Layout

__all__ = ["compressed_layers", "gemm_report", "kept_density", "kernel_check", "pattern_check", "snapshot"]

#: Why a ``Sparse24Linear``'s backward GEMMs run torch (codegen.nn.semisparse: by design).
BACKWARD_24 = ("Sparse24Linear's backward runs torch by design (dX on the dense masked W, whose transpose is not "
               "2:4 along its K; dW dense, gathered at the kept positions)")


def compressed_layers(model) -> dict:
    """The pruned layers of ``model`` by qualified name: its ``BlockSparseLinear`` and ``Sparse24Linear``."""
    return {**pruned_layers(model), **sparse24_layers(model)}


def _used24(layer: Sparse24Linear, layout: str, rows: int, dtype, device) -> str | None:
    """What ran ``layout`` of a 2:4 layer at ``rows`` rows of ``dtype`` (a gemmscape DType): our kernel's
    name, "torch: <reason>", or None (the forward never ran at these rows)."""
    used = None
    if dtype.value in ("bf16", "fp16"):  # a 2:4 problem of another dtype cannot be made (nor looked up)
        used = layer.kernels.used(layer.problem(rows, dtype), device)
    if used is None:  # a dtype gemmscape has no 2:4 kernels of never reaches the lookup: its fallback says why
        torch_dtype = next((t for t, d in DTYPES.items() if d == dtype), None)
        why = layer.kernels.fallbacks.get(
            (f"the 2:4 forward {rows}x{layer.out_features}x{layer.in_features}, {torch_dtype}", str(device)))
        used = f"torch: {why}" if why else None
    if used is None or layout == Layout.forward.value:
        return used
    return f"torch: {BACKWARD_24}"


def gemm_report(model, rows: int, dtype, layouts: tuple[str, ...]) -> dict:
    """Which of the pruned layers' GEMMs (``layouts``, at ``rows`` rows of ``dtype``, a gemmscape
    DType) ran ours and which torch (``not_run``: never asked): counts, by layout, the kernels' names,
    torch's reasons, and how many of ours ran without a verdict against cuBLAS (``unjudged``)."""
    out: dict = {"ours": 0, "torch": 0, "not_run": 0, "by_layout": {}, "kernels": {}, "torch_reasons": {}}
    layers = compressed_layers(model)
    device = next(model.parameters()).device
    for layer in layers.values():
        for layout in Layout:
            if layout.value not in layouts:
                continue
            if isinstance(layer, Sparse24Linear):
                used = _used24(layer, layout.value, rows, dtype, device)
            else:
                used = layer.kernels.used(layer.problem(layout, rows, dtype), device)
            kind = "not_run" if used is None else "torch" if used.startswith("torch") else "ours"
            out[kind] += 1
            out["by_layout"].setdefault(layout.value, {"ours": 0, "torch": 0, "not_run": 0})[kind] += 1
            if kind == "ours":
                out["kernels"][used] = out["kernels"].get(used, 0) + 1
            elif kind == "torch":
                why = used.removeprefix("torch: ")
                out["torch_reasons"][why] = out["torch_reasons"].get(why, 0) + 1
    kernels = {id(layer.kernels): layer.kernels for layer in layers.values()}.values()
    out["unjudged"] = sum(len(k.unjudged) for k in kernels)
    return out


def kept_density(model) -> float:
    """The fraction of the pruned layers' W kept, over all of them: blocks of the block-sparse layers,
    elements of the 2:4 layers."""
    kept = total = 0
    for lay in compressed_layers(model).values():
        if isinstance(lay, Sparse24Linear):
            mask = lay.mask()
            kept, total = kept + int(mask.sum()), total + mask.numel()
        else:
            kept, total = kept + lay.pattern.nnzb, total + lay.pattern.mask().size
    return kept / total


def snapshot(model) -> dict:
    """Each pruned layer's pattern and kept values, as they are now: of a block-sparse layer its block
    mask, indptr, indices, hash and kept blocks; of a 2:4 layer its mask of W (bool [out, in]), its
    metadata and kept values."""
    snap = {}
    for name, layer in compressed_layers(model).items():
        if isinstance(layer, Sparse24Linear):
            snap[name] = {"sparsity": "2:4", "mask": layer.mask().cpu().clone(),
                          "metadata": layer.metadata.cpu().clone(), "values": layer.values.detach().clone()}
        else:
            snap[name] = {"mask": layer.pattern.mask().copy(), "indptr": layer.indptr.cpu().clone(),
                          "indices": layer.indices.cpu().clone(), "hash": layer.pattern_hash,
                          "blocks": layer.blocks.detach().clone()}
    return snap


def pattern_check(model, before: dict) -> dict:
    """After fine-tuning, against ``before`` (a ``snapshot`` taken at pruning): for block-sparse
    layers, how many blocks of the dense W outside the blocks kept at pruning are not all zero (must
    be none), whether every layer's indptr, indices and pattern hash are as pruned, and how many kept
    blocks changed (learned); for 2:4 layers (``check_24``'s figures), how many groups of four of the
    dense W hold more than two non-zeros and how many non-zeros lie outside the positions kept at
    pruning (both must be none), whether the metadata is as pruned, and how many kept values changed.
    ``ok`` when nothing is non-zero where it must not be and no pattern changed."""
    layers = compressed_layers(model)
    blocks = {n: lay for n, lay in layers.items() if not isinstance(lay, Sparse24Linear)}
    halves = {n: lay for n, lay in layers.items() if isinstance(lay, Sparse24Linear)}
    if halves and not blocks:
        return check_24(halves, before)
    got = _check_blocks(blocks, before)
    if halves:
        got["2:4"] = check_24(halves, before)
        got["ok"] = got["ok"] and got["2:4"]["ok"]
    return got


def check_24(layers: dict, before: dict) -> dict:
    """``pattern_check`` of 2:4 layers (name -> ``Sparse24Linear``)."""
    over = outside = changed = kept = groups = 0
    unchanged = True
    for name, layer in layers.items():
        was = before[name]
        unchanged &= torch.equal(layer.metadata.cpu(), was["metadata"])
        w = layer.dense_weight().detach()
        groups += w.shape[0] * -(-w.shape[1] // sparse24.GROUP)
        over += sparse24.groups_over(w.float().cpu().numpy())
        outside += int((w.ne(0).cpu() & ~was["mask"]).sum())
        if layer.values.shape == was["values"].shape:
            changed += int(layer.values.detach().ne(was["values"]).sum())
        kept += int(was["mask"].sum())
    return {"sparsity": "2:4", "groups": groups, "groups_over_two_nonzero": over, "nonzero_outside_pattern": outside,
            "pattern_unchanged": bool(unchanged), "kept_values": kept, "kept_values_changed": changed,
            "ok": over == 0 and outside == 0 and bool(unchanged)}


def _check_blocks(layers: dict, before: dict) -> dict:
    outside = changed = kept = 0
    unchanged = True
    for name, layer in layers.items():
        was = before[name]
        unchanged &= (layer.pattern_hash == was["hash"] and torch.equal(layer.indptr.cpu(), was["indptr"])
                      and torch.equal(layer.indices.cpu(), was["indices"]))
        b = layer.block
        w = layer.dense_weight().detach()
        br, bc = was["mask"].shape
        tiles = F.pad(w, (0, bc * b - w.shape[1], 0, br * b - w.shape[0])).reshape(br, b, bc, b)
        nonzero = tiles.ne(0).any(dim=3).any(dim=1).cpu()
        outside += int(nonzero[~torch.from_numpy(was["mask"])].sum())
        if layer.blocks.shape == was["blocks"].shape:
            changed += int(layer.blocks.detach().ne(was["blocks"]).flatten(1).any(dim=1).sum())
        kept += int(was["mask"].sum())
    return {"nonzero_blocks_outside_pattern": outside, "pattern_unchanged": bool(unchanged), "kept_blocks": kept,
            "kept_blocks_changed": changed, "ok": outside == 0 and bool(unchanged)}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def kernel_check(model, x: torch.Tensor, y: torch.Tensor, autocast) -> dict:
    """One forward and backward of ``model`` on inputs ``x`` and targets ``y`` (under ``autocast()``,
    a context manager factory) against a copy of it
    whose pruned layers run torch's op on the same kept values: the logits' and the loss's differences
    and the relative error ||ours - torch|| / ||torch|| of the logits and of the kept values' gradients
    (``kept_grad_rel_error``: the kept blocks of a block-sparse layer, the kept halves of a 2:4 one;
    ``block_grad_rel_error`` the same where every pruned layer is block-sparse). Leaves no gradients behind."""
    reference = copy.deepcopy(model)  # a copy resolves its GEMMs anew; its layers get a Kernels of no source
    torch_only = kernels_from(None)
    for layer in compressed_layers(reference).values():
        layer.kernels = torch_only
    got = {}
    quiet = logging.getLogger("gemmscape.nn")
    for label, mdl in (("ours", model), ("torch", reference)):
        quiet.disabled = label == "torch"  # the reference's fallbacks are by design: not logged
        try:
            mdl.zero_grad(set_to_none=True)
            with autocast():
                logits = mdl(x)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
        finally:
            quiet.disabled = False
        grads = torch.cat([getattr(lay, lay.STORED).grad.flatten() for lay in compressed_layers(mdl).values()])
        got[label] = (logits.detach().float(), float(loss.detach()), grads)
        mdl.zero_grad(set_to_none=True)
    (lo, loss_o, g_o), (lt, loss_t, g_t) = got["ours"], got["torch"]
    got = {"logits_max_abs_diff": float((lo - lt).abs().max()), "logits_rel_error": _rel(lo, lt),
           "loss_ours": loss_o, "loss_torch": loss_t, "kept_grad_rel_error": _rel(g_o, g_t),
           "finite": bool(torch.isfinite(lo).all() and torch.isfinite(g_o).all())}
    if not sparse24_layers(model):  # the block-sparse rows' name for it, as recorded before 2:4 rows
        got["block_grad_rel_error"] = got["kept_grad_rel_error"]
    return got
