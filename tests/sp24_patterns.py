"""2:4 weights whose kept positions are chosen, for the GPU tiers of the 2:4 families
(tests/gpu/test_sparse24.py, tests/gpu/test_hopper_sp24.py): a kernel that fails some patterns and not
others shows which part of its metadata layout is not the hardware's."""

from __future__ import annotations

import numpy as np

#: Which positions each group (row r, group j) keeps: the same everywhere (01 is the code of a zero group,
#: so a kernel that ignores its metadata passes it alone), by warp of a warpgroup (rows 16w.. of an m64
#: block), by row within 16 (g vs g + 8: an instruction's rows, a word's halves), by the 16-column half of a
#: k-step (the two lanes of a pair), by k-step (the descriptors' step and the k-step's word), by group
#: (nibble order); None: a random W pruned by magnitude.
PATTERNS = {
    "all-01": lambda r, j: (0, 1),
    "all-23": lambda r, j: (2, 3),
    "all-13": lambda r, j: (1, 3),
    "warps-differ": lambda r, j: [(0, 2), (1, 3), (0, 3), (1, 2)][(r % 64) // 16],
    "rows-differ": lambda r, j: (0, 2) if r % 16 < 8 else (1, 3),
    "halves-differ": lambda r, j: (0, 3) if j % 8 < 4 else (1, 2),
    "steps-differ": lambda r, j: (0, 1) if j % 16 < 8 else (2, 3),
    "groups-differ": lambda r, j: [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)][j % 6],
    "random": None,
}


def w_with_positions(n: int, k: int, positions_of, rng) -> np.ndarray:
    """A 2:4 W [n, k] whose group (row r, group j) keeps the positions ``positions_of(r, j)``, non-zero."""
    w = np.zeros((n, k), dtype=np.float32)
    for r in range(n):
        for j in range(k // 4):
            for p in positions_of(r, j):
                w[r, 4 * j + p] = rng.uniform(0.5, 1.5) * rng.choice((-1, 1))
    return w
