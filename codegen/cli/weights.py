"""The W a command line names beside its shape: the options of a block-sparse W (``--block``,
``--density``, ``--pattern-seed``, ``--weights``) and of a 2:4 W (``--sparsity`` with ``--weights``),
how they go together, and the pattern or shape they give (codegen.cli.options builds the problem)."""

from __future__ import annotations

import argparse
import sys

from codegen.cli.errors import UsageError
from codegen.problem import Layout

__all__ = ["SPARSE_OPTIONS", "check_sparse_args", "pattern_from_args", "sparse_given", "structured_shape",
           "weights_from_args"]

#: The options of a block-sparse W (argparse dests), as the command line spells them.
SPARSE_OPTIONS = {"block": "--block", "density": "--density", "pattern_seed": "--pattern-seed", "weights": "--weights"}


def sparse_given(args: argparse.Namespace) -> list[str]:
    """The block-sparse options given, as spelled on the command line."""
    return [flag for dest, flag in SPARSE_OPTIONS.items() if getattr(args, dest, None) is not None]


def check_sparse_args(args: argparse.Namespace) -> None:
    """The block-sparse options go together: --block with --density (a random pattern, seeded by
    --pattern-seed) or with --weights (the file's pattern; with --density, pruned to it). With
    --sparsity 2:4 only --weights goes (the file's W, pruned to 2:4 where it is not)."""
    given = sparse_given(args)
    structured = getattr(args, "sparsity", None)
    if structured:  # a 2:4 W: --weights may give it, no block options go with it
        if getattr(args, "block", None) is not None:
            raise UsageError(f"a W is either {structured} sparse or block-sparse, not both: drop --block or --sparsity")
        if extra := [f for f in given if f != "--weights"]:
            raise UsageError(f"{', '.join(extra)} {'describes' if len(extra) == 1 else 'describe'} a block-sparse "
                             f"W; a {structured} W keeps two of each four along K by magnitude: drop "
                             f"{'it' if len(extra) == 1 else 'them'}")
        return
    if not given:
        return
    if getattr(args, "block", None) is None:
        need = "needs" if len(given) == 1 else "need"
        raise UsageError(f"{', '.join(given)} {need} --block 16, 32 or 64 (the side of W's square blocks)")
    if args.weights is not None and args.pattern_seed is not None:
        raise UsageError("--pattern-seed seeds a random pattern, --weights takes the pattern of your W: "
                         "give one of them, not both")
    if args.density is None and args.weights is None:
        raise UsageError(f"--block {args.block} needs --density D (a random pattern with that fraction of blocks "
                         f"kept) or --weights FILE (the blocks of your own W)")


def weights_from_args(args: argparse.Namespace, layout: Layout):
    """The W of --weights as float32 [out, in]; --n and --k, where given, must be its shape (the
    problem's N x K forward, K x N in grad_input, M x N in grad_weight)."""
    from codegen import sparse

    rows, cols = {Layout.forward: ("n", "k"), Layout.grad_input: ("k", "n"), Layout.grad_weight: ("m", "n")}[layout]
    try:
        w = sparse.load_weights(args.weights)
    except (ValueError, OSError) as e:
        raise UsageError(f"--weights: {e}") from None
    n, k = w.shape
    wrong = [f"--{d} {getattr(args, d)}" for d, size in ((rows, n), (cols, k))
             if getattr(args, d, None) is not None and getattr(args, d) != size]
    if wrong:
        shape = {Layout.forward: "N x K", Layout.grad_input: "K x N, out x in, in grad_input",
                 Layout.grad_weight: "M x N, out x in, in grad_weight"}[layout]
        given = f"--{rows} and --{cols}"
        raise UsageError(f"{' and '.join(wrong)} {'does' if len(wrong) == 1 else 'do'} not match W in "
                         f"{args.weights}, which is {n}x{k} ({shape}); --weights gives {rows.upper()} and "
                         f"{cols.upper()}, so {given} can be left out")
    return w


def structured_shape(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """N and K of a structured-sparse W: --n and --k, or the shape of --weights, which must be 2:4
    already or is pruned to it by magnitude (said in a note on stderr: the kernels are timed on
    random values of the same shape, which take the same time)."""
    if getattr(args, "weights", None) is None:
        return args.n, args.k
    from codegen import sparse24

    w = weights_from_args(args, Layout.forward)
    over = sparse24.groups_over(w)
    if over:
        total = w.shape[0] * -(-w.shape[1] // sparse24.GROUP)
        print(f"note: W in {args.weights} is not {args.sparsity} sparse ({over} of its {total} groups of four along K "
              f"hold more than two non-zeros): pruned by magnitude", file=sys.stderr)
    return w.shape


def pattern_from_args(args: argparse.Namespace):
    """The block-sparse pattern the options name: random (--density, --pattern-seed), or the file's
    W (--weights): its non-zero blocks, or with --density its largest blocks."""
    from codegen import sparse

    # The pattern is of the layer's W [out, in]: the problem's [N, K] forward, [K, N] in grad_input,
    # [M, N] in grad_weight (Problem.w_shape).
    layout = Layout(getattr(args, "layout", None) or "forward")
    rows, cols = {Layout.forward: ("n", "k"), Layout.grad_input: ("k", "n"), Layout.grad_weight: ("m", "n")}[layout]
    if args.weights is None:
        try:
            return sparse.Pattern.random(getattr(args, rows), getattr(args, cols), args.block, args.density,
                                         args.pattern_seed or 0)
        except ValueError as e:
            raise UsageError(str(e)) from None
    w = weights_from_args(args, layout)
    try:
        if args.density is None:
            return sparse.from_dense(w, args.block)[0]
        return sparse.prune_blocks(w, args.block, args.density)[0]
    except ValueError as e:
        raise UsageError(f"--weights {args.weights}: {e}") from None
