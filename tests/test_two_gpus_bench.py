"""CPU tier of benchmarks/two_gpus.py: its command lines, the checks it makes of a store, the record it
writes, how it finds a GPU worker process, and its kill and pair phases end to end with replay workers that
each own a stand-in worker process (tests/search/worker_search.py)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from pathlib import Path

from benchmarks import two_gpus as tg
from codegen.worker import name_this_process, process_name

REPLAY = ["--shape", "4096x4096x4096", "--dtype", "fp32", "--family=", "--restricted", "--driver",
          "tests.search.worker_search"]


def args_of(*argv: str):
    return tg.parser().parse_args(list(argv))


def test_search_commands_of_the_two_modes(tmp_path: Path) -> None:
    a = args_of("kill", "--dir", str(tmp_path))
    cmd = tg.search_command(a, tmp_path / "k.db", "0,1")
    assert cmd[1:4] == ["-m", "codegen", "search"] and cmd[-2:] == ["--gpus", "0,1"]
    assert "--family" in cmd and cmd[cmd.index("--family") + 1] == "hopper" and "--no-warm-start" in cmd
    assert "--budget" in cmd and cmd[cmd.index("--budget") + 1] == "48"
    assert cmd[cmd.index("--sampler") + 1] == "random"
    assert "--gpus" not in tg.search_command(a, tmp_path / "p.db", None)  # the pair's processes: their one GPU

    shared = args_of("kill", "--dir", str(tmp_path), "--share-gpu")
    cmd = tg.search_command(shared, tmp_path / "k.db", "0,1")
    assert cmd[1:5] == ["-m", "benchmarks.two_gpus", "shared-search", "--driver"] and cmd[-2:] == ["--gpus", "0,1"]
    assert tg.search_command(shared, tmp_path / "k.db", "0")[1:4] == ["-m", "codegen", "search"]
    assert tg._phase_head(shared, "kill")["mode"] == "one-gpu-shared"
    assert tg._phase_head(a, "kill")["mode"] == "two-gpus"


def trial(i: int, kernel: str, status: str = "ok", at: float = 0.0) -> dict:
    return {"id": i, "run_id": 1, "kernel": kernel, "status": status, "evidence": "",
            "created": f"2026-12-06T10:00:{at:09.6f}"}


def test_store_checks_find_a_kernel_measured_twice_and_a_budget_missed() -> None:
    good = [trial(1, "a"), trial(2, "b"), trial(3, "c", "compile_error")]
    c = tg.store_checks(good, 3)
    assert c["no_kernel_twice"] and c["budget_respected"] and c["statuses"] == {"compile_error": 1, "ok": 2}
    bad = tg.store_checks([*good, trial(4, "b")], 3)
    assert bad["measured_twice"] == ["b"] and not bad["no_kernel_twice"] and not bad["budget_respected"]
    assert bad["evaluated"] == 4 and bad["distinct_kernels"] == 3


def test_by_worker_and_the_rates_of_a_made_up_search() -> None:
    trials = [trial(1, "a", at=1.0), trial(2, "b", at=2.0), trial(3, "c", at=3.0), trial(4, "d", at=5.0)]
    workers = {"gpus": [0, 1], "measured": [2, 3], "kernels": {"a": 0, "b": 1, "c": 1, "d": 0, "x": 1}}
    rows = tg.by_worker(workers, trials, after="2026-12-06T10:00:02.500000+00:00")
    assert rows == [{"worker": 0, "gpu": 0, "trials": 2, "after_kill": 1}, {"worker": 1, "gpu": 1, "trials": 2,
                                                                            "after_kill": 1}]
    assert tg.by_worker(None, trials) is None
    r = tg.rates(trials, {"evaluated": 4, "wall_s": 8.0, "times_s": {"gpu": 6.0, "compile_wait": 1.0}})
    assert r["steady_tps"] == 0.75 and r["steady_span_s"] == 4.0 and r["end_to_end_tps"] == 0.5
    assert r["times_s"] == {"gpu": 6.0, "compile_wait": 1.0}


def test_verify_kill_says_what_was_lost_and_what_crashed() -> None:
    before = [trial(1, "a"), trial(2, "b")]
    after = [trial(1, "a"), trial(2, "b"), dict(trial(3, "c", "worker_crash"), evidence="worker exited with code -9")]
    v = tg.verify_kill(before, after, 3)
    assert v["nothing_lost"] and v["budget_respected"] and v["before_kill"] == 2
    assert v["worker_crash"] == [{"kernel": "c", "evidence": "worker exited with code -9"}]
    v = tg.verify_kill(before, [trial(1, "a"), trial(2, "b", "timeout"), trial(3, "c")], 3)
    assert v["lost"] == ["b"] and not v["nothing_lost"]  # changed after the kill counts as lost


def phases(share: bool) -> dict:
    mode = tg.MODES[share]
    device = {"name": "NVIDIA H100 80GB HBM3", "nvrtc": "13.0", "driver": "580", "sm": "sm_90"}
    search = {"rc": 0, "summary": {"device": device, "evaluated": 8}}
    head = {"mode": mode, "gpus": "0,1", "shape": "8192x8192x8192", "dtype": "bf16", "family": "hopper",
            "budget": 8, "sampler": "random", "seed": 0, "restricted": False, "started": "2026-12-06T10:00:00+00:00"}
    through = {**head, "phase": "throughput", "one": {"search": search, "steady_tps": 2.0, "end_to_end_tps": 1.0},
               "two": {"search": search, "steady_tps": 3.6, "end_to_end_tps": 1.5}}
    tg._throughput_ratio(through, share)
    return {"kill": {**head, "phase": "kill", "search": search, "survived": True},
            "throughput": through, "pair": {**head, "phase": "pair", "searches": [search, search], "ok": True}}


def test_the_record_of_two_gpus_and_of_one_shared_gpu() -> None:
    doc = tg.build_record(phases(False), "cmd")
    assert doc["suite"] == "two-gpus" and doc["mode"] == "two-gpus" and doc["device"] == "NVIDIA H100 80GB HBM3"
    assert doc["date"] == "2026-12-06T10:00:00Z" and doc["versions"]["nvrtc"] == "13.0"
    assert doc["timing"]["method"] == "cold_single" and doc["problem"]["m"] == 8192
    assert [r["phase"] for r in doc["records"]] == ["kill", "throughput", "pair"]
    (t,) = [r for r in doc["records"] if r["phase"] == "throughput"]
    assert t["speedup"] == {"steady_tps": 1.8, "end_to_end_tps": 1.5} and t["target_met"]
    assert t["settings"]["budget"] == 8 and t["problem"]["dtype"] == "bf16"

    shared = tg.build_record(phases(True), "cmd")
    assert shared["mode"] == "one-gpu-shared"
    (t,) = [r for r in shared["records"] if r["phase"] == "throughput"]
    assert "speedup" not in t and "target_met" not in t and "not a two-GPU result" in t["note"]
    assert t["shared_gpu_ratio"]["steady_tps"] == 1.8


def _named(ordinal: int, conn) -> None:
    name_this_process(process_name(ordinal))
    conn.send("named")
    conn.recv()


def test_a_gpu_worker_is_found_by_its_os_name() -> None:
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_named, args=(1, there), daemon=True)
    proc.start()
    try:
        assert here.poll(60) and here.recv() == "named"
        assert Path(f"/proc/{proc.pid}/comm").read_text().strip() == "gemmscape-gpu1"
        assert (proc.pid, "gemmscape-gpu1") in tg.gpu_workers(os.getpid())
        assert tg.pick_victim([(5, "gemmscape-gpu0"), (7, "gemmscape-gpu1")], False) == (7, "gemmscape-gpu1")
        assert tg.pick_victim([(5, "gemmscape-gpu0"), (7, "gemmscape-gpu0")], True) == (7, "gemmscape-gpu0")
        assert tg.pick_victim([(5, "gemmscape-gpu0")], False) is None
    finally:
        here.send("stop")
        proc.join(10)


def test_kill_phase_end_to_end_with_replay_workers(tmp_path: Path, monkeypatch) -> None:
    """``--gpus 0,1`` on two replay workers, each with a stand-in worker process; the one of GPU 1 is killed
    once a third of the budget is stored: the search ends with the budget, nothing lost, one worker_crash."""
    monkeypatch.setenv("GEMMSCAPE_TEST_DELAY", "0.3")
    t0 = time.monotonic()
    rc = tg.main(["kill", "--dir", str(tmp_path), *REPLAY, "--budget", "18", "--timeout-s", "120"])
    rec = json.loads((tmp_path / "kill.json").read_text())
    assert rc == 0, (rec, (tmp_path / tg.LOG).read_text()[-3000:])
    assert rec["killed"]["name"] == "gemmscape-gpu1" and rec["killed"]["stored_before"] >= 6
    s = rec["store"]
    assert rec["survived"] and s["nothing_lost"] and s["budget_respected"] and s["no_kernel_twice"]
    assert len(s["worker_crash"]) <= 1 and rec["summary_evaluated"] == 18
    assert [w["gpu"] for w in rec["by_worker"]] == [0, 1] and sum(w["trials"] for w in rec["by_worker"]) == 18
    assert rec["by_worker"][1]["after_kill"] > 0  # GPU 1's worker came back and measured again
    assert time.monotonic() - t0 < 120


def test_pair_phase_and_report_in_one_gpu_mode(tmp_path: Path, monkeypatch) -> None:
    """Two processes on one store, both on GPU 0 (--share-gpu): each kernel once, the budget spent; the report
    says which mode ran."""
    monkeypatch.setenv("GEMMSCAPE_TEST_DELAY", "0.1")
    assert tg.main(["pair", "--dir", str(tmp_path), "--share-gpu", *REPLAY, "--budget", "12"]) == 0
    rec = json.loads((tmp_path / "pair.json").read_text())
    assert rec["ok"] and rec["one_study"] and rec["store"]["evaluated"] == 12
    assert [p["CUDA_VISIBLE_DEVICES"] for p in rec["by_process"]] == ["0", "0"]
    assert sum(p["trials"] for p in rec["by_process"]) == 12
    assert len(rec["runs"]) == 2 and all(r["outcome"] == "finished" for r in rec["runs"])
    out = tmp_path / "out"
    assert tg.main(["report", "--dir", str(tmp_path), "--out", str(out)]) == 0
    (path,) = out.glob("two-gpus-*-one-gpu-shared.json")
    doc = json.loads(path.read_text())
    assert doc["mode"] == "one-gpu-shared" and [r["phase"] for r in doc["records"]] == ["pair"]
