"""What the commands' command lines share: argument types, the parser and its help, option
builders, and the problem and kernel variant a command line names.

A bad value is a one-line usage error at parse time (``Parser``); every option's help shows its
default (``HelpFormatter``). ``Commands`` is what each command module adds its subcommands to.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import MISSING

from codegen import families
from codegen.cli.checks import url_problem
from codegen.cli.errors import EXIT_USAGE, UsageError
from codegen.cli.weights import check_sparse_args, pattern_from_args, sparse_given, structured_shape
from codegen.problem import SPARSITIES, DType, Layout, Problem
from codegen.spec import KernelSpec

DEFAULT_FAMILY = "simt"
DEFAULT_DTYPE = "fp32"


# ---- argument types: a bad value is a one-line usage error at parse time --------------------------
def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def fraction(text: str) -> float:
    """A number in [0, 1] (a density: 0 keeps no block, 1 all of them)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {text}")
    return value


def kept_fraction(text: str) -> float:
    """A fraction of blocks kept, in (0, 1]: above 0 (a W of no block is no layer), at most all."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1], above 0 and at most 1, got {text}")
    return value


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, got {value}")
    return value


def arch_name(text: str) -> str:
    if not re.fullmatch(r"sm_\d+a?", text):
        raise argparse.ArgumentTypeError(f"an arch looks like sm_90 or sm_80, got {text!r}")
    return text


def database_url(text: str) -> str:
    reason = url_problem(text)
    if reason:
        raise argparse.ArgumentTypeError(reason)
    return text


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: what is wrong and where help is."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class HelpFormatter(argparse.HelpFormatter):
    """Every option's default in its help: from the help text where it says it, else the value."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.option_strings and action.nargs != 0 and "default" not in text
                and action.default not in (None, argparse.SUPPRESS)):
            text += " (default: %(default)s)"
        return text


class Commands:
    """The subcommands of ``codegen``, to which each command module adds its own (``add``); ``family``
    is the kernel family whose variant options compile and bench take."""

    def __init__(self, parser: argparse.ArgumentParser, family: str) -> None:
        self._sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
        self.family = family

    def add(self, name: str, text: str) -> argparse.ArgumentParser:
        """A subcommand ``name`` described by ``text``; the module sets its ``func`` to run it."""
        p = self._sub.add_parser(name, help=text, description=text, formatter_class=HelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an error")
        return p


# ---- shared options, and the problem and kernel variant they name ----------------------------------

def add_problem_args(p: argparse.ArgumentParser, required: bool = True, replay: bool = False) -> None:
    """--m, --n, --k, --dtype, --bias, and the options of a block-sparse W. --n and --k are checked
    by ``problem_from_args`` (not argparse): --weights gives them. With ``replay`` (a command that
    takes --replay FILE) every problem option may be left out for the recording to give
    (``problem_from_recording``): --m is then checked by the command, and --dtype and --layout
    default to None, read as fp32 and forward (``problem_from_args``) where nothing is replayed."""
    if replay:
        m_none = " (default: none; required unless --replay gives it)"
        nk_none = " (default: none; required unless --weights or --replay gives it)"
        recorded = "; with --replay, the recording's"
    elif required:
        m_none, nk_none, recorded = "", " (default: none; required unless --weights gives it)", ""
    else:
        m_none = nk_none = " (default: none; give all of --m, --n, --k or none; --weights gives --n, --k)"
        recorded = ""
    p.add_argument("--m", type=positive_int, required=required and not replay, help="batch (rows of X and Y)" + m_none)
    p.add_argument("--n", type=positive_int, help="out features (rows of W)" + nk_none)
    p.add_argument("--k", type=positive_int, help="in features" + nk_none)
    p.add_argument("--dtype", choices=[d.value for d in DType], default=None if replay else DEFAULT_DTYPE,
                   help=f"element type (default: {DEFAULT_DTYPE}{recorded})" if replay else "element type")
    p.add_argument("--bias", action="store_true", help="add b[N] (with --layout grad_weight: also db[M] = sum of dY)"
                   + (" (with --replay: as the recording)" if replay else ""))
    p.add_argument("--layout", choices=[v.value for v in Layout], default=None if replay else "forward",
                   help="which GEMM of the linear layer: forward Y = X·Wᵀ; grad_input dX[M,N] = dY[M,K]·W[K,N] "
                        "(M batch, N in, K out); grad_weight dW[M,N] = dY[K,M]ᵀ·X[K,N] (M out, N in, K batch). "
                        "--m, --n, --k are always the GEMM's output rows, output columns and reduction"
                        + (f" (default: forward{recorded})" if replay else ""))
    from codegen.sparse import BLOCKS

    g = p.add_argument_group("block-sparse W (default: none of these, W is dense)")
    g.add_argument("--block", type=int, choices=BLOCKS, metavar="{" + ",".join(map(str, BLOCKS)) + "}",
                   help="W is block-sparse in BLOCK x BLOCK blocks; needs --density or --weights "
                        "(default: none, W dense)")
    g.add_argument("--density", type=fraction, metavar="D",
                   help="fraction of W's blocks kept, 0 to 1: a random pattern, or with --weights the largest "
                        "blocks of the file's W (default: none)")
    g.add_argument("--pattern-seed", type=non_negative_int, metavar="S",
                   help="seed of the random pattern of --density (default: 0)")
    g.add_argument("--weights", metavar="PATH[:NAME]",
                   help="your own W: .npy, .npz, .pt/.pth or .safetensors, NAME picks one tensor of several; "
                        "N and K come from it, the kept blocks are its non-zero ones (with --sparsity 2:4: a 2:4 W, "
                        "or one pruned to 2:4 with a note) (default: none)")
    p.add_argument("--sparsity", choices=[s for s in SPARSITIES if s],
                   help="W is structured-sparse: 2:4 keeps two of each four elements along K, by magnitude, for "
                        "sparse tensor cores (fp16 and bf16, forward layout) (default: none)")


DB_HELP = "store URL, sqlite:///PATH or postgresql+psycopg://... (default: $GEMMSCAPE_DB, else " \
          "sqlite:///~/.local/share/gemmscape/gemmscape.db)"


def add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=database_url, metavar="URL", help=DB_HELP)


def add_gpu_args(p: argparse.ArgumentParser, timeout: float) -> None:
    """Where results go and how kernels are built and run, for the commands that measure."""
    add_db_arg(p)
    p.add_argument("--arch", type=arch_name, help="target, e.g. sm_90 (default: $GEMMSCAPE_ARCH, else the visible GPU's)")
    p.add_argument("--timeout", type=positive_float, default=timeout, help="seconds before a kernel counts as hung")


#: What a command takes when no --family is given (search.fit.default_family).
FAMILY_RULE = ("the fastest family that fits the problem on the arch: fp32 simt; fp16 and bf16 hopper on sm_90, "
               "else tensorcore; tf32 tensorcore")


def add_family_arg(p: argparse.ArgumentParser, what: str, default: str = FAMILY_RULE) -> None:
    p.add_argument("--family", choices=families.names(), default=None,
                   help=f"kernel family {what} (default: {default})")


def family_of_args(args: argparse.Namespace, problem: Problem | None = None) -> str:
    """The family asked for; else the one the parser took variant options for (compile, bench);
    else the default for ``problem`` on the arch (search.fit.default_family)."""
    asked = getattr(args, "family", None) or getattr(args, "variant_family", None)
    if asked or problem is None:
        return asked or DEFAULT_FAMILY
    from codegen.compile import default_arch
    from codegen.spec import DeviceLimits
    from search.fit import default_family

    return default_family(problem, DeviceLimits.for_arch(getattr(args, "arch", None) or default_arch()))


def add_spec_args(p: argparse.ArgumentParser, family: str) -> None:
    """``--kernel`` and one option per variant field of ``family``'s spec (type from the field's
    default, choices from its metadata)."""
    g = p.add_argument_group(f"kernel variant ({family} family; unset options take the defaults shown)")
    g.add_argument("--kernel", metavar="NAME", help="a kernel name, e.g. from `codegen results` "
                   "(default: the variant the options below give)")
    for f in families.variant_fields(family):
        default = f.default if f.default is not MISSING else None
        flag = f"--{f.name.replace('_', '-')}"
        text = f.metadata.get("help", "")
        text = f"{text} (default {default})" if text else f"default {default}"
        if isinstance(default, bool):
            g.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
            continue
        choices = f.metadata.get("choices")
        g.add_argument(flag, dest=f.name, type=type(default) if default is not None else str, default=None,
                       choices=list(choices) if choices else None, help=text)


def check_family(spec: KernelSpec, args: argparse.Namespace) -> KernelSpec:
    """A kernel named on the command line must be of the family asked for, when one is."""
    asked = getattr(args, "family", None)
    if asked and spec.family != asked:
        raise UsageError(f"kernel {spec.name} is of the {spec.family} family, not {asked}; "
                         f"drop --family or name a {asked} kernel")
    return spec


def spec_from_name(name: str, args: argparse.Namespace) -> KernelSpec:
    try:
        spec = families.spec_from_name(name)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return check_family(spec, args)


def spec_from_args(args: argparse.Namespace, problem: Problem | None = None) -> KernelSpec:
    if args.kernel:
        spec = spec_from_name(args.kernel, args)
        block = getattr(spec, "block", 0)
        layout = getattr(spec, "layout", Layout.forward)
        sparsity = getattr(spec, "sparsity", "")
        if problem is not None and (spec.dtype, spec.bias, block, layout, sparsity) != \
                (problem.dtype, problem.bias, problem.block, problem.layout, problem.sparsity):
            raise UsageError(f"kernel {spec.name} is for {spec.dtype.value}, bias={spec.bias}, block={block}, "
                             f"layout={layout.value}, sparsity={sparsity or 'none'}; the problem is "
                             f"{problem.dtype.value}, bias={problem.bias}, block={problem.block}, "
                             f"layout={problem.layout.value}, sparsity={problem.sparsity or 'none'}")
        return spec
    family = family_of_args(args)
    values = {f.name: getattr(args, f.name) for f in families.variant_fields(family)
              if getattr(args, f.name, None) is not None}
    if problem is not None:
        values.update(dtype=problem.dtype, bias=problem.bias)
        block, layout, sparsity = problem.block, problem.layout, problem.sparsity
    else:
        values.update(dtype=DType(getattr(args, "dtype", None) or DEFAULT_DTYPE), bias=getattr(args, "bias", False))
        block, layout = getattr(args, "block", None) or 0, Layout(getattr(args, "layout", None) or "forward")
        sparsity = getattr(args, "sparsity", None)  # a variant with no problem: the family's own, unless given
    dtype = values["dtype"]
    own = getattr(families.get(family), "SPARSITIES", ("",))
    for refused, why, takes in (
            (sparsity is not None and sparsity not in own,
             f"has no {sparsity} sparse variants" if sparsity else f"computes a {own[0]} sparse W only (give "
                                                                   f"--sparsity {own[0]})",
             lambda n: families.takes_sparsity(n, sparsity)),
            (not families.takes_dtype(family, dtype), f"generates no {dtype.value} kernels",
             lambda n: families.takes_dtype(n, dtype)),
            (layout is not Layout.forward and not families.takes_layouts(family), "generates the forward layout only",
             families.takes_layouts),
            (bool(block) and not families.takes_sparse(family), "has no block-sparse variants", families.takes_sparse)):
        if refused:
            raise UsageError(f"the {family} family {why}; choose --family "
                             + " or ".join(n for n in families.names() if takes(n)))
    if layout is not Layout.forward:
        values["layout"] = layout
    if block:
        values["block"] = block
        values.setdefault("bn", block)  # a block tile spans one block row unless --bn parts it (tensorcore)
        if layout is Layout.grad_weight:  # dW sampled at the kept blocks: the family's variant for the block
            defaults = getattr(families.get(family), "sampled_defaults", lambda _block: {})(block)
            values.update({k: v for k, v in defaults.items() if getattr(args, k, None) is None})
    try:
        return families.get(family).Spec(**values)
    except ValueError as e:
        raise UsageError(f"not a {family} variant: {e}") from None


def problem_given(args: argparse.Namespace) -> bool:
    """Whether a problem was given: all of --m, --n, --k, or --m with --weights (which gives N and
    K); some but not all of them, or block-sparse options without them, is a usage error."""
    check_sparse_args(args)
    weights = getattr(args, "weights", None) is not None
    given = [f"--{d}" for d in ("m", "n", "k") if getattr(args, d, None) is not None]
    sparse = sparse_given(args)
    if not given and not sparse:
        return False
    if weights:
        if Layout(getattr(args, "layout", None) or "forward") is Layout.grad_weight:
            if getattr(args, "k", None) is None:
                raise UsageError("a grad_weight problem with --weights needs --k, the batch (--m and --n, out and in "
                                 "features, come from the file)")
        elif getattr(args, "m", None) is None:
            raise UsageError("a problem with --weights needs --m (--n and --k come from the file)")
        return True
    missing = [f"--{d}" for d in ("m", "n", "k") if f"--{d}" not in given]
    if missing and not given:
        raise UsageError(f"{', '.join(sparse)} describe the W of a problem: give --m, --n, --k too")
    if missing:
        raise UsageError(f"a problem needs all of --m, --n, --k: {', '.join(given)} given, "
                         f"{', '.join(missing)} missing")
    return True


def problem_from_args(args: argparse.Namespace) -> Problem:
    """The problem of the command line: dense, with --block block-sparse (its pattern registered
    in this process by ``codegen.sparse.problem_for``), or with --sparsity 2:4 sparse."""
    problem_given(args)
    layout = Layout(getattr(args, "layout", None) or "forward")
    if getattr(args, "sparsity", None):
        n, k = structured_shape(args)
        try:
            return Problem(args.m, n, k, DType(args.dtype or DEFAULT_DTYPE), layout, bias=args.bias,
                           sparsity=args.sparsity)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if getattr(args, "block", None) is not None:
        from codegen.sparse import problem_for

        batch = args.k if layout is Layout.grad_weight else args.m  # dW is sampled at the kept blocks
        try:
            return problem_for(batch, pattern_from_args(args), DType(args.dtype or DEFAULT_DTYPE), bias=args.bias,
                               layout=layout)
        except ValueError as e:
            raise UsageError(str(e)) from None
    try:
        return Problem(args.m, args.n, args.k, DType(args.dtype or DEFAULT_DTYPE), layout, bias=args.bias)
    except ValueError as e:
        raise UsageError(str(e)) from None


def take_recorded(args: argparse.Namespace, source, recorded_key: str, values: dict[str, tuple[str, object]],
                  contradicted: bool = True) -> None:
    """Options a recording gives: ``values`` maps an argparse dest to its flag and the recording's
    value of it, as the command line spells it. Each option not given (None, or a flag left off)
    takes the recording's value; one given that differs is a usage error naming it, since a
    recording answers for its own problem only (unless not ``contradicted``: the caller compares)."""
    conflicts = []
    for dest, (flag, recorded) in values.items():
        given = getattr(args, dest, None)
        if given is None or given is False:
            setattr(args, dest, recorded)
        elif given != recorded:
            conflicts.append(flag if given is True else f"{flag} {given}")
    if conflicts and contradicted:
        one = len(conflicts) == 1
        raise UsageError(f"{', '.join(conflicts)} {'does' if one else 'do'} not match {source}, which records "
                         f"{recorded_key}: leave {'it' if one else 'them'} out (the recording gives "
                         f"{'it' if one else 'them'}), or replay a recording of your problem")


def problem_from_recording(args: argparse.Namespace, recorded: Problem, source) -> Problem:
    """The problem of a command line that replays a recording of ``recorded``: the problem options
    not given take the recording's values (``take_recorded``), one given that differs is a usage
    error. A block-sparse W is named by its pattern's options, which a recording does not hold: they
    must be given; the W they make is built first (its own mistakes said as such), then the whole
    problem must be the recorded one."""
    check_sparse_args(args)  # options that do not go together are said as such, recording or not
    values = {"m": ("--m", recorded.m), "n": ("--n", recorded.n), "k": ("--k", recorded.k),
              "dtype": ("--dtype", recorded.dtype.value), "layout": ("--layout", recorded.layout.value),
              "bias": ("--bias", recorded.bias), "sparsity": ("--sparsity", recorded.sparsity or None)}
    if sparse_given(args):
        if getattr(args, "weights", None) is not None:  # the file gives N and K
            values = {dest: v for dest, v in values.items() if dest not in ("n", "k")}
        take_recorded(args, source, recorded.key, values, contradicted=False)
        problem = problem_from_args(args)
        if problem != recorded:
            raise UsageError(f"{source} records {recorded.key}, not {problem.key}")
        return problem
    take_recorded(args, source, recorded.key, values)
    if recorded.sparse:
        raise UsageError(f"{source} records a block-sparse W ({recorded.key}): give the options of its pattern too "
                         f"(--block with --density and --pattern-seed, or --weights)")
    return problem_from_args(args)


def describe_problem(problem: Problem) -> str:
    """The problem's key, and for a block-sparse W how many blocks of what size it keeps."""
    if problem.structured:
        return f"{problem.key} (W {problem.n}x{problem.k} {problem.sparsity} sparse: two of each four along K kept)"
    if not problem.sparse:
        return problem.key
    from codegen.sparse import lookup

    p = lookup(problem)
    blocks = p.block_rows * p.block_cols
    return (f"{problem.key} (W {p.n}x{p.k} block-sparse: {p.nnzb} of {blocks} {p.block}x{p.block} blocks kept, "
            f"density {p.density:.4g})")


def printer(to_stderr: bool):
    """``print`` for human lines: to stderr when stdout carries JSON."""
    return (lambda *a, **kw: print(*a, **kw, file=sys.stderr)) if to_stderr else print

