"""A pure-numpy model of ``wgmma.mma_async.sp.sync.aligned.m64nNk32`` (fp16/bf16, fp32 accumulate) as
the PTX ISA describes it, for tests: where each warp's metadata register puts the kept values of the
sparse A (64 x 32, stored 64 x 16 in shared memory: its kept halves, K-major) and which threads give
the metadata (the sparsity selector).

From the PTX ISA ("Asynchronous warpgroup level matrix multiply-accumulate operation on sparse
matrices", metadata for .f16/.bf16): warp w of the warpgroup gives the metadata of rows 16w..16w+15
of A, laid out as ``mma.sp`` m16n8k32 lays out a warp's 16 rows (tests/mma_sp_model.py): with
sparsity selector s, lanes 4g + 2s and 4g + 2s + 1 of each group of four give it; lane 4g + 2s + h
covers columns 16h .. 16h + 15 of row 16w + g in bits 15..0 and of row 16w + g + 8 in bits 31..16,
four bits per group of four columns (group q in bits 4q + 3 .. 4q), the first kept position in its
low two bits and the second in its high two. A's kept halves come from shared memory (a descriptor)
in the order of K: kept column 2j and 2j + 1 of a row are the two values of its group j. B (32 x N)
comes from its own descriptor; D is 64 x N. CUTLASS's cute describes the same thread-to-metadata map
(its sparse GMMA traits' ELayout_64x32); tests/test_wgmma_sp_model.py checks the model against it.

What the model takes: ``a_kept`` [64][16] (the shared tile, logically), ``b`` [32][N], ``e`` [128]
(uint32, one register per thread of the warpgroup)."""

from __future__ import annotations

import numpy as np

INVALID_CODES = (0b0000, 0b0101, 0b1010, 0b1111)


def wgmma_sp_m64nnk32(a_kept: np.ndarray, b: np.ndarray, e: np.ndarray, selector: int = 0) -> np.ndarray:
    """D = A · B (64 x N, float64), A expanded from its kept values and the warpgroup's metadata."""
    dense_a = np.zeros((64, 32))
    for row in range(64):
        w, r = divmod(row, 16)
        g, upper = r % 8, r // 8
        for grp in range(8):  # groups of four columns
            h, q = divmod(grp, 4)
            word = int(e[32 * w + 4 * g + 2 * selector + h])
            code = (word >> (16 * upper + 4 * q)) & 0xF
            if code in INVALID_CODES:
                raise ValueError(f"invalid metadata code {code:04b} for row {row}, group {grp}")
            first, second = code & 3, code >> 2
            if first >= second:
                raise ValueError(f"metadata code {code:04b}: positions not ascending")
            dense_a[row, 4 * grp + first] = a_kept[row, 2 * grp]
            dense_a[row, 4 * grp + second] = a_kept[row, 2 * grp + 1]
    return dense_a @ np.asarray(b, dtype=np.float64)


def kernel_registers(we16: np.ndarray, block: int, step: int) -> np.ndarray:
    """The metadata registers the hopper_sp24 kernel loads for the instruction over W's rows
    64*block.. and k-step ``step`` (templates/hopper_sp24.cu.j2, load_meta): thread 32w + 4g + h reads
    word 2g + (h & 1) of m16n8k32 block 4*block + w of WE (codegen.sparse24.metadata_m16n8k32), or the
    zero-group fill 0x44444444 past WE's rows."""
    e = np.zeros(128, dtype=np.uint32)
    for tid in range(128):
        w, lane = divmod(tid, 32)
        blk = 4 * block + w
        e[tid] = we16[blk, step, 2 * (lane >> 2) + (lane & 1)] if blk < we16.shape[0] else 0x44444444
    return e


def ring_stage(we16: np.ndarray, blk0: int, kt: int, bn: int, k_steps: int, loaders: int = 32) -> np.ndarray:
    """The stage of the metadata ring the hopper_sp24 kernel's loader threads fill (``meta="ring"``,
    templates/hopper_sp24.cu.j2, copy_meta) for k-tile ``kt`` of a block tile whose W rows start at
    m16n8k32 block ``blk0``: [bn/16][k_steps][16] uint32, in the 16-byte chunks each thread copies
    (thread t: chunk t % 4 of k-step (t / 4) % k_steps of every (loaders / (4 k_steps))-th block from
    t / (4 k_steps) on), the zero-group fill past WE's blocks or k-steps. Words no thread writes stay
    0xDEADBEEF."""
    blocks, steps = we16.shape[:2]
    stage = np.full(bn // 16 * k_steps * 16, 0xDEADBEEF, dtype=np.uint32)
    per_block = 4 * k_steps
    per_pass = loaders // per_block
    for t in range(loaders):
        step, blk, dst = kt * k_steps + (t // 4) % k_steps, blk0 + t // per_block, 4 * t
        for _ in range(bn // 16 // per_pass):
            q = 4 * (t % 4)
            stage[dst:dst + 4] = we16[blk, step, q:q + 4] if blk < blocks and step < steps else 0x44444444
            blk += per_pass
            dst += 4 * loaders
    return stage.reshape(bn // 16, k_steps, 16)


def ring_registers(stage: np.ndarray, first: int, f: int, s: int) -> np.ndarray:
    """The metadata registers a consumer warpgroup reads from a ring stage (read_meta) for its m64 block
    ``f`` and k-step ``s``: thread 32w + 4g + h takes word 2g + (h & 1) of the stage's block first + w + 4f
    (``first``: the consumer's first m16n8k32 block within the tile, c * bn / consumers / 16)."""
    e = np.zeros(128, dtype=np.uint32)
    for tid in range(128):
        w, lane = divmod(tid, 32)
        e[tid] = stage[first + w + 4 * f, s, 2 * (lane >> 2) + (lane & 1)]
    return e
