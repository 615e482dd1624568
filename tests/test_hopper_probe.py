"""The Hopper device probe's CPU side: its verdicts pinpoint planted faults, and its tables say what
happened to every point, including one whose process hung or timed out mid-shape."""

from __future__ import annotations

import pytest

from benchmarks import hopper_probe as probe
from codegen.families.hopper import Spec
from codegen.problem import DType, Problem
from search.space import space_for, to_spec

torch = pytest.importorskip("torch")


def _pair(m=300, n=520, k=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(m, k, generator=g, dtype=torch.float64) * 2 - 1
    w = torch.rand(n, k, generator=g, dtype=torch.float64) * 2 - 1
    ref = x @ w.t()
    return ref.to(torch.bfloat16), ref


def test_compare_passes_a_rounded_result_and_pinpoints_planted_faults():
    spec = Spec()  # 128 x 256 tiles
    y, ref = _pair()
    ok = probe.compare(y, ref, spec, "bf16")
    assert ok["status"] == "ok" and ok["rel_error"] < 5e-3 and ok["mismatches"] == 0 and ok["nonfinite"] == 0

    unwritten = y.clone()
    unwritten[130:, 260:300] = float("nan")  # one block tile's corner left unwritten
    v = probe.compare(unwritten, ref, spec, "bf16")
    assert v["status"] == "nan_or_inf" and v["first_nonfinite"] == [130, 260] and v["tile"] == [1, 1]
    assert v["nonfinite"] == 170 * 40 and v["rows_with_nonfinite"] == 170 and v["cols_with_nonfinite"] == 40
    assert "first at (130, 260)" in v["evidence"]

    wrong = y.clone()
    wrong[:, 300:] = 0  # columns past 300 never accumulated
    v = probe.compare(wrong, ref, spec, "bf16")
    assert v["status"] == "wrong_result" and v["rel_error"] > 0.1
    assert v["first_mismatch"][1] == 300 and v["tile"] == [v["first_mismatch"][0] // 128, 1]
    assert v["got"] == 0.0 and v["want"] == pytest.approx(float(ref[tuple(v["first_mismatch"])]))
    assert v["cols_with_mismatch"] <= 220

    fp16 = probe.compare(ref.to(torch.float16), ref, spec, "fp16")
    assert fp16["status"] == "ok" and fp16["rel_error"] < 2e-3


def test_every_probe_shape_maps_every_point_to_a_valid_kernel():
    space = space_for("hopper", DType.bf16)
    for _, point in probe.POINTS:
        assert space.indices(point) is not None, point
        for m, n, k, bias, _ in probe.SHAPES:
            for dtype in probe.DTYPES:
                problem = Problem(m, n, k, DType(dtype), bias=bias)
                spec = to_spec("hopper", point, problem)
                assert not spec.check(problem), (spec.name, spec.check(problem))
                assert (spec.prepass == "pack") == (k % 8 != 0)
    assert {s[:3] for s in probe.SHAPES if s[4]} == {(4096, 4096, 4096), (8192, 8192, 8192), (4096, 11008, 4096),
                                                     (4097, 4095, 4093)}


def _run(label, events, ending="done", exit_code=0, stderr=""):
    stages = [e for e in events if e.get("event") == "stage"]
    return {"label": label, "point": {}, "events": events, "ending": ending, "exit_code": exit_code,
            "last_stage": stages[-1] if stages else None, "stderr_tail": stderr, "seconds": 1.0}


def test_tables_show_results_timings_and_where_a_point_stopped():
    shapes = [(67, 45, 88, False, False), (4096, 4096, 4096, False, True)]
    good = _run("good", [
        {"event": "result", "dtype": "bf16", "shape": "67x45x88", "kernel": "hp_a", "status": "ok", "rel_error": 2e-3},
        {"event": "result", "dtype": "bf16", "shape": "4096x4096x4096", "kernel": "hp_a", "status": "ok",
         "rel_error": 3e-3, "tflops": 650.0, "cublas_tflops": 780.0, "ratio": 0.83},
    ])
    hung = _run("hung", [
        {"event": "result", "dtype": "bf16", "shape": "67x45x88", "kernel": "hp_b", "status": "wrong_result",
         "stage": "compare", "evidence": "relative error 0.5 > 0.01; first element off at [64, 0]"},
        {"event": "stage", "dtype": "bf16", "shape": "4096x4096x4096", "stage": "wait"},
        {"event": "hang", "seconds": 10.0},
    ], ending="hang", exit_code=4)
    text = probe.table([good, hung], ["bf16"], shapes)
    assert "ok 2.0e-03" in text and "650 (0.83)" in text and "780" in text
    assert "wrong_result" in text and "first element off at [64, 0]" in text
    assert "hung bf16 4096x4096x4096: hang at wait" in text
    assert "process ended with hang (exit 4)" in text
    assert probe.results_of(hung)[("bf16", "4096x4096x4096")]["status"] == "hang"
