"""What every kernel family shares: device limits and the shape of a spec.

A family's own spec (its dataclass, name, check and geometry) lives in ``codegen/families/<name>.py``;
nothing here names a family's fields.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

from codegen.problem import DType, Layout, Problem

__all__ = ["DeviceLimits", "KernelSpec", "LAYOUT_OF_SUFFIX", "LAYOUT_SUFFIX", "SpecData", "layout_rules", "sparse_rules"]

#: Block sizes a block-sparse W may have (codegen.sparse.BLOCKS).
SPARSE_BLOCKS = (16, 32, 64)
def k_outer(layout: Layout, block: int) -> tuple[bool, bool]:
    """Whether the left and the right operand are stored k-outer rather than k-contiguous: the left
    one ([K][M], dY) in grad_weight; the right one ([K][N]) in grad_weight (X) and in a dense
    grad_input (W). A block-sparse grad_input reads Wᵀ in BSR, whose blocks are k-contiguous."""
    return layout is Layout.grad_weight, layout is Layout.grad_weight or (layout is Layout.grad_input and not block)


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


def layout_rules(layout: Layout, bias: bool, block: int) -> list[str]:
    """What the backward GEMMs of a family that generates them cannot be: the input gradient has no
    bias term (db comes with the weight gradient), and the weight gradient of a block-sparse W
    (its kept blocks only) is not generated."""
    why = []
    if layout is Layout.grad_input and bias:
        why.append("the grad_input layout has no bias (db = sum of dY comes with grad_weight)")
    if layout is Layout.grad_weight and block:
        why.append("a block-sparse W is generated for the forward and grad_input layouts, not grad_weight")
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


class SpecData:
    """What every family's frozen spec dataclass does alike: coerce ``dtype``, ``bias`` and (in
    families that generate the backward GEMMs) ``layout``, refuse values of the wrong type, and
    round-trip through a plain dict that names its family."""

    family: ClassVar[str]

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
