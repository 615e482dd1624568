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


# ---- the table of docs/measurements.md ---------------------------------------------------------------------------
def _made_up_doc() -> dict:
    """A small sparse24 file: an engine record before a search's (file order), one engine record whose
    cuSPARSELt could not run (a note, no baseline), one whose output check failed (no ratio)."""
    def stats(ms):
        return {"median_ms": ms, "p20_ms": ms * 0.99, "p80_ms": ms * 1.01}

    engine = {"problem": bench.problem_dict(16, 4096, 4096, "bf16"), "timing": "engine",
              "ours": {"kernel": "sp24_made_up_engine", **stats(0.02), "rel_error": 1e-3},
              "baselines": {"cublas": stats(0.04), "cusparselt": stats(0.08)}, "ratio": {"cublas": 2.0, "cusparselt": 4.0},
              "check": {"ok": True}}
    no_lt = {**engine, "problem": bench.problem_dict(1, 4096, 4096, "fp16"), "baselines": {"cublas": stats(0.04)},
             "ratio": {"cublas": 2.0}, "note": "cusparselt: RuntimeError: made up"}
    wrong = {**engine, "problem": bench.problem_dict(64, 4096, 4096, "bf16"), "ratio": {}, "check": {"ok": False}}
    search = {"problem": bench.problem_dict(4096, 4096, 4096, "fp16"), "timing": "cold_single",
              "ours": {"kernel": "hsp24_made_up_search", "family": "hopper_sp24", **stats(0.1)},
              "baselines": {"cublas": stats(0.125), "cusparselt": stats(0.3)}, "ratio": {"cublas": 1.25, "cusparselt": 3.0}}
    return {"suite": "sparse24", "date": "2099-01-02T03:04:05Z", "device": "Made Up GPU", "settings": {"budget": 2},
            "records": [engine, no_lt, search, wrong]}


def test_the_measurements_table_puts_prefill_first_and_survives_a_missing_baseline(tmp_path):
    from benchmarks import measurements

    name = "sparse24-Made_Up_GPU-2099-01-02T030405Z.json"
    (tmp_path / name).write_text(json.dumps(_made_up_doc()))
    text = measurements.sparse24(tmp_path, "../benchmarks/results")
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and name in line]
    assert [row[0] for row in rows] == ["| fp16 4096³, 2:4", "| bf16 16×4096×4096, 2:4", "| fp16 1×4096×4096, 2:4",
                                        "| bf16 64×4096×4096, 2:4"]
    assert rows[0][1:7] == ["`hsp24_made_up_search`", "100.0 (99.0–101.0)", "125.0 (123.8–126.2)",
                            "300.0 (297.0–303.0)", "1.25×", "3.00×"]
    assert rows[0][7:9] == ["cold_single", "Made Up GPU, 2099-01-02"] and rows[1][7] == "engine"
    assert rows[2][4] == "–" and rows[2][5:7] == ["2.00×", "–"]  # no cuSPARSELt: said, not a crash
    assert rows[3][5:7] == ["–", "–"]
    assert "cusparselt: RuntimeError: made up" in text and "the output check failed" in text
    assert measurements.sparse24(tmp_path / "none", "x").startswith("No result")


def test_the_measurements_page_gets_its_section_once_a_result_exists(tmp_path):
    from benchmarks import measurements

    results, root = tmp_path / "results", tmp_path / "root"
    results.mkdir()
    (root / "docs").mkdir(parents=True)
    assert "sparse24" not in measurements.tables(results)  # no 2:4 result, no 2:4 table
    for f in measurements.RESULTS.iterdir():  # the committed results (the README's headline names a 2:4 one)
        (results / f.name).symlink_to(f)
    name = "sparse24-Made_Up_GPU-2099-01-02T030405Z.json"
    (results / name).write_text(json.dumps(_made_up_doc()))
    page = (measurements.ROOT / "docs" / "measurements.md").read_text()
    if "### 2:4 sparse W" in page:  # the page as it was before a 2:4 result was committed
        end = "<!-- measurements:sparse24 end -->\n\n"
        page = page[:page.index("### 2:4 sparse W")] + page[page.index(end) + len(end):]
    (root / "docs" / "measurements.md").write_text(page)
    (root / "README.md").write_text((measurements.ROOT / "README.md").read_text())
    assert measurements.main(["--root", str(root), "--results", str(results)]) == 0
    text = (root / "docs" / "measurements.md").read_text()
    at = text.index("### 2:4 sparse W")
    assert text.index("## Block-sparse W") < at < text.index("### Sparsity: quality")
    assert text.count("<!-- measurements:sparse24 end -->") == 1 and "hsp24_made_up_search" in text
    assert "### 2:4 sparse W" not in (root / "README.md").read_text()
    assert measurements.main(["--root", str(root), "--results", str(results), "--check"]) == 0  # placed once
