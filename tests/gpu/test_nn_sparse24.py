"""GPU tier of the 2:4 layer (codegen.nn.semisparse.Sparse24Linear) on gemmscape's sparse24 kernels
(the family's built-in seeds, codegen.nn.bundle.SeedKernels): the forward against float64 of the
masked W on odd shapes (K not a multiple of 4 or 32, N not of 16), bf16 and fp16, with and without
bias, outputs allocated over NaN; the backward on torch (dX and the kept values' gradient); a captured
CUDA graph replays what eager calls give; autocast and no_grad; ``Kernels.used`` names the sparse24
kernel each time."""

from __future__ import annotations

import pytest

from codegen.nn.bundle import SeedKernels
from codegen.problem import DType

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
from codegen.nn.semisparse import Sparse24Linear  # noqa: E402

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _poison_allocator(*shapes, dtype):
    """NaN in blocks of the caching allocator, freed: outputs allocated next reuse NaN memory."""
    junk = [torch.full(s, float("nan"), dtype=dtype, device="cuda") for s in shapes]
    torch.cuda.synchronize()
    del junk


def _rel(got: torch.Tensor, want64: torch.Tensor) -> float:
    return float((got.detach().double() - want64).norm() / want64.norm())


def _sp24_ran(layer: Sparse24Linear, batch: int, dtype: str, bias: bool | None = None) -> str:
    """The kernel ``Kernels.used`` names for the layer's forward at ``batch`` rows, asserted a 2:4 one: the
    built-in seeds give a Hopper 2:4 kernel from SeedKernels.HOPPER_MIN_M rows on, a sparse24 one below."""
    got = layer.kernels.used(layer.problem(batch, DType(dtype), bias), torch.device("cuda", 0))
    prefix = "hsp24_" if batch >= SeedKernels.HOPPER_MIN_M else "sp24_"
    assert got is not None and got.startswith(prefix), got
    return got


def _layer(fin: int, fout: int, dtype: str, bias: bool = True, seed: int = 0) -> Sparse24Linear:
    torch.manual_seed(seed)
    dense = torch.nn.Linear(fin, fout, bias, device="cuda", dtype=TORCH[dtype])
    return Sparse24Linear.from_linear(dense, kernels=SeedKernels())


@pytest.mark.parametrize("dtype,batch,fin,fout,bias", [
    ("bf16", 37, 100, 130, True),   # K not a multiple of 32
    ("bf16", 67, 91, 45, False),    # K not a multiple of 4, N not of 16
    ("fp16", 40, 97, 264, True),
    ("fp16", 1, 64, 24, True),      # a decode row
    ("bf16", 300, 136, 264, True),
    ("bf16", 16, 2, 16, False),     # K smaller than a group of four
])
def test_forward_on_the_kernel_and_the_backward_against_float64(dtype, batch, fin, fout, bias):
    layer = _layer(fin, fout, dtype, bias)
    x = torch.randn(batch, fin, device="cuda", dtype=TORCH[dtype], requires_grad=True)
    dy = torch.randn(batch, fout, device="cuda", dtype=TORCH[dtype])
    w64 = layer.dense_weight().detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    b64 = layer.bias.detach().double().requires_grad_() if bias else None
    y64 = torch.nn.functional.linear(x64, w64, b64)
    y64.backward(dy.double())
    mask = layer.mask()
    tol = DType(dtype).rel_tol
    for _ in range(2):  # the second call reuses the loaded kernel
        _poison_allocator((batch, fout), dtype=TORCH[dtype])
        y = layer(x)
        params = [x, layer.values] + ([layer.bias] if bias else [])
        grads = torch.autograd.grad(y, params, dy)
        torch.cuda.synchronize()
        assert torch.isfinite(y).all() and _rel(y, y64.detach()) < tol
        assert _rel(grads[0], x64.grad) < tol
        dw = layer._dense(grads[1])
        assert _rel(dw, torch.where(mask, w64.grad, 0.0)) < tol and not dw[~mask].any()
        if bias:
            assert _rel(grads[2], b64.grad) < tol
    _sp24_ran(layer, batch, dtype)


def test_cuda_graph_replay_equals_eager():
    from codegen.nn.step import capture

    layer = _layer(97, 72, "bf16", seed=2)
    x = torch.randn(24, 97, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(24, 72, device="cuda", dtype=torch.bfloat16)

    def step():
        y = layer(x)
        return (y, *torch.autograd.grad(y, [x, layer.values, layer.bias], dy))

    graph, captured = capture(step)  # warmed up off the capture first: compiles and loads the kernel
    for seed in (3, 4):
        torch.manual_seed(seed)
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
            dy.copy_(torch.randn_like(dy))
        graph.replay()
        eager = step()
        torch.cuda.synchronize()
        for c, e in zip(captured, eager, strict=True):
            assert torch.equal(c, e)
    _sp24_ran(layer, 24, "bf16")


def test_no_grad_inference_graph():
    layer = _layer(4096 + 8, 200, "fp16", seed=6)
    x = torch.randn(16, 4096 + 8, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        layer(x)  # compiles the kernel off the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = layer(x)
    graph.replay()
    want = torch.nn.functional.linear(x.double(), layer.dense_weight().detach().double(), layer.bias.detach().double())
    torch.cuda.synchronize()
    assert not y.requires_grad and _rel(y, want) < DType.fp16.rel_tol
    _sp24_ran(layer, 16, "fp16")


def test_autocast_runs_the_kernel_in_the_autocast_dtype():
    torch.manual_seed(5)
    dense = torch.nn.Linear(88, 40, device="cuda")
    layer = Sparse24Linear.from_linear(dense, kernels=SeedKernels())
    x = torch.randn(19, 88, device="cuda", requires_grad=True)
    want = torch.nn.functional.linear(x.detach().double(), layer.dense_weight().detach().double(),
                                      layer.bias.detach().double())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        z = layer(x)
    assert z.dtype == torch.bfloat16 and _rel(z, want) < DType.bf16.rel_tol
    z.float().sum().backward()
    assert layer.values.grad.dtype == torch.float32 and torch.isfinite(layer.values.grad).all()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    _sp24_ran(layer, 19, "bf16")
    with torch.no_grad():  # an fp32 layer without autocast: torch, said once
        y = layer(x)
    assert _rel(y, want) < DType.fp32.rel_tol


def test_engine_timing_of_a_2_4_w_runs_the_sparse24_kernel():
    from codegen.nn.layer import Kernels
    from codegen.nn.timing import engine_timing
    from codegen.problem import Problem

    problem = Problem(16, 1032, 520, DType.bf16, sparsity="2:4", density=0.5)
    t = engine_timing(problem, Kernels(SeedKernels()), reps=4, rounds=2)
    assert t.ran.startswith("sp24_bf16_") and not t.wrong and len(t.ours) == len(t.torch) == 4
    assert t.engine["weight_bytes"] < t.engine["dense_weight_bytes"]
