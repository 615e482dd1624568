"""Tuning whole layers and models: the three GEMMs of each linear layer, each searched once per family.

``layer_problems`` lists the GEMMs of a set of layers (identical shapes once), and ``tune`` runs
the search (search.runner.run_search, as ``codegen search`` calls it) for each, in each family asked
for, else in every family that fits the problem (``families_for``: search.fit's rule, the one
``codegen search`` uses), skipping with its reason a family that generates no kernel for it (e.g.
Hopper's backward GEMMs of rows that break TMA's 16-byte rule, or any Hopper kernel off sm_90:
search.fit.generated). The store keeps every family's results, and a bundle or codegen.nn takes the
fastest; one progress bar counts all trials. Finding a model's layers needs torch
(``linear_layers``): its ``nn.Linear`` layers (``LayerShape``), its block-sparse ones
(``SparseShape``: a ``codegen.nn.sparse.BlockSparseLinear``, or a layer a pruned-model file names,
``codegen tune-model --pruned``), whose three GEMMs are block-sparse problems carrying the block, the
density and the pattern's hash, so that a bundle holds kernels per pattern, and its 2:4 ones
(``Sparse24Shape``: a ``codegen.nn.semisparse.Sparse24Linear``, or a layer a pruned-model file
prunes to 2:4), whose one GEMM is the forward with ``sparsity="2:4"`` (fp16 or bf16): their backward
runs on torch by design (Wᵀ is not 2:4 along its own K), so there is nothing of it to tune.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from codegen.problem import DType, Layout, Problem, linear_problems

__all__ = ["SPARSE24_BACKWARD", "LayerShape", "Sparse24Shape", "SparseShape", "TuneResult", "families_for",
           "layer_problems", "linear_layers", "load_model", "tune"]


@dataclass(frozen=True)
class LayerShape:
    """One linear layer as tuned: batch (rows of X), in and out features, dtype, bias."""

    batch: int
    in_features: int
    out_features: int
    dtype: DType
    bias: bool

    def problems(self) -> dict[Layout, Problem]:
        return linear_problems(self.batch, self.in_features, self.out_features, self.dtype, self.bias)

    def describe(self) -> str:
        return f"{self.batch}x{self.in_features}->{self.out_features} {self.dtype.value}" + (" +bias" if self.bias else "")


@dataclass(frozen=True)
class SparseShape:
    """One linear layer whose W is block-sparse (codegen.nn.sparse.BlockSparseLinear) as tuned: batch,
    in and out features, dtype, bias, and W's pattern of kept blocks by its hash (registered in this
    process: ``of`` registers it). Its GEMMs are the layer's own problems: the block-sparse forward,
    grad_input (W read as Wᵀ in BSR) and grad_weight sampled at the kept blocks."""

    batch: int
    in_features: int
    out_features: int
    dtype: DType
    bias: bool
    block: int
    density: float
    pattern: str

    @classmethod
    def of(cls, batch: int, pattern, dtype: DType, bias: bool) -> SparseShape:
        """The shape of a layer of ``pattern`` (a codegen.sparse.Pattern of W [out, in]), registered here."""
        from codegen import sparse

        return cls(batch, pattern.k, pattern.n, DType(dtype), bool(bias), pattern.block, pattern.density,
                   sparse.register(pattern))

    def problems(self) -> dict[Layout, Problem]:
        """The layer's three GEMMs (codegen.sparse.problem_for), as BlockSparseLinear.problems gives them."""
        from codegen import sparse

        pattern = sparse.lookup(self.pattern)
        return {layout: sparse.problem_for(self.batch, pattern, self.dtype, self.bias and layout is not Layout.grad_input,
                                           layout) for layout in Layout}

    def describe(self) -> str:
        return (f"{self.batch}x{self.in_features}->{self.out_features} {self.dtype.value}" + (" +bias" if self.bias else "")
                + f", W block-sparse: blocks of {self.block}, density {self.density:.4g}, pattern {self.pattern[:8]}")


#: Why a 2:4 layer's grad_input and grad_weight GEMMs are not tuned.
SPARSE24_BACKWARD = "on torch: a 2:4 W's backward is not generated"


@dataclass(frozen=True)
class Sparse24Shape:
    """One linear layer whose W is 2:4 sparse (codegen.nn.semisparse.Sparse24Linear) as tuned: batch,
    in and out features, dtype (fp16 or bf16: the sparse tensor cores'), bias. Its one GEMM is the 2:4
    forward, the problem ``Sparse24Linear.problem`` looks its kernel up by; its grad_input and
    grad_weight run on torch (``SPARSE24_BACKWARD``)."""

    batch: int
    in_features: int
    out_features: int
    dtype: DType
    bias: bool
    sparsity: str = "2:4"

    def problems(self) -> dict[Layout, Problem]:
        """The forward GEMM alone (a ValueError for a dtype the 2:4 kernels do not compute)."""
        return {Layout.forward: Problem(self.batch, self.out_features, self.in_features, self.dtype, Layout.forward,
                                        self.bias, sparsity=self.sparsity)}

    def describe(self) -> str:
        return (f"{self.batch}x{self.in_features}->{self.out_features} {self.dtype.value}" + (" +bias" if self.bias else "")
                + f", W {self.sparsity}: its forward alone (its grad GEMMs on torch)")


@dataclass
class TuneResult:
    """What tuning one problem gave: the search summary, or why it was skipped."""

    problem: Problem
    layers: list[str] = field(default_factory=list)  # names of the layers it serves
    skipped: str = ""
    summary: object | None = None
    family: str = ""


def layer_problems(shapes: dict[LayerShape | SparseShape | Sparse24Shape, list[str]]) -> dict[Problem, list[str]]:
    """Every GEMM of the given layers, each once, with the layers (names) that use it."""
    out: dict[Problem, list[str]] = {}
    for shape, names in shapes.items():
        for problem in shape.problems().values():
            out.setdefault(problem, []).extend(names)
    return out


class _Counting:
    """A measurer that also advances one shared progress bar per measured kernel."""

    def __init__(self, measurer, bar) -> None:
        self._m, self._bar = measurer, bar

    def __getattr__(self, name):
        return getattr(self._m, name)

    def __len__(self) -> int:
        return len(self._m)

    def next_done(self):
        done = self._m.next_done()
        self._bar.update(1)
        return done


def families_for(problem: Problem) -> tuple[str, ...]:
    """The families a GEMM is tuned in when none is named: those a search without ``--family``
    takes (search.fit.fitting, on sm_90's limits; the measurer's GPU is checked again before each
    search), fastest first; where none fits, the first that computes its dtype, to be skipped with
    its reason."""
    from search.fit import chosen, default_family, fitting

    found = tuple(f.family for f in chosen(fitting(problem, None)))
    return found or (default_family(problem, None),)


def _measurer_for(problem: Problem, current, make_measurer: Callable[[Problem], object]):
    """A measurer for ``problem``: the current one switched to it where it can be (one GPU worker for
    all of a tuning's searches), else a new one (the current closed)."""
    if current is not None and callable(getattr(current, "switch", None)):
        current.switch(problem)
        return current
    if current is not None:
        current.close()
    return make_measurer(problem)


def tune(problems: dict[Problem, list[str]], families, make_measurer: Callable[[Problem], object], *,
         budget: int, store=None, sampler: str = "tpe", seed: int = 0, restricted: bool = False,
         progress: bool = True, say: Callable[[str], None] = print, seeds_for=None, command: str = "",
         versions: dict | None = None, space=None) -> list[TuneResult]:
    """Search each problem once per family (``families``: a name, several, or None for
    every family that fits each problem, ``families_for``; ``budget`` evaluated trials each), skipping with one
    line each a problem a family does not generate, also on the measurer's device (the Hopper family
    off sm_90). ``make_measurer(problem)`` gives the measurer (closed here); ``space`` the space
    searched (a replay's; default: each family's, full or restricted); ``seeds_for(problem, space,
    measurer, store)`` the seeding (a search.warm.Seeding), default the family's built-in seeds. One
    tqdm bar counts all trials. Results come per problem, in family order."""
    from tqdm import tqdm

    from search import GPU_LOOKAHEAD
    from search.fit import generated
    from search.runner import run_search
    from search.space import space_for

    space_name = "replay" if space is not None else ("restricted" if restricted else "full")
    results: list[TuneResult] = []
    todo = []
    for problem, layers in problems.items():
        asked = (space.family,) if space is not None else (families,) if isinstance(families, str) else \
            tuple(families) if families else families_for(problem)
        for family in asked:
            try:
                space_here = space if space is not None else space_for(family, problem.dtype, restricted,
                                                                         block=problem.block, layout=problem.layout,
                                                                         sparsity=problem.sparsity)
            except ValueError as e:  # a family asked for that does not take the problem (a 2:4 W in a dense one)
                why = str(e)
                say(f"skip {problem.key}: {why}")
                results.append(TuneResult(problem, layers, skipped=why, family=family))
                continue
            why = generated(problem, space_here)
            if why is not None:
                say(f"skip {problem.key}: the {family} family generates no kernel for it ({why})")
                results.append(TuneResult(problem, layers, skipped=why, family=family))
            else:
                todo.append((problem, layers, family, space_here))
    bar = tqdm(total=budget * len(todo), desc=f"tuning {len(todo)} search{'es' if len(todo) != 1 else ''}",
               unit="trial", disable=not progress or not todo, dynamic_ncols=True, file=sys.stderr)
    measurer = None
    try:
        for problem, layers, family, space_here in todo:
            bar.set_postfix_str(f"{problem.key} {family}", refresh=True)
            start = bar.n
            measurer = _measurer_for(problem, measurer, make_measurer)
            try:
                limits = getattr(measurer, "limits", None)
                why = generated(problem, space_here, limits) if limits is not None and space is None else None
                if why is not None:  # e.g. the Hopper family on a GPU without sm_90
                    bar.write(f"skip {problem.key}: the {family} family generates no kernel for it here ({why})",
                              file=sys.stderr)
                    results.append(TuneResult(problem, layers, skipped=why, family=family))
                    bar.update(max(0, start + budget - bar.n))
                    continue
                if seeds_for is not None:
                    points = seeds_for(problem, space_here, measurer, store).points
                else:
                    from search.warm import builtin_seeds

                    points = [s.point for s in builtin_seeds(problem, space_here, measurer.limits)] or None
                summary = run_search(problem, space_here, _Counting(measurer, bar), sampler=sampler, seed=seed,
                                     budget=budget, space_name=space_name, store=store, lookahead=GPU_LOOKAHEAD,
                                     progress=False, command=command, versions=versions or {}, seeds=points)
            except BaseException:
                measurer.close()
                measurer = None
                raise
            bar.update(max(0, start + budget - bar.n))  # a search that stopped early (or resumed) fills its share
            results.append(TuneResult(problem, layers, summary=summary, family=family))
            best = summary.best
            bar.write(f"{problem.key} ({family}): " + (f"best {best['kernel']} {best['tflops']:.2f} TFLOP/s" if best
                                                       else f"no ok kernel ({summary.stopped})"), file=sys.stderr)
    finally:
        if measurer is not None:
            measurer.close()
        bar.close()
    order = {p: i for i, p in enumerate(problems)}
    return sorted(results, key=lambda r: order[r.problem])  # stable: family order within a problem


# ---- models (torch) ---------------------------------------------------------------------------------
def load_model(target: str, weights: bool = False):
    """The model ``target`` names: ``file.py:factory`` (called with no arguments; unless ``weights``,
    on torch's meta device where it can be, so no weights are allocated: tuning needs the shapes
    only) or a module saved whole with ``torch.save`` (.pt/.pth). Raises ValueError saying what is
    wrong."""
    import torch

    if ":" in target and not Path(target).exists():
        path_text, attr = target.rsplit(":", 1)
    else:
        path_text, attr = target, ""
    path = Path(path_text)
    if not path.is_file():
        raise ValueError(f"no file {path}")
    if path.suffix == ".py":
        if not attr:
            raise ValueError(f"name the factory in {path}: {path}:FUNCTION (called with no arguments)")
        spec = importlib.util.spec_from_file_location(f"gemmscape_model_{abs(hash(str(path.resolve())))}", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise ValueError(f"importing {path} failed: {type(e).__name__}: {e}") from None
        factory = getattr(module, attr, None)
        if factory is None:
            raise ValueError(f"{path} has no {attr}")
        if not callable(factory):
            model = factory
        else:
            model = None
            if not weights:
                try:  # shapes only: build on the meta device, no memory for the weights
                    with torch.device("meta"):
                        model = factory()
                except Exception:  # a factory that needs real tensors (loads weights, say): build it as is
                    model = None
            if model is None:
                try:
                    model = factory()
                except Exception as e:
                    raise ValueError(f"{path}:{attr}() failed: {type(e).__name__}: {e}") from None
    else:
        try:
            model = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:
            raise ValueError(f"cannot load {path} as a saved module: {type(e).__name__}: {e}") from None
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"{target} gives a {type(model).__name__}, not a torch.nn.Module")
    return model


def linear_layers(model, batch: int, dtype: DType | None = None, *, pruned: dict | None = None,
                  layers: str | None = None) -> dict[LayerShape | SparseShape | Sparse24Shape, list[str]]:
    """Every linear layer of ``model`` (by qualified name) grouped by shape at ``batch`` rows: an
    ``nn.Linear`` as a ``LayerShape``, a ``BlockSparseLinear`` as a ``SparseShape`` of its pattern, a
    ``Sparse24Linear`` as a ``Sparse24Shape``, and so is an ``nn.Linear`` that ``pruned`` names
    (codegen.nn.pruned.read_patterns: a pruned-model file's layers, name -> (pattern or "2:4",
    description)). The dtype is ``dtype``, else each layer's weight's (fp32, fp16, bf16; for a pruned
    layer, its stored values' in the file). ``layers``: only the layers whose name this regular
    expression matches (re.search). ValueError: a layer ``pruned`` names that the model does not have
    as a linear layer of that shape, a weight dtype gemmscape has no kernels for (for a 2:4 layer:
    other than fp16 and bf16), a ``layers`` that is no regular expression or matches no linear layer."""
    import re

    import torch

    from codegen.nn.semisparse import Sparse24Linear
    from codegen.nn.sparse import BlockSparseLinear

    by_torch = {torch.float32: DType.fp32, torch.float16: DType.fp16, torch.bfloat16: DType.bf16}
    try:
        regex = re.compile(layers) if layers is not None else None
    except re.error as e:
        raise ValueError(f"--layers {layers!r} is not a regular expression: {e}") from None
    pruned = pruned or {}
    found = {name: m for name, m in model.named_modules()
             if isinstance(m, torch.nn.Linear | BlockSparseLinear | Sparse24Linear)}
    for name, (pattern, info) in pruned.items():
        layer = found.get(name)
        out_f, in_f = info["shape"] if isinstance(pattern, str) else (pattern.n, pattern.k)
        if layer is None or (layer.out_features, layer.in_features) != (out_f, in_f):
            raise ValueError(f"the pruned file prunes layer {name or '(model)'} of W {out_f}x{in_f}, which the "
                             f"model does not have as a linear layer of that shape")
    shapes: dict[LayerShape | SparseShape | Sparse24Shape, list[str]] = {}
    for name, layer in found.items():
        if regex is not None and not regex.search(name):
            continue
        if name in pruned or isinstance(layer, BlockSparseLinear | Sparse24Linear):
            pattern, info = pruned[name] if name in pruned else (
                "2:4" if isinstance(layer, Sparse24Linear) else layer.pattern,
                {"dtype": getattr(layer, layer.STORED).dtype, "bias": layer.bias is not None})
            held = info["dtype"]  # a torch dtype (a layer of the model) or a DType value (the file's values)
            d = dtype or (by_torch.get(held) if not isinstance(held, str) else
                          DType(held) if held in DType._value2member_map_ else None)
            if d is None:
                shape = None
            elif isinstance(pattern, str):
                shape = Sparse24Shape(batch, layer.in_features, layer.out_features, d, bool(info["bias"]), pattern)
                if d not in (DType.fp16, DType.bf16):
                    given = f"--dtype {d.value}" if dtype else f"its values are {d.value}"
                    raise ValueError(f"layer {name or '(model)'} is {pattern} sparse, whose kernels compute fp16 or "
                                     f"bf16 only ({given}): give --dtype bf16 or fp16 (what it runs in, e.g. under "
                                     f"autocast), or leave it out with --layers")
            else:
                shape = SparseShape.of(batch, pattern, d, info["bias"])
        else:
            d = dtype or by_torch.get(layer.weight.dtype)
            shape = LayerShape(batch, layer.in_features, layer.out_features, d, layer.bias is not None) if d else None
            held = layer.weight.dtype
        if shape is None:
            raise ValueError(f"layer {name or '(model)'} holds {held} weights; give --dtype")
        shapes.setdefault(shape, []).append(name or "(model)")
    if regex is not None and not shapes:
        raise ValueError(f"--layers {layers!r} matches no linear layer of the model")
    return shapes
