"""One study over several GPUs in one process: one measurer (worker) per GPU, here replays that
take a while per kernel, as GPU workers do."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from codegen.evaluate import InternalError
from search.measure import ReplayMeasurer
from search.parallel import ParallelMeasurer, gpu_ordinals
from search.runner import run_search
from store import Store

RECORDING = Path(__file__).resolve().parents[2] / "search" / "recordings" / "replay-simt-4096x4096x4096-fp32.json"


class SlowReplay(ReplayMeasurer):
    def __init__(self, delay: float = 0.03, fail_at: int | None = None) -> None:
        super().__init__(RECORDING)
        self.delay, self.fail_at, self.n = delay, fail_at, 0
        self.closed = False

    def next_done(self):
        time.sleep(self.delay)
        self.n += 1
        if self.n == self.fail_at:
            raise KeyError("a bug in the harness")
        return super().next_done()

    def close(self) -> None:
        self.closed = True


def test_one_study_runs_one_worker_per_gpu(tmp_path: Path) -> None:
    gpus = [SlowReplay() for _ in range(3)]
    m = ParallelMeasurer(gpus)
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        summary = run_search(m.problem, gpus[0].space, m, sampler="random", seed=2, budget=30, store=store,
                             progress=False)
    finally:
        m.close()
    assert summary.evaluated == 30 and summary.stopped == "budget reached"
    assert all(n > 0 for n in m.measured_by) and sum(m.measured_by) == 30, m.measured_by
    names = [r["kernel"] for r in store.trials() if r["status"] != "invalid"]
    assert len(names) == len(set(names)) == 30
    workers = m.worker_report()  # which worker (on which GPU) measured each kernel: `codegen search --json`'s "workers"
    assert workers["gpus"] == [0, 1, 2] and workers["measured"] == m.measured_by
    assert set(workers["kernels"]) >= set(names)
    assert [sum(w == i for w in workers["kernels"].values()) for i in range(3)] == m.measured_by
    assert all(g.closed for g in gpus)


def test_a_failing_gpu_worker_stops_the_search_with_the_error(tmp_path: Path) -> None:
    gpus = [SlowReplay(), SlowReplay(fail_at=3)]
    m = ParallelMeasurer(gpus)
    try:
        with pytest.raises(InternalError, match="KeyError"):
            run_search(m.problem, gpus[0].space, m, sampler="random", seed=2, budget=30, progress=False)
    finally:
        m.close()


def test_one_study_is_one_gpu_model() -> None:
    a, b = SlowReplay(), SlowReplay()
    b.device = dict(b.device, name="NVIDIA A100")
    with pytest.raises(ValueError, match="one GPU model"):
        ParallelMeasurer([a, b])


def test_gpu_ordinals() -> None:
    listing = "GPU 0: NVIDIA H200 (UUID: a)\nGPU 1: NVIDIA H200 (UUID: b)\n"
    assert gpu_ordinals("all", listing) == [0, 1]
    assert gpu_ordinals("0,2") == [0, 2] and gpu_ordinals("1") == [1]
    for bad in ("", "x", "0,0", "-1"):
        with pytest.raises(ValueError, match="--gpus"):
            gpu_ordinals(bad)
    with pytest.raises(ValueError, match="lists no GPU"):
        gpu_ordinals("all", "")
