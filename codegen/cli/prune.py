"""``codegen prune``: a PyTorch model's linear layers pruned to block-sparse W by block magnitude, or
to 2:4 W (``--pattern 2:4``), written as one safetensors file with each pruned layer's pattern
(codegen.nn.pruned)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from codegen.cli.checks import check_writable
from codegen.cli.errors import EXIT_OK, UsageError
from codegen.cli.options import Commands, kept_fraction


def register(commands: Commands) -> None:
    from codegen.sparse import BLOCKS

    p = commands.add("prune", "prune a PyTorch model's nn.Linear layers to block-sparse W (the blocks of largest "
                     "norm kept) or to 2:4 W (--pattern 2:4) and write its weights with each layer's pattern as safetensors; needs torch and "
                     "safetensors")
    p.add_argument("model", metavar="MODEL", help="FILE.py:FACTORY (called with no arguments; its weights are "
                   "pruned) or a module saved whole with torch.save (.pt/.pth)")
    p.add_argument("--density", type=kept_fraction, metavar="D",
                   help="fraction of each W's blocks kept, above 0 and at most 1 (with --block; no default: "
                   "needed unless --pattern)")
    p.add_argument("--block", type=int, choices=BLOCKS, metavar="{" + ",".join(map(str, BLOCKS)) + "}",
                   help="side of W's square blocks; at most the smaller side of each pruned W (with --density; no "
                   "default: needed unless --pattern)")
    p.add_argument("--pattern", choices=("2:4",), help="prune to a structured pattern instead of blocks: 2:4 keeps "
                   "the two of largest magnitude of every four along K (no --density or --block; default: blocks)")
    p.add_argument("--layers", metavar="REGEX", help="prune the nn.Linear layers whose qualified name this regular "
                   "expression matches (re.search) (default: every nn.Linear)")
    p.add_argument("--out", type=Path, required=True, metavar="FILE", help="the safetensors file to write")
    p.set_defaults(func=cmd_prune)


def cmd_prune(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError("prune reads a PyTorch model: pip install 'gemmscape[torch]'") from None
    try:
        import safetensors  # noqa: F401
    except ImportError:
        raise UsageError("prune writes safetensors: pip install safetensors") from None
    from codegen.nn.pruned import PruneError, load_model_weights, prune_model, save_pruned

    if args.pattern and (args.density is not None or args.block is not None):
        raise UsageError(f"--pattern {args.pattern} keeps half of each W by itself: drop --density and --block")
    if not args.pattern and (args.density is None or args.block is None):
        raise UsageError("prune to blocks needs both --density and --block (or --pattern 2:4)")
    check_writable(args.out, "--out", folder=False)
    try:
        model = load_model_weights(args.model)
    except ValueError as e:
        raise UsageError(f"{args.model}: {e}") from None
    try:
        model = prune_model(model, args.density, args.block, args.layers, pattern=args.pattern)
    except PruneError as e:
        raise UsageError(str(e)) from None
    meta = {"source": str(args.model), "pattern": args.pattern} if args.pattern else \
        {"source": str(args.model), "density": repr(args.density), "block": str(args.block)}
    layers = save_pruned(model, args.out, meta)
    for name, info in layers.items():
        if info.get("sparsity"):
            out, fin = info["shape"]
            print(f"  {name or '(model)'}: W {out}x{fin}, two of every four along K kept ({info['sparsity']})",
                  file=sys.stderr)
            continue
        out, fin = info["shape"]
        print(f"  {name or '(model)'}: W {out}x{fin}, {info['nnzb']} of {-(-out // args.block) * -(-fin // args.block)} "
              f"blocks of {args.block} kept (density {info['density']:.4g}), pattern {info['pattern']}", file=sys.stderr)
    print(f"pruned {len(layers)} linear layer{'s' if len(layers) != 1 else ''}; wrote {args.out} (load it with "
          f"codegen.nn.sparse.load_pruned(model, path))")
    return EXIT_OK
