"""GPU tier of the block-sparse layer (codegen.nn.sparse.BlockSparseLinear) on gemmscape's kernels
(the families' built-in seeds, codegen.nn.bundle.SeedKernels): the forward GEMM, dX (Wᵀ in BSR) and
dW sampled at the kept blocks against float64 on odd shapes with empty block rows, outputs allocated
over NaN; a captured CUDA graph replays what eager calls give; autocast, no_grad; a pruned model's
file loaded onto the kernels; fine-tuning under the pattern lowers the loss (examples/finetune_pruned.py)."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import sparse
from codegen.nn.bundle import SeedKernels
from codegen.problem import DType, Layout

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
from codegen.nn import sparse as nn_sparse  # noqa: E402
from codegen.nn.sparse import BlockSparseLinear  # noqa: E402

TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(autouse=True)
def _exact_fp32():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def pattern_of(out: int, fin: int, block: int, seed: int = 0) -> sparse.Pattern:
    """About half the blocks kept, the first block row empty, the padded corner block kept."""
    mask = np.random.default_rng(seed).random((-(-out // block), -(-fin // block))) < 0.5
    mask[0] = False
    mask[-1, -1] = True
    return sparse.Pattern.from_mask(mask, out, fin, block)


def _poison_allocator(*shapes, dtype):
    """NaN in blocks of the caching allocator, freed: outputs allocated next reuse NaN memory."""
    junk = [torch.full(s, float("nan"), dtype=dtype, device="cuda") for s in shapes]
    torch.cuda.synchronize()
    del junk


def _rel(got: torch.Tensor, want64: torch.Tensor) -> float:
    return float((got.double() - want64).norm() / want64.norm())


def _ran(layer: BlockSparseLinear, problem) -> bool:
    """Whether a gemmscape kernel ran ``problem`` (rather than torch)."""
    got = layer.kernels.used(problem, torch.device("cuda", 0))
    assert got is not None, f"{problem.key} was never asked for"
    return not got.startswith("torch: ")


@pytest.mark.parametrize("dtype,batch,fin,fout,block", [
    ("fp32", 37, 100, 130, 32),
    ("fp32", 67, 91, 45, 64),
    ("bf16", 67, 91, 45, 16),
    ("bf16", 33, 136, 264, 64),
    ("bf16", 300, 264, 136, 32),  # 300 rows: the Hopper family's forward seed
    ("fp16", 40, 96, 128, 32),
])
def test_forward_and_gradients_against_float64(dtype, batch, fin, fout, block):
    seeds = SeedKernels()
    torch.manual_seed(0)
    layer = BlockSparseLinear(fin, fout, pattern_of(fout, fin, block), device="cuda", dtype=TORCH[dtype], kernels=seeds)
    x = torch.randn(batch, fin, device="cuda", dtype=TORCH[dtype], requires_grad=True)
    dy = torch.randn(batch, fout, device="cuda", dtype=TORCH[dtype])
    w64 = layer.dense_weight().detach().double().requires_grad_()
    x64, b64 = (t.detach().double().requires_grad_() for t in (x, layer.bias))
    y64 = torch.nn.functional.linear(x64, w64, b64)
    y64.backward(dy.double())
    want_dw = nn_sparse.dense_to_blocks(w64.grad, layer.rows, layer.cols, block)
    tol = DType(dtype).rel_tol
    for _ in range(2):  # the second call reuses the loaded kernels
        _poison_allocator((batch, fout), (batch, fin), tuple(layer.blocks.shape), dtype=TORCH[dtype])
        y = layer(x)
        gx, gw, gb = torch.autograd.grad(y, [x, layer.blocks, layer.bias], dy)
        torch.cuda.synchronize()
        assert _rel(y, y64.detach()) < tol and _rel(gx, x64.grad) < tol
        assert _rel(gw, want_dw) < tol and _rel(gb, b64.grad) < tol
        assert torch.isfinite(gw).all()
    for layout, problem in layer.problems(batch).items():
        expected = not isinstance(seeds.spec_for(problem), str)
        assert _ran(layer, problem) == expected, layout
    assert _ran(layer, layer.problem(Layout.grad_weight, batch, DType(dtype)))


def test_zero_blocks_stay_zero_under_an_optimizer_on_the_kernels():
    torch.manual_seed(1)
    layer = BlockSparseLinear(100, 130, pattern_of(130, 100, 32), device="cuda", kernels=SeedKernels())
    mask = torch.from_numpy(np.kron(layer.pattern.mask(), np.ones((32, 32), dtype=bool))[:130, :100]).cuda()
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-2, weight_decay=0.1)
    x, target = torch.randn(64, 100, device="cuda"), torch.randn(64, 130, device="cuda")
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(layer(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    w = layer.dense_weight().detach()
    assert not w[~mask].any() and losses[-1] < losses[0]
    assert not layer.blocks.detach()[-1][130 - 128:].any() and not layer.blocks.detach()[-1][:, 100 - 96:].any()
    assert _ran(layer, layer.problem(Layout.grad_weight, 64, DType.fp32))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cuda_graph_replay_equals_eager(dtype):
    from codegen.nn.step import capture

    torch.manual_seed(2)
    layer = BlockSparseLinear(96, 72, pattern_of(72, 96, 16), device="cuda", dtype=TORCH[dtype],
                              kernels=SeedKernels())
    x = torch.randn(24, 96, device="cuda", dtype=TORCH[dtype], requires_grad=True)
    dy = torch.randn(24, 72, device="cuda", dtype=TORCH[dtype])

    def step():
        y = layer(x)
        return (y, *torch.autograd.grad(y, [x, layer.blocks, layer.bias], dy))

    graph, captured = capture(step)  # warmed up off the capture first: compiles and loads the kernels
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
    problems = layer.problems(24)
    assert _ran(layer, problems[Layout.forward]) and _ran(layer, problems[Layout.grad_weight])


def test_no_grad_and_autocast():
    torch.manual_seed(5)
    layer = BlockSparseLinear(88, 40, pattern_of(40, 88, 16), device="cuda", kernels=SeedKernels())
    x = torch.randn(19, 88, device="cuda")
    want = torch.nn.functional.linear(x.double(), layer.dense_weight().detach().double(), layer.bias.detach().double())
    with torch.no_grad():
        y = layer(x)
    assert not y.requires_grad and _rel(y, want) < DType.fp32.rel_tol
    xr = x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        z = layer(xr)
    assert z.dtype == torch.bfloat16 and _rel(z, want) < DType.bf16.rel_tol
    z.float().sum().backward()
    assert layer.blocks.grad.dtype == torch.float32 and torch.isfinite(layer.blocks.grad).all()
    assert _ran(layer, layer.problem(Layout.forward, 19, DType.bf16))
    assert _ran(layer, layer.problem(Layout.grad_weight, 19, DType.bf16))


def test_a_pruned_model_file_runs_on_the_kernels(tmp_path):
    from codegen.nn.pruned import prune_model, save_pruned
    from codegen.nn.sparse import load_pruned

    def build():
        torch.manual_seed(6)
        return torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.ReLU(), torch.nn.Linear(160, 64)).cuda()

    save_pruned(prune_model(build(), 0.5, 32), tmp_path / "p.safetensors")
    model = load_pruned(build(), tmp_path / "p.safetensors", kernels=SeedKernels())
    reference = load_pruned(build(), tmp_path / "p.safetensors")  # no kernels: torch
    x = torch.randn(45, 96, device="cuda")
    torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-4)
    assert _ran(model[0], model[0].problem(Layout.forward, 45, DType.fp32))


def test_fine_tuning_under_the_pattern_lowers_the_loss_on_the_kernels():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "finetune_pruned.py"
    spec = importlib.util.spec_from_file_location("finetune_pruned", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # blocks of 32: the built-in seeds hold an fp32 dW kernel for them (for blocks of 16 it runs on torch)
    report = example.main(["--device", "cuda", "--steps", "60", "--block", "32", "--kernels", "seeds"])
    assert report["pattern_kept"] and report["kept_blocks_learned"]
    assert report["final_loss"] < 0.8 * report["pruned_loss"], report
    # three GEMMs of each of the three pruned layers, but the first layer's dX (its input needs no grad)
    assert report["gemms_asked"] == 8 and report["kernels_ran"] == 8, report
