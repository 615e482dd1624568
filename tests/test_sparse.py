"""CPU tier: codegen.sparse, the block-sparse W: patterns, their hash and registry, the patterns
of a given W (magnitude pruning, non-zero blocks, masks) and reading W from .npy, .npz, .pt and
.safetensors files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from codegen import sparse
from codegen.problem import DType, Problem
from codegen.sparse import Pattern, WeightsError, from_dense, load_weights, prune_blocks


def pattern_of(rows: list[list[int]], n: int, k: int, block: int = 16) -> Pattern:
    return Pattern.from_mask(np.array(rows, dtype=bool), n, k, block)


# ---- Pattern: validation -------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,needle", [
    (dict(block=8), "block must be one of 16, 32, 64"),
    (dict(n=0), "n must be an integer >= 1"),
    (dict(k=2.5), "k must be an integer >= 1"),
    (dict(indptr=[0, 1]), "indptr must be 3 non-decreasing offsets from 0"),
    (dict(indptr=[1, 1, 2]), "indptr must be 3 non-decreasing offsets from 0"),
    (dict(indptr=[0, 2, 1]), "indptr must be 3 non-decreasing offsets from 0"),
    (dict(indptr=[0, 1, 3]), "indptr ends at 3 but there are 2 block indices"),
    (dict(indices=[0, 2]), "block column indices must lie in [0, 2)"),
    (dict(indices=[-1, 1]), "block column indices must lie in [0, 2)"),
    (dict(indptr=[0, 2, 2], indices=[1, 1]), "block row 0: column indices must be strictly ascending"),
    (dict(indptr=[0, 2, 2], indices=[1, 0]), "block row 0: column indices must be strictly ascending"),
])
def test_pattern_refuses_a_bad_structure(kwargs, needle):
    args = dict(n=20, k=20, block=16, indptr=[0, 1, 2], indices=[0, 1]) | kwargs  # 2x2 blocks
    with pytest.raises(ValueError) as e:
        Pattern(**args)
    assert needle in str(e.value)


def test_pattern_shape_and_counts():
    p = pattern_of([[1, 0, 1], [0, 0, 0]], n=20, k=40)
    assert (p.block_rows, p.block_cols, p.nnzb) == (2, 3, 2)
    assert p.density == pytest.approx(2 / 6)
    assert p.row_counts.tolist() == [2, 0]
    assert p.indptr.dtype == np.int32 and p.indices.dtype == np.int32
    assert p.indptr.tolist() == [0, 2, 2] and p.indices.tolist() == [0, 2]


# ---- masks ---------------------------------------------------------------------------------------
def test_from_mask_and_mask_round_trip():
    mask = np.random.default_rng(3).random((5, 7)) < 0.4
    p = Pattern.from_mask(mask, 70, 100, 16)
    assert np.array_equal(p.mask(), mask)
    assert p.nnzb == int(mask.sum())
    assert np.array_equal(Pattern.from_mask(p.mask(), 70, 100, 16).indices, p.indices)


def test_from_mask_of_the_wrong_shape():
    with pytest.raises(ValueError, match="a block mask for 70x100 in 16x16 blocks is 5x7, got 5x6"):
        Pattern.from_mask(np.ones((5, 6), dtype=bool), 70, 100, 16)


# ---- random patterns -----------------------------------------------------------------------------
@pytest.mark.parametrize("density,kept", [(0.0, 0), (0.1, 4), (0.25, 10), (0.5, 20), (1.0, 40)])
def test_random_keeps_exactly_round_density_times_blocks(density, kept):
    p = Pattern.random(100, 300, 32, density, seed=5)  # 4 x 10 blocks
    assert p.nnzb == kept == round(density * 40)
    assert p.density == kept / 40


def test_random_is_deterministic_in_its_seed():
    a, b = Pattern.random(256, 256, 16, 0.3, seed=7), Pattern.random(256, 256, 16, 0.3, seed=7)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.indptr, b.indptr) and a.hash == b.hash
    c = Pattern.random(256, 256, 16, 0.3, seed=8)
    assert c.nnzb == a.nnzb and c.hash != a.hash
    assert Pattern.random(256, 256, 16, 0.3).hash == Pattern.random(256, 256, 16, 0.3, seed=0).hash


@pytest.mark.parametrize("density", [-0.01, 1.01, float("nan")])
def test_random_refuses_a_density_outside_0_1(density):
    with pytest.raises(ValueError, match="density must lie in"):
        Pattern.random(64, 64, 16, density)


# ---- values: expand and gather -------------------------------------------------------------------
@pytest.mark.parametrize("n,k,block", [(64, 64, 16), (70, 100, 16), (33, 65, 32), (1, 1, 64), (130, 7, 64)])
def test_expand_and_gather_round_trip(n, k, block):
    rng = np.random.default_rng(n * k)
    p = Pattern.random(n, k, block, 0.5, seed=2)
    w = rng.standard_normal((n, k)).astype(np.float32)
    blocks = p.gather(w)
    assert blocks.shape == (p.nnzb, block, block) and blocks.flags.c_contiguous
    dense = p.expand(blocks)
    assert dense.shape == (n, k) and dense.dtype == np.float32
    keep = np.repeat(np.repeat(p.mask(), block, axis=0), block, axis=1)[:n, :k]
    assert np.array_equal(dense, np.where(keep, w, 0))  # kept blocks exactly, zeros elsewhere
    assert np.array_equal(p.gather(dense), blocks)


def test_gather_pads_the_edges_with_zeros_and_orders_blocks_as_indices():
    w = np.arange(1, 20 * 20 + 1, dtype=np.float32).reshape(20, 20)
    p = pattern_of([[0, 1], [1, 1]], n=20, k=20)
    blocks = p.gather(w)
    assert blocks.shape == (3, 16, 16)
    assert blocks[0, 0, 0] == w[0, 16] and np.all(blocks[0, :, 4:] == 0)  # block (0, 1): 4 real columns
    assert blocks[1, 0, 0] == w[16, 0] and np.all(blocks[1, 4:, :] == 0)  # block (1, 0): 4 real rows
    assert blocks[2, 3, 3] == w[19, 19] and np.count_nonzero(blocks[2]) == 16


def test_gather_refuses_another_shape():
    with pytest.raises(ValueError, match="W is 20x21, the pattern is 20x20"):
        Pattern.random(20, 20, 16, 1.0).gather(np.zeros((20, 21)))


# ---- identity: hash, dict, registry --------------------------------------------------------------
def test_hash_is_stable_and_sensitive_to_shape_and_structure():
    p = pattern_of([[1, 0], [0, 1]], n=32, k=32)
    assert p.hash == pattern_of([[1, 0], [0, 1]], n=32, k=32).hash
    assert len(p.hash) == 16 and int(p.hash, 16) >= 0
    # a store identity: the same structure hashes the same in every process and release
    assert p.hash == "00d31fa35a9a8ff0"
    others = [pattern_of([[0, 1], [1, 0]], n=32, k=32), pattern_of([[1, 0], [0, 0]], n=32, k=32),
              pattern_of([[1, 0], [0, 1]], n=31, k=32), pattern_of([[1, 0], [0, 1]], n=32, k=31),
              Pattern.from_mask(np.eye(1, dtype=bool), 32, 32, 32)]
    assert len({p.hash, *(o.hash for o in others)}) == 1 + len(others)


def test_dict_round_trip():
    p = Pattern.random(70, 100, 16, 0.4, seed=3)
    d = json.loads(json.dumps(p.to_dict()))
    q = Pattern.from_dict(d)
    assert q.hash == p.hash and np.array_equal(q.indices, p.indices) and (q.n, q.k, q.block) == (70, 100, 16)


def test_register_lookup_and_problem_for():
    p = Pattern.random(96, 160, 32, 0.4, seed=11)  # 3 x 5 blocks, 6 kept
    problem = sparse.problem_for(8, p, "bf16", bias=True)
    assert (problem.m, problem.n, problem.k, problem.dtype, problem.bias) == (8, 96, 160, DType.bf16, True)
    assert (problem.block, problem.density, problem.pattern) == (32, 0.4, p.hash)
    assert problem.key == f"8x96x160_bf16_forward_bias_bsr32_d0.4_{p.hash[:8]}"
    assert sparse.lookup(problem) is p and sparse.lookup(p.hash) is p
    assert Problem.from_dict(problem.to_dict()) == problem


def test_lookup_of_an_unknown_pattern_says_how_to_register_it():
    with pytest.raises(LookupError, match="'0123456789abcdef' is not known in this process"):
        sparse.lookup("0123456789abcdef")
    unknown = Problem(8, 64, 64, block=16, density=0.5, pattern="fedcba9876543210")
    with pytest.raises(LookupError, match="problem_for"):
        sparse.lookup(unknown)


@pytest.mark.parametrize("n,k,block", [(256, 256, 16), (64, 128, 32), (64, 64, 64), (40, 300, 64), (16, 16, 16)])
def test_probe_pattern(n, k, block):
    p = sparse.probe_pattern(n, k, block)
    mask = p.mask()
    assert p.nnzb >= 1
    if p.block_rows > 1:
        assert not mask[0].any()  # the first block row is empty
    if p.block_rows * p.block_cols >= 16:
        assert 0.2 <= p.density <= 0.6  # about half
    assert sparse.probe_pattern(n, k, block).hash == p.hash


# ---- patterns of a given W -----------------------------------------------------------------------
def test_prune_blocks_keeps_the_largest_blocks():
    w = np.zeros((48, 48), dtype=np.float32)  # 3 x 3 blocks of 16
    scale = {(0, 0): 1.0, (0, 2): 5.0, (1, 1): 3.0, (2, 0): 4.0, (2, 2): 2.0}
    for (r, c), s in scale.items():
        w[r * 16:(r + 1) * 16, c * 16:(c + 1) * 16] = s * np.sign(np.arange(256).reshape(16, 16) % 2 - 0.5)
    p, blocks = prune_blocks(w, 16, 3 / 9)
    assert p.mask().tolist() == [[False, False, True], [False, True, False], [True, False, False]]
    assert blocks.shape == (3, 16, 16)
    assert [float(np.abs(b).max()) for b in blocks] == [5.0, 3.0, 4.0]  # in pattern order
    assert np.array_equal(blocks, p.gather(w))
    assert prune_blocks(w, 16, 4 / 9)[0].mask()[2, 2]  # the next largest
    assert prune_blocks(w, 16, 0.0)[0].nnzb == 0 and prune_blocks(w, 16, 1.0)[0].nnzb == 9


@pytest.mark.parametrize("density", [0.0, 0.05, 0.1, 0.333, 0.5, 0.77, 1.0])
def test_prune_blocks_keeps_an_exact_count(density):
    w = np.random.default_rng(1).standard_normal((100, 300)).astype(np.float32)  # 4 x 10 blocks of 32
    p, blocks = prune_blocks(w, 32, density)
    assert p.nnzb == round(density * 40) == len(blocks)
    norms = np.sort(np.square(sparse._block_view(w.astype(np.float64), 32)).sum(axis=(1, 3)).ravel())[::-1]
    kept = np.square(blocks.astype(np.float64)).sum(axis=(1, 2))
    assert np.allclose(np.sort(kept)[::-1], norms[:p.nnzb])


def test_prune_blocks_counts_padding_as_zeros_and_breaks_ties_by_block_index():
    w = np.ones((20, 20), dtype=np.float32)  # 2 x 2 blocks of 16: 256, 64, 64 and 16 ones
    assert prune_blocks(w, 16, 0.25)[0].mask().tolist() == [[True, False], [False, False]]
    assert prune_blocks(w, 16, 0.5)[0].mask().tolist() == [[True, True], [False, False]]  # tie: (0,1) before (1,0)
    assert prune_blocks(w, 16, 0.75)[0].mask().tolist() == [[True, True], [True, False]]
    same = np.ones((320, 320), dtype=np.float32)  # 400 equal blocks: the first in row-major order
    assert prune_blocks(same, 16, 0.25)[0].mask().ravel().tolist() == [True] * 100 + [False] * 300


@pytest.mark.parametrize("w,block,density,needle", [
    (np.ones((16, 16)), 16, 1.5, "density must lie in [0, 1]"),
    (np.ones((16, 16)), 16, -0.5, "density must lie in [0, 1]"),
    (np.ones((16, 16)), 24, 0.5, "block must be one of 16, 32, 64"),
    (np.ones(16), 16, 0.5, "W must be a non-empty 2-D array"),
    (np.ones((0, 16)), 16, 0.5, "W must be a non-empty 2-D array"),
    (np.full((16, 16), np.nan), 16, 0.5, "NaN or infinite"),
])
def test_prune_blocks_refuses(w, block, density, needle):
    with pytest.raises(ValueError) as e:
        prune_blocks(w, block, density)
    assert needle in str(e.value)


def test_from_dense_skips_the_zero_blocks():
    w = np.zeros((96, 64), dtype=np.float32)  # 3 x 2 blocks of 32
    w[0, 0], w[40, 40], w[95, 63] = 1.0, -2.0, 3.0
    p, blocks = from_dense(w, 32)
    assert p.mask().tolist() == [[True, False], [False, True], [False, True]]
    assert p.density == 0.5
    assert np.array_equal(p.expand(blocks), w)
    empty, none = from_dense(np.zeros((10, 10)), 16)
    assert empty.nnzb == 0 and empty.density == 0.0 and none.shape == (0, 16, 16)


def test_from_dense_with_an_element_mask():
    w = np.arange(1, 40 * 40 + 1, dtype=np.float32).reshape(40, 40)  # 2 x 2 blocks of 32, no zeros
    mask = np.zeros((40, 40), dtype=bool)
    mask[5, 33] = mask[35, 35] = True
    p, blocks = from_dense(w, 32, mask)
    assert p.mask().tolist() == [[False, True], [False, True]]
    assert np.array_equal(p.expand(blocks), np.where(mask, w, 0))  # outside the mask: zero
    ints = from_dense(w, 32, mask.astype(np.int8))[0]  # numbers: non-zero is kept
    assert ints.hash == p.hash


def test_from_dense_with_a_block_mask_keeps_whole_blocks():
    w = np.arange(1, 40 * 40 + 1, dtype=np.float32).reshape(40, 40)
    block_mask = np.array([[True, False], [False, True]])
    p, blocks = from_dense(w, 32, block_mask)
    assert np.array_equal(p.mask(), block_mask)
    assert np.array_equal(blocks, p.gather(w))
    assert blocks[1, 7, 7] == w[39, 39]


def test_from_dense_refuses_a_mask_of_another_shape():
    with pytest.raises(ValueError, match="element mask 40x40 or a block mask 2x2, got 3x3"):
        from_dense(np.ones((40, 40)), 32, np.ones((3, 3), dtype=bool))
    with pytest.raises(ValueError, match="got 40"):
        from_dense(np.ones((40, 40)), 32, np.ones(40, dtype=bool))


# ---- load_weights --------------------------------------------------------------------------------
def bf16_bits(values: np.ndarray) -> np.ndarray:
    """The bfloat16 bits of float32 values that bfloat16 holds exactly."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0), "not exact in bf16"
    return (bits >> 16).astype(np.uint16)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]], metadata: dict | None = None,
                      header_patch=None, tail: int = 0) -> Path:
    """A .safetensors file written by hand: {name: (dtype, raw little-endian array)}."""
    header, chunks, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, array) in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if header_patch:
        header_patch(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    data = b"".join(chunks)
    path.write_bytes(struct.pack("<Q", len(text)) + text + (data[:len(data) - tail] if tail else data))
    return path


W = (np.arange(6 * 10, dtype=np.float32).reshape(6, 10) - 30) / 8  # exact in fp16 and bf16


def test_npy_of_any_real_dtype_becomes_float32(tmp_path):
    for dtype in (np.float32, np.float64, np.float16, np.int32):
        np.save(tmp_path / "w.npy", (W * 8).astype(dtype) if dtype is np.int32 else W.astype(dtype))
        got = load_weights(str(tmp_path / "w.npy"))
        assert got.dtype == np.float32 and got.shape == (6, 10) and got.flags.c_contiguous
        assert np.array_equal(got, W * 8 if dtype is np.int32 else W)


def test_npz_picks_a_tensor_by_name(tmp_path):
    np.savez(tmp_path / "m.npz", **{"a.weight": W, "a.bias": W[0], "b.weight": W.T})
    assert np.array_equal(load_weights(f"{tmp_path / 'm.npz'}:b.weight"), W.T)
    with pytest.raises(WeightsError, match=r"holds 2 2-D tensors, pick one with .*m.npz:NAME; its 2-D tensors: "
                                           r"a.weight, b.weight"):
        load_weights(str(tmp_path / "m.npz"))
    np.savez(tmp_path / "one.npz", w=W, b=W[0])
    assert np.array_equal(load_weights(str(tmp_path / "one.npz")), W)  # the only 2-D one


def test_safetensors_by_hand_f32_f16_bf16(tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors", {
        "layer.weight": ("BF16", bf16_bits(W)),
        "layer.bias": ("F32", W[0].astype("<f4")),
        "half.weight": ("F16", W.T.astype("<f2")),
        "full.weight": ("F32", (2 * W).astype("<f4")),
    }, metadata={"format": "pt"})
    for name, want in (("layer.weight", W), ("half.weight", W.T), ("full.weight", 2 * W)):
        got = load_weights(f"{path}:{name}")
        assert got.dtype == np.float32 and np.array_equal(got, want), name
    with pytest.raises(WeightsError, match="holds 3 2-D tensors") as e:
        load_weights(str(path))
    assert "layer.weight, half.weight, full.weight" in str(e.value) and "layer.bias" not in str(e.value)


def test_safetensors_bf16_widening_is_exact_for_every_bit_pattern(tmp_path):
    bits = np.arange(0, 1 << 16, dtype=np.uint16).reshape(256, 256)
    path = write_safetensors(tmp_path / "all.safetensors", {"w": ("BF16", bits)})
    got = load_weights(str(path))
    want = (bits.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # NaN payloads included
    assert got[0x3F, 0x80] == 1.0 and got[0xC0, 0x00] == -2.0  # 0x3F80 is 1.0, 0xC000 is -2.0


def test_safetensors_written_by_the_library(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")
    path = tmp_path / "lib.safetensors"
    st.save_file({"proj.weight": W.astype(np.float16), "proj.bias": W[0]}, str(path), metadata={"a": "b"})
    assert np.array_equal(load_weights(str(path)), W)
    assert np.array_equal(load_weights(f"{path}:proj.weight"), W)


def test_safetensors_bf16_written_by_the_library_through_torch(tmp_path):
    pytest.importorskip("safetensors", reason="the safetensors package is not installed")
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install gemmscape[torch])")
    from safetensors.torch import save_file

    path = tmp_path / "bf16.safetensors"
    w = torch.randn(33, 70)
    save_file({"l.weight": w.to(torch.bfloat16), "l.bias": torch.zeros(33)}, str(path))
    assert np.array_equal(load_weights(str(path)), w.to(torch.bfloat16).float().numpy())


@pytest.mark.parametrize("kind,needle", [
    ("short", "is not a safetensors file (too short)"),
    ("huge-header", "is not a safetensors file (its header says"),
    ("not-json", "is not a safetensors file (its header is not JSON)"),
    ("a-list", "is not a safetensors file (its header is not a JSON object)"),
    ("no-dtype", "damaged safetensors file (tensor 'w' has no valid dtype, shape and data_offsets)"),
    ("truncated", "damaged safetensors file (tensor 'w' lies outside its data; truncated?)"),
    ("size", "damaged safetensors file (tensor 'w': 240 bytes for 60 F16 values)"),
    ("fp8", "holds F8_E4M3 values, which gemmscape does not read"),
    ("3-d", "is 3-D (shape 2x3x10); W of a linear layer is 2-D [N, K]"),
    ("empty", "is empty (shape 0x10)"),
])
def test_a_bad_safetensors_file(kind, needle, tmp_path):
    path = tmp_path / f"{kind}.safetensors"
    if kind == "short":
        path.write_bytes(b"\x01\x02")
    elif kind == "huge-header":
        path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    elif kind in ("not-json", "a-list"):
        text = b"{not json" if kind == "not-json" else b"[1, 2]  "
        path.write_bytes(struct.pack("<Q", len(text)) + text)
    elif kind == "no-dtype":
        write_safetensors(path, {"w": ("F32", W)}, header_patch=lambda h: h["w"].pop("dtype"))
    elif kind == "truncated":
        write_safetensors(path, {"w": ("F32", W)}, tail=8)
    elif kind == "size":
        write_safetensors(path, {"w": ("F32", W)}, header_patch=lambda h: h["w"].update(dtype="F16"))
    elif kind == "fp8":
        write_safetensors(path, {"w": ("F8_E4M3", np.zeros((4, 4), np.uint8))})
    elif kind == "3-d":
        write_safetensors(path, {"w": ("F32", W.reshape(2, 3, 10))})
    else:
        write_safetensors(path, {"w": ("F32", np.zeros((0, 10), np.float32))})
    with pytest.raises(WeightsError) as e:
        load_weights(f"{path}:w" if kind in ("3-d", "empty") else str(path))
    message = str(e.value)
    assert needle in message and "\n" not in message and str(path) in message


def test_selector_errors(tmp_path):
    path = write_safetensors(tmp_path / "m.safetensors", {"a.weight": ("F32", W), "b.weight": ("F32", W),
                                                          "vec": ("F32", W[0])})
    with pytest.raises(WeightsError, match=r"has no tensor 'c.weight'; its 2-D tensors: a.weight, b.weight$"):
        load_weights(f"{path}:c.weight")
    with pytest.raises(WeightsError, match=r"m.safetensors:vec is 1-D \(shape 10\)"):
        load_weights(f"{path}:vec")
    with pytest.raises(WeightsError, match="no tensor name after ':'"):
        load_weights(f"{path}:")
    only_1d = write_safetensors(tmp_path / "v.safetensors", {"v": ("F32", W[0]), "u": ("F32", W[1])})
    with pytest.raises(WeightsError, match=r"it holds no 2-D tensor \(v \[10\], u \[10\]\)"):
        load_weights(str(only_1d))
    np.save(tmp_path / "w.npy", W)
    with pytest.raises(WeightsError, match="holds one array; drop ':x'"):
        load_weights(f"{tmp_path / 'w.npy'}:x")


def test_many_tensors_are_listed_in_one_short_line(tmp_path):
    tensors = {f"layers.{i}.weight": ("F32", W) for i in range(30)}
    path = write_safetensors(tmp_path / "big.safetensors", tensors)
    with pytest.raises(WeightsError) as e:
        load_weights(str(path))
    assert "holds 30 2-D tensors" in str(e.value) and "layers.19.weight, ... (10 more)" in str(e.value)
    assert "layers.20.weight" not in str(e.value)


def test_a_path_with_a_colon_that_exists_is_taken_whole(tmp_path):
    path = tmp_path / "run:3.npy"
    np.save(path, W)
    assert np.array_equal(load_weights(str(path)), W)
    assert sparse.split_weights_spec(f"{tmp_path / 'x.pt'}:a:b") == (tmp_path / "x.pt:a", "b")


@pytest.mark.parametrize("kind,needle", [
    ("missing", "no weights file"),
    ("folder", "is a folder, not a weights file"),
    ("extension", "weights are .npy, .npz, .pt, .pth or .safetensors files"),
    ("npy-garbage", "is not a numpy .npy or .npz file"),
    ("npy-objects", "is not a numpy .npy or .npz file it can read (Object arrays cannot be loaded"),
    ("npy-3d", "is 3-D (shape 2x3x10)"),
    ("npy-complex", "holds complex64 values, not real numbers"),
    ("pt-garbage", "is not a torch file"),
])
def test_a_weights_file_that_cannot_be_used(kind, needle, tmp_path):
    path = tmp_path / {"extension": "w.bin", "folder": "w.npy"}.get(kind, "w.npy")
    if kind == "folder":
        path.mkdir()
    elif kind == "extension":
        path.write_bytes(b"\x00" * 16)
    elif kind == "npy-garbage":
        path.write_bytes(b"these are not weights")
    elif kind == "npy-objects":
        np.save(path, np.array([object()], dtype=object), allow_pickle=True)
    elif kind == "npy-3d":
        np.save(path, W.reshape(2, 3, 10))
    elif kind == "npy-complex":
        np.save(path, W.astype(np.complex64))
    elif kind == "pt-garbage":
        path = tmp_path / "w.pt"
        path.write_bytes(b"these are not weights")
    with pytest.raises(WeightsError) as e:
        load_weights(str(path))
    assert isinstance(e.value, ValueError)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_pt_without_torch_says_how_to_get_it(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)

    path = tmp_path / "w.pt"
    path.write_bytes(b"PK\x03\x04 a zip would follow")
    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(WeightsError, match=r"^reading \.pt needs torch \(pip install gemmscape\[torch\]\)$"):
        load_weights(str(path))


def test_pt_files(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install gemmscape[torch])")
    w = torch.from_numpy(W.copy())
    torch.save(w, tmp_path / "bare.pt")
    assert np.array_equal(load_weights(str(tmp_path / "bare.pt")), W)
    torch.save({"fc.weight": w.to(torch.bfloat16), "fc.bias": torch.zeros(6)}, tmp_path / "sd.pth")
    got = load_weights(str(tmp_path / "sd.pth"))
    assert got.dtype == np.float32 and np.array_equal(got, W)  # W is exact in bf16
    torch.save({"state_dict": {"a.weight": w.half(), "b.weight": 2 * w}, "epoch": 3}, tmp_path / "ckpt.pt")
    assert np.array_equal(load_weights(f"{tmp_path / 'ckpt.pt'}:state_dict.b.weight"), 2 * W)
    with pytest.raises(WeightsError, match="its 2-D tensors: state_dict.a.weight, state_dict.b.weight"):
        load_weights(str(tmp_path / "ckpt.pt"))
    with pytest.raises(WeightsError, match="holds one tensor; drop ':x'"):
        load_weights(f"{tmp_path / 'bare.pt'}:x")
    torch.save(torch.nn.Linear(3, 4), tmp_path / "module.pt")
    with pytest.raises(WeightsError, match="holds more than tensors"):
        load_weights(str(tmp_path / "module.pt"))
    torch.save({"epoch": 3}, tmp_path / "nothing.pt")
    with pytest.raises(WeightsError, match="holds no tensor"):
        load_weights(str(tmp_path / "nothing.pt"))
    (tmp_path / "cut.pt").write_bytes((tmp_path / "sd.pth").read_bytes()[:100])
    with pytest.raises(WeightsError, match="is not a torch file it can read"):
        load_weights(str(tmp_path / "cut.pt"))
