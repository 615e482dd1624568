"""The Hopper device probe's CPU side: its verdicts pinpoint planted faults, and its tables say what
happened to every point, including one whose process hung or timed out mid-shape."""

from __future__ import annotations

import pytest

from benchmarks.probes import hopper_probe as probe
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
    # issue 14's timed layers
    assert {s[:3] for s in probe.SHAPES if s[4]} == {(4096, 4096, 4096), (8192, 8192, 8192), (4096, 11008, 4096),
                                                     (128, 4096, 4096), (32, 4096, 4096), (4097, 4095, 4093)}
    assert {point["split_k"] for _, point in probe.POINTS} == {1, 4, 8}  # split-K for the small batches
    assert {point.get("a_regs", False) for _, point in probe.POINTS} == {False, True}


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


def _timed(kernel, ours_ms, cublas_ms):
    t = lambda ms: {"ms": ms, "p20": ms * 0.99, "p80": ms * 1.01, "reps": 20}  # noqa: E731
    o, c = t(ours_ms), t(cublas_ms)
    return {"event": "result", "dtype": "bf16", "shape": "4096x4096x4096", "kernel": kernel, "status": "ok",
            "rel_error": 2e-3, "ours_ms": o["ms"], "ours_p20": o["p20"], "ours_p80": o["p80"], "ours_reps": 20,
            "cublas_ms": c["ms"], "cublas_p20": c["p20"], "cublas_p80": c["p80"], "cublas_reps": 20,
            "tflops": 137.4 / ours_ms, "cublas_tflops": 137.4 / cublas_ms, "ratio": cublas_ms / ours_ms}


def test_design_doc_keeps_the_fastest_valid_point_with_its_own_baseline():
    device = {"event": "device", "name": "NVIDIA H200", "sm": "sm_90", "driver": "13.0", "torch": "2.11"}
    slow = _run("slow", [device, _timed("hp_slow", 0.25, 0.18)])
    fast = _run("fast", [device, _timed("hp_fast", 0.20, 0.17)])
    wrong = _run("wrong", [device, {**_timed("hp_wrong", 0.01, 0.17), "status": "wrong_result"}])
    doc = {"date": "2026-12-01T21:00:00Z", "device": "NVIDIA H200", "command": "python3 -m benchmarks.probes.hopper_probe",
           "timing": probe.TIMING, "shapes": [(67, 45, 88, False, False), (4096, 4096, 4096, False, True)],
           "runs": [slow, wrong, fast]}
    out = probe.design_doc(doc)
    assert out["suite"] == "hopper" and out["device"] == "NVIDIA H200" and out["versions"]["driver"] == "13.0"
    [rec] = out["records"]  # one timed shape, one dtype; the wrong point never counts
    assert rec["problem"] == {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "layout": "forward", "bias": False,
                              "density": 1.0, "block": None}
    assert rec["ours"]["kernel"] == "hp_fast" and rec["ours"]["median_ms"] == 0.20
    assert rec["baselines"]["cublas"]["median_ms"] == 0.17  # cuBLAS timed beside the chosen point
    assert rec["ratio"]["cublas"] == pytest.approx(0.85)
    assert set(rec["ours"]["others"]) == {"slow"} and "2 hand-picked" in rec["ours"]["search"]["selection"]


class _FakeEngine:
    """Stands in for codegen.engine.Engine on the CPU: "launching" the plan reads every pointer and
    tensor-map operand the plan names and, unless told to leave Y alone, writes the right answer."""

    class ctx:  # noqa: N801
        class info:  # noqa: N801
            sm = "sm_90"

    def __init__(self, write: bool = True) -> None:
        self.write, self.launches, self.seen = write, 0, set()

    def run_plan(self, module, plan, ops) -> None:
        self.launches += 1
        for step in plan.launches:
            for name in step.args:
                arg = plan.tensor_map(name)
                operand = arg.operand if arg is not None else name
                if operand in ("X", "W", "WS", "Y"):
                    assert ops.address(operand, plan) is not None, operand
                self.seen.add(operand)
        if self.write:
            y = ops.x.float() @ ops.w.float().t()
            ops.y.copy_(y + ops.b.float() if ops.b is not None else y)

    def time_calls(self, fn, reps_min, reps_max, target_ms):
        for _ in range(3):
            fn()
        return [0.2, 0.1, 0.3]


@pytest.fixture
def cpu_probe(monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMSCAPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(probe.TorchOperands, "device", "cpu")
    monkeypatch.setattr(probe, "wait", lambda engine, deadline_s: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    import codegen.cuda

    monkeypatch.setattr(codegen.cuda, "Module", lambda cubin: ("module", len(cubin)))
    lines = []
    monkeypatch.setattr(probe, "emit", lambda **record: lines.append(record))
    return lines


def test_one_shape_builds_runs_compares_and_times(cpu_probe):
    from codegen.spec import DeviceLimits

    engine, modules = _FakeEngine(), {}
    point = dict(bm=128, bn=128, stages=4, consumers=2, persistent=True, group_m=8)
    rec = {"dtype": "bf16", "shape": "130x250x72+b"}
    result = probe.one_shape(engine, DeviceLimits(), modules, point, rec, (130, 250, 72, True, True), 10.0)
    assert result["status"] == "ok" and result["rel_error"] < 1e-2, result
    assert result["ours_ms"] == 0.2 and result["cublas_ms"] == 0.2 and result["ratio"] == 1.0
    assert result["tflops"] == pytest.approx(2 * 130 * 250 * 72 / 0.2 / 1e9)
    assert rec["kernel"] == "hp_bf16_bias_128x128x64_c2_s4_g8_ps" and rec["stage"] == "time"
    assert engine.seen >= {"X", "W", "Y", "B"} and list(modules) == [rec["kernel"]]
    compiled = next(line for line in cpu_probe if line.get("event") == "compiled")
    assert "-arch=sm_90a" in compiled["options"] and compiled["report"]["spill_stores"] == 0
    assert compiled["sass"]["HGMMA"] == 4 and compiled["sass"]["UTMALDG"] == 2
    stages = [line["stage"] for line in cpu_probe if line.get("event") == "stage"]
    assert stages == ["check", "compile", "load", "inputs", "run", "wait", "compare", "time"]

    packed = {"dtype": "fp16", "shape": "67x45x91+b"}
    result = probe.one_shape(engine, DeviceLimits(), modules, point, packed, (67, 45, 91, True, False), 10.0)
    assert result["status"] == "ok" and packed["kernel"].endswith("_pk") and "WS" in engine.seen
    assert "ours_ms" not in result


def test_one_shape_runs_a_split_point_on_a_poisoned_workspace(cpu_probe, monkeypatch):
    from codegen.spec import DeviceLimits

    engine, split = _FakeEngine(), dict(next(p for label, p in probe.POINTS if label == "64x256 c1 s4 k8"))
    rec = {"dtype": "bf16", "shape": "32x257x200"}
    ops, real = [], probe.TorchOperands
    monkeypatch.setattr(probe, "TorchOperands", lambda problem, torch: ops.append(real(problem, torch)) or ops[-1])
    result = probe.one_shape(engine, DeviceLimits(), {}, split, rec, (32, 257, 200, False, False), 10.0)
    assert result["status"] == "ok" and rec["kernel"].endswith("_k8") and "WS" in engine.seen
    (op,) = ops
    assert op.ws.numel() == 4 * 8 * 32 * 257 and bool((op.ws == 255).all())  # NaN before the (fake) launch


def test_one_shape_reports_an_unwritten_output_and_an_invalid_point(cpu_probe):
    from codegen.spec import DeviceLimits

    point = dict(bm=128, bn=256, stages=4, consumers=2, persistent=False, group_m=8)
    rec = {"dtype": "bf16", "shape": "67x45x88"}
    result = probe.one_shape(_FakeEngine(write=False), DeviceLimits(), {}, point, rec, (67, 45, 88, False, True), 10.0)
    assert result["status"] == "nan_or_inf" and result["first_nonfinite"] == [0, 0] and "ours_ms" not in result
    too_big = dict(point, stages=6)
    result = probe.one_shape(_FakeEngine(), DeviceLimits(), {}, too_big, dict(rec), (67, 45, 88, False, False), 10.0)
    assert result["status"] == "invalid" and "shared memory" in result["evidence"]
