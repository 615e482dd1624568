"""The metadata of wgmma.mma_async.sp m64nNk32 (codegen.sparse24.metadata_m64nnk32) against a numpy
model of the instruction (tests/wgmma_sp_model.py): packer, the kernel's register loads and the
instruction together reproduce X · (pruned W)ᵀ, for ragged N and K."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import sparse24
from tests.wgmma_sp_model import kernel_registers, ring_registers, ring_stage, wgmma_sp_m64nnk32


@pytest.mark.parametrize(("n", "k", "m"), [(1, 1, 1), (64, 32, 8), (70, 37, 24), (130, 96, 16), (200, 5, 40)])
def test_wgmma_sp_reproduces_pruned_product(n, k, m):
    rng = np.random.default_rng(n * 1000 + k)
    w = rng.standard_normal((n, k))
    x = rng.standard_normal((m, k))
    packed = sparse24.compress(w, sparse24.mask24(w))
    words = sparse24.metadata_m64nnk32(packed)
    we16 = sparse24.metadata_m16n8k32(packed)
    kp = packed.kp
    blocks = -(-n // 64)
    assert words.shape == (blocks, kp // 32, 4, 16)
    rows = 64 * blocks
    kept = np.zeros((rows, kp // 2))
    kept[:n] = packed.values
    xp = np.zeros((m, kp))
    xp[:, :k] = x
    yt = np.zeros((rows, m))  # Yᵀ = W_sparse · Xᵀ: W on the instruction's M side, X its N side
    for b in range(blocks):
        for s in range(kp // 32):
            e = np.zeros(128, dtype=np.uint32)
            for w_ in range(4):
                for g in range(8):
                    for h in range(2):  # selector 0: lanes 4g, 4g+1; lanes 4g+2, 4g+3 unread
                        e[32 * w_ + 4 * g + h] = words[b, s, w_, 2 * g + h]
                        e[32 * w_ + 4 * g + 2 + h] = 0  # an invalid code, never read with selector 0
            e_kernel = kernel_registers(we16, b, s)
            for tid in range(128):
                if tid % 4 < 2:
                    assert e_kernel[tid] == e[tid]
            a_kept = kept[64 * b:64 * b + 64, 16 * s:16 * s + 16]
            yt[64 * b:64 * b + 64] += wgmma_sp_m64nnk32(a_kept, xp[:, 32 * s:32 * s + 32].T, e_kernel)
    expected = x @ sparse24.prune24(w).T
    np.testing.assert_allclose(yt[:n].T, expected, rtol=1e-10, atol=1e-10)


def test_metadata_m64nnk32_is_m16n8k32_regrouped():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((100, 70))
    packed = sparse24.compress(w, sparse24.mask24(w))
    words, we16 = sparse24.metadata_m64nnk32(packed), sparse24.metadata_m16n8k32(packed)
    for blk in range(we16.shape[0]):
        np.testing.assert_array_equal(words[blk // 4, :, blk % 4], we16[blk])
    assert np.all(words[1, :, 3] == 0x44444444)  # rows 112..127: past n, zero groups
    assert words.dtype == np.uint32 and words.flags.c_contiguous


def test_model_rejects_invalid_codes_and_selector_1_reads_other_lanes():
    a = np.ones((64, 16))
    b = np.eye(32)
    with pytest.raises(ValueError, match="invalid"):
        wgmma_sp_m64nnk32(a, b, np.zeros(128, dtype=np.uint32))
    e = np.zeros(128, dtype=np.uint32)
    e[[t for t in range(128) if t % 4 >= 2]] = 0x44444444
    d = wgmma_sp_m64nnk32(a, b, e, selector=1)
    assert np.all(d[:, [0, 1, 4, 5]] == 1) and np.all(d[:, [2, 3, 6, 7]] == 0)


def _cute_elayout_64x32(thread: int, value: int) -> tuple[int, int]:
    """Row and column (of A's logical 64 x 32) of metadata value ``value`` (0..31, 2 bits of one column
    in 16-bit halves: values 0-15 the low half, 16-31 the high) of warpgroup thread ``thread``, as
    CUTLASS's cute describes the sparse GMMA metadata of m64nNk32 in 16-bit types (ELayout_64x32: the
    thread index split (2, 2, 8, 4) with column-major (M, K) strides (1024, 0, 1, 16), the value index
    (16, 2) with strides (64, 8); a stride of 64 is one column, 1024 sixteen)."""
    t0, t1, t2, t3 = thread & 1, (thread >> 1) & 1, (thread >> 2) & 7, thread >> 5
    v0, v1 = value % 16, value // 16
    offset = 1024 * t0 + 0 * t1 + 1 * t2 + 16 * t3 + 64 * v0 + 8 * v1
    return offset % 64, offset // 64


def test_the_model_agrees_with_cutlass_s_metadata_layout():
    """Each 16-bit half of a thread's register covers one row's 16 columns (four groups of four, a
    nibble each): the model's row and columns for every thread and half are cute's ELayout_64x32's,
    and lanes 4g+2, 4g+3 hold what lanes 4g, 4g+1 hold (stride 0: either sparsity selector reads a
    full set)."""
    for thread in range(128):
        w, lane = divmod(thread, 32)
        g, h = lane >> 2, lane & 1
        for half in range(2):
            cells = {_cute_elayout_64x32(thread, 16 * half + c) for c in range(16)}
            model_row = 16 * w + g + 8 * half  # wgmma_sp_m64nnk32: bits 16*upper.. of word 32w+4g+2s+h
            assert cells == {(model_row, 16 * h + c) for c in range(16)}, (thread, half)


@pytest.mark.parametrize(("n", "k", "bn", "consumers", "bk"), [
    (1, 1, 64, 1, 64), (70, 37, 64, 1, 128), (130, 96, 128, 2, 64), (200, 300, 256, 2, 128), (300, 165, 192, 1, 64),
    (64, 64, 256, 2, 64)])
def test_the_metadata_ring_gives_the_registers_of_the_global_loads(n, k, bn, consumers, bk):
    """The ring path (loader threads copy a k-tile's WE words into a stage, consumers read theirs from it)
    hands every consumer thread the word the global loads would (kernel_registers), the zero-group fill
    past W's rows and KP; every word of a stage is written."""
    rng = np.random.default_rng(n + k + bn)
    w = rng.standard_normal((n, k))
    we16 = sparse24.metadata_m16n8k32(sparse24.compress(w, sparse24.mask24(w)))
    steps, k_steps, wg_m = we16.shape[1], bk // 32, bn // consumers
    for n0 in range(0, n, bn):
        for kt in range(-(-steps // k_steps)):
            stage = ring_stage(we16, n0 // 16, kt, bn, k_steps)
            assert not np.any(stage == 0xDEADBEEF)
            for c in range(consumers):
                for f in range(wg_m // 64):
                    for s in range(k_steps):
                        got = ring_registers(stage, c * wg_m // 16, f, s)
                        step = kt * k_steps + s
                        if step < steps:
                            want = kernel_registers(we16, (n0 + c * wg_m) // 64 + f, step)
                        else:
                            want = np.full(128, 0x44444444, dtype=np.uint32)
                        np.testing.assert_array_equal(got, want)


def test_the_metadata_ring_reproduces_the_pruned_product():
    """X · (pruned W)ᵀ from the ring's registers through the instruction model, tile by tile (bn 128, two
    consumers, k-tiles of 128), ragged N and K."""
    n, k, m, bn, bk, consumers = 150, 200, 24, 128, 128, 2
    rng = np.random.default_rng(7)
    w, x = rng.standard_normal((n, k)), rng.standard_normal((m, k))
    packed = sparse24.compress(w, sparse24.mask24(w))
    we16, kp = sparse24.metadata_m16n8k32(packed), packed.kp
    tiles = -(-n // bn)
    kept = np.zeros((tiles * bn, -(-kp // bk) * bk // 2))
    kept[:n, :kp // 2] = packed.values
    xp = np.zeros((m, kept.shape[1] * 2))
    xp[:, :k] = x
    yt = np.zeros((tiles * bn, m))
    wg_m, k_steps = bn // consumers, bk // 32
    for n0 in range(0, tiles * bn, bn):
        for kt in range(kept.shape[1] * 2 // bk):
            stage = ring_stage(we16, n0 // 16, kt, bn, k_steps)
            for c in range(consumers):
                for f in range(wg_m // 64):
                    r0 = n0 + c * wg_m + 64 * f
                    for s in range(k_steps):
                        col = kt * bk + 32 * s
                        yt[r0:r0 + 64] += wgmma_sp_m64nnk32(kept[r0:r0 + 64, col // 2:col // 2 + 16],
                                                            xp[:, col:col + 32].T, ring_registers(stage, c * wg_m // 16, f, s))
    np.testing.assert_allclose(yt[:n].T, x @ sparse24.prune24(w).T, rtol=1e-10, atol=1e-10)
