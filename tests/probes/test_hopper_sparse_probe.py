"""The Hopper block-sparse device probe's CPU side: its jobs cover the asked problems with valid
kernels, its operands hold the BSR layout the kernels read, a job whose child hung is reported as
such, and the results file has the benchmark-results shape with both baselines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.probes import hopper_sparse_probe as probe
from codegen import sparse
from codegen.problem import DType
from search.space import space_for, to_spec

torch = pytest.importorskip("torch")


def test_arguments_and_their_errors(capsys):
    args = probe.parse([])
    assert args.blocks == [64, 32, 16] and args.torch_bsr and args.budget_s == 50.0 and args.child is None
    args = probe.parse(["--blocks", "32", "--no-torch-bsr", "--budget-s", "30", "--out", "/tmp/x"])
    assert args.blocks == [32] and not args.torch_bsr and args.out == "/tmp/x" and args.pattern_seeds == [7]
    assert probe.parse(["--pattern-seeds", "7", "0"]).pattern_seeds == [7, 0]
    for bad in (["--blocks", "48"], ["--budget-s", "0"], ["--hang-s", "-1"], ["--pattern-seeds", "-2"]):
        with pytest.raises(SystemExit) as e:
            probe.parse(bad)
        assert e.value.code == 2
    assert "invalid choice: 48" in capsys.readouterr().err


def test_jobs_cover_the_asked_problems_with_valid_points():
    jobs = probe.jobs()
    shapes = {(j["m"], j["n"], j["k"], j["block"], j["density"]) for j in jobs}
    for block in (64, 32, 16):
        for d in (0.05, 0.1, 0.25, 0.5):
            assert (4096, 4096, 4096, block, d) in shapes
        assert (32, 4096, 4096, block, 0.1) in shapes
    assert [j["id"] for j in jobs] == list(range(len(jobs))) and jobs[0]["block"] == 64  # block 64 first
    assert len(jobs) <= 100  # under a second each: the default 50 s budget reaches block 64's and 32's
    assert {j["seed"] for j in jobs} == {probe.PATTERN_SEED}
    two = probe.jobs((64,), (7, 0))
    assert len({probe.problem_key(j) for j in two}) == 10 and {j["seed"] for j in two} == {7, 0}
    assert sum(j["point"].get("swap", False) for j in two if j["m"] == 4096) == 4 * 8  # four swapped points
    for j in jobs:
        pattern = sparse.Pattern.random(j["n"], j["k"], j["block"], j["density"], seed=7)
        problem = sparse.problem_for(j["m"], pattern, DType.bf16)
        assert space_for("hopper", DType.bf16, block=j["block"]).indices(j["point"]) is not None
        spec = to_spec("hopper", j["point"], problem)
        assert not spec.check(problem), (j["label"], j["block"], spec.check(problem))


class _CpuOperands(probe.SparseOperands):
    device = "cpu"


def test_operands_hold_the_bsr_layout_the_kernel_reads():
    pattern = sparse.Pattern.random(200, 136, 64, 0.5, seed=3)  # partial edge blocks both ways
    problem = sparse.problem_for(5, pattern, DType.bf16, bias=True)
    ops = _CpuOperands(problem, pattern, torch)
    w = ops.w_dense.float().numpy()
    assert w.shape == (200, 136) and ops.blocks.shape == (pattern.nnzb, 64, 64)
    assert np.array_equal(pattern.gather(w), ops.blocks.float().numpy())  # kept blocks, in BSR order, padded zero
    assert np.array_equal(pattern.expand(ops.blocks.float().numpy()), w)  # and nothing outside them
    assert ops.rp.dtype == ops.ci.dtype == torch.int32 and ops.rp.tolist() == pattern.indptr.tolist()
    assert ops.address("W", None) == ops.blocks.data_ptr() and ops.address("WS", None) is None
    ref = ops.reference()
    assert ref.dtype == torch.float64 and ref.shape == (5, 200)


def _run(jobs, events, ending="done", stderr=""):
    return {"jobs": [j["id"] for j in jobs], "events": events, "ending": ending, "exit_code": 0, "stderr_tail": stderr,
            "seconds": 1.0}


def _ok(job, ours, cublas, bsr=None):
    r = {"event": "result", "id": job["id"], "status": "ok", "kernel": f"hp_{job['label']}", "rel_error": 3e-3,
         "nnzb": 410, "density": job["density"], "tflops": 100.0, "pattern": "b2c7aaf2c6bdd138"}
    for who, ms in (("ours", ours), ("cublas", cublas), ("torch_bsr", bsr)):
        if ms is not None:
            r.update({f"{who}_ms": ms, f"{who}_p20": ms * 0.98, f"{who}_p80": ms * 1.02, f"{who}_reps": 20})
    return r


def test_results_doc_and_table_from_runs_that_hung_midway():
    jobs = [j for j in probe.jobs((64,)) if j["m"] == 4096 and j["density"] in (0.1, 0.25)]
    a, b, c = jobs[0], jobs[1], jobs[2]  # three points of density 0.1
    first = _run(jobs, [
        {"event": "device", "name": "NVIDIA H200", "driver": 580, "sm": "sm_90", "torch": "2.9"},
        {"event": "stage", "id": a["id"], "stage": "start"}, _ok(a, 0.030, 0.175, 0.300),
        {"event": "stage", "id": b["id"], "stage": "start"}, _ok(b, 0.025, 0.175, 0.300),
        {"event": "stage", "id": c["id"], "stage": "start"}, {"event": "stage", "id": c["id"], "stage": "run"},
        {"event": "hang", "seconds": 5.0},
    ], ending="hang")
    rest = [j for j in jobs if j["density"] == 0.25]  # the last points of density 0.1 never ran
    second = _run(rest, [{"event": "stage", "id": rest[0]["id"], "stage": "start"}, _ok(rest[0], 0.020, 0.175)])
    doc = {"date": "2026-12-02T01:00:00Z", "device": "smi line", "command": "python3 -m benchmarks.probes.hopper_sparse_probe",
           "jobs": jobs, "runs": [first, second]}
    got = probe.results(doc["runs"], jobs)
    assert got[c["id"]]["status"] == "hang" and got[b["id"]]["status"] == "ok"
    design = json.loads(json.dumps(probe.design_doc(doc)))
    assert design["suite"] == "hopper_sparse" and design["device"] == "NVIDIA H200"
    assert set(design) >= {"date", "versions", "command", "timing", "records"}
    first_rec = next(r for r in design["records"] if r["problem"]["density"] == 0.1)
    assert first_rec["problem"] == {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16", "layout": "forward",
                                    "bias": False, "density": 0.1, "block": 64, "nnzb": 410, "pattern_seed": 7,
                                    "pattern": "b2c7aaf2c6bdd138"}
    assert first_rec["ours"]["point"] == b["label"] and first_rec["ours"]["median_ms"] == 0.025
    assert set(first_rec["ours"]["others"]) == {a["label"]}
    assert first_rec["ratio"]["cublas"] == pytest.approx(7.0) and first_rec["ratio"]["torch_bsr"] == pytest.approx(12.0)
    assert first_rec["baselines"]["cublas"] == {"median_ms": 0.175, "p20_ms": 0.175 * 0.98, "p80_ms": 0.175 * 1.02,
                                                "reps": 20}
    assert len(design["records"]) == 2 and "torch_bsr" not in design["records"][1]["baselines"]
    text = probe.table(doc)
    assert "hang" in text and "7.00" in text and "not run" in text
