"""GPU tier for the tensor-core family: correct on the SIMT tier's awkward shapes (float64
reference, NaN-poisoned outputs), rows that break 16-byte alignment, faults as statuses, an
export that runs from its manifest, and a search through the CLI that stores and resumes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from codegen.evaluate import Evaluator
from codegen.export import export_files
from codegen.families.tensorcore import Spec
from codegen.problem import DType, Problem
from tests.gpu.test_export_and_search import _launch_from_manifest
from tests.gpu.test_kernels import _planted, assert_correct_on

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1, 1), (32, 4096, 4096), (67, 45, 91), (4097, 4095, 4093)]
QUICK = {"reps_min": 3, "reps_max": 3, "target_ms": 1.0}

SQUARE = dict(bm=128, bn=128, bk=32, wm=64, wn=64, stages=4, epilogue="direct")
VARIANTS = [
    SQUARE,
    dict(bm=128, bn=256, bk=64, wm=64, wn=64, stages=3, epilogue="direct"),
    dict(SQUARE, smem="pad", epilogue="smem", group_m=1),
    dict(SQUARE, prepass="pack", stages=3),
    dict(bm=32, bn=16, bk=128, wm=32, wn=16, warps_k=4, stages=5, epilogue="smem"),
    dict(bm=16, bn=16, bk=256, wm=16, wn=16, warps_k=8, stages=3, epilogue="smem"),
    dict(bm=32, bn=64, bk=64, wm=32, wn=32, stages=4, split_k=4, reduce="two_pass", epilogue="direct"),
    dict(bm=64, bn=64, bk=32, wm=32, wn=32, stages=2, split_k=3, reduce="two_pass", epilogue="smem", prepass="pack"),
    dict(mma="wmma", smem="pad", epilogue="smem", bm=128, bn=128, bk=32, wm=64, wn=32, stages=3),
    dict(mma="wmma", smem="pad", epilogue="smem", bm=64, bn=64, bk=32, wm=32, wn=32, warps_k=2, stages=4),
    # added after this tier last ran on the GPU (2026-12-01); each was validated inside the suite
    dict(bm=128, bn=256, bk=32, wm=64, wn=64, stages=3, epilogue="smem"),  # the suite's fastest at 4096^3
    dict(bm=128, bn=128, bk=32, wm=64, wn=32, stages=4, epilogue="smem"),  # the family's default
    dict(SQUARE, bk=16),  # one k-step per tile: the operand double buffer hands over through f[1]
]
TF32_VARIANTS = [
    dict(SQUARE, bk=16),
    dict(SQUARE, bk=16, prepass="pack"),
    dict(bm=64, bn=64, bk=16, wm=32, wn=32, stages=3, split_k=4, reduce="atomic", epilogue="direct"),
    dict(bm=64, bn=64, bk=32, wm=32, wn=32, stages=3, split_k=2, reduce="atomic", epilogue="smem"),
    dict(mma="wmma", smem="pad", epilogue="smem", bm=64, bn=64, bk=16, wm=32, wn=32, stages=3),
]
CASES = (
    [(DType.bf16, bias, v) for v in VARIANTS for bias in (False, True)]
    + [(DType.fp16, bias, v) for v in VARIANTS[:5] for bias in (False, True)]
    + [(DType.tf32, bias, v) for v in TF32_VARIANTS for bias in (False, True)]
)


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(baseline=False, timing=QUICK, timeout_s=120.0) as ev:
        yield ev


def test_case_count():
    assert len(CASES) >= 30


@pytest.mark.parametrize("dtype,bias,params", CASES, ids=[Spec(dtype=d, bias=b, **v).name for d, b, v in CASES])
def test_correct_on_all_shapes(evaluator, dtype, bias, params):
    assert_correct_on(evaluator, Spec(dtype=dtype, bias=bias, **params), SHAPES)


def test_faults_are_statuses_and_the_next_evaluation_succeeds():
    spec = Spec(dtype=DType.tf32, **dict(SQUARE, bk=16))
    problem = Problem(256, 256, 256, DType.tf32)
    with Evaluator(baseline=False, timing=QUICK, timeout_s=10.0) as ev:
        assert ev.run(_planted("Y[threadIdx.x + (1ll << 40)] = 1.0f;", spec), problem)["status"] == "runtime_error"
        assert ev.evaluate(spec, problem)[0]["status"] == "ok"
        hang = _planted("volatile const float* x = X; while (x[0] == x[0]) { }", spec)
        assert ev.run(hang, problem)["status"] == "timeout"
        assert ev.evaluate(spec, problem)[0]["status"] == "ok"
        garbage = _planted(
            "for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < M * N; i += gridDim.x * blockDim.x) Y[i] = 1.0f;",
            spec,
        )
        assert ev.run(garbage, problem)["status"] == "wrong_result"
        assert ev.run(_planted("", spec), problem)["status"] == "nan_or_inf"
        assert ev.evaluate(spec, problem)[0]["status"] == "ok"


def test_misaligned_rows_take_the_fallback_and_stay_correct(evaluator):
    # K = 4093 (odd): no row of X or W is 16-byte aligned; without the pack prepass the kernel
    # must take its element-wise path, with it the padded copies.
    for params in (SQUARE, dict(SQUARE, prepass="pack")):
        spec = Spec(bias=True, **params)
        result, _ = evaluator.evaluate(spec, Problem(257, 129, 4093, DType.bf16, bias=True))
        assert result["status"] == "ok", result["evidence"]


def test_exported_kernel_runs_from_its_manifest_alone():
    problem = Problem(67, 45, 91, DType.tf32, bias=True)
    spec = Spec(dtype=DType.tf32, bias=True, bm=32, bn=32, bk=16, wm=16, wn=16, stages=3, epilogue="direct", split_k=2,
                reduce="two_pass", prepass="pack")
    cu, js = export_files(spec, problem, None, "sm_90")
    manifest = json.loads(js)
    assert [k["symbol"] for k in manifest["kernels"]] == [spec.name + "_pack", spec.name, spec.name + "_reduce"]
    rng = np.random.default_rng()
    x = rng.uniform(-1, 1, (67, 91)).astype(np.float32)
    w = rng.uniform(-1, 1, (45, 91)).astype(np.float32)
    b = rng.uniform(-1, 1, 45).astype(np.float32)
    y = _launch_from_manifest(cu, manifest, x, w, b)
    ref = x.astype(np.float64) @ w.astype(np.float64).T + b
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < DType.tf32.rel_tol


def test_search_cli_runs_end_to_end_and_resumes(tmp_path):
    db = f"sqlite:///{tmp_path / 't.db'}"
    cmd = [sys.executable, "-m", "codegen", "search", "--family", "tensorcore", "--dtype", "bf16", "--m", "512",
           "--n", "512", "--k", "512", "--db", db, "--quiet", "--json", "--no-baseline"]
    first = subprocess.run(cmd + ["--budget", "8"], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run(cmd + ["--budget", "12"], capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    one, two = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (first, second))
    assert (one["evaluated"], two["evaluated"]) == (8, 12)
    assert two["best"]["kernel"].startswith("tc_bf16_")
    from store import Store

    rows = [r for r in Store(db, read_only=True).trials() if r["status"] != "invalid"]
    assert len(rows) == 12 and len({r["kernel"] for r in rows}) == 12
