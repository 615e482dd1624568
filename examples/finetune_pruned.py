"""Prune a small model to block-sparse W and fine-tune it with its pattern fixed.

A student MLP learns a teacher MLP's outputs (full-batch regression on fixed inputs), dense at first.
Its linear layers are then pruned by block magnitude (``codegen.nn.pruned.prune_model``, what
``codegen prune`` does; the file it writes goes back into the model through the same
``save_pruned`` / ``load_pruned`` round trip) to ``BlockSparseLinear`` layers: only their kept
blocks are parameters, and their weight gradient is sampled at those blocks, so fine-tuning moves
the kept blocks and every other block of W stays zero. On a GPU each layer's three GEMMs run
gemmscape's block-sparse kernels (``--kernels``: ``seeds``, the families' built-in seeds, or a
bundle folder or store URL of tuned ones); on the CPU torch runs them (logged once per GEMM).

    python examples/finetune_pruned.py --device cuda --steps 200 --density 0.3 --block 16

Prints the loss of the dense model, of the model just pruned and after fine-tuning, and whether
every pruned layer kept its pattern; ``main`` returns the same as a dict.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from codegen.nn.pruned import load_pruned, prune_model, pruned_layers, save_pruned

#: Layer sizes: every side a multiple of 32 or not (ragged blocks), the smallest 32 (blocks up to 32 fit).
SIZES = (96, 200, 160, 32)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def mlp(seed: int, device, dtype) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (fin, fout) in enumerate(zip(SIZES, SIZES[1:], strict=False)):
        layers += [nn.Linear(fin, fout)] + ([nn.GELU()] if i < len(SIZES) - 2 else [])
    return nn.Sequential(*layers).to(device=device, dtype=dtype)


def train(model: nn.Module, x: torch.Tensor, target: torch.Tensor, steps: int, lr: float) -> list[float]:
    """Full-batch AdamW on the mean squared error; the loss before each step, then the final one."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x).float(), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses + [loss_of(model, x, target)]


def loss_of(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> float:
    with torch.no_grad():
        return nn.functional.mse_loss(model(x).float(), target).item()


def pattern_kept(model: nn.Module, before: dict[str, tuple[np.ndarray, np.ndarray]]) -> bool:
    """Every pruned layer still has its index arrays, and W is zero outside its kept blocks (padding included)."""
    for name, layer in pruned_layers(model).items():
        indptr, indices = before[name]
        if not (np.array_equal(layer.indptr.cpu().numpy(), indptr) and np.array_equal(layer.indices.cpu().numpy(), indices)):
            return False
        b = layer.block
        mask = np.kron(layer.pattern.mask(), np.ones((b, b), dtype=bool))
        mask[layer.out_features:], mask[:, layer.in_features:] = False, False  # the padding of the edge blocks
        padded = torch.zeros(mask.shape, dtype=layer.blocks.dtype, device=layer.blocks.device)
        grid = padded.view(mask.shape[0] // b, b, mask.shape[1] // b, b).permute(0, 2, 1, 3)
        grid[layer.rows, layer.cols] = layer.blocks.detach()
        if padded[torch.from_numpy(~mask).to(padded.device)].any():
            return False
    return True


def kernels_for(name: str | None, device: torch.device):
    if name is None or name == "none" or device.type != "cuda":
        return None
    if name == "seeds":
        from codegen.nn.bundle import SeedKernels

        return SeedKernels()
    return name


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    p.add_argument("--density", type=float, default=0.3, help="fraction of each W's blocks kept")
    p.add_argument("--block", type=int, choices=(16, 32), default=16)
    p.add_argument("--pretrain", type=int, default=150, help="dense steps before pruning")
    p.add_argument("--steps", type=int, default=200, help="fine-tuning steps after pruning")
    p.add_argument("--kernels", default="seeds", help="seeds, a bundle folder, a store URL, or none (torch)")
    args = p.parse_args(argv)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    torch.manual_seed(0)
    x = torch.randn(1024, SIZES[0], device=device, dtype=dtype)
    with torch.no_grad():
        target = mlp(1, device, dtype)(x).float()
    model = mlp(2, device, dtype)
    dense_losses = train(model, x, target, args.pretrain, lr=3e-3)
    with tempfile.TemporaryDirectory() as folder:  # what `codegen prune` writes, loaded back
        path = Path(folder) / "pruned.safetensors"
        save_pruned(prune_model(model, args.density, args.block), path)
        model = load_pruned(mlp(2, device, dtype), path, kernels=kernels_for(args.kernels, device))
    layers = pruned_layers(model)
    before = {name: (lay.indptr.cpu().numpy(), lay.indices.cpu().numpy()) for name, lay in layers.items()}
    start = {name: lay.blocks.detach().clone() for name, lay in layers.items()}
    pruned_loss = loss_of(model, x, target)
    losses = train(model, x, target, args.steps, lr=1e-3)
    learned = all(not torch.equal(lay.blocks.detach(), start[name]) for name, lay in layers.items())
    kernels = next(iter(layers.values())).kernels
    used = [kernels.used(problem, x.device) for lay in layers.values() for problem in lay.problems(x.shape[0]).values()]
    asked = [u for u in used if u is not None]  # the first layer's dX is never asked: its input needs no grad
    ran = sum(not u.startswith("torch") for u in asked)
    report = {"device": str(device), "dtype": args.dtype, "density": args.density, "block": args.block,
              "layers": {name: f"{lay.out_features}x{lay.in_features}, {lay.pattern.nnzb} blocks kept"
                         for name, lay in layers.items()},
              "dense_loss": dense_losses[-1], "pruned_loss": pruned_loss, "final_loss": losses[-1],
              "losses": losses, "pattern_kept": pattern_kept(model, before),
              "kept_blocks_learned": learned, "gemms_asked": len(asked), "kernels_ran": ran}
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    out = main()
    print(json.dumps({k: v for k, v in out.items() if k != "losses"}, indent=1))
    sys.exit(0 if out["pattern_kept"] else 1)
