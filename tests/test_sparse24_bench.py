"""benchmarks/sparse24.py on the CPU: the plan's ``codegen search --sparsity 2:4`` command lines, the
records a report makes of the searches' summaries and of the engine phase (DESIGN.md's format, both
baselines, ratios baseline / ours), and one engine record made with the harness replaced by stand-ins
(the GPU runs the real one: benchmarks/device/sparse24.sh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import sparse24 as bench
from codegen.cli import main as cli_main
from codegen.problem import DType, Problem


def test_the_plan_searches_each_shape_and_dtype_into_its_own_store(tmp_path):
    args = bench.parser().parse_args(["run", "--dir", str(tmp_path), "--budget", "4", "--dtypes", "fp16"])
    steps = bench.plan(args)
    assert [s.name for s in steps] == [f"{shape}-fp16" for shape in bench.SHAPES]
    first = list(steps[0].args)
    assert first[:3] == ["-m", "codegen", "search"] and first[first.index("--sparsity") + 1] == "2:4"
    assert first[first.index("--budget") + 1] == "4" and "--no-warm-start" in first and "--json" in first
    assert len({s.args[s.args.index("--db") + 1] for s in steps}) == len(steps)
    with pytest.raises(SystemExit) as stop:  # today's command line takes them (parsed up to the first check)
        cli_main([*first[2:], "--help"])
    assert stop.value.code == 0


def _summary(ms: float) -> dict:
    return {"sampler": "tpe", "evaluated": 4, "device": {"name": "NVIDIA H100 80GB HBM3", "nvrtc": "13.0",
                                                          "driver": "580"},
            "best": {"kernel": "sp24_bf16_nobias_128x128x64_w64x32_s3x_es_g8_k1", "family": "sparse24",
                     "median_ms": ms, "p20_ms": ms, "p80_ms": ms, "tflops": 100.0, "gbps": 1.0,
                     "baselines": {"cublas": {"median_ms": 2 * ms, "p20_ms": 2 * ms, "p80_ms": 2 * ms},
                                   "cusparselt": {"median_ms": ms / 2, "p20_ms": ms / 2, "p80_ms": ms / 2}}}}


def test_report_writes_both_kinds_of_record(tmp_path, capsys):
    steps = [{"step": "4096x4096x4096-bf16", "shape": "4096x4096x4096", "dtype": "bf16", "budget": 4, "rc": 0,
              "started": "2026-12-06T08:00:00+00:00", "wall_s": 30.0, "summary": _summary(1.0)},
             {"step": "8192x8192x8192-bf16", "shape": "8192x8192x8192", "dtype": "bf16", "budget": 4, "rc": 130,
              "started": "2026-12-06T08:01:00+00:00", "wall_s": 300.0, "summary": None}]
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    engine = {"p": bench.problem_dict(16, 14336, 4096, "fp16"), "timing": "engine",
              "ours": {"kernel": "sp24_fp16_nobias_16x64x128_w8x32_s4x_es_g4_k1", "median_ms": 0.05},
              "baselines": {"cublas": {"median_ms": 0.06}}, "ratio": {"cublas": 1.2}}
    engine["problem"] = engine.pop("p")
    (tmp_path / bench.ENGINE_FILE).write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "records": [engine]}))
    out = tmp_path / "results"
    assert bench.main(["report", "--dir", str(tmp_path), "--out", str(out)]) == 0
    (path,) = out.glob("sparse24-NVIDIA_H100_80GB_HBM3-2026-12-06T080000Z.json")
    doc = json.loads(path.read_text())
    assert doc["suite"] == "sparse24" and doc["versions"] == {"nvrtc": "13.0", "driver": "580"}
    search, decode = doc["records"]
    assert search["problem"] == {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "layout": "forward", "bias": False,
                                 "density": 0.5, "block": None, "sparsity": "2:4"}
    assert search["timing"] == "cold_single" and search["ratio"] == {"cublas": 2.0, "cusparselt": 0.5}
    assert search["ours"]["search"]["budget"] == 4 and set(search["baselines"]) == {"cublas", "cusparselt"}
    assert decode["timing"] == "engine" and decode["problem"]["sparsity"] == "2:4"
    assert "4096x4096x4096 bf16 cold_single" in capsys.readouterr().out


def test_report_without_measurements_says_so(tmp_path, capsys):
    assert bench.main(["report", "--dir", str(tmp_path), "--out", str(tmp_path / "o")]) == 1
    assert "nothing measured" in capsys.readouterr().err


def test_an_engine_record_with_stand_ins(monkeypatch):
    from codegen.nn import timing

    problem = Problem(1, 4096, 14336, DType.bf16, sparsity="2:4", density=0.5)

    def fake_engine_timing(p, kernels):
        assert p == problem
        return timing.EngineTiming([0.02] * 4, [0.04] * 4, "sp24_bf16_x", 1e-3, {"copies": 4, "calls_per_replay": 24},
                                   DType.bf16)

    monkeypatch.setattr(timing, "engine_timing", fake_engine_timing)
    monkeypatch.setattr(bench, "cusparselt_in_engine", lambda p, copies, calls: ([0.01] * 4, [0.04] * 4, 1e-3))
    rec = bench.engine_record(problem, kernels=None)
    assert rec["ratio"] == {"cublas": 2.0, "cusparselt": 0.5} and rec["check"]["ok"]
    assert rec["ours"]["kernel"] == "sp24_bf16_x" and rec["timing"] == "engine"

    def refused(p, copies, calls):
        raise RuntimeError("CUDA graph capture of cuSPARSELt failed\nmore")

    monkeypatch.setattr(bench, "cusparselt_in_engine", refused)
    rec = bench.engine_record(problem, kernels=None)
    assert rec["note"] == "cusparselt: RuntimeError: CUDA graph capture of cuSPARSELt failed"
    assert set(rec["baselines"]) == {"cublas"} and rec["ratio"] == {"cublas": 2.0}


def test_the_device_script_runs_the_three_steps():
    text = (Path(bench.__file__).parent / "device" / "sparse24.sh").read_text()
    assert "source \"$(dirname \"$0\")/env.sh\"" in text
    for sub in ("benchmarks.sparse24 run", "benchmarks.sparse24 engine", "benchmarks.sparse24 report"):
        assert sub in text
