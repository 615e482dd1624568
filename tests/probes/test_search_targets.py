"""benchmarks/probes/search_targets.py on the CPU: its plan run as real ``codegen search`` processes over
recorded H200 sweeps (search/recordings/), resumed, and reported."""

from __future__ import annotations

import json


def test_search_targets_runs_its_plan_resumes_and_reports(tmp_path):
    """benchmarks.probes.search_targets over two recorded H200 sweeps (recorded data, search/recordings/):
    every step runs a real ``codegen search`` process into its own store, a finished step is not run
    again, and the report holds each shape's long search, its short unseeded searches and the warm start."""
    from benchmarks.probes import search_targets

    recordings = ["search/recordings/replay-simt-4096x4096x4096-fp32.json",
                  "search/recordings/replay-simt-skinny-32x4096x4096-fp32.json"]
    common = ["--dir", str(tmp_path / "st"), "--shapes", "4096x4096x4096", "32x4096x4096", "--big", "16",
              "--small", "6", "--seeds", "0", "1", "--warm", "4", "--replay", *recordings]
    assert search_targets.main(["run", *common, "--deadline-s", "600"]) == 0
    steps = search_targets.load_steps(tmp_path / "st")
    assert [s["step"] for s in steps] == ["A-16", "A-6-s0", "A-6-s1", "B-warm", "B-16", "B-6-s0", "B-6-s1"]
    assert all(s["rc"] == 0 for s in steps)
    assert "--no-seeds" in steps[1]["command"] and "--no-warm-start" in steps[0]["command"]
    assert search_targets.main(["run", *common, "--deadline-s", "600"]) == 0  # nothing left to run
    assert len(search_targets.load_steps(tmp_path / "st")) == len(steps)
    assert search_targets.main(["report", *common, "--out", str(tmp_path / "out")]) == 0
    doc = json.loads(next((tmp_path / "out").glob("search-targets-*.json")).read_text())
    a, b = doc["records"]
    assert a["ours"]["search"]["evaluated"] == 16 and a["ours"]["search"]["seeds_tried_first"] >= 1
    assert set(a["short_searches"]) == {"seed0", "seed1"}
    assert all(r["evaluated"] == 6 and r["seeds_tried_first"] == 0 for r in a["short_searches"].values())
    assert a["targets"]["warm_start"] is None  # the first shape has no other shape's search to start from
    warm = b["targets"]["warm_start"]
    assert warm["evaluated"] == 4 and warm["store_held"] == ["4096x4096x4096_fp32_forward"]
    assert 0 < warm["of_long_best"] <= 1.5
