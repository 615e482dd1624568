"""2:4 structured-sparse W on the host: pruning, compression and the metadata sparse MMAs read (numpy only).

W[N, K] is 2:4 sparse when each group of four consecutive elements along K (a row's columns
4j..4j+3, the last group padded with zeros when K is not a multiple of four) holds at most two
non-zeros. Sparse tensor cores multiply such a W from its **kept halves**: two values per group
(``values`` [N, Kp/2], in the order of K) and the **position** of each in its group (``positions``
[N, Kp/2], 0..3, the two of a group ascending). Kp is K padded with zeros to whole ``K_ALIGN``
columns (one instruction's depth), so every compressed row is whole 16-byte chunks; a group of
zeros is kept as positions 0 and 1 (any two positions are valid for it).

That much describes the instruction-free form. How the positions reach an instruction is its own
layout, one function per instruction: :func:`metadata_m16n8k32` packs them as ``mma.sp.sync``
``.m16n8k32`` (fp16/bf16, sparsity selector 0) reads them, one 32-bit word per contributing lane;
:func:`positions_from_m16n8k32` reads such words back; :func:`metadata_m64nnk32` packs them as
Hopper's ``wgmma.mma_async.sp`` ``.m64nNk32`` (fp16/bf16, sparsity selector 0) reads them: per warp of
the warpgroup the m16n8k32 layout of its 16 rows, so its words are those of ``metadata_m16n8k32``
regrouped per 64 rows (a kernel can read either array).

Pruning (:func:`prune24`) keeps the two elements of largest magnitude in each group (ties go to the
lower position); :func:`compress` takes a W that is 2:4 already, or its 2:4 mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GROUP", "KEEP", "K_ALIGN", "M16N8K32_ROWS", "M64NNK32_ROWS", "Compressed", "check_24", "compress",
           "decompress", "groups_over", "mask24", "metadata_m16n8k32", "metadata_m64nnk32", "padded_k",
           "positions_from_m16n8k32", "prune24"]

#: Elements per group along K, and how many of them a 2:4 W keeps.
GROUP, KEEP = 4, 2
#: K of the compressed form is padded to a multiple of this: the depth of one m16n8k32 instruction
#: (its 16 kept columns are two 16-byte chunks of fp16/bf16).
K_ALIGN = 32
#: Rows of W one m16n8k32 instruction takes (its M side); the metadata is laid out in such row blocks.
M16N8K32_ROWS = 16
#: Rows of W one wgmma.mma_async.sp m64nNk32 instruction takes (its M side: four warps of 16).
M64NNK32_ROWS = 64
#: The position pair of a group that keeps positions 0 and 1, as a 4-bit code (a valid code for a
#: group of zeros, and for the padding past N or K).
ZERO_GROUP_CODE = 0b0100


def padded_k(k: int, align: int = K_ALIGN) -> int:
    """K rounded up to whole ``align`` columns: the width of the compressed form (x 2)."""
    return -(-k // align) * align


def _as_2d(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if w.ndim != 2 or w.size == 0:
        raise ValueError(f"W must be a non-empty 2-D array [N, K], got shape {tuple(w.shape)}")
    return w


def _groups(w: np.ndarray, width: int) -> np.ndarray:
    """``w`` [N, K] zero-padded to ``width`` columns, as [N, width/4, 4]."""
    n, k = w.shape
    padded = np.zeros((n, width), dtype=w.dtype)
    padded[:, :k] = w
    return padded.reshape(n, width // GROUP, GROUP)


def groups_over(w: np.ndarray) -> int:
    """How many groups of four of ``w`` [N, K] hold more than two non-zeros (0: W is 2:4 already)."""
    w = _as_2d(w)
    return int(((_groups(w, padded_k(w.shape[1], GROUP)) != 0).sum(axis=2) > KEEP).sum())


def mask24(w: np.ndarray) -> np.ndarray:
    """The 2:4 magnitude mask of a dense W [N, K] (bool, W's shape): in each group of four along K the
    two elements of largest |w| (equal magnitudes go to the lower position; in the last group, when
    K is not a multiple of four, the padding counts as zeros)."""
    w = _as_2d(w)
    if w.dtype.kind == "f" and not np.all(np.isfinite(w)):
        raise ValueError("W has NaN or infinite values: its groups of four cannot be ranked by magnitude")
    n, k = w.shape
    width = padded_k(k, GROUP)
    mags = np.abs(_groups(w.astype(np.float64, copy=False), width))
    order = np.argsort(-mags, axis=2, kind="stable")  # stable: ties keep the lower position
    keep = np.zeros(mags.shape, dtype=bool)
    np.put_along_axis(keep, order[:, :, :KEEP], True, axis=2)
    return keep.reshape(n, width)[:, :k]


def prune24(w: np.ndarray) -> np.ndarray:
    """W [N, K] magnitude-pruned to 2:4 (``mask24``): the other two of each group set to zero."""
    w = _as_2d(w)
    return np.where(mask24(w), w, np.zeros((), dtype=w.dtype))


def check_24(w: np.ndarray) -> None:
    """ValueError unless W [N, K] is 2:4 sparse (at most two non-zeros in every group of four)."""
    over = groups_over(w)
    if over:
        total = w.shape[0] * -(-w.shape[1] // GROUP)
        raise ValueError(f"W is not 2:4 sparse: {over} of its {total} groups of four along K hold more than two "
                         f"non-zeros (prune it first: codegen.sparse24.prune24)")


@dataclass(frozen=True, eq=False)
class Compressed:
    """A 2:4 W [n, k] as its kept halves: ``values`` [n, Kp/2] (W's element type) and ``positions``
    [n, Kp/2] (uint8, 0..3: each value's place in its group of four, ascending within a group),
    Kp = ``padded_k(k)``; columns past k are zero groups kept at positions 0 and 1."""

    values: np.ndarray
    positions: np.ndarray
    k: int

    @property
    def n(self) -> int:
        return int(self.values.shape[0])

    @property
    def kp(self) -> int:
        return 2 * int(self.values.shape[1])


def compress(w: np.ndarray, mask: np.ndarray | None = None, align: int = K_ALIGN) -> Compressed:
    """The kept halves of a 2:4 W [N, K]. Without ``mask``, W's non-zeros are kept and W must be 2:4
    already (``check_24``); with ``mask`` (bool, W's shape, at most two of each group of four, e.g.
    ``mask24(w)``) the masked elements are kept whatever their values and the others are dropped.
    A group with fewer than two kept also keeps its lowest other positions, as zeros. K is padded
    to whole ``align`` columns (``padded_k``), in zero groups."""
    w = _as_2d(w)
    n, k = w.shape
    width = padded_k(k, align)
    if mask is None:
        check_24(w)
        mask = w != 0
    else:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (n, k):
            raise ValueError(f"a 2:4 mask of a {n}x{k} W is {n}x{k}, got {'x'.join(map(str, mask.shape))}")
    kept = _groups(mask, width)
    if np.any(kept.sum(axis=2) > KEEP):
        raise ValueError("a 2:4 mask keeps at most two of each group of four along K")
    values = np.where(kept, _groups(w, width), np.zeros((), dtype=w.dtype))
    rank = np.argsort(~kept, axis=2, kind="stable")  # kept positions first, then the lowest others
    keep = np.zeros(kept.shape, dtype=bool)
    np.put_along_axis(keep, rank[:, :, :KEEP], True, axis=2)
    positions = np.nonzero(keep)[2].astype(np.uint8).reshape(n, width // 2)  # row-major: ascending in a group
    return Compressed(np.ascontiguousarray(values[keep].reshape(n, width // 2)), np.ascontiguousarray(positions), k)


def decompress(c: Compressed) -> np.ndarray:
    """The dense W [n, k] of a compressed one (zeros where nothing is kept)."""
    n, half = c.values.shape
    groups = np.zeros((n, half // KEEP, GROUP), dtype=c.values.dtype)
    g = np.broadcast_to(np.arange(half // KEEP).repeat(KEEP), (n, half))
    rows = np.broadcast_to(np.arange(n)[:, None], (n, half))
    groups[rows, g, c.positions.astype(np.intp)] = c.values
    return groups.reshape(n, -1)[:, : c.k]


# ---- the metadata of mma.sp.sync.aligned.m16n8k32 (fp16 / bf16, sparsity selector 0) -------------------
def _codes(positions: np.ndarray) -> np.ndarray:
    """Each group's 4-bit code: the first kept position in bits 1..0, the second in bits 3..2."""
    p = positions.astype(np.uint32)
    return p[:, 0::2] | (p[:, 1::2] << 2)


def metadata_m16n8k32(c: Compressed) -> np.ndarray:
    """The positions of ``c`` as ``mma.sp.sync.aligned.m16n8k32`` reads them with sparsity selector 0:
    uint32 [ceil(n/16), Kp/32, 16]. Word ``[b, s, 2*g + h]`` is the metadata register of lane
    ``4*g + h`` (h = 0, 1: the first two lanes of each group of four) for the instruction over rows
    16b..16b+15 and columns 32s..32s+31 of W: bits 15..0 hold row 16b+g, bits 31..16 row 16b+g+8,
    each 16 bits four groups of columns 32s+16h.. (group q's code in bits 4q+3..4q). Rows past n are
    zero groups (code 0b0100), so every word is valid."""
    n, kp = c.n, c.kp
    if kp % K_ALIGN:
        raise ValueError(f"the compressed W is {kp} columns wide; m16n8k32 metadata needs a multiple of {K_ALIGN}")
    rows = -(-n // M16N8K32_ROWS) * M16N8K32_ROWS
    codes = np.full((rows, kp // GROUP), ZERO_GROUP_CODE, dtype=np.uint32)
    codes[:n] = _codes(c.positions)
    halves = (codes.reshape(rows, kp // 16, 4) << np.array([0, 4, 8, 12], dtype=np.uint32)).sum(axis=2, dtype=np.uint32)
    # [block, upper 8 rows?, g, step, h] -> words of rows g (low half) and g + 8 (high half)
    h = halves.reshape(rows // 16, 2, 8, kp // K_ALIGN, 2)
    words = h[:, 0] | (h[:, 1] << np.uint32(16))  # [block, g, step, h]
    return np.ascontiguousarray(words.transpose(0, 2, 1, 3).reshape(rows // 16, kp // K_ALIGN, 16))


def positions_from_m16n8k32(words: np.ndarray, n: int) -> np.ndarray:
    """The positions [n, Kp/2] that ``metadata_m16n8k32`` packed into ``words`` (its inverse)."""
    words = np.asarray(words, dtype=np.uint32)
    blocks, steps, _ = words.shape
    w = words.reshape(blocks, steps, 8, 2).transpose(0, 2, 1, 3)  # [block, g, step, h]
    halves = np.stack([w & 0xFFFF, w >> 16], axis=1).reshape(blocks * 16, steps * 2)  # [row, 16-column half]
    codes = (halves[:, :, None] >> np.array([0, 4, 8, 12], dtype=np.uint32)) & 0xF  # [row, half, group]
    codes = codes.reshape(blocks * 16, steps * 8)[:n]
    return np.stack([codes & 3, codes >> 2], axis=2).reshape(n, steps * 16).astype(np.uint8)


# ---- the metadata of wgmma.mma_async.sp.sync.aligned.m64nNk32 (fp16 / bf16, sparsity selector 0) ---------
def metadata_m64nnk32(c: Compressed) -> np.ndarray:
    """The positions of ``c`` as ``wgmma.mma_async.sp`` ``.m64nNk32`` reads them with sparsity selector 0:
    uint32 [ceil(n/64), Kp/32, 4, 16]. Word ``[b, s, w, 2*g + h]`` is the metadata register of thread
    ``32*w + 4*g + h`` of the warpgroup (warp w, h = 0, 1: the first two lanes of each group of four;
    the other two lanes' registers are not read) for the instruction over rows 64b..64b+63 and columns
    32s..32s+31 of W: warp w covers rows 64b+16w.. as ``mma.sp`` m16n8k32 covers its 16 (bits 15..0 row
    64b+16w+g, bits 31..16 row 64b+16w+g+8, each 16 bits the four groups of columns 32s+16h..). So
    ``[b, s, w]`` is ``metadata_m16n8k32(c)[4b + w, s]``; rows past n are zero groups (code 0b0100)."""
    words = metadata_m16n8k32(c)  # [ceil(n/16), Kp/32, 16]
    blocks16, steps, _ = words.shape
    blocks = -(-blocks16 // 4)
    full = np.full((4 * blocks, steps, 16), ZERO_GROUP_CODE * 0x11111111, dtype=np.uint32)
    full[:blocks16] = words
    return np.ascontiguousarray(full.reshape(blocks, 4, steps, 16).transpose(0, 2, 1, 3))
