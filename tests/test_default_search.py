"""benchmarks/default_search.py on the CPU: its plan run as real ``codegen search`` processes over
recorded H200 sweeps (search/recordings/), resumed, and reported against its targets."""

from __future__ import annotations

import json

RECORDINGS = ["search/recordings/replay-simt-4096x4096x4096-fp32.json",
              "search/recordings/replay-simt-skinny-32x4096x4096-fp32.json"]


def test_default_search_runs_its_plan_resumes_and_reports(tmp_path):
    from benchmarks import default_search
    from benchmarks.steps import load_steps

    common = ["--dir", str(tmp_path / "ds"), "--target", "4096x4096x4096", "--target-budget", "8",
              "--held-out", "32x4096x4096", "--budget", "10", "--families", "simt", "--dtype", "fp32",
              "--replay", *RECORDINGS]
    assert default_search.main(["run", *common, "--deadline-s", "600"]) == 0
    steps = load_steps(tmp_path / "ds")
    assert [s["step"] for s in steps] == ["target", "A-default", "A-simt"] and all(s["rc"] == 0 for s in steps)
    assert "--family" not in steps[1]["command"] and "--family simt" in steps[2]["command"]
    assert all("--no-warm-start" in s["command"] for s in steps)
    assert len({s["command"].split("--db ")[1].split()[0] for s in steps}) == 3  # a store each
    assert default_search.main(["run", *common, "--deadline-s", "600"]) == 0  # nothing left to run
    assert len(load_steps(tmp_path / "ds")) == 3
    assert default_search.main(["report", *common, "--out", str(tmp_path / "out")]) == 0
    doc = json.loads(next((tmp_path / "out").glob("default-search-*.json")).read_text())
    assert doc["timing"] == "cold_single" and doc["versions"]["gemmscape"]
    target, held = doc["records"]
    assert target["ours"]["search"]["evaluated"] == 8 and target["ours"]["family"] == "simt"
    assert target["ratio"]["cublas"] > 0  # recordings keep the ratio measured beside cuBLAS, not its times
    assert target["targets"]["met"] == (target["ratio"]["cublas"] >= 0.97)
    share = held["targets"]["of_best_single_family"]
    assert share == round(held["ours"]["tflops"] / held["single_family"]["simt"]["tflops"], 4)
    assert held["targets"]["met"] == (share >= 0.97) and held["ours"]["search"]["evaluated"] == 10


def test_default_search_refuses_a_replay_list_of_the_wrong_length(tmp_path, capsys):
    import pytest

    from benchmarks import default_search

    with pytest.raises(SystemExit) as e:
        default_search.main(["run", "--dir", str(tmp_path), "--replay", RECORDINGS[0]])
    assert e.value.code == 2 and "one recording for the target" in capsys.readouterr().err
