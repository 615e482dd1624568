"""What a model pruned to ``BlockSparseLinear`` layers ran and kept, for benchmarks.sparse_quality (needs torch):
which of its GEMMs ran gemmscape's kernels and which torch's op, whether its pruned blocks stayed
zero through fine-tuning, and whether our kernels compute what torch computes from the same blocks.
"""

from __future__ import annotations

import copy
import logging

import torch
import torch.nn.functional as F

from codegen.nn.layer import kernels_from
from codegen.nn.pruned import pruned_layers

__all__ = ["gemm_report", "kept_density", "kernel_check", "pattern_check", "snapshot"]


def gemm_report(model, rows: int, dtype, layouts: tuple[str, ...]) -> dict:
    """Which of the pruned layers' GEMMs (``layouts``, at ``rows`` rows of ``dtype``, a gemmscape
    DType) ran ours and which torch (``not_run``: never asked): counts, by layout, the kernels' names,
    torch's reasons, and how many of ours ran without a verdict against cuBLAS (``unjudged``)."""
    out: dict = {"ours": 0, "torch": 0, "not_run": 0, "by_layout": {}, "kernels": {}, "torch_reasons": {}}
    layers = pruned_layers(model)
    device = next(model.parameters()).device
    for layer in layers.values():
        for layout, problem in layer.problems(rows, dtype).items():
            if layout.value not in layouts:
                continue
            used = layer.kernels.used(problem, device)
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
    """The fraction of the pruned layers' blocks kept, over all of them."""
    layers = pruned_layers(model).values()
    return sum(lay.pattern.nnzb for lay in layers) / sum(lay.pattern.mask().size for lay in layers)


def snapshot(model) -> dict:
    """Each pruned layer's pattern (block mask, indptr, indices, hash) and kept blocks, as they are now."""
    return {name: {"mask": layer.pattern.mask().copy(), "indptr": layer.indptr.cpu().clone(),
                   "indices": layer.indices.cpu().clone(), "hash": layer.pattern_hash,
                   "blocks": layer.blocks.detach().clone()} for name, layer in pruned_layers(model).items()}


def pattern_check(model, before: dict) -> dict:
    """After fine-tuning: how many blocks of the pruned layers' dense W outside the blocks kept at
    pruning (``before``, a ``snapshot``) are not all zero (must be none), whether every layer's
    indptr, indices and pattern hash are as pruned, and how many kept blocks changed (learned);
    ``ok`` when none is non-zero and no pattern changed."""
    outside = changed = kept = 0
    unchanged = True
    for name, layer in pruned_layers(model).items():
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
    whose pruned layers run torch's op on the same blocks: the logits' and the loss's differences and
    the relative error ||ours - torch|| / ||torch|| of the logits and of the kept blocks' gradients.
    Leaves no gradients behind."""
    reference = copy.deepcopy(model)  # a copy resolves its GEMMs anew; its layers get a Kernels of no source
    torch_only = kernels_from(None)
    for layer in pruned_layers(reference).values():
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
        grads = torch.cat([lay.blocks.grad.flatten() for lay in pruned_layers(mdl).values()])
        got[label] = (logits.detach().float(), float(loss.detach()), grads)
        mdl.zero_grad(set_to_none=True)
    (lo, loss_o, g_o), (lt, loss_t, g_t) = got["ours"], got["torch"]
    return {"logits_max_abs_diff": float((lo - lt).abs().max()), "logits_rel_error": _rel(lo, lt),
            "loss_ours": loss_o, "loss_torch": loss_t, "block_grad_rel_error": _rel(g_o, g_t),
            "finite": bool(torch.isfinite(lo).all() and torch.isfinite(g_o).all())}
