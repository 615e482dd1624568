"""CPU tier: a 2:4 W on the host (codegen.sparse24): magnitude pruning, compression and back, the
metadata of mma.sp m16n8k32 checked against a numpy model of the instruction as the PTX ISA defines
it (tests/mma_sp_model.py), the 2:4 problem, its inputs and float64 reference, and the store."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import sparse24
from codegen.data import dense_w, input_shapes, random_inputs, reference, references, to_float64
from codegen.launch import SP24_ARGS_NOTE
from codegen.problem import DType, Layout, Problem
from tests.mma_sp_model import d_position, mma_sp_m16n8k32, warp_operands

SHAPES = [(1, 1), (3, 5), (16, 32), (17, 37), (33, 64), (130, 136), (264, 136)]


def random_w(n: int, k: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)


# ---- pruning ------------------------------------------------------------------------------------------
def test_prune_keeps_the_two_largest_magnitudes_of_each_group_of_four():
    w = np.array([[1.0, -4.0, 3.0, 2.0, 0.5, 0.0, -0.25, 0.0]])
    assert sparse24.prune24(w).tolist() == [[0.0, -4.0, 3.0, 0.0, 0.5, 0.0, -0.25, 0.0]]


def test_prune_breaks_ties_by_the_lower_position_and_pads_the_last_group():
    w = np.array([[2.0, 2.0, 2.0, 2.0, -7.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    assert sparse24.mask24(w).tolist() == [[True, True, False, False, True], [True, True, False, False, True]]
    assert sparse24.prune24(w).tolist() == [[2.0, 2.0, 0.0, 0.0, -7.0], [0.0] * 5]


@pytest.mark.parametrize("n,k", SHAPES)
def test_pruned_w_is_2_4_and_loses_only_what_it_must(n, k):
    w = random_w(n, k)
    pruned = sparse24.prune24(w)
    assert sparse24.groups_over(pruned) == 0 and sparse24.groups_over(w) == n * (k // 4 + (k % 4 == 3))
    kept = pruned != 0
    assert np.array_equal(pruned[kept], w[kept])
    groups = np.abs(np.pad(w, ((0, 0), (0, -k % 4)))).reshape(n, -1, 4)
    smallest_kept = np.where(np.pad(kept, ((0, 0), (0, -k % 4))).reshape(n, -1, 4), groups, np.inf).min(axis=2)
    largest_dropped = np.where(np.pad(kept, ((0, 0), (0, -k % 4))).reshape(n, -1, 4), -np.inf, groups).max(axis=2)
    assert np.all(smallest_kept >= largest_dropped)


def test_check_24_and_prune_refuse_what_they_cannot_use():
    with pytest.raises(ValueError, match="1 of its 2 groups of four along K hold more than two non-zeros"):
        sparse24.check_24(np.array([[1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]]))
    sparse24.check_24(np.array([[0.0, 1.0, 0.0, 1.0, 1.0]]))
    with pytest.raises(ValueError, match="NaN"):
        sparse24.prune24(np.array([[np.nan, 1.0]]))
    with pytest.raises(ValueError, match="2-D"):
        sparse24.mask24(np.zeros(4))


# ---- compression ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,k", SHAPES)
def test_decompress_of_compress_is_the_masked_w(n, k):
    w = random_w(n, k, seed=n + k)
    mask = sparse24.mask24(w)
    c = sparse24.compress(w, mask)
    assert (c.n, c.k, c.kp) == (n, k, sparse24.padded_k(k)) and c.kp % 32 == 0
    assert c.values.shape == c.positions.shape == (n, c.kp // 2) and c.values.dtype == w.dtype
    assert np.array_equal(sparse24.decompress(c), np.where(mask, w, 0))
    again = sparse24.compress(np.where(mask, w, 0))  # a 2:4 W given as it is: the same kept halves
    assert np.array_equal(sparse24.decompress(again), np.where(mask, w, 0))
    pairs = c.positions.reshape(n, -1, 2)
    assert np.all(pairs[:, :, 0] < pairs[:, :, 1]) and c.positions.max() <= 3  # ordered, two distinct
    past_k = pairs[:, -(-k // 4):]  # groups wholly past K: zeros kept at positions 0 and 1
    assert np.all(past_k == [0, 1]) and not c.values[:, 2 * -(-k // 4):].any()


def test_a_group_with_fewer_than_two_non_zeros_keeps_zeros_at_its_lowest_free_positions():
    w = np.zeros((1, 12), dtype=np.float32)
    w[0, 3], w[0, 5], w[0, 6] = 7.0, 1.0, 2.0  # groups: one value at 3; values at 1, 2; none
    c = sparse24.compress(w)
    assert c.positions[0, :6].tolist() == [0, 3, 1, 2, 0, 1]
    assert c.values[0, :6].tolist() == [0.0, 7.0, 1.0, 2.0, 0.0, 0.0]


def test_compress_keeps_storage_types_bit_for_bit():
    bits = np.arange(1, 65, dtype=np.uint16).reshape(2, 32)  # bf16 as raw bits
    mask = sparse24.mask24(bits.astype(np.float32))
    c = sparse24.compress(bits, mask)
    assert c.values.dtype == np.uint16
    assert np.array_equal(sparse24.decompress(c), np.where(mask, bits, 0))


def test_compress_refuses_a_w_or_mask_that_is_not_2_4():
    with pytest.raises(ValueError, match="not 2:4 sparse"):
        sparse24.compress(np.ones((2, 8)))
    with pytest.raises(ValueError, match="at most two of each group"):
        sparse24.compress(np.ones((1, 4)), np.array([[True, True, True, False]]))
    with pytest.raises(ValueError, match="a 2:4 mask of a 1x4 W is 1x4, got 1x5"):
        sparse24.compress(np.ones((1, 4)), np.ones((1, 5), dtype=bool))


# ---- the metadata of mma.sp m16n8k32 --------------------------------------------------------------------
@pytest.mark.parametrize("n,k", SHAPES)
def test_metadata_reads_back_and_pads_rows_with_valid_codes(n, k):
    c = sparse24.compress(random_w(n, k), sparse24.mask24(random_w(n, k)))
    words = sparse24.metadata_m16n8k32(c)
    assert words.shape == (-(-n // 16), c.kp // 32, 16) and words.dtype == np.uint32
    assert np.array_equal(sparse24.positions_from_m16n8k32(words, n), c.positions)
    if n % 16:  # rows past N: every group keeps positions 0 and 1
        assert np.array_equal(sparse24.positions_from_m16n8k32(words, -(-n // 16) * 16)[n:].reshape(-1, 2) % 4,
                              np.tile([0, 1], ((-(-n // 16) * 16 - n) * c.kp // 4, 1)))


def _words_from_the_manifest_note(positions: np.ndarray, n: int) -> np.ndarray:
    """WE written from SP24_ARGS_NOTE's words alone, element by element (a check of the note)."""
    kp = positions.shape[1] * 2
    out = np.zeros((-(-n // 16), kp // 32, 16), dtype=np.uint32)
    for b in range(out.shape[0]):
        for s in range(out.shape[1]):
            for g in range(8):
                for h in range(2):
                    word = 0
                    for upper, row in ((0, 16 * b + g), (1, 16 * b + g + 8)):
                        for q in range(4):
                            group = (32 * s + 16 * h) // 4 + q
                            first, second = positions[row, 2 * group:2 * group + 2] if row < n else (0, 1)
                            word |= (int(first) | int(second) << 2) << (16 * upper + 4 * q)
                    out[b, s, 2 * g + h] = word
    return out


def test_the_manifest_note_says_how_the_metadata_is_laid_out():
    assert "WE[ceil(N/16)][KP/32][16]" in SP24_ARGS_NOTE and "0b0100" in SP24_ARGS_NOTE
    for n, k in ((17, 37), (40, 96)):
        c = sparse24.compress(random_w(n, k), sparse24.mask24(random_w(n, k, seed=1)))
        assert np.array_equal(_words_from_the_manifest_note(c.positions, n), sparse24.metadata_m16n8k32(c))


@pytest.mark.parametrize("n,k,m", [(16, 32, 8), (48, 96, 24), (37, 70, 11)])
def test_the_instruction_model_multiplies_the_masked_w(n, k, m):
    """Each instruction of a W [n, k] times X [m, k]: the kernel's fragments of the compressed tile,
    its metadata words and X (tests/mma_sp_model.warp_operands) fed to the instruction as the PTX ISA
    describes it give the masked W times Xᵀ, summed over k-steps."""
    rng = np.random.default_rng(n * k)
    w, x = random_w(n, k, seed=n), rng.standard_normal((m, k))
    c = sparse24.compress(w, sparse24.mask24(w))
    words = sparse24.metadata_m16n8k32(c)
    rows, cols = -(-n // 16) * 16, -(-m // 8) * 8
    wc = np.zeros((rows, c.kp // 2))
    wc[:n] = c.values
    xp = np.zeros((cols, c.kp))
    xp[:m, :k] = x
    yt = np.zeros((rows, cols))
    for b in range(rows // 16):
        for j in range(cols // 8):
            for s in range(c.kp // 32):
                a, bb, e = warp_operands(wc[16 * b:16 * b + 16, 16 * s:16 * s + 16], words[b, s],
                                         xp[8 * j:8 * j + 8, 32 * s:32 * s + 32])
                yt[16 * b:16 * b + 16, 8 * j:8 * j + 8] += mma_sp_m16n8k32(a, bb, e)
    masked = np.where(sparse24.mask24(w), w, 0).astype(np.float64)
    np.testing.assert_allclose(yt[:n, :m], masked @ x.T, rtol=1e-12, atol=1e-12)


def test_the_model_reads_only_the_selected_lanes_metadata_and_refuses_invalid_codes():
    w = random_w(16, 32)
    c = sparse24.compress(w, sparse24.mask24(w))
    x = np.random.default_rng(1).standard_normal((8, 32))
    a, b, e = warp_operands(c.values, sparse24.metadata_m16n8k32(c)[0, 0], x)
    want = mma_sp_m16n8k32(a, b, e)
    noisy = e.copy()
    noisy[2::4] = noisy[3::4] = 0  # lanes 4g+2, 4g+3 give nothing under selector 0
    np.testing.assert_array_equal(mma_sp_m16n8k32(a, b, noisy), want)
    moved = np.roll(e.reshape(8, 4), 2, axis=1).reshape(32)  # the words on lanes 4g+2, 4g+3: selector 1
    np.testing.assert_array_equal(mma_sp_m16n8k32(a, b, moved, selector=1), want)
    swapped = e.reshape(8, 4)[:, [1, 0, 3, 2]].reshape(32)  # the halves of K exchanged: another product
    assert not np.allclose(mma_sp_m16n8k32(a, b, swapped), want)
    with pytest.raises(ValueError, match="invalid metadata code 0000"):
        mma_sp_m16n8k32(a, b, np.zeros(32, dtype=np.uint32))
    assert d_position(5, 3) == (9, 3)


# ---- the problem, its inputs and reference ----------------------------------------------------------------
def test_a_2_4_problem_says_what_it_is():
    p = Problem(130, 264, 136, DType.bf16, bias=True, sparsity="2:4")
    assert p.key == "130x264x136_bf16_forward_bias_sp24" and p.structured and not p.sparse
    assert p.density == 0.5 and p.flops == pytest.approx(130 * 264 * 136)
    assert p.min_bytes == pytest.approx(2 * (130 * 136 + 264 * 136 / 2 + 130 * 264 + 264) + 264 * 136 / 8)
    assert Problem.from_dict(p.to_dict()) == p and p.to_dict()["sparsity"] == "2:4"
    assert "sparsity" not in Problem(4, 4, 4).to_dict()  # the dict of a problem without one is as before
    assert Problem(4, 4, 4, DType.fp16, sparsity="2:4", density=0.5).density == 0.5


@pytest.mark.parametrize("kwargs,needle", [
    (dict(dtype=DType.fp32), "fp16 or bf16, not fp32"),
    (dict(dtype=DType.tf32), "fp16 or bf16, not tf32"),
    (dict(layout=Layout.grad_input), "forward layout only, not grad_input"),
    (dict(layout=Layout.grad_weight), "forward layout only, not grad_weight"),
    (dict(block=16, density=0.5, pattern="abc"), "either 2:4 sparse or block-sparse, not both"),
    (dict(density=0.25), "keeps 0.5 of W, not 0.25"),
    (dict(sparsity="1:2"), "sparsity must be one of 2:4"),
])
def test_a_2_4_problem_refuses_what_no_kernel_computes(kwargs, needle):
    args = dict(m=4, n=4, k=4, dtype=DType.bf16, sparsity="2:4") | kwargs
    with pytest.raises(ValueError, match=needle):
        Problem(**args)


@pytest.mark.parametrize("shape", [(1, 1, 1), (5, 37, 37), (13, 130, 5)])
@pytest.mark.parametrize("dtype", [DType.bf16, DType.fp16])
def test_inputs_are_the_compressed_2_4_w_and_the_reference_its_masked_product(shape, dtype):
    m, n, k = shape
    p = Problem(m, n, k, dtype, bias=True, sparsity="2:4")
    inputs = random_inputs(p, np.random.default_rng(0))
    assert {name: a.shape for name, a in inputs.items()} == input_shapes(p)
    assert inputs["WE"].dtype == np.uint32 and inputs["WC"].dtype == inputs["X"].dtype
    w = dense_w(p, inputs)
    assert w.shape == (n, k) and sparse24.groups_over(to_float64(w, dtype)) == 0
    assert np.count_nonzero(to_float64(w, dtype)) <= n * 2 * -(-k // 4)
    x, b = to_float64(inputs["X"], dtype), to_float64(inputs["B"], dtype)
    np.testing.assert_allclose(reference(p, inputs), x @ to_float64(w, dtype).T + b)
    assert set(references(p, inputs)) == {"Y"}


def test_the_store_keeps_a_2_4_problem_apart_from_the_dense_one(tmp_path):
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    p24, dense = Problem(8, 16, 40, DType.bf16, sparsity="2:4"), Problem(8, 16, 40, DType.bf16)
    assert store.problem(p24) != store.problem(dense) and store.problem(p24) == store.problem(p24)
    rows = {r["key"]: r for r in store.problems()}
    assert rows[p24.key]["sparsity"] == "2:4" and rows[p24.key]["pattern"] is None
    assert "sparsity" not in rows[dense.key] and rows[dense.key]["density"] == 1.0
    assert store.find_problem(p24.key) == p24 and store.find_problem(dense.key) == dense
