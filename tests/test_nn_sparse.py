"""CPU tier of the block-sparse layer (codegen.nn.sparse.BlockSparseLinear): torch runs every GEMM
here (no GPU; logged once per problem), computing Y = X·Wᵀ + b, dX and dW at the kept blocks from
the BSR blocks; pruning, the state dict, conversions, autocast and no_grad; and the kernel path's
plumbing with a stand-in for the compiled kernels (which BSR array each kernel argument gets, Wᵀ's
blocks in their BSR order, dW at the kept blocks). The GPU tier runs the kernels:
tests/gpu/test_nn_sparse.py."""

from __future__ import annotations

import copy
import io
import logging

import numpy as np
import pytest

from codegen import sparse
from codegen.nn.bundle import SeedKernels
from codegen.problem import Layout

torch = pytest.importorskip("torch")
from codegen.nn import sparse as nn_sparse  # noqa: E402  (after torch: the layer needs it)
from codegen.nn.sparse import BlockSparseLinear  # noqa: E402

F = torch.nn.functional


def ragged_pattern(out: int, fin: int, block: int, seed: int = 0) -> sparse.Pattern:
    """About half of W's blocks kept, the first block row empty, the padded corner block kept."""
    mask = np.random.default_rng(seed).random((-(-out // block), -(-fin // block))) < 0.5
    mask[0] = False
    mask[-1, -1] = True
    return sparse.Pattern.from_mask(mask, out, fin, block)


def layer(out=70, fin=45, block=16, bias=True, dtype=torch.float32, seed=0, kernels=None) -> BlockSparseLinear:
    torch.manual_seed(seed)
    return BlockSparseLinear(fin, out, ragged_pattern(out, fin, block, seed), bias, dtype=dtype, kernels=kernels)


def float64_reference(lay: BlockSparseLinear, x: torch.Tensor, grad_y: torch.Tensor):
    """Y, dX, dW (dense, [out, in]) and db in float64 from the layer's dense W."""
    w = lay.dense_weight().detach().double().requires_grad_()
    b = lay.bias.detach().double().requires_grad_() if lay.bias is not None else None
    x64 = x.detach().double().requires_grad_()
    y = F.linear(x64, w, b)
    y.backward(grad_y.double())
    return y.detach(), x64.grad, w.grad, (b.grad if b is not None else None)


def kept_mask(lay: BlockSparseLinear) -> torch.Tensor:
    """W's elements inside a kept block, [out, in]."""
    b = lay.block
    return torch.from_numpy(np.kron(lay.pattern.mask(), np.ones((b, b), dtype=bool))[: lay.out_features, : lay.in_features])


# ---- the layer on torch --------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_gradients_match_float64_and_dw_is_sampled_at_the_kept_blocks(bias):
    lay = layer(bias=bias)
    x = torch.randn(2, 3, 45, requires_grad=True)
    y = lay(x)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    ref_y, ref_dx, ref_dw, ref_db = float64_reference(lay, x.reshape(6, 45), grad_y.reshape(6, 70))
    assert y.shape == (2, 3, 70)
    torch.testing.assert_close(y.reshape(6, 70).double(), ref_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.reshape(6, 45).double(), ref_dx, rtol=1e-5, atol=1e-5)
    dense_grad = nn_sparse.blocks_to_dense(lay.blocks.grad, lay.rows, lay.cols, (70, 45), 16).double()
    torch.testing.assert_close(dense_grad, torch.where(kept_mask(lay), ref_dw, 0.0), rtol=1e-5, atol=1e-5)
    assert lay.blocks.grad.shape == (lay.pattern.nnzb, 16, 16)
    assert not lay.blocks.grad[-1, 70 - 64:].any() and not lay.blocks.grad[-1, :, 45 - 32:].any()  # the padding
    if bias:
        torch.testing.assert_close(lay.bias.grad.double(), ref_db, rtol=1e-5, atol=1e-5)


def test_zero_blocks_stay_zero_and_kept_blocks_learn_under_an_optimizer():
    lay = layer()
    before_w, mask = lay.dense_weight().detach().clone(), kept_mask(lay)
    padding = lay.blocks.detach()[-1].clone()
    opt = torch.optim.AdamW(lay.parameters(), lr=1e-2, weight_decay=0.1)
    x, target = torch.randn(32, 45), torch.randn(32, 70)
    for _ in range(3):
        opt.zero_grad()
        F.mse_loss(lay(x), target).backward()
        opt.step()
    after = lay.dense_weight().detach()
    assert not after[~mask].any() and (after[mask] != before_w[mask]).all()
    assert not lay.blocks.detach()[-1][70 - 64:].any() and not lay.blocks.detach()[-1][:, 45 - 32:].any()
    assert padding[70 - 64:].abs().sum() == 0
    assert np.array_equal(lay.indptr.numpy(), lay.pattern.indptr)


def test_no_grad_autocast_and_an_empty_batch():
    lay = layer()
    x = torch.randn(5, 45)
    with torch.no_grad():
        y = lay(x)
    assert not y.requires_grad
    torch.testing.assert_close(y, F.linear(x, lay.dense_weight().detach(), lay.bias.detach()))
    xr = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = lay(xr)
    assert z.dtype == torch.bfloat16
    z.float().sum().backward()
    assert lay.blocks.grad.dtype == torch.float32 and xr.grad.dtype == torch.float32
    torch.testing.assert_close(z.float(), y, rtol=3e-2, atol=3e-2)
    assert lay(torch.randn(0, 45)).shape == (0, 70)


def test_a_gemm_without_kernels_is_logged_once(caplog):
    lay = layer()
    with caplog.at_level(logging.WARNING, logger="gemmscape.nn"):
        for _ in range(3):
            lay(torch.randn(4, 45, requires_grad=True)).sum().backward()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all("runs torch's op instead: the tensors are on cpu" in line for line in lines)
    assert {k[0].split("_")[2] for k in lay.kernels.fallbacks} == {"forward", "grad"}
    assert any("_grad_weight_bias_bsr16_" in k[0] for k in lay.kernels.fallbacks)


# ---- pruning, the state dict, conversions ----------------------------------------------------------------
def test_from_linear_keeps_the_largest_blocks_and_to_dense_gives_them_back():
    torch.manual_seed(1)
    dense = torch.nn.Linear(100, 130)
    with torch.no_grad():
        dense.weight[:32, 32:64] *= 10  # the block every pruning keeps
    lay = BlockSparseLinear.from_linear(dense, density=0.25, block=32)
    pattern, kept = sparse.prune_blocks(dense.weight.detach().numpy(), 32, 0.25)
    assert lay.pattern_hash == pattern.hash and lay.pattern.mask()[0, 1]
    np.testing.assert_array_equal(lay.blocks.detach().numpy(), kept)
    assert lay.bias is dense.bias  # shared, as codegen.nn.Linear.from_linear shares
    back = lay.to_dense()
    assert isinstance(back, torch.nn.Linear) and back.weight.shape == (130, 100)
    w = dense.weight.detach()
    torch.testing.assert_close(back.weight.detach(), torch.where(kept_mask(lay), w, 0.0))
    x = torch.randn(3, 100)
    torch.testing.assert_close(back(x), lay(x))
    with pytest.raises(ValueError, match="meta device"):
        BlockSparseLinear.from_linear(torch.nn.Linear(64, 64, device="meta"), 0.5, 16)
    with pytest.raises(ValueError, match="density"):
        BlockSparseLinear.from_linear(dense, 1.5, 32)


def test_the_state_dict_round_trips_with_its_pattern():
    lay = layer(out=130, fin=100, block=32)
    state = lay.state_dict()
    assert set(state) == {"blocks", "bias", "indptr", "indices", "_extra_state"}
    assert state["_extra_state"] == {"pattern": lay.pattern_hash, "block": 32, "shape": [130, 100]}
    other = layer(out=130, fin=100, block=32, seed=0)
    with torch.no_grad():
        other.blocks.zero_()
    other.load_state_dict(state)
    assert torch.equal(other.blocks, lay.blocks) and other.pattern_hash == lay.pattern_hash
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    other.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(other.blocks, lay.blocks)
    wrong = dict(state, _extra_state={**state["_extra_state"], "pattern": "0" * 16})
    with pytest.raises(ValueError, match="names pattern 0000000000000000"):
        other.load_state_dict(wrong)
    whole = io.BytesIO()
    torch.save(lay, whole)  # the module itself: no compiled kernel travels with it
    whole.seek(0)
    loaded = torch.load(whole, weights_only=False)
    x = torch.randn(2, 100)
    torch.testing.assert_close(loaded(x), lay(x))
    torch.testing.assert_close(copy.deepcopy(lay)(x), lay(x))


def test_a_pattern_of_another_shape_is_refused():
    with pytest.raises(ValueError, match="the pattern is of a 64x64 W; the layer's W is 70x45"):
        BlockSparseLinear(45, 70, sparse.Pattern.random(64, 64, 16, 0.5))


# ---- the kernel path, with a stand-in for the compiled kernels ----------------------------------------------
class StandIn:
    """What a compiled kernel of ``problem`` computes, from the arrays a call passes by role: BSR ones
    read back through codegen.sparse (so a wrong permutation or index array shows)."""

    def __init__(self, problem, arg_names, calls) -> None:
        self.problem, self.arg_names, self.calls = problem, frozenset(arg_names), calls

    def __call__(self, t, stream=None):
        p = self.problem
        self.calls.append((p.layout, sorted(k for k, v in t.items() if v is not None)))
        out_, in_ = p.w_shape
        if p.layout is Layout.forward:
            w = sparse.Pattern(out_, in_, p.block, t["indptr"].numpy(), t["indices"].numpy()).expand(
                t["weight"].detach().double().numpy())
            t["y"].copy_(F.linear(t["x"].double(), torch.from_numpy(w), t["bias"].double() if t["bias"] is not None
                                  else None))
        elif p.layout is Layout.grad_input:  # Wᵀ's blocks, or W's own read through BI (t_order) in place
            blocks_t = (t["weight_t"] if "WT" in self.arg_names else
                        t["weight"][t["t_order"].long()].transpose(1, 2))
            wt = sparse.Pattern(in_, out_, p.block, t["t_indptr"].numpy(), t["t_indices"].numpy()).expand(
                blocks_t.detach().double().numpy())
            t["grad_x"].copy_(t["grad_y"].double() @ torch.from_numpy(wt).t())
        else:
            pattern = sparse.Pattern(out_, in_, p.block, t["indptr"].numpy(), t["indices"].numpy())
            t["grad_weight"].copy_(torch.from_numpy(pattern.gather((t["grad_y"].double().t() @ t["x"].double()).numpy())))
            if t["grad_bias"] is not None:
                t["grad_bias"].copy_(t["grad_y"].sum(0))
        return None


@pytest.mark.parametrize(("with_db", "in_place"), [(True, False), (False, False), (False, True)])
def test_the_kernel_path_passes_the_bsr_arrays_by_role(monkeypatch, with_db, in_place):
    """grad_input's kernel gets Wᵀ's blocks (WT) only where it takes them; one that reads W's blocks in place
    (BI) gets them and the order, and no transposed copy is made."""
    calls, problems = [], []

    class Source:
        def kernel(self, problem, device):
            problems.append(problem)
            names = {"DB"} if with_db and problem.layout is Layout.grad_weight else set()
            if problem.layout is Layout.grad_input:
                names = {"W", "BI"} if in_place else {"WT"}
            return StandIn(problem, names, calls)

    lay = layer(out=130, fin=100, block=32, seed=4)
    monkeypatch.setattr(lay.kernels, "kernel", Source().kernel)
    x = torch.randn(37, 100, requires_grad=True)
    y = lay(x)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    ref_y, ref_dx, ref_dw, ref_db = float64_reference(lay, x, grad_y)
    torch.testing.assert_close(y.double(), ref_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), ref_dx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lay.blocks.grad.double(),
                               nn_sparse.dense_to_blocks(ref_dw, lay.rows, lay.cols, 32), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lay.bias.grad.double(), ref_db, rtol=1e-5, atol=1e-5)
    assert [(p.layout, p.m, p.n, p.k, p.bias) for p in problems] == [
        (Layout.forward, 37, 130, 100, True), (Layout.grad_input, 37, 100, 130, False),
        (Layout.grad_weight, 130, 100, 37, True)]
    assert {p.pattern for p in problems} == {lay.pattern_hash} and problems[2].nnzb == lay.pattern.nnzb
    roles = dict(calls)
    assert roles[Layout.forward] == ["bias", "indices", "indptr", "weight", "x", "y"]
    assert roles[Layout.grad_input] == ["grad_x", "grad_y", "t_indices", "t_indptr", "t_order", "weight"] + (
        [] if in_place else ["weight_t"])
    assert roles[Layout.grad_weight] == (["grad_bias"] if with_db else []) + ["grad_weight", "grad_y", "indices",
                                                                             "indptr", "x"]
    lay(x)  # resolved once per batch: no second lookup
    assert len(problems) == 3


def test_compiled_kernels_point_each_bsr_argument_at_its_tensor(monkeypatch):
    """The compiled kernel's launch steps (codegen.nn.layer) with the BSR arguments by role: a call's
    pointers land in the slots the manifest's argument names say (no GPU: the launch is recorded)."""
    from types import SimpleNamespace

    from codegen.nn.layer import _Compiled

    lay = layer(out=130, fin=100, block=32, dtype=torch.bfloat16)
    seeds = SeedKernels(arch="sm_90")
    tensors = {"y": torch.empty(8, 130, dtype=torch.bfloat16), "x": torch.empty(8, 100, dtype=torch.bfloat16),
               "weight": lay.blocks.detach(), "bias": lay.bias.detach(), "indptr": lay.indptr,
               "indices": lay.indices, "grad_x": torch.empty(8, 100), "grad_y": torch.empty(8, 130),
               "weight_t": lay.blocks.detach().clone(), "t_indptr": lay.t_indptr, "t_indices": lay.t_indices,
               "grad_weight": torch.empty_like(lay.blocks), "grad_bias": torch.empty(130)}
    for layout, bias in ((Layout.forward, True), (Layout.grad_input, False), (Layout.grad_weight, True)):
        problem = lay.problem(layout, 8, "bf16", bias)
        found = seeds.find(problem, "NVIDIA H200")
        compiled = _Compiled.__new__(_Compiled)
        compiled.manifest, compiled.problem, compiled.device, compiled.sms = found.manifest, problem, torch.device(
            "cuda", 0), 132
        compiled.functions = [f"function {i}" for i in range(len(found.manifest["kernels"]))]
        compiled.counters, compiled.maps = None, {}
        compiled.prepare()
        launched = []
        compiled.cuda = SimpleNamespace(launch_prepared=lambda func, *rest, into=launched: into.append(func))
        compiled._launch(tensors, None, "stream")
        assert launched == compiled.functions
        for step, kernel in zip(compiled.steps, found.manifest["kernels"], strict=True):
            names = [a["name"] for a in kernel["args"]]
            for i, role in step.pointers:
                want = {"RP": {"forward": "indptr", "grad_input": "t_indptr", "grad_weight": "indptr"},
                        "CI": {"forward": "indices", "grad_input": "t_indices", "grad_weight": "indices"},
                        "WT": {"grad_input": "weight_t"}}.get(names[i], {}).get(layout.value)
                if want:
                    assert role == want and step.args[i].value == tensors[want].data_ptr(), (names[i], role)
        assert {"RP", "CI"} <= compiled.arg_names


def test_a_kernel_cublas_beat_is_left_to_torch_unless_ours_everywhere(monkeypatch):
    """The layer's kernels follow codegen.nn's verdicts: cuBLAS won, torch runs (said once); no verdict,
    ours runs and is listed as unjudged; ours_everywhere runs ours regardless."""
    from types import SimpleNamespace

    from codegen.nn import layer as nn_layer
    from codegen.nn.layer import Kernels

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(nn_layer, "_Compiled", lambda found, problem, device: ("compiled", found.manifest))
    lay = layer(out=130, fin=100, block=32)
    problem = lay.problem(Layout.forward, 8, "fp32")
    cuda = torch.device("cuda", 0)

    def source(winner):
        verdict = None if winner is None else SimpleNamespace(
            winner=winner, note="", reason=lambda: "torch: cuBLAS won (ratio 0.8 at margin 0.02, timing cold_single)")
        return SimpleNamespace(find=lambda p, device: SimpleNamespace(manifest={"name": "k"}, origin="a bundle",
                                                                      verdict=verdict))

    kernels = Kernels(source("cublas"))
    assert kernels.kernel(problem, cuda) is None
    assert "cuBLAS won" in kernels.fallbacks[(problem.key, str(cuda))]
    everywhere = Kernels(source("cublas"), ours_everywhere=True)
    assert everywhere.kernel(problem, cuda)[0] == "compiled"
    unjudged = Kernels(source(None))
    assert unjudged.kernel(problem, cuda)[0] == "compiled"
    assert unjudged.unjudged == {(problem.key, str(cuda)): "a bundle holds no verdict"}
    assert Kernels(source("ours")).kernel(problem, cuda)[0] == "compiled"
