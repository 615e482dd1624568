"""GPU tier: generated SIMT kernels are correct on awkward shapes; faults end as statuses."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from codegen.compile import compile_source
from codegen.evaluate import Built, Evaluator
from codegen.families.simt import Spec as SimtSpec
from codegen.problem import DType, Problem
from codegen.render import render

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1, 1), (32, 4096, 4096), (67, 45, 91), (4097, 4095, 4093)]
QUICK = {"reps_min": 3, "reps_max": 3, "target_ms": 1.0}

NAIVE = dict(bm=16, bn=16, bk=1, wm=4, wn=8, tm=1, tn=1, pad=0, vec=1, stages=0)
TILED16 = dict(bm=16, bn=16, bk=16, wm=4, wn=8, tm=1, tn=1, pad=0, vec=1, stages=1)
TILED32 = dict(bm=32, bn=32, bk=32, wm=4, wn=8, tm=1, tn=1, pad=1, vec=1, stages=1)
BIG = dict(bm=128, bn=128, bk=8, wm=32, wn=64, tm=8, tn=8, pad=4, vec=4, stages=2)
VARIANTS = [
    NAIVE,
    TILED16,
    TILED32,
    BIG,
    dict(BIG, stages=1),
    dict(BIG, vec=2, pad=0),
    dict(BIG, vec=1, group_m=8),
    dict(BIG, bk=16, group_m=4),
    dict(bm=64, bn=64, bk=16, wm=32, wn=32, tm=4, tn=8, pad=4, vec=4, stages=2),
    dict(bm=64, bn=128, bk=8, wm=16, wn=64, tm=4, tn=8, pad=4, vec=4, stages=2),
    dict(bm=32, bn=64, bk=32, wm=16, wn=32, tm=2, tn=8, pad=4, vec=4, stages=2),
    dict(bm=32, bn=128, bk=32, wm=32, wn=32, tm=4, tn=8, pad=0, vec=4, stages=2, split_k=4, reduce="atomic"),
    dict(bm=32, bn=128, bk=32, wm=32, wn=32, tm=4, tn=8, pad=4, vec=4, stages=2, split_k=3, reduce="two_pass"),
    dict(bm=16, bn=64, bk=64, wm=16, wn=16, tm=2, tn=4, pad=4, vec=4, stages=2, split_k=8, reduce="two_pass"),
    dict(bm=64, bn=32, bk=8, wm=32, wn=16, tm=4, tn=4, pad=4, vec=4, stages=1),
    dict(BIG, bk=16, copy="async", stages=3),
    dict(bm=64, bn=64, bk=32, wm=32, wn=32, tm=4, tn=8, pad=4, vec=4, stages=4, copy="async", group_m=4),
    dict(bm=32, bn=128, bk=32, wm=32, wn=32, tm=4, tn=8, pad=4, vec=4, stages=3, copy="async", split_k=8, reduce="atomic"),
    dict(bm=16, bn=64, bk=64, wm=16, wn=16, tm=2, tn=4, pad=4, vec=2, stages=2, copy="async", split_k=4, reduce="two_pass"),
    # split-K in one thread-block cluster: 8 splits (the most), and 2 through register copies
    dict(bm=32, bn=128, bk=32, wm=16, wn=64, tm=4, tn=8, pad=4, vec=4, stages=3, copy="async", split_k=8, reduce="cluster"),
    dict(bm=32, bn=128, bk=32, wm=32, wn=32, tm=4, tn=8, pad=0, vec=4, stages=2, split_k=2, reduce="cluster"),
    # split-K summed by the last split of each tile to finish (tile counters), async and register copies
    dict(bm=32, bn=128, bk=32, wm=16, wn=64, tm=4, tn=8, pad=4, vec=4, stages=3, copy="async", split_k=8, reduce="last"),
    dict(bm=16, bn=64, bk=64, wm=16, wn=16, tm=2, tn=4, pad=4, vec=4, stages=2, split_k=3, reduce="last"),
]
HALF_VARIANTS = [
    dict(BIG, vec=8, bk=16),
    dict(bm=32, bn=128, bk=32, wm=32, wn=32, tm=4, tn=8, pad=4, vec=8, stages=2, split_k=4, reduce="two_pass"),
    dict(bm=32, bn=128, bk=64, wm=32, wn=32, tm=4, tn=8, pad=8, vec=8, stages=4, copy="async", split_k=4, reduce="two_pass"),
    dict(bm=32, bn=128, bk=64, wm=32, wn=32, tm=4, tn=8, pad=8, vec=8, stages=4, copy="async", split_k=4, reduce="cluster"),
    dict(bm=32, bn=128, bk=64, wm=32, wn=32, tm=4, tn=8, pad=8, vec=8, stages=4, copy="async", split_k=4, reduce="last"),
    dict(bm=64, bn=64, bk=32, wm=32, wn=32, tm=4, tn=8, pad=8, vec=4, stages=3, copy="async"),
]
CASES = [(DType.fp32, bias, v) for v in VARIANTS for bias in (False, True)] + [
    (dt, bias, v) for dt in (DType.fp16, DType.bf16) for v in HALF_VARIANTS for bias in (False, True)
]


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(baseline=False, timing=QUICK, timeout_s=120.0) as ev:
        yield ev


def test_case_count():
    assert len(CASES) >= 30


@pytest.mark.parametrize("dtype,bias,params", CASES, ids=[SimtSpec(dtype=d, bias=b, **v).name for d, b, v in CASES])
def test_correct_on_all_shapes(evaluator, dtype, bias, params):
    assert_correct_on(evaluator, SimtSpec(dtype=dtype, bias=bias, **params), SHAPES)


def assert_correct_on(evaluator, spec, shapes) -> None:
    """``spec`` validates (float64 reference, poisoned output, odd probe) on every shape (any family)."""
    for m, n, k in shapes:
        problem = Problem(m, n, k, spec.dtype, bias=spec.bias)
        result, _ = evaluator.evaluate(spec, problem)
        if result["status"] == "invalid" and "k-tiles" in result["evidence"]:
            continue  # split-K finer than K: rejected before compile, by design
        assert result["status"] == "ok", f"{spec.name} on {problem.key}: {result['evidence']}"
        assert result["rel_error"] <= spec.dtype.rel_tol
        assert result["median_ms"] > 0


def _planted(body: str, spec) -> Built:
    """A hand-written kernel under ``spec``'s name and signature (float pointers), compiled as is."""
    source = (
        f'extern "C" __global__ void {spec.name}(float* Y, const float* X, const float* W, const float* B,'
        f" float* WS, int M, int N, int K) {{ {body} }}"
    )
    return Built(spec, source, compile_source(source, spec.name, use_cache=False))


def test_faults_are_statuses_and_the_next_evaluation_succeeds():
    spec = SimtSpec(**BIG)
    problem = Problem(256, 256, 256)
    with Evaluator(baseline=False, timing=QUICK, timeout_s=10.0) as ev:
        out_of_bounds = _planted("Y[threadIdx.x + (1ll << 40)] = 1.0f;", spec)
        assert ev.run(out_of_bounds, problem)["status"] == "runtime_error"
        assert ev.evaluate(spec, problem)[0]["status"] == "ok"

        hang = _planted("volatile const float* x = X; while (x[0] == x[0]) { }", spec)  # inputs are never NaN
        result = ev.run(hang, problem)
        assert result["status"] == "timeout", result
        assert ev.evaluate(spec, problem)[0]["status"] == "ok"

        garbage = _planted(
            "for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < M * N; i += gridDim.x * blockDim.x) Y[i] = 1.0f;",
            spec,
        )  # writes every output, all wrong
        assert ev.run(garbage, problem)["status"] == "wrong_result"

        lazy = _planted("", spec)
        assert ev.run(lazy, problem)["status"] == "nan_or_inf"
        assert ev.evaluate(spec, problem)[0]["status"] == "ok"
        assert ev.worker.starts == 3  # the fault and the hang each cost one worker


def test_tile_counters_left_set_are_a_wrong_result():
    """A split-K summed by its last split must leave its tile counters zero, or the next launch starts
    from them: a kernel that computes Y right but leaves a counter set is a wrong result."""
    spec = SimtSpec(bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, split_k=2, reduce="last")
    body = ("if (blockIdx.x + blockIdx.y + threadIdx.x == 0) { for (int i = 0; i < M * N; ++i) { float v = 0.0f; "
            "for (int k = 0; k < K; ++k) v += X[(i / N) * K + k] * W[(i % N) * K + k]; Y[i] = v; } CT[0] = 1; }")
    source = (f'extern "C" __global__ void {spec.name}(float* Y, const float* X, const float* W, const float* B,'
              f" float* WS, int* CT, int M, int N, int K) {{ {body} }}")
    with Evaluator(baseline=False, timing=QUICK, timeout_s=30.0) as ev:
        result = ev.run(Built(spec, source, compile_source(source, spec.name, use_cache=False)), Problem(64, 64, 64))
    assert result["status"] == "wrong_result" and "tile counters left non-zero" in result["evidence"], result


def test_too_many_resources_is_a_status():
    # 264 KiB of shared memory: check() rejects it, so render it unchecked to plant the launch.
    spec = SimtSpec(bm=128, bn=128, bk=128, wm=32, wn=64, tm=8, tn=8, pad=4, vec=4, stages=2)
    problem = Problem(512, 512, 512)
    with Evaluator(baseline=False, timing=QUICK, timeout_s=30.0) as ev:
        assert any("shared memory" in r for r in spec.check(problem, ev.limits()))
        text = render(spec, check=False)
        built = Built(spec, text, compile_source(text, spec.name, use_cache=False))
        result = ev.run(built, problem)
        assert result["status"] == "launch_out_of_resources", result
        assert ev.evaluate(SimtSpec(**BIG), problem)[0]["status"] == "ok"


def test_bench_cli_prints_one_line_with_the_baseline_and_stores_it(tmp_path):
    pytest.importorskip("torch")
    out = subprocess.run(
        [sys.executable, "-m", "codegen", "bench", "--m", "67", "--n", "45", "--k", "91", "--bias",
         "--bm", "32", "--bn", "32", "--bk", "32", "--wm", "4", "--wn", "8", "--tm", "1", "--tn", "1",
         "--pad", "1", "--vec", "1", "--stages", "1", "--db", f"sqlite:///{tmp_path / 'b.db'}"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and " ok " in lines[0] and "cublas" in lines[0], out.stdout
    from store import Store

    rows = Store(f"sqlite:///{tmp_path / 'b.db'}", read_only=True).trials()
    assert len(rows) == 1 and rows[0]["status"] == "ok" and rows[0]["ratio_cublas"] > 0


@pytest.mark.parametrize("m,n,k", list(itertools.islice(SHAPES, 4)))
def test_cublas_baseline_timed_in_the_same_run(m, n, k):
    pytest.importorskip("torch")
    problem = Problem(m, n, k)
    with Evaluator(baseline=True, timing=QUICK) as ev:
        result, _ = ev.evaluate(SimtSpec(**BIG), problem)
    assert result["status"] == "ok", result["evidence"]
    assert result["baselines"]["cublas"]["median_ms"] > 0
    assert result["ratio"]["cublas"] == pytest.approx(result["baselines"]["cublas"]["median_ms"] / result["median_ms"])
