"""GPU tier of a pruned layer timed and run as a pruned model runs: engine timing of a block-sparse forward
(BlockSparseLinear copies on the families' seeds, checked against float64, against F.linear on each
copy's dense W); a forward whose verdict says dense cuBLAS won runs torch on a dense W kept between
calls, also inside a captured CUDA graph; and benchmarks.sparse_model's decode step (transformers'
static KV cache, rewound each step) captured and replayed as it runs eagerly, on a tiny LLaMA, also on
the stand-in model without GEMMs that times the non-GEMM part."""

from __future__ import annotations

import dataclasses

import pytest

from codegen import sparse
from codegen.nn import verdict as V
from codegen.nn.bundle import SeedKernels
from codegen.problem import DType

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _problem(m=16, n=1024, k=2048, density=0.25):
    return sparse.problem_for(m, sparse.Pattern.random(n, k, 64, density, seed=5), DType.bf16)


def test_engine_timing_runs_the_block_sparse_kernel_over_copies_past_l2():
    from codegen.nn.layer import kernels_from
    from codegen.nn.timing import L2_FACTOR, engine_timing

    problem = _problem()
    got = engine_timing(problem, kernels_from(SeedKernels()), reps=12, rounds=6)
    assert not got.ran.startswith("torch"), got.ran
    assert got.rel_error <= DType.bf16.rel_tol
    e = got.engine
    assert e["weight_bytes"] == problem.nnzb * 64 * 64 * 2 + 4 * problem.nnzb
    assert e["copies"] * e["weight_bytes"] >= min(L2_FACTOR * e["l2_bytes"], 64 * e["weight_bytes"])
    assert len(got.ours) == len(got.torch) == 12 and min(got.ours + got.torch) > 0


def test_where_dense_cublas_won_the_layer_keeps_its_dense_w_also_in_a_graph():
    from codegen.nn.layer import Kernels
    from codegen.nn.sparse import BlockSparseLinear
    from codegen.nn.step import Pinned, capture

    problem = _problem(m=8)
    file = SeedKernels().find(problem, torch.cuda.get_device_name())
    lost = dataclasses.replace(file, verdict=V.judge(1.0, 0.5, "engine", problem))
    pattern = sparse.lookup(problem)
    layer = BlockSparseLinear(pattern.k, pattern.n, pattern, bias=False, dtype=torch.bfloat16, device="cuda",
                              kernels=Kernels(Pinned({problem.key: lost})))
    x = torch.randn(8, pattern.k, device="cuda", dtype=torch.bfloat16)
    exact = x.double() @ layer.dense_weight().detach().double().T
    with torch.no_grad():
        graph, y = capture(lambda: layer(x))
    assert layer.kernels.used(problem, x.device).startswith("torch: cuBLAS won")
    kept = layer._kept["w"][1]
    graph.replay()
    torch.cuda.synchronize()
    assert float((y.double() - exact).norm() / exact.norm()) <= DType.bf16.rel_tol
    assert layer._kept["w"][1] is kept  # made once, in the warm-up before the capture


def test_the_decode_step_replays_in_a_graph_as_it_runs_eagerly():
    pytest.importorskip("transformers")
    from benchmarks import sparse_phases as ph
    from benchmarks.model import build, config_dict

    model = build(config_dict(1, 128, tiny=True), seed=0, device="cuda")
    cuda = torch.device("cuda")
    step = ph.decode_call(model, 2, 8, 128, cuda, seed=1)  # as the benchmark does: one step, eager then captured
    want = step().clone()
    assert torch.equal(step(), want)  # the cache is rewound: a second call writes the same slot
    replay, out, why = ph.graphed(step, cuda=True)
    assert why is None, why
    for _ in range(3):  # every replay writes the same cache slot: the same hidden states each time
        replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)


def test_the_decode_step_without_gemms_replays_in_a_graph():
    pytest.importorskip("transformers")
    from benchmarks import sparse_phases as ph
    from benchmarks.model import build, config_dict

    cuda = torch.device("cuda")
    stub, stubs = ph.no_gemm_model(build(config_dict(1, 128, tiny=True), seed=0, device="cpu"), cuda)
    step = ph.decode_call(stub, 2, 8, 128, cuda, seed=1)
    want = step().clone()
    replay, out, why = ph.graphed(step, cuda=True)
    assert why is None, why
    replay()
    torch.cuda.synchronize()
    assert out.shape == want.shape == (2, 1, 64) and torch.equal(out, want)
    assert len(stubs) == 7 and all(s.calls >= 3 for s in stubs.values())
