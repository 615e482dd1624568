"""benchmarks.engine's arithmetic and records (the timing itself runs on the GPU)."""

from __future__ import annotations

import pytest

from benchmarks import engine


def test_the_copies_of_one_replay_are_far_past_l2():
    l2 = 60 << 20
    for n, k in engine.LAYERS:
        w = n * k * 2
        copies = engine.copies_for(w, l2)
        assert copies * w >= engine.L2_FACTOR * l2 and copies >= engine.MIN_COPIES
    assert engine.copies_for(4096 * 4096 * 2, l2) == 8  # 32 MiB each: 8 copies make 256 MiB >= 240 MiB
    assert engine.copies_for(64, l2) == engine.MAX_COPIES


def test_calls_are_whole_rounds_over_the_copies():
    assert engine.calls_for(4) == 24 and engine.calls_for(5) == 25 and engine.calls_for(30) == 30


def test_the_shapes_are_llama_3_8b_decode_and_prefill():
    got = {(p["m"], p["n"], p["k"]) for p in engine.shapes(["decode", "prefill"])}
    assert len(got) == 12 and (16, 14336, 4096) in got and (2048, 6144, 4096) in got
    assert all(p["layout"] == "forward" and p["density"] == 1.0 for p in engine.shapes(["decode"]))


def test_a_record_says_engine_timing_and_its_ratio():
    problem = engine.shapes(["decode"])[0]
    r = engine.record(problem, [0.030] * 5, [0.033] * 5, "hp_kernel", 1e-3, {"copies": 4})
    assert r["timing"] == "engine" and r["ours"]["kernel"] == "hp_kernel"
    assert r["ratio"]["cublas"] == pytest.approx(1.1)
    assert r["baselines"]["cublas"]["gbps"] == pytest.approx(2 * (14336 * 4096 + 4096 + 14336) / 33e-6 / 1e9)


def test_a_wrong_result_has_no_ratio_and_torch_runs_name_no_kernel():
    problem = engine.shapes(["decode"])[0]
    r = engine.record(problem, [0.03], [0.03], "torch: cuBLAS was faster", float("nan"), {})
    assert r["ratio"]["cublas"] is None and r["ours"]["status"] == "wrong_result" and r["ours"]["kernel"] is None
