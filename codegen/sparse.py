"""Block-sparse W: the pattern of kept blocks (BSR) and the problems built on it (numpy only).

W[N,K] is cut into ``block x block`` blocks (the last block row and column padded with zeros
when N or K is not a multiple of the block). A :class:`Pattern` says which blocks are kept, in
BSR form: ``indptr[r] .. indptr[r+1]`` index ``indices``, the block columns kept in block row
``r``, ascending. The values travel separately as ``blocks[nnzb, block, block]``, each block
row-major and contiguous, in the order of ``indices``.

A pattern's identity is the hash of its shape and structure. Kernels are timed on random values
on the pattern (the values do not change the time), so a problem carries the hash, and the
pattern itself is registered in each process that needs it (:func:`register`, :func:`lookup`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from codegen.problem import DType, Problem

__all__ = ["BLOCKS", "Pattern", "lookup", "probe_pattern", "problem_for", "register"]

#: Block sizes the sparse kernels take.
BLOCKS = (16, 32, 64)


@dataclass(frozen=True, eq=False)
class Pattern:
    """Which ``block x block`` blocks of an ``n x k`` W are kept (BSR structure, no values)."""

    n: int
    k: int
    block: int
    indptr: np.ndarray  # int32 [block_rows + 1]
    indices: np.ndarray  # int32 [nnzb], ascending within each block row

    def __post_init__(self) -> None:
        if self.block not in BLOCKS:
            raise ValueError(f"block must be one of {', '.join(map(str, BLOCKS))}, got {self.block!r}")
        for name in ("n", "k"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        indptr = np.ascontiguousarray(self.indptr, dtype=np.int32)
        indices = np.ascontiguousarray(self.indices, dtype=np.int32)
        if indptr.shape != (self.block_rows + 1,) or indptr[0] != 0 or np.any(np.diff(indptr) < 0):
            raise ValueError(f"indptr must be {self.block_rows + 1} non-decreasing offsets from 0")
        if indptr[-1] != indices.size:
            raise ValueError(f"indptr ends at {indptr[-1]} but there are {indices.size} block indices")
        if indices.size and (indices.min() < 0 or indices.max() >= self.block_cols):
            raise ValueError(f"block column indices must lie in [0, {self.block_cols})")
        for r in range(self.block_rows):
            row = indices[indptr[r]:indptr[r + 1]]
            if np.any(np.diff(row) <= 0):
                raise ValueError(f"block row {r}: column indices must be strictly ascending")
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "indices", indices)

    # ---- shape ----------------------------------------------------------------------------------
    @property
    def block_rows(self) -> int:
        return -(-self.n // self.block)

    @property
    def block_cols(self) -> int:
        return -(-self.k // self.block)

    @property
    def nnzb(self) -> int:
        return int(self.indices.size)

    @property
    def density(self) -> float:
        """The fraction of blocks kept."""
        return self.nnzb / (self.block_rows * self.block_cols)

    @property
    def row_counts(self) -> np.ndarray:
        return np.diff(self.indptr)

    @property
    def hash(self) -> str:
        h = hashlib.sha256(f"bsr:{self.n}:{self.k}:{self.block}:".encode())
        h.update(self.indptr.tobytes())
        h.update(self.indices.tobytes())
        return h.hexdigest()[:16]

    # ---- conversions ----------------------------------------------------------------------------
    def mask(self) -> np.ndarray:
        """Kept blocks as a bool array [block_rows, block_cols]."""
        m = np.zeros((self.block_rows, self.block_cols), dtype=bool)
        rows = np.repeat(np.arange(self.block_rows), self.row_counts)
        m[rows, self.indices] = True
        return m

    @classmethod
    def from_mask(cls, mask: np.ndarray, n: int, k: int, block: int) -> Pattern:
        """The pattern of a bool block mask [ceil(n/block), ceil(k/block)]."""
        mask = np.asarray(mask, dtype=bool)
        want = (-(-n // block), -(-k // block))
        if mask.shape != want:
            raise ValueError(f"a block mask for {n}x{k} in {block}x{block} blocks is {want[0]}x{want[1]}, "
                             f"got {mask.shape[0]}x{mask.shape[1]}")
        indptr = np.concatenate([[0], np.cumsum(mask.sum(axis=1))])
        return cls(n, k, block, indptr, np.nonzero(mask)[1])

    @classmethod
    def random(cls, n: int, k: int, block: int, density: float, seed: int = 0) -> Pattern:
        """``round(density * blocks)`` blocks chosen uniformly at random (a synthetic pattern)."""
        if not 0.0 <= density <= 1.0:
            raise ValueError(f"density must lie in [0, 1], got {density!r}")
        rows, cols = -(-n // block), -(-k // block)
        keep = round(density * rows * cols)
        chosen = np.random.default_rng(seed).choice(rows * cols, size=keep, replace=False)
        mask = np.zeros(rows * cols, dtype=bool)
        mask[chosen] = True
        return cls.from_mask(mask.reshape(rows, cols), n, k, block)

    def expand(self, blocks: np.ndarray) -> np.ndarray:
        """The dense [n, k] W of ``blocks[nnzb, block, block]`` on this pattern (zeros elsewhere)."""
        b = self.block
        dense = np.zeros((self.block_rows * b, self.block_cols * b), dtype=blocks.dtype)
        rows = np.repeat(np.arange(self.block_rows), self.row_counts)
        for i, (r, c) in enumerate(zip(rows, self.indices, strict=True)):
            dense[r * b:(r + 1) * b, c * b:(c + 1) * b] = blocks[i]
        return dense[: self.n, : self.k]

    def gather(self, dense: np.ndarray) -> np.ndarray:
        """The kept blocks ``[nnzb, block, block]`` of a dense [n, k] array (padding zero)."""
        b = self.block
        if dense.shape != (self.n, self.k):
            raise ValueError(f"W is {dense.shape[0]}x{dense.shape[1]}, the pattern is {self.n}x{self.k}")
        padded = np.zeros((self.block_rows * b, self.block_cols * b), dtype=dense.dtype)
        padded[: self.n, : self.k] = dense
        tiles = padded.reshape(self.block_rows, b, self.block_cols, b).swapaxes(1, 2)
        rows = np.repeat(np.arange(self.block_rows), self.row_counts)
        return np.ascontiguousarray(tiles[rows, self.indices])

    def to_dict(self) -> dict:
        return {"n": self.n, "k": self.k, "block": self.block, "indptr": self.indptr.tolist(),
                "indices": self.indices.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> Pattern:
        return cls(d["n"], d["k"], d["block"], np.asarray(d["indptr"]), np.asarray(d["indices"]))


_REGISTRY: dict[str, Pattern] = {}


def register(pattern: Pattern) -> str:
    """Make ``pattern`` findable by its hash in this process; returns the hash."""
    _REGISTRY[pattern.hash] = pattern
    return pattern.hash


def lookup(problem_or_hash: Problem | str) -> Pattern:
    """The registered pattern of a sparse problem (or of a hash)."""
    key = problem_or_hash if isinstance(problem_or_hash, str) else problem_or_hash.pattern
    try:
        return _REGISTRY[key]
    except KeyError:
        raise LookupError(f"block-sparse pattern {key!r} is not known in this process: build the problem with "
                          "codegen.sparse.problem_for (or register its pattern)") from None


def problem_for(m: int, pattern: Pattern, dtype: DType | str = DType.fp32, bias: bool = False) -> Problem:
    """The problem ``Y = X·Wᵀ (+ b)`` with W block-sparse on ``pattern`` (registered here)."""
    return Problem(m, pattern.n, pattern.k, DType(dtype), bias=bias, block=pattern.block,
                   density=pattern.density, pattern=register(pattern))


def probe_pattern(n: int, k: int, block: int) -> Pattern:
    """The small pattern every sparse evaluation also checks: about half the blocks kept, the
    first block row empty when there are several, at least one block kept."""
    p = Pattern.random(n, k, block, 0.5, seed=1)
    mask = p.mask()
    if mask.shape[0] > 1:
        mask[0] = False
    if not mask.any():
        mask[-1, -1] = True
    return Pattern.from_mask(mask, n, k, block)
