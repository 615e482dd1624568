"""GPU tier for the sparse24 family (2:4 W on mma.sp m16n8k32): correct against float64 of X·(masked W)ᵀ
(+ b) on odd shapes (M, N, K = 1; K = 5 and 37; 130x264x136; a large layer), bf16 and fp16, with and
without bias, outputs poisoned with NaN (the evaluation's own validation, with its 67x45x91 probe);
metadata patterns chosen to tell a wrong metadata layout from a wrong value layout; an export run
from its manifest alone; bench and search through the command line, with the cuSPARSELt baseline.

Where the CPU tier (tests/test_sparse24*.py) checks the kernels against the instruction as the PTX
ISA describes it, this tier checks that description against the hardware."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from codegen import sparse24
from codegen.data import to_float64, to_storage
from codegen.evaluate import Evaluator
from codegen.export import export_files
from codegen.families.sparse24 import Spec
from codegen.problem import DType, Problem
from tests import sp24_patterns
from tests.gpu.test_export_and_search import _launch_from_manifest

pytestmark = pytest.mark.gpu

QUICK = {"reps_min": 3, "reps_max": 3, "target_ms": 1.0}
SHAPES = [(1, 1, 1), (1, 64, 5), (3, 17, 5), (5, 37, 37), (67, 45, 91), (130, 264, 136), (32, 4096, 4096),
          (1000, 1030, 1050)]
VARIANTS = [
    {},  # the default: 8 warps of 32x32, 16-byte stores through shared memory
    dict(bm=32, bn=32, bk=32, wm=16, wn=16, stages=2),  # one k-step per tile: the double buffer through f[1]
    dict(bm=128, bn=128, bk=64, wm=64, wn=32, stages=3),
    dict(bm=64, bn=128, bk=32, wm=32, wn=64, stages=4, smem="pad", epilogue="direct"),
    dict(bm=16, bn=64, bk=128, wm=8, wn=32, stages=4, group_m=4),
    dict(bm=16, bn=32, bk=128, wm=16, wn=16, stages=4, split_k=4, reduce="two_pass"),
    dict(bm=32, bn=64, bk=64, wm=16, wn=32, stages=3, split_k=3, reduce="two_pass", epilogue="direct"),
]
CASES = ([(DType.bf16, bias, v) for v in VARIANTS for bias in (False, True)]
         + [(DType.fp16, bias, v) for v in VARIANTS[:4] for bias in (False, True)])


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(baseline=False, timing=QUICK, timeout_s=120.0) as ev:
        yield ev


@pytest.mark.parametrize("dtype,bias,fields", CASES, ids=[Spec(dtype=d, bias=b, **f).name for d, b, f in CASES])
def test_correct_on_odd_shapes(evaluator, dtype, bias, fields):
    spec = Spec(dtype=dtype, bias=bias, **fields)
    for m, n, k in SHAPES:
        problem = Problem(m, n, k, dtype, bias=bias, sparsity="2:4")
        result, _ = evaluator.evaluate(spec, problem)
        if result["status"] == "invalid" and "k-tiles" in result["evidence"]:
            continue  # split-K finer than K: refused before compile, by design
        assert result["status"] == "ok", f"{spec.name} on {problem.key}: {result['evidence']}"
        assert result["rel_error"] <= dtype.rel_tol and result["median_ms"] > 0


#: The patterns of the mma.sp layout (m16n8k32: no warpgroups; k-tiles split across instructions alike).
PATTERNS = {name: sp24_patterns.PATTERNS[name] for name in
            ("all-01", "all-23", "all-13", "rows-differ", "halves-differ", "groups-differ", "random")}


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_metadata_patterns_tell_layout_errors_apart(pattern):
    """One kernel, W with chosen kept positions, launched from its export: a failure of some patterns
    and not others says which part of the metadata layout (codegen.sparse24.metadata_m16n8k32) is
    not the hardware's."""
    rng = np.random.default_rng(11)
    m, n, k = 24, 48, 96
    problem = Problem(m, n, k, DType.bf16, sparsity="2:4")
    spec = Spec(bm=32, bn=32, bk=32, wm=16, wn=16, stages=2)
    if PATTERNS[pattern] is None:
        w = sparse24.prune24(rng.standard_normal((n, k)).astype(np.float32))
    else:
        w = sp24_patterns.w_with_positions(n, k, PATTERNS[pattern], rng)
    w = to_float64(to_storage(w, DType.bf16), DType.bf16).astype(np.float32)  # exact in bf16
    packed = sparse24.compress(w)
    x = to_float64(to_storage(rng.uniform(-1, 1, (m, k)).astype(np.float32), DType.bf16), DType.bf16)
    cu, js = export_files(spec, problem, None, "sm_90")  # the lent GPUs are sm_90
    y = _launch_from_manifest(cu, json.loads(js), to_storage(x.astype(np.float32), DType.bf16), None, None,
                              operands={"WC": to_storage(packed.values, DType.bf16),
                                        "WE": sparse24.metadata_m16n8k32(packed)})
    ref = x @ w.astype(np.float64).T
    err = np.linalg.norm(to_float64(y, DType.bf16) - ref) / np.linalg.norm(ref)
    assert err < DType.bf16.rel_tol, f"{pattern}: relative error {err:.3g}"


@pytest.mark.parametrize("dtype", [DType.bf16, DType.fp16])
def test_an_export_runs_from_its_manifest_alone(dtype):
    problem = Problem(67, 45, 91, dtype, bias=True, sparsity="2:4")
    spec = Spec(dtype=dtype, bias=True, split_k=2, reduce="two_pass", bm=32, bn=32, bk=32, wm=16, wn=16)
    cu, js = export_files(spec, problem, None, "sm_90")  # the lent GPUs are sm_90
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


def test_bench_and_search_through_the_command_line(tmp_path):
    bench = subprocess.run([sys.executable, "-m", "codegen", "bench", "--m", "256", "--n", "1024", "--k", "1024",
                            "--dtype", "bf16", "--bias", "--sparsity", "2:4", "--no-store", "--json"],
                           capture_output=True, text=True, timeout=600)
    assert bench.returncode == 0, bench.stderr
    doc = json.loads(bench.stdout)
    assert doc["kernel"].startswith("sp24_") and doc["problem"]["sparsity"] == "2:4"
    assert doc["result"]["status"] == "ok", doc["result"]["evidence"]
    if importlib.util.find_spec("torch") is not None:  # the baselines run on torch
        assert "cublas" in doc["result"]["baselines"]
        print("cuSPARSELt beside it:", doc["result"]["baselines"].get("cusparselt", "not run (see the bench line)"),
              bench.stderr.strip().splitlines()[-1])
    db = f"sqlite:///{tmp_path / 's.db'}"
    search = subprocess.run([sys.executable, "-m", "codegen", "search", "--m", "130", "--n", "264", "--k", "136",
                             "--dtype", "fp16", "--sparsity", "2:4", "--budget", "6", "--db", db, "--json"],
                            capture_output=True, text=True, timeout=900)
    assert search.returncode == 0, search.stderr
    from store import Store

    best = Store(db).best(Problem(130, 264, 136, DType.fp16, sparsity="2:4"))
    assert best and best[0]["kernel"].startswith("sp24_fp16")
