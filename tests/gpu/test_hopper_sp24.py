"""GPU tier for the Hopper 2:4 family (2:4 W on wgmma.mma_async.sp m64nNk32): correct against float64
of X·(masked W)ᵀ (+ b) on odd shapes (M, N, K = 1; K = 5 and 37; 130x264x136; part of a 4096^3
layer; 300x200x72: three m-tiles of 128), bf16 and fp16, with and without bias (the evaluation's own validation, outputs poisoned with
NaN); metadata patterns chosen to tell a wrong metadata layout (which rows, lanes, nibbles) from a
wrong value layout or descriptor, on both metadata paths (the ring, the global loads) and both
k-tiles (64, 128: the kept halves 64- or 128-byte swizzled), and both epilogues; cluster pairs along M
(WC's box multicast) on the same shapes, where M = 1, 5, 32 or 300 gives an odd count of m-tiles at
bm = 128 (and 130, 300 at bm = 64; 67, 130, 300 at bm = 16: a last pair's second block past M) and N < bn/2
a half of WC wholly past N; an export run from its
manifest alone; bench against cuBLAS at 4096^3 and a tiny search through the command line.

The CPU tier checks the kernel's metadata loads and the packer against the instruction as the PTX
ISA describes it (tests/test_wgmma_sp_model.py); this tier checks that description, and the shared
memory descriptors of the 64-byte-swizzled kept halves, against the hardware."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from codegen import sparse24
from codegen.data import to_float64, to_storage
from codegen.evaluate import Evaluator
from codegen.export import export_files
from codegen.families.hopper_sp24 import Spec
from codegen.problem import DType, Problem
from tests import sp24_patterns
from tests.gpu.test_export_and_search import _launch_from_manifest

pytestmark = pytest.mark.gpu

QUICK = {"reps_min": 3, "reps_max": 3, "target_ms": 1.0}
SHAPES = [(1, 1, 1), (1, 64, 5), (3, 17, 5), (5, 37, 37), (67, 45, 91), (130, 264, 136), (32, 4096, 4096),
          (1000, 1030, 1048), (300, 200, 72)]
VARIANTS = [
    {},  # the default: 128 x 256, two consumers of 128 of W's rows (two m64 blocks each)
    dict(bm=64, bn=128, consumers=1, stages=6),
    dict(bm=256, bn=128, consumers=2, persistent=True),
    dict(bm=16, bn=64, consumers=1, stages=3, group_m=1),  # wgmma N = 16
    dict(bm=128, bn=128, consumers=2, stages=2, persistent=True),  # a ring of two: every phase flips
    # k-tiles of 128: two X boxes a stage, WC 128-byte swizzled, four k-steps (K = 37 or 136: a ragged last k-tile)
    dict(bk=128, stages=3),
    dict(bk=128, bm=256, bn=128, stages=2, persistent=True),
    dict(bk=128, bm=16, bn=64, consumers=1, stages=4, group_m=1),
    dict(bk=128, bm=128, bn=128, stages=4, persistent=True),
    # the metadata loaded by each consumer thread from global memory instead of the ring
    dict(meta="global"),
    dict(meta="global", bk=128, bm=64, bn=128, consumers=1, stages=4),
    # the epilogue through shared memory: 16-byte pieces of Y's rows where N is a multiple of 8 (4096, 264),
    # element by element where it is not (17, 37, 45, 1030)
    dict(epilogue="smem"),
    dict(epilogue="smem", bk=128, stages=2, persistent=True),
    dict(epilogue="smem", bm=16, bn=64, consumers=1, stages=3, group_m=1),
    dict(epilogue="smem", bm=256, bn=128, stages=3, persistent=True, meta="global"),
]
#: Cluster pairs along M sharing WC's box (each block multicasts half): persistent and not, both k-tiles,
#: both metadata paths and epilogues, one consumer of 64 rows (halves of 32 rows).
PAIRS = [
    dict(cluster=2),
    dict(cluster=2, stages=5, persistent=True, epilogue="smem"),
    dict(cluster=2, bk=128, stages=3, persistent=True),
    dict(cluster=2, bm=64, bn=128, consumers=1, stages=6, meta="global"),
    dict(cluster=2, bm=16, bn=64, consumers=1, stages=2, group_m=1, persistent=True, epilogue="smem"),
]
VARIANTS += PAIRS
CASES = ([(DType.bf16, bias, v) for v in VARIANTS for bias in (False, True)]
         + [(DType.fp16, bias, v) for v in VARIANTS[:3] + VARIANTS[5:6] + VARIANTS[11:12] + PAIRS[:2]
            for bias in (False, True)])


def _spec(dtype, bias, fields, k):
    return Spec(dtype=dtype, bias=bias, prepass="pack" if k % 8 else "none", **fields)


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(baseline=False, timing=QUICK, timeout_s=120.0) as ev:
        yield ev


@pytest.mark.parametrize("dtype,bias,fields", CASES, ids=[Spec(dtype=d, bias=b, **f).name for d, b, f in CASES])
def test_correct_on_odd_shapes(evaluator, dtype, bias, fields):
    for m, n, k in SHAPES:
        spec = _spec(dtype, bias, fields, k)
        problem = Problem(m, n, k, dtype, bias=bias, sparsity="2:4")
        result, _ = evaluator.evaluate(spec, problem)
        assert result["status"] == "ok", f"{spec.name} on {problem.key}: {result['evidence']}"
        assert result["rel_error"] <= dtype.rel_tol and result["median_ms"] > 0


@pytest.mark.parametrize("dtype", [DType.bf16, DType.fp16])
def test_a_large_layer_subset(evaluator, dtype):
    """4096^3's W with a batch of 256 rows of X (the full layer is the bench below)."""
    problem = Problem(256, 4096, 4096, dtype, bias=True, sparsity="2:4")
    for spec in (Spec(dtype=dtype, bias=True), Spec(dtype=dtype, bias=True, bm=256, bn=128, persistent=True),
                 Spec(dtype=dtype, bias=True, bk=128, stages=3), Spec(dtype=dtype, bias=True, epilogue="smem"),
                 Spec(dtype=dtype, bias=True, stages=5, persistent=True, epilogue="smem", cluster=2),
                 Spec(dtype=dtype, bias=True, epilogue="smem", cluster=2)):
        result, _ = evaluator.evaluate(spec, problem)
        assert result["status"] == "ok", f"{spec.name}: {result['evidence']}"
        assert result["rel_error"] <= dtype.rel_tol


PATTERNS = sp24_patterns.PATTERNS


#: The kernels the patterns run on: the metadata ring at k-tiles of 64 and 128, and the global loads.
PATTERN_SPECS = [dict(bm=64, bn=128, consumers=1, stages=3), dict(bm=64, bn=128, consumers=1, stages=3, bk=128),
                 dict(bm=64, bn=128, consumers=1, stages=3, meta="global")]


@pytest.mark.parametrize("fields", PATTERN_SPECS, ids=[Spec(**f).name for f in PATTERN_SPECS])
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_metadata_patterns_tell_layout_errors_apart(pattern, fields):
    """One kernel, W with chosen kept positions, launched from its export: a failure of some patterns
    and not others says which part of the wgmma.sp metadata layout (codegen.sparse24.metadata_m64nnk32,
    read from metadata_m16n8k32's words) is not the hardware's; every pattern failing points at the
    kept halves' descriptor (64-byte swizzle) or the instruction's operands instead."""
    rng = np.random.default_rng(11)
    m, n, k = 40, 200, 256
    problem = Problem(m, n, k, DType.bf16, sparsity="2:4")
    spec = Spec(**fields)
    if PATTERNS[pattern] is None:
        w = sparse24.prune24(rng.standard_normal((n, k)).astype(np.float32))
    else:
        w = sp24_patterns.w_with_positions(n, k, PATTERNS[pattern], rng)
    w = to_float64(to_storage(w, DType.bf16), DType.bf16).astype(np.float32)  # exact in bf16
    packed = sparse24.compress(w)
    x = to_float64(to_storage(rng.uniform(-1, 1, (m, k)).astype(np.float32), DType.bf16), DType.bf16)
    cu, js = export_files(spec, problem, None, "sm_90")
    y = _launch_from_manifest(cu, json.loads(js), to_storage(x.astype(np.float32), DType.bf16), None, None,
                              operands={"WC": to_storage(packed.values, DType.bf16),
                                        "WE": sparse24.metadata_m16n8k32(packed)})
    ref = x @ w.astype(np.float64).T
    err = np.linalg.norm(to_float64(y, DType.bf16) - ref) / np.linalg.norm(ref)
    assert err < DType.bf16.rel_tol, f"{spec.name}, {pattern}: relative error {err:.3g}"


@pytest.mark.parametrize("fields", [{}, dict(bk=128), dict(epilogue="smem"), dict(cluster=2)],
                         ids=["bk64", "bk128", "smem-epilogue", "cluster-pair"])
@pytest.mark.parametrize("dtype", [DType.bf16, DType.fp16])
def test_an_export_runs_from_its_manifest_alone(dtype, fields):
    problem = Problem(67, 45, 91, dtype, bias=True, sparsity="2:4")
    spec = Spec(dtype=dtype, bias=True, bm=64, bn=128, consumers=1, prepass="pack", **fields)
    cu, js = export_files(spec, problem, None, "sm_90")
    manifest = json.loads(js)
    rng = np.random.default_rng()
    x = rng.uniform(-1, 1, (67, 91)).astype(np.float32)
    w = rng.uniform(-1, 1, (45, 91)).astype(np.float32)
    b = rng.uniform(-1, 1, 45).astype(np.float32)
    packed = sparse24.compress(w, sparse24.mask24(w))  # as manifest["sparse"]["made_by"] says
    ops = {"WC": to_storage(packed.values, dtype), "WE": sparse24.metadata_m16n8k32(packed)}
    assert {k: list(v.shape) for k, v in ops.items()} == {k: v["shape"] for k, v in
                                                          manifest["sparse"]["operands"].items()}
    xs, bs = to_storage(x, dtype), to_storage(b, dtype)
    y = _launch_from_manifest(cu, manifest, xs, None, bs, operands=ops)
    masked = to_float64(to_storage(np.where(sparse24.mask24(w), w, 0), dtype), dtype)
    ref = to_float64(xs, dtype) @ masked.T + to_float64(bs, dtype)
    assert np.linalg.norm(to_float64(y, dtype) - ref) / np.linalg.norm(ref) < dtype.rel_tol


def test_bench_against_cublas_and_search_through_the_command_line(tmp_path):
    bench = subprocess.run([sys.executable, "-m", "codegen", "bench", "--m", "4096", "--n", "4096", "--k", "4096",
                            "--dtype", "bf16", "--sparsity", "2:4", "--family", "hopper_sp24", "--no-store",
                            "--json"], capture_output=True, text=True, timeout=600)
    assert bench.returncode == 0, bench.stderr
    doc = json.loads(bench.stdout)
    assert doc["kernel"].startswith("hsp24_") and doc["result"]["status"] == "ok", doc["result"]["evidence"]
    print("hopper_sp24 at 4096^3:", doc["result"].get("median_ms"), "ms; baselines:", doc["result"].get("baselines"))
    db = f"sqlite:///{tmp_path / 's.db'}"
    search = subprocess.run([sys.executable, "-m", "codegen", "search", "--m", "130", "--n", "264", "--k", "136",
                             "--dtype", "fp16", "--sparsity", "2:4", "--family", "hopper_sp24", "--budget", "4",
                             "--db", db, "--json"], capture_output=True, text=True, timeout=900)
    assert search.returncode == 0, search.stderr
    from store import Store

    best = Store(db).best(Problem(130, 264, 136, DType.fp16, sparsity="2:4"))
    assert best and best[0]["kernel"].startswith("hsp24_fp16")
