"""``codegen`` command line: compile, bench, search, sweep, export, tune-linear, pick-step, tune-model,
prune, results, app.

``--family NAME`` picks a kernel family; without it every command takes what search.fit's one rule
says fits the problem on the arch (search, tune-linear and tune-model: every such family, and they
take ``--family`` several times; compile, bench and sweep: the first of them). The variant options are
that family's own, built from its spec's fields (``codegen bench --family NAME --help`` lists them).

Exit codes (codegen.cli.errors): 0 done; 1 it ran and the answer is a failure (a kernel failed,
nothing was found, an export could not be made); 2 a usage error: the command line, or a file,
database or setting it names, cannot be used; nothing was written. A user mistake is reported in
one line on stderr; ``--debug`` shows the traceback instead, and a bug in gemmscape always does.

One module per command group adds its subcommands (``register(commands)``, each set to run its own
``cmd_*`` function), in the order of ``COMMANDS``, which is the order ``codegen --help`` lists:
``kernel`` (compile, bench), ``search`` (search, sweep), ``export`` (export, with ``--bundle``),
``layer`` (tune-linear, pick-step, tune-model), ``prune`` (prune) and ``results`` (results, app). A new command is one
more such module in that list. What they share: ``options`` (argument types, the parser, option
builders, the problem and kernel variant of a command line) and ``checks`` (places on disk, the
cache and the store, checked before anything is written).
"""

from __future__ import annotations

import argparse
import os
import sys

from codegen import families
from codegen.cli import export, kernel, layer, prune, results, search
from codegen.cli.checks import no_gpu_line, one_line
from codegen.cli.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, Failure, UsageError
from codegen.cli.options import DEFAULT_FAMILY, Commands, HelpFormatter, Parser

#: The command modules, in the order ``codegen --help`` lists their commands.
COMMANDS = (kernel, search, export, layer, prune, results)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("gemmscape")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser(family: str = DEFAULT_FAMILY) -> argparse.ArgumentParser:
    """The parser, with ``family``'s variant options on compile and bench."""
    parser = Parser(prog="codegen", formatter_class=HelpFormatter,
                    description="gemmscape: generate, check and time CUDA GEMM kernels for the linear layer "
                                "Y = X·Wᵀ + b.",
                    epilog="exit codes: 0 done; 1 a failure or nothing found (a kernel failed, no result, no "
                           "export); 2 a usage error (the command line, or a file, database or setting it names, "
                           "cannot be used; nothing written)")
    parser.add_argument("--version", action="version", version=f"gemmscape {version()}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = Commands(parser, family)
    for module in COMMANDS:
        module.register(commands)
    return parser


def family_asked(argv: list[str] | None) -> str:
    """A first look at the command line for the family whose variant options compile and bench
    take: ``--family``, else the one the problem's dtype, layout, shape and W (dense, block-sparse
    with ``--block`` or 2:4 with ``--sparsity``) take on the arch (``--arch``, else $GEMMSCAPE_ARCH, else the visible GPU's;
    search.fit.default_family)."""
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False)
    for flag in ("--family", "--dtype", "--layout", "--arch", "--m", "--n", "--k", "--block", "--sparsity"):
        pre.add_argument(flag)
    pre.add_argument("--bias", action="store_true")
    known, _ = pre.parse_known_args(argv)
    if known.family in families.names():
        return known.family
    if not {"compile", "bench"} & set(argv):
        return DEFAULT_FAMILY
    from codegen.compile import default_arch
    from codegen.problem import DType, Layout, Problem
    from codegen.spec import DeviceLimits
    from search.fit import default_family

    try:
        dims = [int(v) if v is not None else 4096 for v in (known.m, known.n, known.k)]
        # a block-sparse W stands for any pattern of its block: the kernels' rules do not look at which
        sparse = {"block": int(known.block), "density": 0.5, "pattern": "any"} if known.block else {}
        problem = Problem(*dims, DType(known.dtype or "fp32"), Layout(known.layout or "forward"), bias=known.bias,
                          sparsity=known.sparsity or "", **sparse)
        limits = DeviceLimits.for_arch(known.arch or default_arch())
    except ValueError:  # a bad value: the parser proper says so
        return DEFAULT_FAMILY
    return default_family(problem, limits)


def _say(args: argparse.Namespace, message: str) -> None:
    print(f"codegen {getattr(args, 'command', '')}: {message}".replace("codegen : ", "codegen: "), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code (see the module docstring). A user mistake, a store
    that cannot be used, a compiler that cannot run and no GPU to run on become one line on stderr;
    with ``--debug`` they raise instead. Any other exception is a bug in gemmscape and keeps its
    traceback."""
    from sqlalchemy.exc import SQLAlchemyError

    from codegen.worker import WorkerUnavailable
    from store import StoreError

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(family_asked(argv)).parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        return args.func(args)
    except UsageError as e:
        if debug:
            raise
        _say(args, str(e))
        return EXIT_USAGE
    except Failure as e:
        if debug:
            raise
        _say(args, str(e))
        return EXIT_FAILURE
    except WorkerUnavailable as e:  # no GPU (codegen.worker.NoGpu), or one whose worker cannot start
        if debug:
            raise
        _say(args, no_gpu_line(e, getattr(args, "command", None)))
        return EXIT_USAGE
    except (StoreError, SQLAlchemyError) as e:
        if debug:
            raise
        _say(args, f"database error: {one_line(e)} (--debug shows the traceback)")
        return EXIT_FAILURE
    except BrokenPipeError:  # the reader of stdout went away (`codegen results --json | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except KeyboardInterrupt:
        if debug:
            raise
        _say(args, "interrupted")
        return EXIT_INTERRUPTED
