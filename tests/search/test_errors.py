"""A bug is not a kernel failure: gemmscape's own exceptions stop a search (never stored as a
status), a run of identical failures stops it with a message, and statuses say what happened."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import os
import pickle
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import pytest

from codegen.evaluate import STATUSES, Evaluator, InternalError, blank_result
from search.measure import Done, GpuMeasurer, ReplayMeasurer
from search.runner import failure_signature, run_search
from store import Store

RECORDING = Path(__file__).resolve().parents[2] / "search" / "recordings" / "replay-simt-4096x4096x4096-fp32.json"


class Scripted(ReplayMeasurer):
    """The recording, except that measurements go as ``script(n, spec)`` says (n counts from 0)."""

    def __init__(self, script) -> None:
        super().__init__(RECORDING)
        self.script, self.n = script, 0

    def next_done(self) -> Done:
        done = super().next_done()
        answer = self.script(self.n, done.spec)
        self.n += 1
        if answer is not None:
            done.result = blank_result(*answer)
        return done


def search(measurer, tmp_path: Path, **kw):
    store = Store(f"sqlite:///{tmp_path / 'e.db'}")
    kw.setdefault("budget", 40)
    return store, lambda: run_search(measurer.problem, measurer.space, measurer, sampler="random", seed=1,
                                     store=store, progress=False, **kw)


def test_an_exception_in_our_code_stops_the_search_and_is_not_stored(tmp_path: Path) -> None:
    def script(n, spec):
        if n == 3:
            raise KeyError("plan")  # as a bug in plan() or the harness would
        return None

    store, go = search(Scripted(script), tmp_path)
    with pytest.raises(InternalError, match="KeyError.*a bug, not a kernel's failure"):
        go()
    statuses = [r["status"] for r in store.trials() if r["status"] != "invalid"]
    assert statuses == ["ok"] * 3  # the fourth kernel has no trial: nothing was stored for the bug
    (run,) = store.runs()
    assert run["ended"] is not None and store.run_state(run["id"])["outcome"] == "failed"
    assert store.used_budget(run["study_name"]) == 3  # its claim was dropped


def test_a_store_failure_stops_the_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, go = search(ReplayMeasurer(RECORDING), tmp_path)
    calls = {"n": 0}
    real = store.add_trial

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("disk full")
        return real(*a, **kw)

    monkeypatch.setattr(store, "add_trial", flaky)
    with pytest.raises(InternalError, match="disk full"):
        go()


def test_identical_failures_in_a_row_stop_the_search_with_a_message(tmp_path: Path) -> None:
    crash = ("worker_crash", "worker exited with code 1 after 0.{n} s")
    store, go = search(Scripted(lambda n, spec: (crash[0], crash[1].format(n=n))), tmp_path)
    summary = go()
    assert summary.evaluated_now == 10 and summary.failures == {"worker_crash": 10}
    assert summary.stopped.startswith("stopped after 10 identical failures in a row (worker_crash")
    assert "run the same command again" in summary.stopped
    (run,) = store.runs()
    assert store.run_state(run["id"])["outcome"] == "stopped"


def test_varied_failures_do_not_stop_the_search(tmp_path: Path) -> None:
    kinds = [("compile_error", "error: a"), ("timeout", "no answer"), ("wrong_result", "rel error 3")]
    _, go = search(Scripted(lambda n, spec: kinds[n % 3] if n % 4 else None), tmp_path, budget=30)
    summary = go()
    assert summary.evaluated_now == 30 and summary.stopped == "budget reached"


def test_failure_signature_ignores_numbers_and_kernel_names() -> None:
    a = failure_signature("compile_error", "simt_fp32_a.cu(12): error: x", "simt_fp32_a")
    b = failure_signature("compile_error", "simt_fp32_b.cu(40): error: x", "simt_fp32_b")
    assert a == b and a != failure_signature("compile_error", "other", "k")


# ---- the GPU measurer's compile side (no GPU: the pool and the evaluator are stand-ins) --------
@dataclass
class _Spec:
    name: str = "simt_fp32_x"
    family: str = "simt"

    def to_dict(self) -> dict:
        return {"family": self.family}


def _measurer_with(future: cf.Future) -> GpuMeasurer:
    m = object.__new__(GpuMeasurer)
    m.pool = cf.ThreadPoolExecutor(1)
    m.workers = 1
    m.pending = collections.deque([("tag", _Spec(), future, time.monotonic())])
    m.compile_timeout_s = 60.0
    m.gpu_wait_seconds = m.compile_seconds = 0.0
    m.evaluator = Evaluator()
    m.arch = "sm_90"
    m.problem = None
    m._new_pool = lambda: cf.ThreadPoolExecutor(1)
    return m


def test_a_build_that_raises_is_our_bug() -> None:
    f = cf.Future()
    f.set_exception(TypeError("template_values() got an unexpected keyword"))
    with pytest.raises(InternalError, match="gemmscape's own code"):
        _measurer_with(f).next_done()


def test_a_dead_compiler_process_is_the_kernels_compile_error() -> None:
    f = cf.Future()
    f.set_exception(BrokenProcessPool("a process in the pool was terminated abruptly"))
    done = _measurer_with(f).next_done()
    assert done.result["status"] == "compile_error" and "compiler process died" in done.result["evidence"]


# ---- worker and evaluator: a bug is reported as one ----------------------------------------------
class _Err:
    def __init__(self, name: str) -> None:
        self.name = name


def test_worker_replies_say_what_happened() -> None:
    from codegen.cuda import CudaError
    from codegen.engine import Failure
    from codegen.worker import reply_for

    assert reply_for(Failure("wrong_result", "rel 1e-2"))["status"] == "wrong_result"
    sticky = reply_for(CudaError("cuCtxSynchronize", _Err("CUDA_ERROR_ILLEGAL_ADDRESS")))
    assert sticky["status"] == "context_lost" and sticky["restart"] and "bug" not in sticky
    bug = reply_for(KeyError("probe_plan"))
    assert bug["bug"] and "KeyError" in bug["bug"]
    pickle.dumps(bug)  # it crosses the pipe


def test_launch_errors_are_classified_by_their_code() -> None:
    from codegen.cuda import CudaError
    from codegen.engine import Failure, launch_failure

    def status(code: str, stage: str = "launch"):
        got = launch_failure(CudaError("cuLaunchKernel", _Err(code)), stage, "k", 0)
        return got.status if isinstance(got, Failure) else type(got).__name__

    assert status("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES") == "launch_out_of_resources"
    assert status("CUDA_ERROR_INVALID_VALUE", "function") == "launch_out_of_resources"  # smem over the opt-in
    assert status("CUDA_ERROR_INVALID_VALUE") == "runtime_error"  # a refused launch, not resources
    assert status("CUDA_ERROR_ILLEGAL_ADDRESS") == "runtime_error"
    assert status("CUDA_ERROR_NOT_FOUND", "function") == "RuntimeError"  # the plan named no such symbol: ours


def test_a_module_that_will_not_load_is_not_a_compile_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from codegen import engine
    from codegen.cuda import CudaError

    def refuse(cubin):
        raise CudaError("cuModuleLoadData", _Err("CUDA_ERROR_NO_BINARY_FOR_GPU"))

    monkeypatch.setattr(engine, "Module", refuse)
    with pytest.raises(engine.Failure) as caught:
        object.__new__(engine.Engine).evaluate({"problem": {"m": 1, "n": 1, "k": 1}, "cubin": b""})
    assert caught.value.status == "load_error" and "load_error" in STATUSES


class _Worker:
    starts = 1
    info = {"name": "fake", "sm": "sm_90", "max_smem_optin": 232448}

    def __init__(self, reply: dict) -> None:
        self.reply = reply

    def ensure(self) -> None:
        pass

    def request(self, msg: dict, timeout: float) -> dict:
        return {"baselines": {}} if msg["op"] == "prepare" else self.reply


def test_the_evaluator_raises_when_the_worker_reports_a_bug() -> None:
    from codegen.evaluate import Built
    from codegen.families.simt import Spec
    from codegen.problem import Problem

    problem = Problem(64, 64, 64)
    built = Built(Spec(), failure=None)
    built.compiled = type("C", (), {"cubin": b""})()
    ev = Evaluator()
    ev.worker = _Worker({"status": "worker_crash", "evidence": "x", "bug": "Traceback ... KeyError"})
    with pytest.raises(InternalError, match="KeyError"):
        ev.run(built, problem)
    ev.worker = _Worker({"status": "timeout", "evidence": "no answer"})
    assert ev.run(built, problem)["status"] == "timeout"


def test_a_running_search_beats_its_heartbeat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from store import coord

    monkeypatch.setattr(coord, "HEARTBEAT_S", 0.05)
    beats = []
    store, go = search(Scripted(lambda n, spec: time.sleep(0.02)), tmp_path, budget=15)
    real = store.heartbeat
    monkeypatch.setattr(store, "heartbeat", lambda run_id: (beats.append(run_id), real(run_id)))
    summary = go()
    assert len(beats) >= 3 and set(beats) == {summary.run_id}
    state = store.run_state(summary.run_id)
    assert state["outcome"] == "finished" and state["pid"] == os.getpid()
