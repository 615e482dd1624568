"""The benchmark runner's search mode, driven by the recorded H200 sweep instead of a GPU.

The replayed numbers are recorded data (see search/recordings/); the test checks the plumbing:
seeds first, every trial stored, a DESIGN.md-shaped JSON written.
"""

from __future__ import annotations

import json

import pytest

import search.measure
from benchmarks import run
from codegen.problem import Problem
from search import DEFAULT_SAMPLER
from search.measure import ReplayMeasurer
from tests.search.test_replay import RECORDING


def test_search_mode_writes_a_record_per_problem(tmp_path, monkeypatch):
    best = ReplayMeasurer(RECORDING).best
    hand = dict(bm=128, bn=128, bk=16, wm=32, wn=64, tm=8, tn=8, pad=4, vec=4, stages=2, group_m=8)
    monkeypatch.setitem(run.SUITES, "replayed", [(Problem(4096, 4096, 4096), [hand])])
    monkeypatch.setattr(search.measure, "GpuMeasurer", lambda problem, **kw: ReplayMeasurer(RECORDING, problem))
    assert run.main(["--suite", "replayed", "--search", "12", "--out", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("replayed-*.json")).read_text())
    (record,) = doc["records"]
    assert record["ours"]["search"]["evaluated"] == 12
    assert record["ours"]["search"]["sampler"] == DEFAULT_SAMPLER  # the CLI's default, not a copy of its own
    assert record["ours"]["tflops"] >= ReplayMeasurer(RECORDING).results[
        "simt_fp32_nobias_128x128x16_w32x64_t8x8_p4_v4_s2_g8_k1"]["tflops"]  # the seed was tried
    assert record["ratio"]["cublas"] > 0 and doc["device"].startswith("NVIDIA H200 (recorded 2026-11-30, ")
    assert best["tflops"] >= record["ours"]["tflops"]
    assert (tmp_path / "replayed.db").is_file()


class _FakeEvaluator:
    """Stands in for the GPU: every correct build 'measures' a time from its tile size."""

    target_arch = "sm_90"

    def __init__(self, **kw):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def device(self):
        return {"name": "Fake GPU", "nvrtc": "0", "driver": "0", "sm": "sm_90"}

    def limits(self):
        from codegen.spec import DeviceLimits

        return DeviceLimits.for_arch(90)

    def run(self, built, problem):
        from codegen.evaluate import blank_result

        if built.failure:
            return built.failure
        ms = 1.0 / built.spec.bn
        return dict(blank_result("ok", ""), median_ms=ms, p20_ms=ms, p80_ms=ms, tflops=1.0, gbps=1.0,
                    rel_error=0.0, baselines={"cublas": {"median_ms": 0.01}}, ratio={"cublas": 0.01 / ms})


def test_hand_suite_builds_in_parallel_and_keeps_the_fastest(tmp_path, monkeypatch):
    good = dict(bm=32, bn=64, bk=16, wm=32, wn=16, tm=4, tn=4, pad=4, vec=4, stages=3, copy="async")
    monkeypatch.setitem(run.SUITES, "fake", [
        (Problem(32, 256, 256), [good, dict(good, bn=128), dict(good, pad=2)]),
        (Problem(8, 64, 64), [dict(good, bm=8, wm=8, tm=1)]),
    ])
    monkeypatch.setattr(run, "Evaluator", _FakeEvaluator)
    out = tmp_path / "out"
    assert run.main(["--suite", "fake", "--out", str(out), "--problems", "32x256x256_fp32_forward"]) == 0
    (path,) = out.glob("fake-Fake_GPU-*.json")
    (record,) = json.loads(path.read_text())["records"]  # only the problem asked for
    assert record["ours"]["kernel"] == "simt_fp32_nobias_32x128x16_w32x16_t4x4_p4_v4_s3c_g1_k1"
    assert [c["status"] for c in record["candidates"]] == ["ok", "ok", "invalid"]


def test_unknown_problem_is_refused_with_the_suite_s_problems(capsys):
    with pytest.raises(SystemExit) as stop:
        run.main(["--suite", "skinny", "--problems", "3x3x3_fp32_forward"])
    assert stop.value.code == 2
    assert "32x4096x4096_fp32_forward" in capsys.readouterr().err


def test_sparse_report_holds_our_best_block_against_the_baseline_s_best(tmp_path):
    """Made-up figures, written here: the report's arithmetic, not a measurement."""
    from benchmarks.sparse_report import report

    def rec(block, density, ours, cublas, bsr):
        return {"problem": {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "layout": "forward", "bias": False,
                            "block": block, "density": density, "pattern": f"p{block}{density}"},
                "ours": {"kernel": f"k{block}", "median_ms": ours, "p20_ms": ours, "p80_ms": ours},
                "baselines": {"cublas": {"median_ms": cublas}, "torch_bsr": {"median_ms": bsr}}}

    path = tmp_path / "sparse-x.json"
    path.write_text(json.dumps({"records": [rec(32, 0.1, 0.05, 0.2, 0.4), rec(64, 0.1, 0.04, 0.21, 0.1),
                                            rec(64, 0.25, 0.1, 0.2, 0.3), rec(64, 0.5, 0.3, 0.2, 0.5)]}))
    doc = report([path])
    t = {(x["baseline"], x["density"]): x for x in doc["targets"] if (x["m"], x["dtype"]) == (4096, "bf16")}
    assert all(x["ratio"] is None for x in doc["targets"] if x["dtype"] == "fp32")  # nothing measured: no verdict
    assert t[("torch_bsr", 0.1)]["ratio"] == pytest.approx(0.1 / 0.04) and t[("torch_bsr", 0.1)]["met"] is False
    assert t[("cublas", 0.1)]["ratio"] == pytest.approx(0.2 / 0.04) and t[("cublas", 0.1)]["met"] is True
    even = {e["block"]: e for e in doc["break_even"]}
    # block 64 wins at 0.1 (5.25x) and 0.25 (2x), loses at 0.5 (0.67x): crossing between 0.25 and 0.5
    assert even[64]["break_even_vs_cublas"] == pytest.approx(0.25 + (2 - 1) * 0.25 / (2 - 0.2 / 0.3))
