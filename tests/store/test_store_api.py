"""Store round-trips, get-or-create, best, known_result, filters and run bookkeeping."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import pytest

from codegen.families.simt import Spec as SimtSpec
from codegen.problem import DType, Problem
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
    assert row | {"id": 0} == {**Q.to_dict(), "key": Q.key, "density": 1.0, "block": None, "id": 0}
    assert [d["name"] for d in store.devices()] == ["NVIDIA H200", "NVIDIA H200"]


def test_problem_keeps_density_and_block_when_given(store: Store) -> None:
    @dataclass(frozen=True)
    class Sparse(Problem):
        density: float = 1.0
        block: int | None = None

        @property
        def key(self) -> str:
            return f"{super().key}_d{self.density}_b{self.block}"

    store.problem(Sparse(128, 128, 128, density=0.25, block=32))
    (row,) = store.problems()
    assert (row["density"], row["block"]) == (0.25, 32)


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
