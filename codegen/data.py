"""Host-side inputs, float64 references and error measures (numpy only, no CUDA)."""

from __future__ import annotations

import math

import numpy as np

from codegen.problem import DType, Layout, Problem

#: numpy storage type of each element type (bf16 is kept as its 16 raw bits).
STORAGE = {DType.fp32: np.float32, DType.tf32: np.float32, DType.fp16: np.float16, DType.bf16: np.uint16}
#: 16-bit pattern of a quiet NaN, used to poison outputs before a run.
NAN16 = {DType.fp16: 0x7E00, DType.bf16: 0x7FC0}
NAN32_HALVES = 0x7FC0  # the high and low halves of 0x7FC07FC0, a float32 NaN


def _bf16_from_f32(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
    return (rounded >> 16).astype(np.uint16)


def to_storage(x: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is DType.bf16:
        return _bf16_from_f32(x)
    return np.ascontiguousarray(x, dtype=STORAGE[dtype])


def to_float64(x: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype is DType.bf16:
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def input_shapes(problem: Problem) -> dict[str, tuple[int, ...]]:
    """The dense input arrays of the problem's layout and their shapes, in the problem's M, N, K
    (codegen.problem.Layout): forward X[M,K], W[N,K] (+ B[N]); grad_input dY[M,K], W[K,N] (a
    block-sparse W as WT, the kept blocks of Wᵀ in BSR, with RP and CI, and as W's own kept blocks W
    with BI, the index among them of each of Wᵀ's, for kernels that read them in place); grad_weight dY[K,M], X[K,N]
    (with a block-sparse W, also its RP and CI: dW is sampled at its kept blocks).
    A block-sparse forward W is the codegen.sparse blocks (``random_inputs``); a 2:4 W is WC, its kept
    halves [N, KP/2], and WE, their positions as mma.sp m16n8k32 reads them (codegen.sparse24)."""
    m, n, k = problem.m, problem.n, problem.k
    if problem.structured:  # a 2:4 W as its kept halves and their metadata (codegen.sparse24)
        from codegen import sparse24

        kp = sparse24.padded_k(k)
        return {"X": (m, k), "WC": (n, kp // 2), "WE": (-(-n // sparse24.M16N8K32_ROWS), kp // sparse24.K_ALIGN, 16),
                **({"B": (n,)} if problem.bias else {})}
    if problem.layout is Layout.grad_weight and problem.sparse:
        return {"DY": (k, m), "X": (k, n), "RP": (-(-m // problem.block) + 1,), "CI": (problem.nnzb,)}
    if problem.layout is Layout.grad_input and problem.sparse:  # Wᵀ's kept blocks in BSR, with its index arrays
        from codegen import sparse

        pt = sparse.lookup(problem).transpose()
        return {"DY": (m, k), "WT": (pt.nnzb, pt.block, pt.block), "RP": pt.indptr.shape, "CI": pt.indices.shape,
                "W": (pt.nnzb, pt.block, pt.block), "BI": (pt.nnzb,)}
    if problem.layout is Layout.grad_input:
        return {"DY": (m, k), "W": (k, n)}
    if problem.layout is Layout.grad_weight:
        return {"DY": (k, m), "X": (k, n)}
    return {"X": (m, k), "W": (n, k), **({"B": (n,)} if problem.bias else {})}


def output_shapes(problem: Problem) -> dict[str, tuple[int, ...]]:
    """The output arrays of the problem's layout, the GEMM's own first: Y[M,N], dX[M,N], or dW[M,N]
    with db[M] = Σ_batch dY when the layer has a bias; a weight gradient sampled at a block-sparse W
    is its BSR values dW[nnzb, block, block] (codegen.sparse)."""
    shape = (problem.m, problem.n)
    if problem.layout is Layout.grad_weight and problem.sparse:
        shape = (problem.nnzb, problem.block, problem.block)
    if problem.layout is Layout.grad_input:
        return {"DX": shape}
    if problem.layout is Layout.grad_weight:
        return {"DW": shape, **({"DB": (problem.m,)} if problem.bias else {})}
    return {"Y": shape}


def random_inputs(problem: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The layout's inputs (``input_shapes``) uniform in [-1, 1), in storage format. Never zeros.
    A 2:4 W is pruned from a random one by magnitude and comes compressed (WC, WE; codegen.sparse24).
    A block-sparse W comes as its kept blocks ``W[nnzb, block, block]`` (zero past N and K) with
    ``RP`` and ``CI``, the BSR index arrays of its registered pattern (codegen.sparse)."""
    p = problem
    if p.structured:
        return _random_24(p, rng)
    if p.layout is Layout.grad_input and p.sparse:
        from codegen import sparse

        pattern = sparse.lookup(p)
        pt = pattern.transpose()
        blocks = rng.uniform(-1, 1, (pattern.nnzb, p.block, p.block)).astype(np.float32)
        w = pattern.expand(blocks)  # the layer's W [K, N] (out x in), zeros outside the kept blocks
        return {"DY": to_storage(rng.uniform(-1, 1, (p.m, p.k)).astype(np.float32), p.dtype),
                "WT": to_storage(pt.gather(np.ascontiguousarray(w.T)), p.dtype), "RP": pt.indptr, "CI": pt.indices,
                "W": to_storage(pattern.gather(w), p.dtype), "BI": pattern.transpose_order()}
    if p.layout is Layout.grad_weight and p.sparse:  # dY and X dense; W's BSR index arrays say where dW goes
        from codegen import sparse

        pattern = sparse.lookup(p)
        return {"DY": to_storage(rng.uniform(-1, 1, (p.k, p.m)).astype(np.float32), p.dtype),
                "X": to_storage(rng.uniform(-1, 1, (p.k, p.n)).astype(np.float32), p.dtype),
                "RP": pattern.indptr, "CI": pattern.indices}
    if p.layout is not Layout.forward:
        return {name: to_storage(rng.uniform(-1, 1, shape).astype(np.float32), p.dtype)
                for name, shape in input_shapes(p).items()}
    out = {"X": to_storage(rng.uniform(-1, 1, (p.m, p.k)).astype(np.float32), p.dtype)}
    if p.sparse:
        from codegen import sparse

        pattern = sparse.lookup(p)
        blocks = rng.uniform(-1, 1, (pattern.nnzb, p.block, p.block)).astype(np.float32)
        out["W"] = to_storage(pattern.gather(pattern.expand(blocks)), p.dtype)  # zero the padding
        out["RP"], out["CI"] = pattern.indptr, pattern.indices
    else:
        out["W"] = to_storage(rng.uniform(-1, 1, (p.n, p.k)).astype(np.float32), p.dtype)
    if p.bias:
        out["B"] = to_storage(rng.uniform(-1, 1, p.n).astype(np.float32), p.dtype)
    return out


def _random_24(p: Problem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs of a 2:4 problem: X, a random W magnitude-pruned to 2:4 and compressed (WC, WE), B."""
    from codegen import sparse24

    w = rng.uniform(-1, 1, (p.n, p.k)).astype(np.float32)
    packed = sparse24.compress(w, sparse24.mask24(w))
    out = {"X": to_storage(rng.uniform(-1, 1, (p.m, p.k)).astype(np.float32), p.dtype),
           "WC": to_storage(packed.values, p.dtype), "WE": sparse24.metadata_m16n8k32(packed)}
    if p.bias:
        out["B"] = to_storage(rng.uniform(-1, 1, p.n).astype(np.float32), p.dtype)
    return out


def dense_w(problem: Problem, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """W as a dense array in storage format (a block-sparse W expanded, zeros elsewhere): [N, K] in
    the forward layout, the layer's [K, N] (out x in) in grad_input. A 2:4 W is decompressed from
    WC and WE (zeros where nothing is kept)."""
    if problem.structured:
        from codegen import sparse24

        positions = sparse24.positions_from_m16n8k32(inputs["WE"], problem.n)
        return sparse24.decompress(sparse24.Compressed(inputs["WC"], positions, problem.k))
    if not problem.sparse:
        return inputs["W"]
    from codegen import sparse

    if problem.layout is Layout.grad_input:
        return np.ascontiguousarray(sparse.lookup(problem).transpose().expand(inputs["WT"]).T)
    return sparse.lookup(problem).expand(inputs["W"])


def references(problem: Problem, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of the problem's layout (``output_shapes``) in float64 from the (already
    rounded) inputs."""
    if problem.layout is Layout.forward:
        return {"Y": reference(problem, inputs)}
    f = {name: to_float64(a, problem.dtype) for name, a in inputs.items() if name in ("DY", "X")}
    if problem.layout is Layout.grad_input:
        return {"DX": f["DY"] @ to_float64(dense_w(problem, inputs), problem.dtype)}
    out = {"DW": f["DY"].T @ f["X"]}
    if problem.sparse:  # sampled at the kept blocks: W's BSR values, zero past M and N
        from codegen import sparse

        out["DW"] = sparse.lookup(problem).gather(out["DW"])
    if problem.bias:
        out["DB"] = f["DY"].sum(axis=0)
    return out


def reference(problem: Problem, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """Y of a forward problem in float64 from the (already rounded) inputs."""
    x = to_float64(inputs["X"], problem.dtype)
    w = to_float64(dense_w(problem, inputs), problem.dtype)
    y = x @ w.T
    if problem.bias:
        y += to_float64(inputs["B"], problem.dtype)[None, :]
    return y


def absolute(problem: Problem, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs with every value made non-negative (index arrays as they are): their references
    are the magnitudes |X|·|W|ᵀ + |b| (and so on by layout) that rounding errors scale with."""
    out = {}
    for name, a in inputs.items():
        if name in ("RP", "CI"):
            out[name] = a
        elif problem.dtype is DType.bf16:
            out[name] = a & np.uint16(0x7FFF)
        else:
            out[name] = np.abs(a)
    return out


def compare(problem: Problem, y: np.ndarray, ref: np.ndarray,
            scale: np.ndarray | None = None) -> tuple[str, str, float | None]:
    """(status, evidence, relative error) of an output against its reference: the Frobenius norm of
    the error over the reference's. Where the terms of the sums cancel (a handful of outputs, as in a
    1x1x1 problem), the reference's norm falls far below the terms' own and no rounding could meet
    the bound; with ``scale`` (the reference of ``absolute`` inputs) the norm divided by is at least
    ``|scale| / sqrt(K + 1)``, about what random signs leave of it, so a large problem is held as
    before."""
    got = to_float64(y, problem.dtype).reshape(ref.shape)
    bad = ~np.isfinite(got)
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), bad.shape)
        return "nan_or_inf", f"{int(bad.sum())} of {bad.size} outputs not finite (unwritten or overflow), first at {first}", None
    denom = float(np.linalg.norm(ref))
    if scale is not None:
        denom = max(denom, float(np.linalg.norm(scale)) / math.sqrt(problem.k + 1))
    denom = denom or 1.0
    rel = float(np.linalg.norm(got - ref)) / denom
    if rel > problem.dtype.rel_tol:
        diff = np.abs(got - ref)
        where = np.unravel_index(int(np.argmax(diff)), diff.shape)
        return (
            "wrong_result",
            f"relative error {rel:.3g} > {problem.dtype.rel_tol:g}; max abs error {diff[where]:.3g} at {where}",
            rel,
        )
    return "ok", "", rel


def summarize(times_ms: list[float], problem: Problem) -> dict:
    """Median, p20, p80 and the rates of a list of timings."""
    t = np.asarray(times_ms, dtype=np.float64)
    median = float(np.median(t))
    return {
        "median_ms": median,
        "p20_ms": float(np.percentile(t, 20)),
        "p80_ms": float(np.percentile(t, 80)),
        "tflops": problem.flops / (median * 1e-3) / 1e12,
        "gbps": problem.min_bytes / (median * 1e-3) / 1e9,
    }
