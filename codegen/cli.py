"""``codegen`` command line: compile, bench, search, sweep, export, results, app.

``--family NAME`` picks a kernel family (default simt; tune-linear and tune-model take it several
times and default to the dtype's families, codegen.nn.tune.DEFAULT_FAMILIES); the variant options are that family's own,
built from its spec's fields (``codegen bench --family NAME --help`` lists them).

Exit codes: 0 done; 1 it ran and the answer is a failure (a kernel failed, nothing was found, an
export could not be made); 2 a usage error: the command line, or a file, database or setting it
names, cannot be used; nothing was written. A user mistake is reported in one line on stderr;
``--debug`` shows the traceback instead, and a bug in gemmscape always does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from dataclasses import MISSING
from pathlib import Path

from codegen import families
from codegen.problem import DType, Layout, Problem
from codegen.spec import KernelSpec
from search import DEFAULT_SAMPLER, GPU_LOOKAHEAD, SAMPLERS

DEFAULT_FAMILY = "simt"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
SQLITE_HEADER = b"SQLite format 3\x00"


class UsageError(ValueError):
    """The command line, or a file, database or setting it names, cannot be used (exit 2)."""


class Failure(Exception):
    """The command ran and its answer is a failure or nothing found (exit 1)."""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("gemmscape")
    except PackageNotFoundError:
        return "unknown (not installed)"


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


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, got {value}")
    return value


def arch_name(text: str) -> str:
    if not re.fullmatch(r"sm_\d+a?", text):
        raise argparse.ArgumentTypeError(f"an arch looks like sm_90 or sm_80, got {text!r}")
    return text


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a database URL gemmscape can take (None: it looks like one)."""
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError

    if "://" not in url:
        path = Path(url).expanduser()
        return (f"{url!r} is a path, not a database URL; for a SQLite file write "
                f"sqlite:///{path.resolve() if not path.is_absolute() else path}")
    try:
        parsed = make_url(url)
    except ArgumentError:
        return f"{url!r} is not a database URL (e.g. sqlite:////abs/path/gemmscape.db or postgresql+psycopg://...)"
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        return f"{url!r}: gemmscape stores in SQLite or PostgreSQL, not {parsed.get_backend_name()}"
    return None


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


#: The options of a block-sparse W (argparse dests), as the command line spells them.
SPARSE_OPTIONS = {"block": "--block", "density": "--density", "pattern_seed": "--pattern-seed", "weights": "--weights"}


def add_problem_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    """--m, --n, --k, --dtype, --bias, and the options of a block-sparse W. --n and --k are checked
    by ``problem_from_args`` (not argparse): --weights gives them."""
    if required:
        m_none, nk_none = "", " (default: none; required unless --weights gives it)"
    else:
        m_none = nk_none = " (default: none; give all of --m, --n, --k or none; --weights gives --n, --k)"
    p.add_argument("--m", type=positive_int, required=required, help="batch (rows of X and Y)" + m_none)
    p.add_argument("--n", type=positive_int, help="out features (rows of W)" + nk_none)
    p.add_argument("--k", type=positive_int, help="in features" + nk_none)
    p.add_argument("--dtype", choices=[d.value for d in DType], default="fp32", help="element type")
    p.add_argument("--bias", action="store_true", help="add b[N] (with --layout grad_weight: also db[M] = sum of dY)")
    p.add_argument("--layout", choices=[v.value for v in Layout], default="forward",
                   help="which GEMM of the linear layer: forward Y = X·Wᵀ; grad_input dX[M,N] = dY[M,K]·W[K,N] "
                        "(M batch, N in, K out); grad_weight dW[M,N] = dY[K,M]ᵀ·X[K,N] (M out, N in, K batch). "
                        "--m, --n, --k are always the GEMM's output rows, output columns and reduction")
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
                        "N and K come from it, the kept blocks are its non-zero ones (default: none)")


DB_HELP = "store URL, sqlite:///PATH or postgresql+psycopg://... (default: $GEMMSCAPE_DB, else " \
          "sqlite:///~/.local/share/gemmscape/gemmscape.db)"


def add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=database_url, metavar="URL", help=DB_HELP)


def add_gpu_args(p: argparse.ArgumentParser, timeout: float) -> None:
    """Where results go and how kernels are built and run, for the commands that measure."""
    add_db_arg(p)
    p.add_argument("--arch", type=arch_name, help="target, e.g. sm_90 (default: $GEMMSCAPE_ARCH, else the visible GPU's)")
    p.add_argument("--timeout", type=positive_float, default=timeout, help="seconds before a kernel counts as hung")


def add_family_arg(p: argparse.ArgumentParser, what: str, default: str = DEFAULT_FAMILY) -> None:
    p.add_argument("--family", choices=families.names(), default=None,
                   help=f"kernel family {what} (default {default})")


def family_of_args(args: argparse.Namespace) -> str:
    return getattr(args, "family", None) or DEFAULT_FAMILY


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
        if problem is not None and (spec.dtype, spec.bias, block, layout) != \
                (problem.dtype, problem.bias, problem.block, problem.layout):
            raise UsageError(f"kernel {spec.name} is for {spec.dtype.value}, bias={spec.bias}, block={block}, "
                             f"layout={layout.value}; the problem is {problem.dtype.value}, bias={problem.bias}, "
                             f"block={problem.block}, layout={problem.layout.value}")
        return spec
    family = family_of_args(args)
    values = {f.name: getattr(args, f.name) for f in families.variant_fields(family)
              if getattr(args, f.name, None) is not None}
    if problem is not None:
        values.update(dtype=problem.dtype, bias=problem.bias)
        block, layout = problem.block, problem.layout
    else:
        values.update(dtype=DType(getattr(args, "dtype", "fp32")), bias=getattr(args, "bias", False))
        block, layout = getattr(args, "block", None) or 0, Layout(getattr(args, "layout", None) or "forward")
    if layout is not Layout.forward:
        if not families.takes_layouts(family):
            raise UsageError(f"the {family} family generates the forward layout only; choose --family "
                             + " or ".join(n for n in families.names() if families.takes_layouts(n)))
        values["layout"] = layout
    if block:
        if not families.takes_sparse(family):
            raise UsageError(f"the {family} family has no block-sparse variants; choose --family "
                             + " or ".join(n for n in families.names() if families.takes_sparse(n)))
        values["block"] = block
        values.setdefault("bn", block)  # a block tile spans one block row unless --bn parts it (tensorcore)
    try:
        return families.get(family).Spec(**values)
    except ValueError as e:
        raise UsageError(f"not a {family} variant: {e}") from None


def sparse_given(args: argparse.Namespace) -> list[str]:
    """The block-sparse options given, as spelled on the command line."""
    return [flag for dest, flag in SPARSE_OPTIONS.items() if getattr(args, dest, None) is not None]


def check_sparse_args(args: argparse.Namespace) -> None:
    """The block-sparse options go together: --block with --density (a random pattern, seeded by
    --pattern-seed) or with --weights (the file's pattern; with --density, pruned to it)."""
    given = sparse_given(args)
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
        if getattr(args, "m", None) is None:
            raise UsageError("a problem with --weights needs --m (--n and --k come from the file)")
        return True
    missing = [f"--{d}" for d in ("m", "n", "k") if f"--{d}" not in given]
    if missing and not given:
        raise UsageError(f"{', '.join(sparse)} describe the W of a problem: give --m, --n, --k too")
    if missing:
        raise UsageError(f"a problem needs all of --m, --n, --k: {', '.join(given)} given, "
                         f"{', '.join(missing)} missing")
    return True


def pattern_from_args(args: argparse.Namespace):
    """The block-sparse pattern the options name: random (--density, --pattern-seed), or the file's
    W (--weights): its non-zero blocks, or with --density its largest blocks."""
    from codegen import sparse

    # The pattern is of the layer's W [out, in]: the problem's [N, K] forward, [K, N] in grad_input.
    gi = Layout(getattr(args, "layout", None) or "forward") is Layout.grad_input
    rows, cols = ("k", "n") if gi else ("n", "k")
    if args.weights is None:
        try:
            return sparse.Pattern.random(getattr(args, rows), getattr(args, cols), args.block, args.density,
                                         args.pattern_seed or 0)
        except ValueError as e:
            raise UsageError(str(e)) from None
    try:
        w = sparse.load_weights(args.weights)
    except (ValueError, OSError) as e:
        raise UsageError(f"--weights: {e}") from None
    n, k = w.shape
    wrong = [f"--{d} {getattr(args, d)}" for d, size in ((rows, n), (cols, k))
             if getattr(args, d, None) is not None and getattr(args, d) != size]
    if wrong:
        shape = "K x N, out x in, in grad_input" if gi else "N x K"
        raise UsageError(f"{' and '.join(wrong)} {'does' if len(wrong) == 1 else 'do'} not match W in "
                         f"{args.weights}, which is {n}x{k} ({shape}); --weights gives N and K, so --n and --k "
                         f"can be left out")
    try:
        if args.density is None:
            return sparse.from_dense(w, args.block)[0]
        return sparse.prune_blocks(w, args.block, args.density)[0]
    except ValueError as e:
        raise UsageError(f"--weights {args.weights}: {e}") from None


def problem_from_args(args: argparse.Namespace) -> Problem:
    """The problem of the command line: dense, or with --block block-sparse (its pattern registered
    in this process by ``codegen.sparse.problem_for``)."""
    problem_given(args)
    layout = Layout(getattr(args, "layout", None) or "forward")
    if getattr(args, "block", None) is not None:
        from codegen.sparse import problem_for

        if layout is Layout.grad_weight:
            raise UsageError("--block: a block-sparse W is generated for --layout forward and grad_input, "
                             "not grad_weight")
        try:
            return problem_for(args.m, pattern_from_args(args), DType(args.dtype), bias=args.bias, layout=layout)
        except ValueError as e:
            raise UsageError(str(e)) from None
    try:
        return Problem(args.m, args.n, args.k, DType(args.dtype), layout, bias=args.bias)
    except ValueError as e:
        raise UsageError(str(e)) from None


def describe_problem(problem: Problem) -> str:
    """The problem's key, and for a block-sparse W how many blocks of what size it keeps."""
    if not problem.sparse:
        return problem.key
    from codegen.sparse import lookup

    p = lookup(problem)
    blocks = p.block_rows * p.block_cols
    return (f"{problem.key} (W {p.n}x{p.k} block-sparse: {p.nnzb} of {blocks} {p.block}x{p.block} blocks kept, "
            f"density {p.density:.4g})")


# ---- places on disk and the store: checked before anything is written ------------------------------
def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _can_create_in(folder: Path) -> str | None:
    """None when a file can be created in ``folder`` (tried with a temporary file, then removed)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def check_writable(path: Path, what: str, folder: bool) -> None:
    """``path`` (a folder when ``folder``, else a file) can be created or written; UsageError why not."""
    path = path.expanduser()
    if path.exists():
        if folder and not path.is_dir():
            raise UsageError(f"{what} {path} is a file, not a folder")
        if not folder and path.is_dir():
            raise UsageError(f"{what} {path} is a folder, not a file")
        where = path if folder else path.parent
    else:
        where = _nearest_existing(path.parent)
        if not where.is_dir():
            raise UsageError(f"{what} {path} is under {where}, which is a file, not a folder")
    reason = _can_create_in(where)
    if reason:
        raise UsageError(f"{what} {path} cannot be written: {where} is not writable ({reason})")
    if path.exists() and not folder and not os.access(path, os.W_OK):
        raise UsageError(f"{what} {path} is read-only")


def check_cache() -> None:
    """``$GEMMSCAPE_CACHE``, when set, must name a folder that can be written."""
    value = os.environ.get("GEMMSCAPE_CACHE")
    if value is None:
        return
    if not value.strip():
        raise UsageError("GEMMSCAPE_CACHE is set but empty: unset it (the cache is then ~/.cache/gemmscape) "
                         "or name a folder")
    check_writable(Path(value), "GEMMSCAPE_CACHE", folder=True)


def store_url(url: str | None) -> str:
    """The URL the store opens: ``--db``, else ``$GEMMSCAPE_DB``, else the default file (checked)."""
    from store.db import ENV_VAR, default_url

    if url:
        return url
    chosen = default_url()
    reason = url_problem(chosen)
    if reason:
        raise UsageError(f"{ENV_VAR}: {reason}")
    return chosen


def check_store(url: str | None, read_only: bool = False) -> str:
    """Check what ``url`` names before anything opens it: a SQLite file must be a SQLite database
    and, to write, writable (or creatable). Returns the URL to open."""
    from store.db import sqlite_path

    url = store_url(url)
    path = sqlite_path(url)
    if path is None:
        return url
    if path.is_dir():
        raise UsageError(f"the store {path} is a folder, not a database file")
    if path.exists():
        try:
            with path.open("rb") as f:
                head = f.read(len(SQLITE_HEADER))
        except OSError as e:
            raise UsageError(f"cannot read the store {path}: {e.strerror or e}") from None
        if head and head != SQLITE_HEADER:
            raise UsageError(f"{path} is not a SQLite database, so not a gemmscape store")
    elif read_only:
        raise Failure(f"no gemmscape database at {path}: run a search first (`codegen search ...`), or name one "
                      f"with --db URL or the GEMMSCAPE_DB environment variable")
    if not read_only:
        check_writable(path, "the store", folder=False)
    return url


def open_store(url: str | None, read_only: bool = False):
    """The store, opened after ``check_store``; a database that cannot be opened is a UsageError."""
    from sqlalchemy.exc import SQLAlchemyError

    from store import Store, StoreError

    url = check_store(url, read_only)
    try:
        store = Store(url, read_only=read_only)
        _ = store.ready  # connect now: an unreachable server is found here
    except ModuleNotFoundError as e:
        raise UsageError(f"no database driver for {_safe(url)} ({e.name} is not installed; for PostgreSQL: "
                         f"pip install 'gemmscape[postgres]')") from None
    except (StoreError, SQLAlchemyError, OSError) as e:
        raise UsageError(f"cannot open the store {_safe(url)}: {one_line(e)}") from None
    return store


def _safe(url: str) -> str:
    from sqlalchemy import make_url

    return make_url(url).render_as_string(hide_password=True)


def one_line(e: BaseException) -> str:
    """An exception as one line: a database error's own message, without SQLAlchemy's trailer."""
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).strip() or type(e).__name__
    return " ".join(line.strip() for line in text.splitlines()
                    if line.strip() and not line.strip().startswith("(Background on this error"))


def printer(to_stderr: bool):
    """``print`` for human lines: to stderr when stdout carries JSON."""
    return (lambda *a, **kw: print(*a, **kw, file=sys.stderr)) if to_stderr else print


# ---- commands -----------------------------------------------------------------------------------
def cmd_compile(args: argparse.Namespace) -> int:
    from codegen.compile import CompileError, compile_source, default_arch
    from codegen.render import render

    problem = problem_from_args(args) if problem_given(args) else None
    spec = spec_from_name(args.name, args) if args.name else spec_from_args(args, problem)
    check_cache()
    arch = args.arch or default_arch()
    reasons = spec.check(problem)
    if reasons:
        raise UsageError(f"invalid variant {spec.name}: " + "; ".join(reasons))
    source = render(spec)
    if args.source and not args.json:
        print(source)
    try:
        result = compile_source(source, spec.name, arch, target=families.compile_target(spec, arch))
    except CompileError as e:  # the variant's own compile log: the answer, not a usage error
        print(e, file=sys.stderr)
        return EXIT_FAILURE
    except (RuntimeError, ImportError) as e:  # NVRTC or the CUDA headers cannot be used here
        raise UsageError(f"the compiler cannot run here: {one_line(e)}") from None
    if args.json:
        print(json.dumps({"name": spec.name, **result.meta(),
                          **({"problem": problem.to_dict()} if problem is not None else {}),
                          **({"source": source} if args.source else {})}, indent=2))
        return EXIT_OK
    target = families.compile_target(spec, arch)
    print(f"{spec.name}  {arch}{f' (-arch={target})' if target != arch else ''}  NVRTC {result.nvrtc_version}  {len(result.cubin)} B cubin"
          f"{'  (cached)' if result.cached else f'  {result.seconds:.2f} s'}")
    if problem is not None:
        print(f"  problem {describe_problem(problem)}")
    print(f"  threads {spec.threads}, dynamic shared memory {spec.smem_bytes} B")
    for fn, r in result.report.items():
        print(f"  {fn}: {r.get('registers')} registers, {r.get('stack', 0)} B stack, "
              f"spills {r.get('spill_stores', 0)}/{r.get('spill_loads', 0)} B (st/ld), {r.get('barriers', 0)} barriers")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    from codegen.evaluate import Evaluator
    from codegen.worker import WorkerUnavailable

    problem = problem_from_args(args)
    spec = spec_from_args(args, problem)
    check_cache()
    if not args.no_store:
        check_store(args.db)  # before the GPU runs: a store that cannot take the trial is found now
    try:
        with Evaluator(arch=args.arch, baseline=not args.no_baseline, timeout_s=args.timeout) as ev:
            result, built = ev.evaluate(spec, problem)
            device, arch = ev.device(), ev.target_arch
    except WorkerUnavailable as e:
        raise UsageError(str(e)) from None
    if not args.no_store:  # nothing measured is lost: the trial goes to the store (no search run)
        store = open_store(args.db)
        record = built.kernel_record()
        record.setdefault("arch", arch)
        store.kernel(record)
        store.add_trial(None, spec.name, record["arch"], problem, store.device(device), None, result, spec.to_dict(),
                        source_hash=record.get("source_hash"))
    line = f"{problem.key}  {spec.name}  {result['status']}"
    if result["status"] == "ok":
        line += (f"  {result['median_ms'] * 1e3:.1f} us (p20 {result['p20_ms'] * 1e3:.1f}, p80 {result['p80_ms'] * 1e3:.1f})"
                 f"  {result['tflops']:.2f} TFLOP/s  {result['gbps']:.0f} GB/s  err {result['rel_error']:.1e}")
        for name, base in result["baselines"].items():
            line += f"  | {name} {base['median_ms'] * 1e3:.1f} us, ratio {result['ratio'][name]:.2f}"
    else:
        line += f"  {result['evidence'].strip().splitlines()[-1] if result['evidence'].strip() else ''}"
    printer(args.json)(line)
    if args.json:
        print(json.dumps({"device": device, "problem": problem.to_dict(), "kernel": spec.name, "result": result}))
    return EXIT_OK if result["status"] == "ok" else EXIT_FAILURE


def search_seeds(args: argparse.Namespace, problem: Problem, space, space_name: str, measurer, store):
    """What a search tries first (search.warm.Seeding): nothing with --no-seeds; the family's
    built-in seeds with --no-warm-start or --no-store; else the store's best kernels for the
    nearest problems (warm start). A study that has started already is resumed: no seeds."""
    from search import warm
    from search.runner import study_name

    if args.no_seeds:
        return warm.no_seeds("no seeds (--no-seeds)")
    name = study_name(problem, space.family, space_name, args.sampler, args.seed, measurer.device.get("name", "?"))
    if warm.study_started(store, name):
        return warm.resumed(name)
    if args.no_warm_start or store is None:
        found = warm.builtin_seeds(problem, space, measurer.limits)
        flag = "--no-warm-start" if args.no_warm_start else "--no-store: no history to start from"
        return warm.Seeding(found, "built-in" if found else "none", f"the family's built-in seeds ({flag})")
    return warm.warm_seeds(store, problem, space, measurer.device, limits=measurer.limits)


def say_seeds(say, seeding, quiet: bool) -> None:
    """The seeds a search tries first: a count with --quiet, else one line per seed."""
    n, mine = len(seeding.seeds), seeding.from_history
    if seeding.source in ("none", "resumed"):
        say(seeding.note)
        return
    count = f"{n} seed{'s' if n != 1 else ''}" + (f" ({mine} from the store, {n - mine} built-in)" if mine else "")
    if quiet:
        say(f"seeds: {count}")
        return
    dropped = len(seeding.dropped)
    say(f"seeds: {count}; {seeding.note}" + (f"; {dropped} left out (not points of this space, or invalid here)"
                                            if dropped else ""))
    for seed in seeding.seeds:
        say(f"  seed {seed.describe()}")


def cmd_search(args: argparse.Namespace) -> int:
    from codegen.versions import versions
    from search.measure import NoGpu, ReplayError, ReplayMeasurer
    from search.parallel import gpu_measurer
    from search.runner import run_search
    from search.space import space_for

    say = printer(args.json)
    problem = problem_from_args(args)
    command = "codegen " + " ".join(sys.argv[1:])
    if args.sampler == "gp":
        try:
            import scipy  # noqa: F401
            import torch  # noqa: F401
        except ImportError as e:
            raise UsageError(f"the gp sampler needs torch and scipy ({e.name} is missing): "
                             f"pip install 'gemmscape[gp]', or pick another --sampler") from None
    if args.replay:
        try:
            measurer = ReplayMeasurer(args.replay, problem)
        except ReplayError as e:
            raise UsageError(str(e)) from None
        space, space_name = measurer.space, "replay"
        if args.family and args.family != space.family:
            raise UsageError(f"{args.replay} records the {space.family} family, not {args.family}")
        store = None if args.no_store else open_store(args.db)
        where = (f"trials stored in {store.location} under the device \"{measurer.device['name']}\""
                 if store is not None else "nothing stored (--no-store)")
        print(f"replaying {args.replay}: recorded on {measurer.recorded['where']} at {measurer.recorded['when']}; "
              f"no GPU is used; {where}", file=sys.stderr)
        if not measurer.hashes_known:
            print("note: this recording does not say which source each result measured (no source hashes); "
                  "its results are not tied to today's templates", file=sys.stderr)
    else:
        space_name = "restricted" if args.restricted else "full"
        try:
            space = space_for(family_of_args(args), problem.dtype, args.restricted, block=problem.block,
                              layout=problem.layout)
        except ValueError as e:
            raise UsageError(str(e)) from None
        from codegen.nn.tune import generated

        why = generated(problem, space)
        if why is not None:
            raise UsageError(f"the {space.family} family generates no kernel for {problem.key}: {why}")
        check_cache()
        if not args.no_store:
            check_store(args.db)
        try:
            measurer = gpu_measurer(problem, args.gpus, arch=args.arch, timeout_s=args.timeout,
                                    baseline=not args.no_baseline)
        except NoGpu as e:
            raise UsageError(f"{e}; to search recorded H200 measurements without a GPU use --replay FILE "
                             f"(see README)") from None
        except ValueError as e:  # --gpus naming GPUs that are not there, or of different models
            raise UsageError(str(e)) from None
        try:
            store = None if args.no_store else open_store(args.db)
        except BaseException:
            measurer.close()
            raise
    try:
        seeding = search_seeds(args, problem, space, space_name, measurer, store)
    except BaseException:
        measurer.close()
        raise
    say_seeds(say, seeding, args.quiet)
    try:
        summary = run_search(problem, space, measurer, sampler=args.sampler, seed=args.seed, budget=args.budget,
                             space_name=space_name, store=store, lookahead=args.lookahead, progress=not args.quiet,
                             command=command, versions=versions(), seeds=seeding.points)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the run is marked ended; say how to resume
        print(f"codegen search: {e or 'interrupted'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        measurer.close()
    best = summary.best
    say(f"{summary.study}: {summary.evaluated} of {summary.budget} trials evaluated "
        f"({summary.evaluated_now} now, {summary.proposals} proposals) in {summary.wall_s:.1f} s; {summary.stopped}")
    if problem.sparse:
        say(f"  problem {describe_problem(problem)}")
    for line in summary.describe():
        say(f"  {line}")
    if summary.failures:
        say("  failures: " + ", ".join(f"{k} {v}" for k, v in summary.failures.most_common()))
    if best:
        ratio = best.get("ratio", {}).get("cublas")
        say(f"  best {best['kernel']}  {best['tflops']:.2f} TFLOP/s" + (f"  {ratio:.3f}x cuBLAS" if ratio else ""))
    if args.replay and measurer.best:
        say(f"  recorded best {measurer.best['kernel']}  {measurer.best['tflops']:.2f} TFLOP/s")
    if args.replay and store is not None:
        say(f"  stored under \"{measurer.device['name']}\": `codegen results`, `codegen export --best ...` and "
            f"`codegen app` show them, marked as a recording")
    if args.json:
        print(json.dumps({"study": summary.study, "device": measurer.device, "recorded": bool(args.replay),
                          "store": store.location if store is not None else None,
                          "evaluated": summary.evaluated, "wall_s": summary.wall_s,
                          "gpu_wait_s": summary.gpu_wait_s, "best": best, "failures": dict(summary.failures),
                          "history": summary.history, "stopped": summary.stopped, "seeds": seeding.to_dict(),
                          "sampler": args.sampler, "seeded": summary.seeded, "handover": summary.handover,
                          "proposals": {"all": summary.proposals, "sampler": summary.sampler_proposals,
                                        "valid": summary.valid_proposals, "new": summary.new_proposals,
                                        "replaced": summary.replaced, "valid_fraction": summary.valid_fraction},
                          "times_s": summary.times}))
    return EXIT_OK if best else EXIT_FAILURE


def cmd_sweep(args: argparse.Namespace) -> int:
    from search.measure import GpuMeasurer, NoGpu
    from search.space import narrowings, space_for

    problem = problem_from_args(args)
    if args.space not in narrowings(family_of_args(args)):
        raise UsageError(f"--space {args.space}: the {family_of_args(args)} family's narrowings are "
                         f"{', '.join(narrowings(family_of_args(args)))}")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out} already exists; a sweep does not overwrite a recording: remove it or "
                         f"choose another name")
    check_writable(args.out, "--out", folder=False)
    try:
        space = space_for(family_of_args(args), problem.dtype, restricted=args.space, block=problem.block,
                          layout=problem.layout)
    except ValueError as e:
        raise UsageError(str(e)) from None
    check_cache()
    check_store(args.db)
    earlier = None
    if args.resume is not None:
        try:
            earlier = json.loads(args.resume.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"--resume {args.resume}: cannot read it as a recording ({e})") from None
        if not isinstance(earlier, dict) or earlier.get("problem") != problem.to_dict() or \
                earlier.get("space") != space.to_dict():
            raise UsageError(f"--resume {args.resume} is not a recording of {problem.key} over the "
                             f"{args.space} space")
    try:
        measurer = GpuMeasurer(problem, arch=args.arch, timeout_s=args.timeout)
    except NoGpu as e:
        raise UsageError(str(e)) from None
    from search.sweep import sweep

    try:
        doc = sweep(problem, space, measurer,
                    store=open_store(args.db), command="codegen " + " ".join(sys.argv[1:]), space_name=args.space,
                    max_seconds=args.max_seconds, resume=earlier)
    finally:
        measurer.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=0) + "\n")
    ok = [r for r in doc["results"].values() if r["status"] == "ok"]
    print(f"{len(doc['results'])} kernels measured, {len(ok)} ok; wrote {args.out}")
    return EXIT_OK


def _device_list(store) -> str:
    return "; ".join(f"{d['id']} {d['name']}" for d in store.devices()) or "none"


def _given_device(store, given: str | None) -> dict | None:
    """The store's device named by ``--device`` (an id or a name), None when not given."""
    if not given:
        return None
    device = store.find_device(given)
    if device is None:
        raise UsageError(f"no single device {given!r} in {store.location} (id or name; there: {_device_list(store)})")
    return device


def cmd_export_bundle(args: argparse.Namespace) -> int:
    """``codegen export --bundle DIR``: the best kernel of every tuned problem, with one index."""
    from codegen.nn.bundle import write_bundle

    given = [f for f, v in (("--best", args.best), ("--kernel", args.kernel), ("--out", args.out)) if v]
    given += [f"--{d}" for d in ("m", "n", "k") if getattr(args, d, None) is not None] + sparse_given(args)
    if given:
        raise UsageError(f"--bundle exports every tuned problem; drop {', '.join(given)}")
    check_writable(args.bundle, "--bundle", folder=True)
    store = open_store(args.db, read_only=True)
    device = _given_device(store, args.device)
    index = write_bundle(store, args.bundle, device_id=device["id"] if device else None, family=args.family)
    for s in index["skipped"]:
        print(f"skipped {s['problem']} on {s['device']}: {s['reason']}", file=sys.stderr)
    if not index["kernels"]:
        raise Failure(f"no kernel could be exported from {store.location}" +
                      (" (all skipped, see above)" if index["skipped"] else ": nothing tuned yet (`codegen tune-linear`)"))
    devices = sorted({e["device"] for e in index["kernels"]})
    print(f"wrote {len(index['kernels'])} kernels ({len({e['key'] for e in index['kernels']})} problems, "
          f"{len(devices)} device{'s' if len(devices) != 1 else ''}) and {args.bundle / 'index.json'}")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from codegen.export import ExportError, export_kernel, write_export
    from store.records import is_recorded

    if args.bundle is not None:
        return cmd_export_bundle(args)
    if args.out is None:
        raise UsageError("give --out DIR (one kernel) or --bundle DIR (every tuned kernel)")
    if args.best and args.kernel:
        raise UsageError("give --best (the fastest kernel for a problem) or --kernel NAME, not both")
    if not args.best and not args.kernel:
        raise UsageError("give --best with a problem (--m, --n, --k), or --kernel NAME")
    problem = problem_from_args(args) if problem_given(args) else None
    if args.best and problem is None:
        raise UsageError("--best needs the problem: --m, --n, --k (and --dtype, --bias)")
    check_writable(args.out, "--out", folder=True)
    store = open_store(args.db, read_only=True)
    device = _given_device(store, args.device)
    device_id = device["id"] if device else None
    arch = source = None
    name = args.kernel
    if args.best:
        row = store.best_for(problem, device_id=device_id, family=args.family)
        if row is None:
            on = f" on {device['name']}" if device else ""
            of = f" of the {args.family} family" if args.family else ""
            raise Failure(f"no ok kernel{of} stored for {problem.key}{on} in {store.location}")
        name, arch, source, device_id = row["kernel"], row["arch"], row["source_hash"], row["device_id"]
        others = {r["device"] for r in store.best(problem, family=args.family)} - {row["device"]}
        print(f"fastest for {problem.key}: {name}, {row['median_ms'] * 1e3:.1f} us, {row['tflops']:.2f} TFLOP/s "
              f"on {row['device']}" + (" (a recording, replayed; not measured live)" if is_recorded(row["device"]) else "")
              + (f"; the fastest over {len(others) + 1} devices" if others and device is None else ""),
              file=sys.stderr)
    record = store.kernel_record(name)
    if record is not None and args.family and record["family"] != args.family:
        raise UsageError(f"kernel {name} is of the {record['family']} family, not {args.family}")
    try:
        texts = export_kernel(store, name, problem, arch=arch, source_hash=source, device_id=device_id,
                              unmeasured_render=True)
    except ExportError as e:
        raise Failure(str(e)) from None
    doc = json.loads(texts[1])
    if doc.get("measured_other_source"):
        print(f"note: {name} was measured with source {str(doc['measured_other_source']['source_hash'])[:12]}…, "
              f"which is not stored and which the templates no longer render; this export is today's render, "
              f"not measured (the manifest's measured_other_source says what was)", file=sys.stderr)
    cu, js = write_export(args.out, name, texts)
    print(f"wrote {cu} and {js}")
    return EXIT_OK


def cmd_tune_linear(args: argparse.Namespace) -> int:
    from codegen.nn.tune import LayerShape, layer_problems

    shape = LayerShape(args.batch, args.in_features, args.out_features, DType(args.dtype), args.bias)
    print(f"layer {shape.describe()}: forward, grad_input and grad_weight GEMMs", file=sys.stderr)
    return run_tuning(args, layer_problems({shape: ["layer"]}))


def cmd_pick_step(args: argparse.Namespace) -> int:
    """``codegen pick-step``: a layer's three kernels picked by the train step's time (codegen.nn.step),
    written as a bundle with the timings beside its index (step-pick.json)."""
    import datetime as dt

    dtype = DType(args.dtype)
    if dtype not in (DType.fp32, DType.fp16, DType.bf16):
        raise UsageError(f"--dtype {dtype.value}: pick-step runs the layer in torch, whose dtypes are fp32, fp16, bf16")
    try:
        import torch
    except ImportError:
        raise UsageError("pick-step times the layer's train step in torch: install the torch extra "
                         "(pip install 'gemmscape[torch]')") from None
    if not torch.cuda.is_available():
        raise Failure("pick-step needs a CUDA GPU visible to torch")
    from codegen.export import export_kernel
    from codegen.nn import step as steps
    from codegen.nn.bundle import pick_stored, write_bundle
    from codegen.versions import versions

    check_writable(args.bundle, "--bundle", folder=True)
    store = open_store(args.db, read_only=True)
    device = torch.cuda.get_device_name()
    step = steps.Step(args.batch, args.in_features, args.out_features, dtype, args.bias)
    try:
        found = steps.pick(store, step, device, args.candidates, args.reps,
                           progress=(lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr)))
    except ValueError as e:
        raise Failure(str(e)) from None
    by_key = {step.problems[lay].key: row for lay, row in found["chosen"].items()}

    def choose(st, problem, rows):  # the step's choice for the layer's GEMMs, the store's own for any other
        row = by_key.get(problem.key)
        if row is None or row["device"] != rows[0]["device"]:
            return pick_stored(st, problem, rows)
        return (row, *export_kernel(st, row["kernel"], problem, arch=row["arch"], source_hash=row["source_hash"],
                                    device_id=row["device_id"]))

    index = write_bundle(store, args.bundle, choose=choose)
    doc = {"suite": "step_pick", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "device": device,
           "versions": {**versions(), "torch": torch.__version__}, "command": "codegen " + " ".join(sys.argv[1:]),
           "layer": {"batch": args.batch, "in": args.in_features, "out": args.out_features, "dtype": dtype.value,
                     "bias": args.bias},
           "timing": {"reps": args.reps, "rounds": 5, "l2_flush_bytes": steps.FLUSH_BYTES,
                      "note": "CUDA-event-timed graph replays of forward + autograd.grad, the L2 flushed before each"},
           "chosen": {lay.value: r["kernel"] for lay, r in found["chosen"].items()},
           "store_pick": {lay.value: r["kernel"] for lay, r in found["store_pick"].items()},
           "final": found["final"], "trials": found["trials"]}
    (args.bundle / "step-pick.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    fin = found["final"]
    for lay, row in found["chosen"].items():
        print(f"{lay.value:11s} {row['kernel']}" + ("" if row["id"] == found["store_pick"][lay]["id"] else
                                                   f"  (the store's pick: {found['store_pick'][lay]['kernel']})"))
    print(f"train step {fin['chosen']['median_us']:.1f} us (range {fin['chosen']['min_us']:.1f}-"
          f"{fin['chosen']['max_us']:.1f}) against {fin['store_pick']['median_us']:.1f} us with the store's pick; "
          f"wrote {len(index['kernels'])} kernels and {args.bundle / 'index.json'}")
    return EXIT_OK


def cmd_tune_model(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError("tune-model reads a PyTorch model: pip install 'gemmscape[torch]'") from None
    from codegen.nn.tune import layer_problems, linear_layers, load_model

    try:
        model = load_model(args.model)
        shapes = linear_layers(model, args.batch, DType(args.dtype) if args.dtype else None)
    except ValueError as e:
        raise UsageError(f"{args.model}: {e}") from None
    if not shapes:
        raise Failure(f"{args.model} has no nn.Linear layer")
    layers = sum(len(v) for v in shapes.values())
    print(f"{layers} linear layer{'s' if layers != 1 else ''}, {len(shapes)} distinct shape"
          f"{'s' if len(shapes) != 1 else ''} at batch {args.batch}:", file=sys.stderr)
    for shape, names in shapes.items():
        shown = ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")
        print(f"  {shape.describe()}: {shown}", file=sys.stderr)
    return run_tuning(args, layer_problems(shapes))


def run_tuning(args: argparse.Namespace, problems: dict) -> int:
    """Tune ``problems`` (Problem -> layer names) as tune-linear and tune-model ask; a summary table."""
    from codegen.nn.tune import tune
    from codegen.versions import versions
    from search.measure import NoGpu, ReplayError, ReplayMeasurer

    asked = args.family  # None: each dtype's default families (codegen.nn.tune.DEFAULT_FAMILIES)
    space_name = "restricted" if args.restricted else "full"
    seeding = argparse.Namespace(no_seeds=False, no_warm_start=args.no_warm_start, sampler=args.sampler, seed=args.seed)
    results_skipped = []
    if args.replay:
        try:
            recorded = ReplayMeasurer(args.replay)
        except ReplayError as e:
            raise UsageError(str(e)) from None
        if asked and set(asked) != {recorded.space.family}:
            raise UsageError(f"{args.replay} records the {recorded.space.family} family, not "
                             f"{', '.join(dict.fromkeys(asked))}")
        space_name = "replay"
        for p in [p for p in problems if p != recorded.problem]:
            print(f"skip {p.key}: {args.replay} records {recorded.problem.key}", file=sys.stderr)
            results_skipped.append(p)
        problems = {p: v for p, v in problems.items() if p == recorded.problem}

        def make_measurer(problem):
            return ReplayMeasurer(args.replay, problem)
    else:
        check_cache()
        from search.parallel import gpu_measurer

        def make_measurer(problem):
            return gpu_measurer(problem, None, arch=args.arch, timeout_s=args.timeout, baseline=not args.no_baseline)
    if not args.no_store:
        check_store(args.db)
    store = None if args.no_store else open_store(args.db)

    def seeds_for(problem, space, measurer, store):
        return search_seeds(seeding, problem, space, space_name, measurer, store)

    try:
        results = tune(problems, list(dict.fromkeys(asked)) if asked else None, make_measurer, budget=args.budget, store=store, sampler=args.sampler,
                       seed=args.seed, restricted=args.restricted, progress=not args.quiet,
                       say=lambda line: print(line, file=sys.stderr), seeds_for=seeds_for,
                       command="codegen " + " ".join(sys.argv[1:]), versions=versions(),
                       space=recorded.space if args.replay else None)
    except NoGpu as e:
        raise UsageError(f"{e}; to tune from a recording without a GPU use --replay FILE") from None
    except KeyboardInterrupt as e:
        print(f"codegen {args.command}: {e or 'interrupted'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(tuning_table(results, results_skipped))
    if store is not None and any(r.summary is not None and r.summary.best for r in results):
        print(f"stored in {store.location}: `codegen export --bundle DIR` writes them for codegen.nn", file=sys.stderr)
    return EXIT_OK if any(r.summary is not None and r.summary.best for r in results) else EXIT_FAILURE


def tuning_table(results: list, not_recorded: list | None = None) -> str:
    """One line per GEMM and family searched: layout, problem, the best kernel or why none, and what it
    serves; where several families ran a GEMM, ``*`` marks the fastest (what a bundle takes)."""
    fastest: dict = {}
    for r in results:
        best = r.summary.best if r.summary is not None else None
        if best and best["tflops"] > fastest.get(r.problem, (None, -1.0))[1]:
            fastest[r.problem] = (r, best["tflops"])
    several = {p for p in fastest
               if sum(r.problem == p and r.summary is not None and bool(r.summary.best) for r in results) > 1}
    lines = [f"{'layout':12s} {'problem':34s} {'best kernel':62s} {'TFLOP/s':>8s} {'x cuBLAS':>8s}  layers"]
    for r in results:
        layers = ", ".join(dict.fromkeys(r.layers))
        best = r.summary.best if r.summary is not None else None
        if best:
            ratio = best.get("ratio", {}).get("cublas")
            mark = " *" if r.problem in several and fastest[r.problem][0] is r else ""
            lines.append(f"{r.problem.layout.value:12s} {r.problem.key:34s} {best['kernel']:62s} "
                         f"{best['tflops']:8.2f} {(f'{ratio:.3f}' if ratio else '-'):>8s}  {layers}{mark}")
        else:
            why = f"skipped ({r.family}): {r.skipped}" if r.skipped and r.family else \
                f"skipped: {r.skipped}" if r.skipped else f"no ok kernel: {r.summary.stopped}"
            lines.append(f"{r.problem.layout.value:12s} {r.problem.key:34s} {why[:62]:62s} {'-':>8s} {'-':>8s}  {layers}")
    for p in not_recorded or []:
        lines.append(f"{p.layout.value:12s} {p.key:34s} {'skipped: not in the recording':62s} {'-':>8s} {'-':>8s}")
    return "\n".join(lines)


def cmd_results(args: argparse.Namespace) -> int:
    store = open_store(args.db, read_only=True)
    rows = store.best(per_problem=args.top)
    if args.json:
        print(json.dumps(rows, default=str, indent=1))
        return EXIT_OK if rows else EXIT_FAILURE
    if not rows:
        raise Failure(f"no results in {store.location} yet: run `codegen search` first")
    width = max(30, *(len(str(r["problem"])) for r in rows))  # a block-sparse key is longer
    head = f"{'problem':{width}s} {'kernel':62s} {'median us':>10s} {'TFLOP/s':>8s} {'GB/s':>7s} {'x cuBLAS':>8s}  device"
    print(head)
    for r in rows:
        ratio = f"{r['ratio_cublas']:.3f}" if r.get("ratio_cublas") else "-"
        print(f"{r['problem']:{width}s} {r['kernel']:62s} {r['median_ms'] * 1e3:10.1f} {r['tflops']:8.2f} "
              f"{r['gbps']:7.0f} {ratio:>8s}  {r['device']}")
    if any(r.get("recorded") for r in rows):
        print("(a device named \"... (recorded DATE, FILE)\" holds results replayed from a recording, not measured "
              "live)", file=sys.stderr)
    return EXIT_OK


def cmd_app(args: argparse.Namespace) -> int:
    from app.launch import run
    from store.db import sqlite_path

    url = store_url(args.db)
    path = sqlite_path(url)
    if path is not None and path.exists():
        check_store(url, read_only=True)
    elif args.db and path is not None:
        raise UsageError(f"no gemmscape database at {path}")
    print(f"dashboard on http://127.0.0.1:{args.port}, reading {_safe(url)} read-only (Ctrl-C stops it)",
          file=sys.stderr)
    return run(args.db, args.port)


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
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text, formatter_class=HelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of an error")
        return p

    p = command("compile", "render and NVRTC-compile one variant (no GPU needed); print its resources")
    p.add_argument("name", nargs="?", help="kernel name (default: built from the options)")
    add_problem_args(p, required=False)
    add_family_arg(p, "of the variant options below")
    add_spec_args(p, family)
    p.add_argument("--arch", type=arch_name, help="target, e.g. sm_90 (default: $GEMMSCAPE_ARCH, else the visible "
                   "GPU's, else sm_90)")
    p.add_argument("--source", action="store_true", help="print the CUDA source too (with --json: as \"source\")")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=cmd_compile)

    p = command("bench", "validate and time one variant and the cuBLAS baseline on the GPU")
    add_problem_args(p)
    add_family_arg(p, "of the variant options below")
    add_spec_args(p, family)
    add_gpu_args(p, timeout=60.0)
    p.add_argument("--no-baseline", action="store_true", help="skip cuBLAS (torch) timing")
    p.add_argument("--no-store", action="store_true", help="do not record the trial")
    p.add_argument("--json", action="store_true", help="JSON on stdout (the result line goes to stderr)")
    p.set_defaults(func=cmd_bench)

    p = command("search", "search the space with Optuna on the GPU (or over a recording with --replay)")
    add_problem_args(p)
    add_family_arg(p, "whose space is searched")
    p.add_argument("--sampler", default=DEFAULT_SAMPLER, choices=list(SAMPLERS),
                   help=f"sampler (default {DEFAULT_SAMPLER}, chosen on the replay recordings: see README)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed")
    p.add_argument("--budget", type=positive_int, default=200,
                   help="evaluated (compiled and run) trials, across resumed runs")
    p.add_argument("--restricted", action="store_true", help="search the restricted space (the one sweeps record)")
    p.add_argument("--replay", type=Path, metavar="FILE",
                   help="answer from a recorded sweep, no GPU; trials are stored under a device named as a "
                        "recording (default: none, measure on the GPU)")
    p.add_argument("--no-warm-start", action="store_true",
                   help="do not start from the store's best kernels for the nearest problems (same family, dtype "
                        "and GPU); try only the family's built-in seeds first")
    p.add_argument("--no-seeds", action="store_true",
                   help="try no known points first: neither the store's (warm start) nor the family's built-in seeds")
    add_gpu_args(p, timeout=30.0)
    p.add_argument("--no-store", action="store_true", help="do not record the trials")
    p.add_argument("--lookahead", type=positive_int, default=GPU_LOOKAHEAD,
                   help="candidates compiling ahead of the GPU; search.GPU_LOOKAHEAD says why this many")
    p.add_argument("--gpus", metavar="all|0,1,...", default=None,
                   help="measure on these GPUs, one worker each, over one study (default: GPU 0)")
    p.add_argument("--no-baseline", action="store_true", help="skip cuBLAS (torch) timing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="JSON on stdout (the summary lines go to stderr)")
    p.set_defaults(func=cmd_search)

    p = command("sweep", "measure every valid point of a narrowed space; write a replay recording")
    add_problem_args(p)
    add_family_arg(p, "whose narrowed space is swept")
    p.add_argument("--space", default="restricted", metavar="NAME",
                   help="which narrowing of the family's space: restricted (default) or one of its larger "
                        "NARROWINGS (simt: skinny; tensorcore: large)")
    p.add_argument("--max-seconds", type=float, default=None, metavar="S",
                   help="start no kernel after S seconds; the recording then says it is partial (default: none, "
                        "every valid kernel)")
    p.add_argument("--resume", type=Path, default=None, metavar="FILE",
                   help="a partial recording of the same problem and space: keep its results (where the source "
                        "is unchanged) and measure the rest into --out (default: none)")
    p.add_argument("--out", type=Path, required=True, metavar="FILE",
                   help="the recording to write (a new file)")
    add_gpu_args(p, timeout=30.0)
    p.set_defaults(func=cmd_sweep)

    p = command("export", "write <name>.cu and <name>.json that run without gemmscape")
    add_problem_args(p, required=False)
    p.add_argument("--best", action="store_true", help="the fastest stored kernel for the problem")
    p.add_argument("--kernel", metavar="NAME", help="a kernel by name (default: none; give it or --best)")
    add_family_arg(p, "to export (with --best: the fastest of that family)", default="any family")
    p.add_argument("--device", metavar="NAME|ID",
                   help="the device whose measurement counts, by id or name as `codegen results` shows "
                        "(default: the fastest over all devices)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="folder to write into, created if missing (default: none; needed unless --bundle)")
    p.add_argument("--bundle", type=Path, metavar="DIR",
                   help="write the fastest kernel of every tuned problem (per device; with --device, --family: "
                        "of those) and one index.json that codegen.nn loads without the store (default: none)")
    add_db_arg(p)
    p.set_defaults(func=cmd_export)

    p = command("tune-linear", "tune the three GEMMs of one linear layer (forward, grad_input, grad_weight)")
    p.add_argument("--batch", type=positive_int, required=True, help="rows of X (tokens per step)")
    p.add_argument("--in", dest="in_features", type=positive_int, required=True, metavar="IN", help="in features")
    p.add_argument("--out", dest="out_features", type=positive_int, required=True, metavar="OUT",
                   help="out features")
    p.add_argument("--dtype", choices=[d.value for d in DType], default="fp32", help="element type")
    p.add_argument("--bias", action="store_true", help="the layer has a bias (forward adds b, grad_weight gives db)")
    add_tune_args(p)
    p.set_defaults(func=cmd_tune_linear)

    p = command("pick-step", "pick a tuned layer's three kernels by the train step's time (CUDA graph replays), "
                "into a bundle; needs torch and a GPU")
    p.add_argument("--batch", type=positive_int, required=True, help="rows of X (tokens per step)")
    p.add_argument("--in", dest="in_features", type=positive_int, required=True, metavar="IN", help="in features")
    p.add_argument("--out", dest="out_features", type=positive_int, required=True, metavar="OUT",
                   help="out features")
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32", help="element type")
    p.add_argument("--bias", action="store_true", help="the layer has a bias")
    p.add_argument("--bundle", type=Path, required=True, metavar="DIR",
                   help="folder to write the bundle to (the layer's picks; the store's own pick for any other problem)")
    p.add_argument("--candidates", type=positive_int, default=12,
                   help="stored kernels tried per GEMM, fastest alone first")
    p.add_argument("--reps", type=positive_int, default=30, help="timed graph replays per step tried")
    p.add_argument("--quiet", action="store_true", help="no line per step tried")
    add_db_arg(p)
    p.set_defaults(func=cmd_pick_step)

    p = command("tune-model", "tune every nn.Linear of a PyTorch model (identical shapes once); needs torch")
    p.add_argument("model", metavar="MODEL", help="FILE.py:FACTORY (called with no arguments) or a module saved "
                   "whole with torch.save (.pt/.pth)")
    p.add_argument("--batch", type=positive_int, required=True, help="rows of X (tokens per step) for every layer")
    p.add_argument("--dtype", choices=[d.value for d in DType], default=None,
                   help="element type (default: each layer's weight dtype)")
    add_tune_args(p)
    p.set_defaults(func=cmd_tune_model)

    p = command("results", "the best kernels per problem and device")
    add_db_arg(p)
    p.add_argument("--top", type=positive_int, default=1, help="kernels per problem and device")
    p.add_argument("--json", action="store_true", help="the rows as one JSON list on stdout")
    p.set_defaults(func=cmd_results)

    p = command("app", "the Streamlit dashboard on 127.0.0.1 (database opened read-only)")
    add_db_arg(p)
    p.add_argument("--port", type=port_number, default=8501, help="port on 127.0.0.1")
    p.set_defaults(func=cmd_app)
    return parser


def add_tune_args(p: argparse.ArgumentParser) -> None:
    """What tune-linear and tune-model share with ``codegen search``."""
    p.add_argument("--family", choices=families.names(), action="append", default=None,
                   help="kernel family whose space is searched; repeat it for several (each GEMM is searched in "
                        "each; the store keeps all and a bundle takes the fastest). default per dtype: fp32 simt, "
                        "tf32 tensorcore, fp16 and bf16 tensorcore and hopper (skipped with its reason off sm_90)")
    p.add_argument("--budget", type=positive_int, default=200, help="evaluated trials per GEMM and family")
    p.add_argument("--sampler", default=DEFAULT_SAMPLER, choices=list(SAMPLERS),
                   help=f"sampler (default {DEFAULT_SAMPLER}, as codegen search)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed")
    p.add_argument("--restricted", action="store_true", help="search the restricted space")
    p.add_argument("--no-warm-start", action="store_true", help="start from the family's built-in seeds only")
    p.add_argument("--replay", type=Path, metavar="FILE",
                   help="answer from a recorded sweep, no GPU: only the GEMM it recorded is tuned, the others "
                        "are skipped (default: none, measure on the GPU)")
    add_gpu_args(p, timeout=30.0)
    p.add_argument("--no-store", action="store_true", help="do not record the trials")
    p.add_argument("--no-baseline", action="store_true", help="skip cuBLAS (torch) timing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def family_asked(argv: list[str] | None) -> str:
    """A first look at the command line for ``--family`` (the variant options depend on it)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--family")
    known, _ = pre.parse_known_args(sys.argv[1:] if argv is None else argv)
    return known.family if known.family in families.names() else DEFAULT_FAMILY


def _say(args: argparse.Namespace, message: str) -> None:
    print(f"codegen {getattr(args, 'command', '')}: {message}".replace("codegen : ", "codegen: "), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code (see the module docstring). A user mistake, a store
    that cannot be used and a compiler that cannot run become one line on stderr; with ``--debug``
    they raise instead. Any other exception is a bug in gemmscape and keeps its traceback."""
    from sqlalchemy.exc import SQLAlchemyError

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
