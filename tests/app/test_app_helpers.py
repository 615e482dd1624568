"""The dashboard's pure pieces: launcher command, roofline place, break-even, importances, counts,
orders, labels, and which source the Kernel page shows."""

from __future__ import annotations

import pytest

from app import launch
from app.frames import (
    best_so_far,
    choice_order,
    device_label,
    family_wins,
    filter_param,
    kernel_source,
    run_counts,
    trial_counts,
    trials_frame,
)
from app.importance import param_importances
from app.roofline import place
from app.sparsity import break_even, break_even_table, references, sparse_points, speedup_series, time_series
from codegen.families.simt import Spec as SimtSpec
from codegen.problem import Problem
from codegen.render import render, source_hash
from codegen.sparse import Pattern, problem_for
from store.records import recorded_device_name


def test_launch_binds_loopback_headless_and_passes_the_database() -> None:
    cmd = launch.command(8777)
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4].endswith("app/main.py")
    flags = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert flags["--server.address"] == "127.0.0.1" and flags["--server.port"] == "8777"
    assert flags["--server.headless"] == "true"
    assert launch.environment("sqlite:////x/y.db")["GEMMSCAPE_DB"] == "sqlite:////x/y.db"


def test_launch_keeps_the_environment_without_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMMSCAPE_DB", "sqlite:////from/env.db")
    assert launch.environment(None)["GEMMSCAPE_DB"] == "sqlite:////from/env.db"


def row(**kw: object) -> dict:
    return {"m": 4096, "n": 4096, "k": 4096, "dtype": "fp32", "bias": False, "density": 1.0,
            "device": "NVIDIA H200", "tflops": 46.6, "gbps": 68.0} | kw  # fmt: skip


def test_roofline_place_on_the_h200() -> None:
    big = place(row())
    assert big["bound"] == "compute" and big["of_compute"] == pytest.approx(46.6 / 67)
    assert big["of_roofline"] == pytest.approx(46.6 / 67)
    skinny = place(row(m=32, dtype="bf16", tflops=55.6, gbps=1700.0))
    assert skinny["bound"] == "memory"
    assert skinny["of_bandwidth"] == pytest.approx(1700 / 4270)
    assert skinny["of_roofline"] == pytest.approx(55.6 / (skinny["intensity"] * 4.27))


def test_roofline_counts_a_sparse_problems_kept_blocks_once() -> None:
    quarter = place(row(block=32, density=0.25, pattern="ab" * 8, tflops=10.0))
    n = 4096 * 4096
    flops = 2.0 * 4096**3 * 0.25  # the useful work, density counted once
    nbytes = (n + 0.25 * n + n) * 4 + 4 * 0.25 * n / (32 * 32)  # X, kept blocks of W, Y; the block indices
    assert quarter["intensity"] == pytest.approx(flops / nbytes)
    real = problem_for(4096, Pattern.random(4096, 4096, 32, 0.25), "fp32")
    assert quarter["intensity"] == pytest.approx(real.flops / real.min_bytes)
    assert place(row(block=32, density=0.25))["intensity"] == quarter["intensity"]  # no hash: sized the same
    assert quarter["of_roofline"] == pytest.approx(10.0 / min(67.0, quarter["intensity"] * 4.27))


def test_roofline_of_an_all_zero_w() -> None:
    empty = place(row(block=64, density=0.0, pattern="0" * 16, tflops=0.0))
    assert empty["intensity"] == 0.0 and empty["bound"] == "memory" and empty["of_roofline"] is None
    assert empty["of_bandwidth"] == pytest.approx(68.0 / 4270)


def test_roofline_unknown_device_says_so() -> None:
    unknown = place(row(device="Some Other GPU"))
    assert unknown["ceilings"] == "unknown for this device" and unknown["of_compute"] is None
    assert place(row(dtype="fp8"))["intensity"] is None  # a dtype this version cannot size


def test_break_even_interpolates_and_says_when_it_cannot() -> None:
    assert break_even([(0.1, 3.0), (0.5, 0.6), (0.25, 1.4)])[0] == pytest.approx(0.25 + 0.4 / 0.8 * 0.25)
    assert break_even([(0.1, 0.5), (0.2, 0.4)]) == (None, "slower than dense at every measured density (down to 0.1)")
    assert break_even([(0.1, 2.0), (0.3, 1.5)])[0] == 0.3
    assert break_even([]) == (None, "no points")


def trial(i: int, status: str = "ok", **params: object) -> dict:
    return {"id": i, "number": i, "status": status, "tflops": float(i) if status == "ok" else None,
            "params": {"family": "simt", **params}}  # fmt: skip


def test_best_so_far_carries_over_failures() -> None:
    rows = [trial(0, bm=1), trial(1, "timeout"), trial(3), trial(2)]
    curve = best_so_far(rows, "run")
    assert list(curve["trial"]) == [0, 1, 2, 3]
    assert list(curve["best_tflops"]) == [0.0, 0.0, 2.0, 3.0]


def test_param_filter_compares_as_text() -> None:
    frame = trials_frame([trial(0, bm=64) | {"kernel": "a"}, trial(1, bm=128) | {"kernel": "b"}])
    assert list(filter_param(frame, "spec.bm", ["128"])["kernel"]) == ["b"]
    assert len(filter_param(frame, "spec.bm", [])) == 2


def test_importances_need_enough_varying_trials() -> None:
    few = [trial(i, bm=i) for i in range(1, 4)]
    assert param_importances(few)[0] is None and "at least 5" in param_importances(few)[1]
    flat = [trial(i, bm=64) for i in range(1, 9)]
    assert param_importances(flat) == (None, "No spec parameter varies across the matching ok trials.")
    rows = [trial(i, bm=16 * (i % 4 + 1), pad=i % 2) for i in range(1, 25)]
    found, note = param_importances(rows)
    assert set(found) == {"bm", "pad"} and sum(found.values()) == pytest.approx(1.0)
    assert "Optuna" in note and "24 ok trials" in note


def best(problem: Problem, ms: float, device: str = "NVIDIA H200", **baselines: float) -> dict:
    """A best-row as the store gives it (trial_dict): the problem's fields, ours, the baselines."""
    return {**problem.to_dict(), "block": problem.block or None, "pattern": problem.pattern or None,
            "problem": problem.key, "kernel": f"k{problem.block}", "device": device, "median_ms": ms,
            "ratio_cublas": None, "baselines": {name: {"median_ms": t, "p20_ms": t, "p80_ms": t}
                                                for name, t in baselines.items()}}  # fmt: skip


def sparse(block: int, density: float, dtype: str = "fp16", m: int = 256) -> Problem:
    return problem_for(m, Pattern.random(512, 256, block, density, seed=block), dtype)


def test_sparse_points_take_the_sparse_rows_and_their_baselines() -> None:
    rows = [
        best(Problem(256, 512, 256, "fp16"), 1.0, cublas=1.0),  # dense: not a point
        best(sparse(32, 0.5), 0.8, cublas=1.0, torch_bsr=2.0, cusparselt=0.6),
        best(sparse(32, 0.0), 0.05, cublas=1.2),  # an all-zero W is a point, at density 0
        {**best(sparse(64, 0.25), 0.5), "ratio_cublas": 1.5},  # no baselines stored: the ratio column
        best(sparse(16, 1.0), 1.25, cublas=1.0),  # every block kept: still block-sparse
    ]
    points = sparse_points(rows)
    assert [(p["block"], p["density"]) for p in points] == [(16, 1.0), (32, 0.0), (32, 0.5), (64, 0.25)]
    by = {(p["block"], p["density"]): p for p in points}
    half = by[32, 0.5]
    assert (half["ms"], half["cublas_ms"], half["torch_bsr_ms"], half["cusparselt_ms"]) == (0.8, 1.0, 2.0, 0.6)
    assert half["speedup"] == pytest.approx(1.25) and half["torch_bsr_speedup"] == pytest.approx(0.5)
    assert half["vs_torch_bsr"] == pytest.approx(2.5) and half["shape"] == "256x512x256"
    assert by[32, 0.0]["speedup"] == pytest.approx(24.0) and by[32, 0.0]["torch_bsr_ms"] is None
    assert by[64, 0.25]["speedup"] == 1.5 and by[64, 0.25]["cublas_ms"] is None
    assert by[16, 1.0]["speedup"] == pytest.approx(0.8)
    assert sparse_points([{**best(sparse(32, 0.5), 0.8), "median_ms": None}]) == []


def test_time_and_speedup_series_and_references() -> None:
    rows = [best(sparse(32, d), ms, cublas=c, torch_bsr=t, **({"cusparselt": s} if s else {}))
            for d, ms, c, t, s in ((0.25, 0.4, 1.0, 0.8, 0.55), (0.5, 0.9, 1.2, 1.5, 0.65), (0.75, 1.3, 1.1, 2.0, None))]
    points = sparse_points(rows)
    times = time_series(points)
    assert [(t["series"], t["density"], t["ms"]) for t in times] == [
        ("gemmscape", 0.25, 0.4), ("torch BSR", 0.25, 0.8), ("gemmscape", 0.5, 0.9), ("torch BSR", 0.5, 1.5),
        ("gemmscape", 0.75, 1.3), ("torch BSR", 0.75, 2.0)]  # fmt: skip
    speedups = speedup_series(points)
    assert [round(s["speedup"], 4) for s in speedups if s["series"] == "gemmscape"] == [2.5, 1.3333, 0.8462]
    assert [round(s["speedup"], 4) for s in speedups if s["series"] == "torch BSR"] == [1.25, 0.8, 0.55]
    dense, semi = references(points)
    assert (dense["baseline"], dense["density"], dense["ms"], dense["measurements"]) == ("dense cuBLAS", None, 1.1, 3)
    assert (dense["min_ms"], dense["max_ms"]) == (1.0, 1.2)
    assert (semi["baseline"], semi["density"], semi["measurements"]) == ("cuSPARSELt 2:4", 0.5, 2)
    assert semi["ms"] == pytest.approx(0.6)  # the median of 0.55 and 0.65
    assert references(sparse_points([best(sparse(32, 0.5), 1.0)])) == []


def test_break_even_table_per_dtype_and_block() -> None:
    rows = [best(sparse(32, d, "fp16"), 1.0 / s, cublas=1.0, torch_bsr=1.0 / t)
            for d, s, t in ((0.25, 1.4, 1.1), (0.5, 0.6, 0.5))]  # fmt: skip
    rows += [best(sparse(32, d, "fp32"), 1.0 / s, cublas=1.0) for d, s in ((0.25, 2.0), (0.5, 1.2))]
    rows += [best(sparse(64, 0.25, "fp32"), 2.0, cublas=1.0)]
    rows += [best(sparse(32, 0.5, "fp16"), 1.0, device="Other GPU", cublas=2.0)]
    table = break_even_table(sparse_points(rows))
    assert [(t["device"], t["dtype"], t["block"], t["points"]) for t in table] == [
        ("NVIDIA H200", "fp16", 32, 2), ("NVIDIA H200", "fp32", 32, 2), ("NVIDIA H200", "fp32", 64, 1),
        ("Other GPU", "fp16", 32, 1)]  # fmt: skip
    fp16, fp32, fp32_64, other = table
    assert fp16["break_even_density"] == pytest.approx(0.25 + 0.4 / 0.8 * 0.25) and fp16["note"] == "interpolated"
    assert fp16["torch_bsr_break_even"] == pytest.approx(0.25 + 0.1 / 0.6 * 0.25)
    assert fp32["break_even_density"] == 0.5 and fp32["torch_bsr_note"] == "not measured"
    assert fp32_64["break_even_density"] is None and other["break_even_density"] == 0.5


def test_choice_order_sorts_numbers_as_numbers() -> None:
    assert choice_order([128, 256, 64, 128]) == ["64", "128", "256"]
    assert choice_order(["128", "256", "64"]) == ["64", "128", "256"]  # as widgets hand them back
    assert choice_order([0.5, 0.25, 1, -2]) == ["-2", "0.25", "0.5", "1"]
    assert choice_order(["b", 16, "a", 8, None, float("nan")]) == ["8", "16", "a", "b"]  # text after the numbers


def test_device_label_shortens_a_recorded_name() -> None:
    name = recorded_device_name("NVIDIA H200", "2026-11-30T08:00:00", "replay-simt-4096x4096x4096-fp32.json")
    assert name == "NVIDIA H200 (recorded 2026-11-30, replay-simt-4096x4096x4096-fp32.json)"
    assert device_label(name) == "NVIDIA H200 · recorded 2026-11-30"
    assert device_label("NVIDIA H200") == "NVIDIA H200" and device_label("Odd (GPU)") == "Odd (GPU)"


def test_trial_counts_leave_out_invalid_points_as_the_cli_does() -> None:
    """56 kernels of one trial each, 6 of them points refused before compiling: 50 trials, 50 kernels."""
    kernels = [{"id": i, "trials": 1} for i in range(56)]
    invalid = [{"kernel_id": i, "run_id": 1, "status": "invalid"} for i in range(50, 56)]
    assert trial_counts(kernels, invalid) == {"trials": 50, "kernels": 50, "invalid": 6}
    kernels[0]["trials"] = 3  # measured twice more: still one kernel
    assert trial_counts(kernels, invalid) == {"trials": 52, "kernels": 50, "invalid": 6}
    assert trial_counts([], []) == {"trials": 0, "kernels": 0, "invalid": 0}


def test_run_counts_take_invalid_points_apart() -> None:
    runs = [{"id": 1, "trials": 56}, {"id": 2, "trials": 4}]
    invalid = [{"kernel_id": i, "run_id": 1} for i in range(6)] + [{"kernel_id": 9, "run_id": None}]
    assert [(r["trials"], r["invalid"]) for r in run_counts(runs, invalid)] == [(50, 6), (4, 0)]


def test_family_wins_counts_the_fastest_kernel_of_each_problem_and_device() -> None:
    rows = [{"family": "simt", "rank": 1}, {"family": "tensorcore", "rank": 1}, {"family": "tensorcore", "rank": 1},
            {"family": "simt", "rank": 2}]  # a runner-up wins nothing
    wins = family_wins(rows)
    assert list(zip(wins["family"], wins["wins"], strict=True)) == [("tensorcore", 2), ("simt", 1)]
    assert list(family_wins([]).columns) == ["family", "wins"]


SHOWN = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4)


def kernel_row(source: str | None = None, digest: str | None = None, spec: SimtSpec = SHOWN) -> dict:
    return {"name": spec.name, "family": "simt", "spec": spec.to_dict(), "source": source, "source_hash": digest}


REPLAYED = [{"status": "ok", "recorded": True}]


def test_kernel_source_stored_first() -> None:
    shown = kernel_source(kernel_row("// stored\n", "ab" * 32), REPLAYED)
    assert (shown.text, shown.kind) == ("// stored\n", "stored")


def test_kernel_source_of_a_replayed_kernel_is_todays_render_said_so() -> None:
    today = render(SHOWN)
    differs = kernel_source(kernel_row(None, "0" * 64), REPLAYED)
    assert differs.text == today and differs.kind == "render_differs"
    assert "Not the measured source" in differs.note and "replayed from a recording" in differs.note
    assert "000000000000" in differs.note and source_hash(today)[:12] in differs.note
    matches = kernel_source(kernel_row(None, source_hash(today)), REPLAYED)
    assert matches.text == today and matches.kind == "render_matches" and "matches the measured" in matches.note
    unhashed = kernel_source(kernel_row(None, None), [{"status": "ok", "recorded": False}])
    assert unhashed.text == today and unhashed.kind == "render_unhashed" and "not recorded" in unhashed.note
    assert "replayed" not in unhashed.note and "never compiled" not in unhashed.note


def test_kernel_source_of_a_point_refused_before_rendering() -> None:
    for trials in ([{"status": "invalid", "recorded": True}], []):
        refused = kernel_source(kernel_row(None, None), trials)
        assert refused.text is None and refused.kind == "never_compiled" and "No source stored" in refused.note
    bad = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, pad=2)  # the rules refuse it
    unrenderable = kernel_source(kernel_row(None, "0" * 64, bad), REPLAYED)
    assert unrenderable.text is None and unrenderable.kind == "unrenderable" and "cannot render" in unrenderable.note
