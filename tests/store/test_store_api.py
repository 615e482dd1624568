"""Store round-trips, get-or-create, best, known_result, filters and run bookkeeping."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from codegen import sparse
from codegen.families.simt import Spec as SimtSpec
from codegen.problem import DType, Layout, Problem
from codegen.sparse import Pattern, problem_for
from store import Store

H200 = {"name": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04", "nvrtc": "13.0"}
P = Problem(256, 512, 128)
Q = Problem(64, 64, 64, dtype=DType.bf16, bias=True)


def ok(ms: float, **extra: object) -> dict:
    result = {
        "status": "ok", "evidence": "", "median_ms": ms, "p20_ms": ms * 0.99, "p80_ms": ms * 1.01,
        "times_ms": [ms * 0.98, ms, ms * 1.02], "tflops": 1.0 / ms, "gbps": 10.0 / ms, "rel_error": 1e-7,
        "baselines": {"cublas": {"median_ms": 1.0, "p20_ms": 0.99, "p80_ms": 1.01}}, "ratio": {"cublas": 1.0 / ms},
    }  # fmt: skip
    result.update(extra)
    return result


def failed(status: str, evidence: str) -> dict:
    return {"status": status, "evidence": evidence, "median_ms": None, "times_ms": [], "baselines": {}, "ratio": {}}


def spec(variant: int = 0, **kw: object) -> SimtSpec:
    """Distinct specs whatever SimtSpec's defaults are: ``variant`` shifts the padding."""
    base = SimtSpec(**kw)  # type: ignore[arg-type]
    return dataclasses.replace(base, pad=base.pad + variant)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


#: The hash of the source the trials below measured, unless a test says otherwise.
H1, H2 = sha("source one"), sha("source two")
ROOT = Path(__file__).resolve().parents[2]


def add(store: Store, dev: int, s: SimtSpec, result: dict, problem: Problem = P, run: int | None = None, n: int = 0,
        source_hash: str | None = H1):
    return store.add_trial(run, s.name, "sm_90", problem, dev, n, result, s.to_dict(), source_hash=source_hash)


def test_device_and_problem_get_or_create_is_idempotent(store: Store) -> None:
    first = store.device(H200)
    assert store.device(dict(H200)) == first
    assert store.device({**H200, "driver": "590.0"}) != first
    assert store.problem(P) == store.problem(Problem(256, 512, 128)) != store.problem(Q)
    assert [p["key"] for p in store.problems()] == sorted([P.key, Q.key])
    (row,) = [p for p in store.problems() if p["key"] == Q.key]
    dense = {"density": 1.0, "block": None, "pattern": None}  # a dense W: no block, no pattern
    assert row | {"id": 0} == {**Q.to_dict(), "key": Q.key, **dense, "id": 0}
    assert Problem.from_dict(row) == Q
    assert [d["name"] for d in store.devices()] == ["NVIDIA H200", "NVIDIA H200"]


def test_problem_keeps_density_block_and_pattern(store: Store) -> None:
    quarter = problem_for(128, Pattern.random(128, 256, 32, 0.25, seed=3), DType.fp16, bias=True)
    empty = problem_for(64, Pattern.random(128, 128, 16, 0.0), DType.fp32)  # an all-zero W
    ids = {store.problem(quarter), store.problem(empty), store.problem(P)}
    assert len(ids) == 3 and store.problem(quarter) in ids
    rows = {r["key"]: r for r in store.problems()}
    assert (rows[quarter.key]["density"], rows[quarter.key]["block"]) == (0.25, 32)
    assert rows[quarter.key]["pattern"] == quarter.pattern and len(quarter.pattern) == 16
    assert (rows[empty.key]["density"], rows[empty.key]["block"]) == (0.0, 16)  # 0 stays 0, never 1
    assert Problem.from_dict(rows[quarter.key]) == quarter and Problem.from_dict(rows[empty.key]) == empty
    assert (rows[P.key]["block"], rows[P.key]["pattern"]) == (None, None)


def test_trial_and_best_rows_carry_the_sparsity(store: Store) -> None:
    dev = store.device(H200)
    problem = problem_for(256, Pattern.random(512, 128, 64, 0.5, seed=1))
    run = store.start_run(problem, dev, "simt", "tpe", 0, 5, "sparse", {}, "test")
    add(store, dev, spec(), ok(0.4), problem=problem, run=run)
    add(store, dev, spec(1), ok(0.3), problem=problem, run=run)
    add(store, dev, spec(), ok(1.0))  # dense
    wanted = {"density": 0.5, "block": 64, "pattern": problem.pattern}
    for row in (*store.trials(problem=problem), *store.best(problem), store.best_for(problem)):
        assert {k: row[k] for k in wanted} == wanted and Problem.from_dict(row) == problem
    (dense,) = store.best(P)
    assert (dense["density"], dense["block"], dense["pattern"]) == (1.0, None, None)
    assert Problem.from_dict(dense) == P
    assert store.known_result(problem, dev, spec(1).name, H1)["median_ms"] == 0.3
    assert [r["problem"] for r in store.runs()] == [problem.key]


def test_a_sparse_problem_stores_its_pattern_once(store: Store) -> None:
    pattern = Pattern.random(200, 100, 32, 0.4, seed=7)  # neither side a multiple of the block
    a, b = problem_for(64, pattern), problem_for(128, pattern, DType.bf16)
    store.problem(a)
    store.problem(b)
    assert store.patterns() == [{"hash": pattern.hash, "n": 200, "k": 100, "block": 32, "nnzb": pattern.nnzb,
                                 "density": pattern.density, "created": store.patterns()[0]["created"]}]
    got = store.pattern(pattern.hash)
    assert got is not pattern and got.hash == pattern.hash and (got.n, got.k, got.block) == (200, 100, 32)
    assert np.array_equal(got.indptr, pattern.indptr) and np.array_equal(got.indices, pattern.indices)
    assert got.indptr.dtype == np.int32 and np.array_equal(got.mask(), pattern.mask())
    assert store.pattern("0" * 16) is None and store.pattern("") is None
    empty = Pattern.random(64, 64, 16, 0.0)
    store.problem(problem_for(8, empty))
    assert store.pattern(empty.hash).nnzb == 0


def test_an_unregistered_pattern_is_filled_in_later(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    pattern = Pattern.random(64, 64, 16, 0.5, seed=2)
    problem = Problem(32, 64, 64, block=16, density=pattern.density, pattern=pattern.hash)  # not registered
    monkeypatch.setattr(sparse, "_REGISTRY", {})
    first = store.problem(problem)
    assert store.pattern(pattern.hash) is None and store.patterns() == []
    assert store.problems()[0]["pattern"] == pattern.hash
    sparse.register(pattern)
    assert store.problem(problem) == first and store.pattern(pattern.hash).hash == pattern.hash


def test_a_block_sparse_backward_problem_is_stored_with_its_w_s_pattern(store: Store) -> None:
    """grad_input reads W [out, in] as N = in, K = out, grad_weight writes it as M = out, N = in
    (Problem.w_shape): the pattern is W's in every layout, and one that is not still is refused."""
    pattern = Pattern.random(96, 64, 16, 0.5, seed=5)  # W [out 96, in 64]
    for layout in Layout:
        store.problem(problem_for(32, pattern, DType.bf16, layout=layout))
    assert sorted(p["layout"] for p in store.problems()) == ["forward", "grad_input", "grad_weight"]
    assert store.patterns()[0]["hash"] == pattern.hash
    with pytest.raises(ValueError, match="not the problem's"):  # the forward's N and K in grad_input
        store.problem(Problem(32, 96, 64, layout=Layout.grad_input, block=16, density=pattern.density,
                              pattern=pattern.hash))


def test_a_pattern_that_is_not_the_problems_is_refused(store: Store) -> None:
    pattern = Pattern.random(64, 64, 16, 0.5, seed=2)
    store.problem(problem_for(16, pattern))  # stored once: a later wrong use is refused all the same
    with pytest.raises(ValueError, match="not the problem's"):
        store.problem(Problem(32, 64, 128, block=16, density=pattern.density, pattern=pattern.hash))
    with pytest.raises(ValueError, match="not the problem's"):
        store.problem(Problem(32, 64, 64, block=16, density=0.25, pattern=pattern.hash))
    # Two patterns whose hashes share the 8 characters in the key: the second is refused, never merged.
    one = Problem(32, 64, 64, block=16, density=0.5, pattern="abcdef01" + "0" * 8)
    two = Problem(32, 64, 64, block=16, density=0.5, pattern="abcdef01" + "1" * 8)
    assert one.key == two.key
    store.problem(one)
    with pytest.raises(ValueError, match="hash prefix"):
        store.problem(two)
    assert [r["pattern"] for r in store.problems()] == [pattern.hash, one.pattern]  # nothing refused was written


def test_a_later_process_rebuilds_a_sparse_problem(store: Store, store_url: str) -> None:
    pattern = Pattern.random(256, 128, 32, 0.3, seed=11)
    problem = problem_for(64, pattern, DType.fp16)
    store.problem(problem)
    code = ("import sys; from codegen import sparse; from store import Store; s = Store(sys.argv[1], read_only=True);"
            "p = s.find_problem(sys.argv[2]); q = sparse.lookup(p);"
            "print(p.key, q.hash, q.nnzb, s.find_problem('nope'))")
    out = subprocess.run([sys.executable, "-c", code, store_url, problem.key], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [problem.key, pattern.hash, str(pattern.nnzb), "None"]


def test_kernel_upsert_fills_in_later_fields(store: Store) -> None:
    s = spec()
    source = 'extern "C" __global__ void k() {}'
    record = {"name": s.name, "family": "simt", "spec": s.to_dict(), "arch": "sm_90", "source_hash": sha(source)}
    kid = store.kernel(record)
    assert store.kernel_record(s.name)["source"] is None
    report = {s.name: {"registers": 64, "stack": 0, "spill_stores": 0, "spill_loads": 0, "barriers": 1}}
    full = {**record, "source": source, "options": ["-arch=sm_90", "-std=c++17"], "report": report, "log": "ok"}
    assert store.kernel(full) == kid
    assert store.kernel(record) == kid  # a later record without source keeps what is known
    got = store.kernel_record(s.name, "sm_90")
    assert {k: got[k] for k in full} == full
    assert store.kernel({**record, "arch": "sm_80"}) != kid
    assert store.kernel_record(s.name, "sm_75") is None
    assert store.kernel_record("nope") is None


def test_kernel_identity_includes_the_source_hash(store: Store) -> None:
    s = spec()
    base = {"name": s.name, "family": "simt", "spec": s.to_dict(), "arch": "sm_90"}
    old = store.kernel({**base, "source": "old template text"})  # the hash is computed from the source
    new = store.kernel({**base, "source": "new template text"})
    unrendered = store.kernel(base)  # an invalid point: never rendered, no hash
    assert len({old, new, unrendered}) == 3 and store.kernel(base) == unrendered
    assert store.kernel_record(s.name, source_hash=sha("old template text"))["source"] == "old template text"
    assert store.kernel_record(s.name, "sm_90", sha("new template text"))["id"] == new
    assert store.kernel_record(s.name, source_hash=sha("never")) is None
    assert [k["source_hash"] for k in store.kernels()] == [sha("old template text"), sha("new template text"), None]
    with pytest.raises(ValueError, match="not the hash of its source"):
        store.kernel({**base, "source": "text", "source_hash": sha("other text")})


def test_trials_attach_to_the_source_they_measured(store: Store) -> None:
    dev = store.device(H200)
    s = spec()
    store.kernel({"name": s.name, "family": "simt", "spec": s.to_dict(), "arch": "sm_90", "source": "source one"})
    add(store, dev, s, ok(2.0), source_hash=H1)
    add(store, dev, s, ok(1.0), source_hash=H2)  # the same name after a template change
    rows = store.trials(kernel_name=s.name)
    assert [r["source_hash"] for r in rows] == [H1, H2] and rows[0]["kernel_id"] != rows[1]["kernel_id"]
    assert [r["median_ms"] for r in store.trials(source_hash=H1)] == [2.0]
    assert len(store.kernels()) == 2
    best = store.measured_kernel(s.name)
    assert best["trial"]["median_ms"] == 1.0 and best["kernel"]["source_hash"] == H2
    assert best["kernel"]["source"] is None  # H2 was never stored with its text
    assert best["device"]["name"] == "NVIDIA H200" and best["versions"] == {}
    of_h1 = store.measured_kernel(s.name, P, arch="sm_90", source_hash=H1)
    assert of_h1["trial"]["median_ms"] == 2.0 and of_h1["kernel"]["source"] == "source one"
    assert store.measured_kernel(s.name, Q) is None and store.measured_kernel(s.name, arch="sm_80") is None


def test_trial_round_trip(store: Store) -> None:
    dev = store.device(H200)
    run = store.start_run(P, dev, "simt", "tpe", 7, 200, "study-a", {"gemmscape": "0.1"}, "codegen search")
    result = ok(0.5)
    tid = add(store, dev, spec(), result, run=run, n=3)
    (row,) = store.trials(run_id=run)
    assert row["id"] == tid and row["number"] == 3 and row["run_id"] == run
    assert {k: row[k] for k in result} == result
    assert row["ratio_cublas"] == pytest.approx(2.0)
    assert row["params"] == spec().to_dict()
    assert (row["kernel"], row["family"], row["arch"], row["problem"], row["device"]) == (
        spec().name, "simt", "sm_90", P.key, "NVIDIA H200")  # fmt: skip


def test_runs_report_counts_and_end(store: Store) -> None:
    dev = store.device(H200)
    run = store.start_run(P, dev, "simt", "random", None, 10, None, {}, "codegen search --sampler random")
    add(store, dev, spec(), ok(2.0), run=run, n=0)
    add(store, dev, spec(1), failed("compile_error", "error: x"), run=run, n=1)
    (r,) = store.runs()
    assert (r["trials"], r["ok"], r["best_ms"], r["ended"]) == (2, 1, 2.0, None)
    store.end_run(run)
    (r,) = store.runs()
    assert r["ended"] is not None and r["sampler"] == "random" and r["problem"] == P.key


def test_best_picks_fastest_ok_trial_per_problem(store: Store) -> None:
    dev = store.device(H200)
    fast, slow, broken = spec(1), spec(), spec(2)
    add(store, dev, slow, ok(2.0))
    add(store, dev, fast, ok(1.0))
    add(store, dev, fast, ok(1.5))  # a slower re-measurement of the same kernel
    add(store, dev, broken, {**failed("wrong_result", "rel error 0.3"), "median_ms": 0.1})
    qs = SimtSpec(dtype=DType.bf16, bias=True)
    add(store, dev, qs, ok(0.2), problem=Q)
    best = store.best()
    assert [(b["problem"], b["kernel"], b["median_ms"]) for b in best] == [
        (P.key, fast.name, 1.0), (Q.key, qs.name, 0.2)]  # fmt: skip
    top = store.best(problem=P, per_problem=3)
    assert [(b["kernel"], b["rank"]) for b in top] == [(fast.name, 1), (slow.name, 2)]
    assert store.best(problem=P.key, device_id=dev, family="simt", limit=1)[0]["kernel"] == fast.name
    assert store.best(family="wmma") == [] and store.best(device_id=dev + 100) == []
    assert store.best_for(P)["kernel"] == fast.name and store.best_for(Q.key)["median_ms"] == 0.2
    other = store.device({**H200, "name": "NVIDIA H100"})
    add(store, other, slow, ok(0.9))
    assert store.best_for(P)["device_id"] == other and store.best_for(P, device_id=dev)["kernel"] == fast.name
    assert store.best_for(Problem(8, 8, 8)) is None


def test_known_result_answers_a_spec_seen_before(store: Store) -> None:
    dev = store.device(H200)
    bad = spec(1)
    assert store.known_result(P, dev, bad.name, H1) is None
    add(store, dev, bad, failed("launch_out_of_resources", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"))
    known = store.known_result(P, dev, bad.name, H1)
    assert known["status"] == "launch_out_of_resources"
    assert known["evidence"] == "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
    assert store.known_result(Q, dev, bad.name, H1) is None
    assert store.known_result(P, store.device({**H200, "name": "other"}), bad.name, H1) is None


def test_known_result_never_answers_for_changed_source(store: Store) -> None:
    dev = store.device(H200)
    s = spec()
    add(store, dev, s, ok(1.0), source_hash=H1)
    assert store.known_result(P, dev, s.name, H1)["median_ms"] == 1.0
    assert store.known_result(P, dev, s.name, H2) is None  # the template changed: measure again
    assert store.known_result(P, dev, s.name, "") is None
    add(store, dev, s, failed("invalid", "pad breaks alignment"), source_hash=None)  # never rendered
    assert store.known_result(P, dev, s.name, H1)["status"] == "ok"
    add(store, dev, s, ok(3.0), source_hash=H2)
    assert store.known_result(P, dev, s.name, H2)["median_ms"] == 3.0
    assert store.known_result(P, dev, s.name, H1)["median_ms"] == 1.0


def test_trial_filters(store: Store) -> None:
    dev = store.device(H200)
    add(store, dev, spec(), ok(1.0))
    add(store, dev, spec(1), failed("timeout", "no answer in 10 s"))
    add(store, dev, SimtSpec(dtype=DType.bf16, bias=True), ok(0.3), problem=Q)
    assert len(store.trials()) == 3
    assert [t["status"] for t in store.trials(status=["timeout"])] == ["timeout"]
    assert len(store.trials(status=("ok", "timeout"), problem=P)) == 2
    assert len(store.trials(problem=[P.key, Q.key], family="simt")) == 3
    pad = spec(1).pad
    assert [t["status"] for t in store.trials(params={"pad": str(pad)})] == ["timeout"]
    assert len(store.trials(params={"pad": pad - 1, "dtype": "fp32"})) == 1
    assert [t["status"] for t in store.trials(name_contains=f"_p{pad}_")] == ["timeout"]
    assert store.trials(name_contains="%") == []  # LIKE wildcards are literal text
    assert len(store.trials(limit=2)) == 2


def test_filter_values_never_become_sql(store: Store) -> None:
    dev = store.device(H200)
    add(store, dev, spec(), ok(1.0))
    hostile = "'; DROP TABLE gs_trials; --"
    assert store.trials(name_contains=hostile) == []
    assert store.trials(status=hostile) == [] and store.trials(family=[hostile]) == []
    assert store.trials(problem=hostile) == [] and store.trials(study=hostile) == []
    assert store.trials(params={"bm": hostile}) == []
    assert len(store.trials()) == 1


def test_count_trials_by_run_and_study(store: Store) -> None:
    dev = store.device(H200)
    a = store.start_run(P, dev, "simt", "tpe", 0, 3, "study-x", {}, "first")
    b = store.start_run(P, dev, "simt", "tpe", 0, 3, "study-x", {}, "resumed")
    add(store, dev, spec(), ok(1.0), run=a, n=0)
    add(store, dev, spec(3), failed("invalid", "warp tile does not divide block tile"), run=a, n=1)
    add(store, dev, spec(1), ok(2.0), run=b, n=2)
    add(store, dev, spec(), ok(3.0), run=None)  # a `codegen bench` measurement outside any search
    assert store.count_trials(a) == 2 and store.count_trials(b) == 1
    assert store.count_trials("study-x") == 3
    assert store.count_trials("study-x", evaluated_only=True) == 2
    assert store.count_trials("nope") == 0
    assert len(store.trials(study="study-x")) == 3


def test_optuna_study_lives_beside_the_results(store: Store) -> None:
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dev = store.device(H200)
    add(store, dev, spec(), ok(1.0))
    storage = optuna.storages.RDBStorage(store.optuna_url(), engine_kwargs=store.optuna_engine_kwargs())
    study = optuna.create_study(study_name="beside", storage=storage, load_if_exists=True)
    study.optimize(lambda t: t.suggest_int("bm", 16, 128), n_trials=2)
    assert len(optuna.load_study(study_name="beside", storage=store.optuna_url()).trials) == 2
    assert len(store.trials()) == 1
    add(store, dev, spec(1), ok(1.0))
    assert len(store.trials()) == 2
    optuna.delete_study(study_name="beside", storage=storage)
    storage.engine.dispose()
