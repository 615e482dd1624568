"""A pure-numpy model of ``mma.sp.sync.aligned.m16n8k32`` (fp16/bf16, fp32 accumulate) as the PTX ISA
describes it, for tests: which elements of A each thread's fragment holds, where the metadata puts
them, and which threads give the metadata (the sparsity selector).

From the PTX ISA, "Matrix Fragments for sparse mma.m16n8k32 with .f16 and .bf16 types"
(groupID g = lane >> 2, threadID_in_group t = lane % 4):

- A (16 x 32, 2:4 sparse): a thread's eight values a0..a7 are the two kept values of a group of four
  columns; a_i lies in row g for i in {0, 1, 4, 5} and g + 8 otherwise, in the group of columns from
  4t (i < 4) or 4t + 16 (i >= 4); a_(2j) and a_(2j+1) are its first and second kept value.
- B (32 x 8): b_i is row 8 * (i // 2) + 2t + (i % 2), column g.
- C, D (16 x 8): c_i is row g + 8 * (i // 2), column 2t + (i % 2).
- Metadata: with sparsity selector s, threads 4g + 2s and 4g + 2s + 1 of each group of four give it:
  thread 4g + 2s + h covers columns 16h .. 16h + 15 of row g in bits 15..0 and of row g + 8 in bits
  31..16, four bits per group of four columns (group q of the 16 in bits 4q + 3 .. 4q), each the
  first kept position in its low two bits and the second in its high two. Codes that repeat a
  position are invalid (0b0000, 0b0101, 0b1010, 0b1111).

What the model takes is per lane: ``a`` [32][8], ``b`` [32][8] (values) and ``e`` [32] (uint32).
"""

from __future__ import annotations

import numpy as np

INVALID_CODES = (0b0000, 0b0101, 0b1010, 0b1111)


def mma_sp_m16n8k32(a: np.ndarray, b: np.ndarray, e: np.ndarray, selector: int = 0) -> np.ndarray:
    """D = A · B (16 x 8, float64) of one warp's fragments, A expanded from its kept values and metadata."""
    dense_a = np.zeros((16, 32))
    placed = np.zeros((16, 32), dtype=bool)
    dense_b = np.zeros((32, 8))
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(8):
            row = g if i in (0, 1, 4, 5) else g + 8
            first_col = 4 * t + (16 if i >= 4 else 0)
            h, q = first_col // 16, (first_col % 16) // 4
            word = int(e[4 * g + 2 * selector + h])
            code = (word >> (16 * (row // 8) + 4 * q)) & 0xF
            if code in INVALID_CODES:
                raise ValueError(f"invalid metadata code {code:04b} for row {row}, columns {first_col}..")
            col = first_col + ((code >> (2 * (i % 2))) & 3)
            assert not placed[row, col], "two values at one position"
            dense_a[row, col], placed[row, col] = a[lane, i], True
            dense_b[8 * (i // 2) + 2 * t + i % 2, g] = b[lane, i]
    return dense_a @ dense_b


def d_position(lane: int, i: int) -> tuple[int, int]:
    """Row and column of D that element i (0..3) of ``lane``'s accumulators holds."""
    return (lane >> 2) + 8 * (i // 2), 2 * (lane % 4) + i % 2


def warp_operands(wc: np.ndarray, words: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fragments the sparse24 kernel hands one instruction (templates/sparse24.cu.j2, load_frags):
    ``wc`` 16 rows x 16 kept values of W (ldmatrix x4: rows 0-7 and 8-15 of kept columns 0-7, then 8-15),
    ``words`` the instruction's 16 metadata words (lane 4g + h reads word 2g + (h % 2)), ``x`` 8 rows x
    32 columns of X (ldmatrix x4: columns 0-7, 8-15, 16-23, 24-31). ldmatrix gives lane (g, t) the
    elements 2t, 2t + 1 of row g of each 8 x 8 matrix."""
    a, b, e = np.zeros((32, 8)), np.zeros((32, 8)), np.zeros(32, dtype=np.uint32)
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for m, (r0, c0) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):  # register m: a_(2m), a_(2m+1)
            a[lane, 2 * m:2 * m + 2] = wc[r0 + g, c0 + 2 * t:c0 + 2 * t + 2]
        for r in range(4):
            b[lane, 2 * r:2 * r + 2] = x[g, 8 * r + 2 * t:8 * r + 2 * t + 2]
        e[lane] = words[2 * g + (lane & 1)]
    return a, b, e
