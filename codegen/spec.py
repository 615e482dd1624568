"""What every kernel family shares: device limits, the shape of a spec (``SpecData``: its types,
dict and name read back), and the rules every family's ``check`` applies alike (``*_rules``).

A family's own spec (its dataclass, name, own rules and geometry) lives in
``codegen/families/<name>.py``; nothing here names a family's own fields.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

from codegen.problem import DType, Layout, Problem

__all__ = ["DeviceLimits", "KernelSpec", "LAYOUT_COMMENT", "LAYOUT_OF_SUFFIX", "LAYOUT_SUFFIX", "SpecData",
           "arch_rules", "dtype_rules", "field_rules", "layout_comment", "layout_rules", "problem_rules",
           "reg_rules", "resource_rules", "rows_aligned", "sampled_rules", "smem_rules", "sparse_rules", "thread_rules"]

#: Block sizes a block-sparse W may have (codegen.sparse.BLOCKS).
SPARSE_BLOCKS = (16, 32, 64)


def k_outer(layout: Layout, block: int) -> tuple[bool, bool]:
    """Whether the left and the right operand are stored k-outer rather than k-contiguous: the left
    one ([K][M], dY) in grad_weight; the right one ([K][N]) in grad_weight (X) and in a dense
    grad_input (W). A block-sparse grad_input reads Wᵀ in BSR, whose blocks are k-contiguous."""
    return layout is Layout.grad_weight, layout is Layout.grad_weight or (layout is Layout.grad_input and not block)


def rows_aligned(layout: Layout, block: int, unit: str) -> str:
    """When every row of both operands is a whole number of ``unit`` elements, as a C condition:
    the row length of each (K if k-contiguous, else M or N; see ``k_outer``)."""
    a_t, w_t = k_outer(layout, block)
    return " && ".join(f"{d} % {unit} == 0" for d in dict.fromkeys(["M" if a_t else "K", "N" if w_t else "K"]))


def sparse_rules(block: int, bn: int, bk: int, blocks_per_tile: bool = False, part_rows: bool = False) -> list[str]:
    """What a block-sparse variant of any family needs of its tiles: one block row per block tile
    (or, where the family can, an equal part of one), whole k-tiles per block (or, where the family
    can, whole blocks per k-tile)."""
    why = []
    if block not in SPARSE_BLOCKS:
        why.append(f"block must be one of {SPARSE_BLOCKS} (0: dense W), got {block}")
    if part_rows:
        if bn > block or block % bn:
            why.append(f"a block tile spans one block row or an equal part of it: bn must divide the block ({block}), "
                       f"got {bn}")
    elif bn != block:
        why.append(f"a block tile spans one block row: bn must equal the block ({block}), got {bn}")
    if block % bk and not (blocks_per_tile and bk % block == 0):
        why.append(f"bk {bk} must divide the block ({block})" + (" or be a multiple of it" if blocks_per_tile else ""))
    return why


#: What a kernel name adds for each backward layout (forward names carry none), and back.
LAYOUT_SUFFIX = {Layout.forward: "", Layout.grad_input: "_gi", Layout.grad_weight: "_gw"}
LAYOUT_OF_SUFFIX = {"": Layout.forward, "gi": Layout.grad_input, "gw": Layout.grad_weight}
#: The GEMM of each backward layout in a kernel's argument names, for the source's header (for a
#: block-sparse W, ``layout_comment``).
LAYOUT_COMMENT = {
    Layout.forward: "",
    Layout.grad_input: "grad_input: Y[M,N] = X[M,K] * W[K,N] (dX = dY * W), row-major",
    "sparse_grad_input": "grad_input: Y[M,N] = X[M,K] * W[N,K]^T, W the transposed layer weight in BSR (dX = dY * W)",
    Layout.grad_weight: "grad_weight: Y[M,N] = X[K,M]^T * W[K,N] (dW = dY^T * X), row-major",
    "sampled_grad_weight": "grad_weight sampled at a block-sparse W: Y[M,N] = X[K,M]^T * W[K,N] at the kept blocks "
                           "only, Y their BSR values (dW = dY^T * X)",
}


def layout_comment(layout: Layout, block: int) -> str:
    """``LAYOUT_COMMENT`` of a layout, where a block-sparse grad_input reads Wᵀ in BSR and a
    block-sparse grad_weight writes dW at the kept blocks only."""
    if block and layout is not Layout.forward:
        return LAYOUT_COMMENT[f"{'sparse' if layout is Layout.grad_input else 'sampled'}_{layout.value}"]
    return LAYOUT_COMMENT[layout]


def layout_rules(layout: Layout, bias: bool) -> list[str]:
    """What the backward GEMMs of a family that generates them cannot be: the input gradient has no
    bias term (db comes with the weight gradient)."""
    if layout is Layout.grad_input and bias:
        return ["the grad_input layout has no bias (db = sum of dY comes with grad_weight)"]
    return []


def sampled_rules(block: int, bm: int, bn: int, split_k: int = 1, group_m: int = 1) -> list[str]:
    """What the weight gradient of a block-sparse W (dW at its kept blocks only) needs of its tiles:
    each block tile lies in one kept block, an equal part of it or all of it, and one tile covers a
    part of a kept block over the whole batch, in the pattern's order (no split-K, no grouping)."""
    if block not in SPARSE_BLOCKS:
        return [f"block must be one of {SPARSE_BLOCKS} (0: dense W), got {block}"]
    why = [f"a tile of dW sampled at the kept blocks lies in one block: {side} must divide the block ({block}), "
           f"got {value}" for side, value in (("bm", bm), ("bn", bn)) if value > block or block % value]
    if split_k != 1 or group_m != 1:
        why.append("dW sampled at the kept blocks runs one tile per part of a kept block, in the pattern's "
                   "order, over the whole batch: split_k and group_m must be 1")
    return why


def field_rules(spec: Any, positive: tuple[str, ...] = (), choices: tuple[tuple[str, tuple], ...] = ()) -> list[str]:
    """What a spec's own fields must be before anything is derived from them: each field named in
    ``positive`` at least 1, each of ``choices`` (field, allowed values) one of its values."""
    why = [f"{name} must be >= 1" for name in positive if getattr(spec, name) < 1]
    return why + [f"{name} must be one of {allowed}, got {getattr(spec, name)!r}" for name, allowed in choices
                  if getattr(spec, name) not in allowed]


def dtype_rules(spec: Any, dtypes: tuple[DType, ...], note: str = "") -> list[str]:
    """The input types a family takes (``note`` says more)."""
    if spec.dtype in dtypes:
        return []
    return [f"the {spec.family} family takes {', '.join(d.value for d in dtypes)} inputs, not {spec.dtype.value}{note}"]


def arch_rules(spec: Any, limits: DeviceLimits, sm: int, needs: str) -> list[str]:
    """The oldest architecture a family generates for (``needs``: the instructions that need it)."""
    return [f"the {spec.family} family needs sm_{sm} or newer ({needs})"] if limits.sm < sm else []


def thread_rules(spec: Any, limits: DeviceLimits) -> list[str]:
    """A block's threads within the device's."""
    return [f"{spec.threads} threads per block > {limits.max_threads}"] if spec.threads > limits.max_threads else []


def smem_rules(spec: Any, limits: DeviceLimits) -> list[str]:
    """A block's shared memory within the device's."""
    return [f"shared memory {spec.smem_bytes} B > {limits.max_smem} B"] if spec.smem_bytes > limits.max_smem else []


def reg_rules(spec: Any, limits: DeviceLimits) -> list[str]:
    """The registers a thread (``regs_estimate``), and then the block's threads together, may have."""
    regs = spec.regs_estimate
    if regs > limits.max_regs_per_thread:
        return [f"about {regs} registers per thread > {limits.max_regs_per_thread}"]
    if regs * spec.threads > limits.regs_per_block:
        return [f"about {regs * spec.threads} registers per block > {limits.regs_per_block}"]
    return []


def resource_rules(spec: Any, limits: DeviceLimits) -> list[str]:
    """Threads, shared memory and registers within the device's, in that order."""
    return thread_rules(spec, limits) + smem_rules(spec, limits) + reg_rules(spec, limits)


def problem_rules(spec: Any, problem: Problem | None, k_tile: int = 0, sparse_only: bool = False) -> list[str]:
    """What a spec must agree on with the problem it runs (none without one): the layout (forward in
    a family without ``layout``), dtype, bias, W's block (``sparse_only``: a family that has no
    dense W) and W's structured sparsity (the spec's ``sparsity``, "" where it has none); with
    ``k_tile``, the k-tile split_k splits, no more splits than K has k-tiles."""
    if problem is None:
        return []
    why = []
    layout = getattr(spec, "layout", None)
    if layout is None and problem.layout is not Layout.forward:
        why.append(f"the {spec.family} family generates the forward layout only, not {problem.layout.value}")
    elif layout is not None and problem.layout is not layout:
        why.append(f"spec layout {layout.value} != problem layout {problem.layout.value}")
    if problem.dtype is not spec.dtype:
        why.append(f"spec dtype {spec.dtype.value} != problem dtype {problem.dtype.value}")
    if problem.bias != spec.bias:
        why.append("spec and problem disagree on bias")
    block = getattr(spec, "block", 0)
    if problem.block != block:
        needs = f"; the {spec.family} family needs a block-sparse one" if sparse_only else ""
        why.append(f"spec block {block} != problem block {problem.block} (0: dense W{needs})")
    sparsity = getattr(spec, "sparsity", "")
    if problem.sparsity != sparsity:
        why.append(f"the {spec.family} family computes a {sparsity} sparse W only, not a W without that structure"
                   if sparsity else f"the {spec.family} family has no {problem.sparsity} sparse variants")
    if k_tile and spec.split_k > -(-problem.k // k_tile):
        why.append(f"split_k {spec.split_k} > {-(-problem.k // k_tile)} k-tiles of K={problem.k}")
    return why


@dataclass(frozen=True)
class DeviceLimits:
    """What a point must fit into. Defaults are the sm_90 (H100/H200) limits."""

    sm: int = 90
    max_threads: int = 1024
    max_smem: int = 232448  # opt-in dynamic shared memory per block, bytes
    max_regs_per_thread: int = 255
    regs_per_block: int = 65536

    @classmethod
    def for_arch(cls, sm: int | str) -> DeviceLimits:
        """Limits of an architecture given as 90 or "sm_90" ("sm_90a" too)."""
        if isinstance(sm, str):
            match = re.fullmatch(r"sm_(\d+)a?", sm)
            if not match:
                raise ValueError(f"not an architecture: {sm!r}")
            sm = int(match.group(1))
        smem = {80: 166912, 86: 101376, 89: 101376, 90: 232448}.get(sm, 232448 if sm >= 90 else 101376)
        return cls(sm=sm, max_smem=smem)


@runtime_checkable
class KernelSpec(Protocol):
    """What the rest of gemmscape may ask of any family's spec (see codegen.families)."""

    family: ClassVar[str]
    dtype: DType
    bias: bool

    @property
    def name(self) -> str: ...

    @property
    def threads(self) -> int: ...

    @property
    def smem_bytes(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...

    def check(self, problem: Problem | None = None, limits: DeviceLimits | None = None) -> list[str]: ...


#: How a kernel name spells the fields every family's name spells alike.
NAME_MARKS: dict[str, dict[str, Any]] = {"dtype": {d.value: d for d in DType}, "bias": {"bias": True, "nobias": False},
                                         "layout": LAYOUT_OF_SUFFIX}


class SpecData:
    """What every family's frozen spec dataclass does alike: coerce ``dtype``, ``bias`` and (in
    families that generate the backward GEMMs) ``layout``, refuse values of the wrong type,
    round-trip through a plain dict that names its family, and read its name back.

    A family sets ``_NAME``, the pattern of its names with a group named after each field a name
    spells, and ``_MARKS``, what the text of each group that is not a number means (beside
    ``NAME_MARKS``)."""

    family: ClassVar[str]
    _NAME: ClassVar[re.Pattern[str]]
    _MARKS: ClassVar[dict[str, dict[str, Any]]] = {}
    #: How error messages call the family (its name unless set).
    _TITLE: ClassVar[str] = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DType(self.dtype))
        object.__setattr__(self, "bias", bool(self.bias))
        if hasattr(self, "layout"):
            object.__setattr__(self, "layout", Layout(self.layout))
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
                raise TypeError(f"{f.name} must be an int, got {value!r}")
            if f.type == "str" and not isinstance(value, str):
                raise TypeError(f"{f.name} must be a string, got {value!r}")
            if f.type == "bool" and f.name != "bias" and not isinstance(value, bool):
                raise TypeError(f"{f.name} must be true or false, got {value!r}")

    @property
    def a_t(self) -> bool:
        """Whether the left operand is stored k-outer (MN-major; ``k_outer``), in a family with ``layout``."""
        return k_outer(self.layout, self.block)[0]

    @property
    def w_t(self) -> bool:
        """Whether the right operand is stored k-outer (MN-major; ``k_outer``), in a family with ``layout``."""
        return k_outer(self.layout, self.block)[1]

    @classmethod
    def from_name(cls, name: str) -> Self:
        """The spec whose ``name`` is ``name``: a group the name leaves out keeps its field's default
        and one that is no field (derived) is not read; a name the spec does not give itself again
        (not canonical) is refused."""
        title = cls._TITLE or cls.family
        match = cls._NAME.fullmatch(name)
        if not match:
            raise ValueError(f"not a {title} kernel name: {name!r}")
        marks, own = {**NAME_MARKS, **cls._MARKS}, {f.name for f in fields(cls)}
        spec = cls(**{k: marks[k][v] if k in marks else int(v) for k, v in match.groupdict().items()
                      if v is not None and k in own})
        if spec.name != name:
            raise ValueError(f"not a canonical {title} kernel name: {name!r} (canonical: {spec.name})")
        return spec

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dtype"] = self.dtype.value
        if hasattr(self, "layout"):
            d["layout"] = self.layout.value
        d["family"] = self.family
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        """The spec of a ``to_dict()`` form; a dict of another family is refused, not filled in."""
        if d.get("family", cls.family) != cls.family:
            raise ValueError(f"a {d['family']!r} spec is not a {cls.family!r} spec: {d!r}")
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
