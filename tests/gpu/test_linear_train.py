"""GPU tier of benchmarks/linear_train.py on small layers: eager and CUDA-graph timing both give
valid records (every output against float64, graph outputs poisoned with NaN before the checked
replay) and times. A few seconds on an H200."""

from __future__ import annotations

import pytest

from benchmarks import linear_train as lt
from codegen.nn.bundle import SeedKernels

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("timing", lt.TIMINGS)
@pytest.mark.parametrize("dtype,mode", [("fp32", "forward"), ("fp32", "train"), ("bf16", "train")])
def test_eager_and_graph_timing_give_valid_records(timing, dtype, mode):
    from codegen.nn import kernels_from

    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        case = lt.Case(40, dtype, mode, features=264)
        kernels = kernels_from(SeedKernels())
        ours, base, gemms, rel = lt.measure(case, kernels, reps=4, rounds=2, timing=timing)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    r = lt.record(case, ours, base, gemms, rel, "seeds", timing)
    assert r["timing"] == timing and r["ours"]["status"] == "ok", r["ours"]
    assert set(rel) >= ({"y"} if mode == "forward" else {"y", "dx", "dw", "db"})
    assert len(ours) == len(base) == 4 and all(t > 0 for t in ours + base)
    assert not any(v.startswith("torch") for v in gemms.values()), gemms
