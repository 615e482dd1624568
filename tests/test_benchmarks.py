"""The benchmark runner's search mode, driven by the recorded H200 sweep instead of a GPU.

The replayed numbers are recorded data (see search/recordings/); the test checks the plumbing:
seeds first, every trial stored, a DESIGN.md-shaped JSON written.
"""

from __future__ import annotations

import json

import search.measure
from benchmarks import run
from codegen.problem import Problem
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
    assert record["ours"]["tflops"] >= ReplayMeasurer(RECORDING).results[
        "simt_fp32_nobias_128x128x16_w32x64_t8x8_p4_v4_s2_g8_k1"]["tflops"]  # the seed was tried
    assert record["ratio"]["cublas"] > 0 and doc["device"] == "NVIDIA H200"
    assert best["tflops"] >= record["ours"]["tflops"]
    assert (tmp_path / "replayed.db").is_file()
