"""CPU tier of the 2:4 layer (codegen.nn.semisparse.Sparse24Linear): torch runs the forward here (no
GPU; logged once), computing X·W_maskedᵀ + b from the kept halves; dX and the gradient of the kept
values; the pattern kept through optimizer steps; pruning, the state dict, conversions, autocast and
no_grad; the kernel path's plumbing with a stand-in for the compiled kernel (which tensor WC and WE
get); the built-in seeds of a 2:4 problem; ``codegen prune --pattern 2:4`` and ``load_pruned``. The
GPU tier runs the kernels: tests/gpu/test_nn_sparse24.py."""

from __future__ import annotations

import copy
import io
import json
import logging

import numpy as np
import pytest

from codegen import cli, sparse24
from codegen.nn.bundle import SeedKernels
from codegen.problem import DType, Problem

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
from codegen.nn import semisparse  # noqa: E402  (after torch: the layer needs it)
from codegen.nn.layer import OPERANDS, Kernels, replace_linear  # noqa: E402
from codegen.nn.pruned import PruneError, load_pruned, prune_model  # noqa: E402
from codegen.nn.semisparse import Sparse24Linear  # noqa: E402

nn = torch.nn


def dense(out=21, fin=37, bias=True, dtype=torch.float64, seed=0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(fin, out, bias, dtype=dtype)


def masked64(layer: nn.Linear) -> torch.Tensor:
    """The 2:4 magnitude-pruned W of ``layer`` in float64 (codegen.sparse24.prune24)."""
    return torch.from_numpy(sparse24.prune24(layer.weight.detach().double().numpy()))


def test_from_linear_keeps_two_of_four_by_magnitude_and_to_dense_goes_back():
    lin = dense()
    layer = Sparse24Linear.from_linear(lin)
    want = masked64(lin)
    assert torch.equal(layer.dense_weight().detach(), want)
    assert layer.values.shape == (21, sparse24.padded_k(37) // 2) and layer.metadata.dtype == torch.int32
    assert layer.metadata.shape == (2, 2, 16) and layer.bias is lin.bias  # the bias is shared
    mask = layer.mask()
    assert torch.equal(mask, want != 0)
    groups = torch.nn.functional.pad(mask, (0, 3)).reshape(21, -1, 4)[:, : -(-37 // 4)]
    assert int(groups.sum(2).max()) == 2
    back = layer.to_dense()
    assert isinstance(back, nn.Linear) and torch.equal(back.weight, want) and torch.equal(back.bias, lin.bias)
    assert back.weight.data_ptr() != lin.weight.data_ptr()


@pytest.mark.parametrize("fin", [37, 38, 39, 64, 3, 1])
def test_magnitude_positions_on_torch_are_the_host_mask24s(fin):
    rng = np.random.default_rng(fin)
    w = rng.integers(-2, 3, size=(19, fin)).astype(np.float32)  # many equal magnitudes and zeros: ties go low
    want = sparse24.compress(w, sparse24.mask24(w)).positions
    np.testing.assert_array_equal(semisparse.magnitude_positions(torch.from_numpy(w)), want)
    layer = Sparse24Linear.from_dense(torch.from_numpy(w))
    assert torch.equal(layer.dense_weight().detach(), torch.from_numpy(sparse24.prune24(w)))
    own = Sparse24Linear.from_dense(torch.from_numpy(w), mask=sparse24.mask24(w))  # the host path, a mask given
    assert torch.equal(own.metadata, layer.metadata) and torch.equal(own.values, layer.values)
    with pytest.raises(ValueError, match="NaN or infinite"):
        semisparse.magnitude_positions(torch.full((2, fin), float("nan")))


@pytest.mark.parametrize("fin", [37, 64, 3])
def test_forward_on_torch_equals_float64_of_the_masked_w(fin, caplog):
    lin = dense(fin=fin)
    kernels = Kernels(SeedKernels())
    layer = Sparse24Linear.from_linear(lin, kernels=kernels)
    x = torch.randn(2, 5, fin, dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger="gemmscape.nn"):
        y = layer(x)
        layer(x)
    want = x @ masked64(lin).T + lin.bias.detach()
    assert y.shape == (2, 5, 21) and torch.allclose(y, want, rtol=1e-12, atol=1e-12)
    said = [r for r in caplog.records if "runs torch's op instead" in r.getMessage()]
    assert len(said) == 1 and "float64" in said[0].getMessage()  # once, with the reason


def test_bf16_on_cpu_is_asked_of_the_kernels_and_falls_back_once():
    lin = dense(dtype=torch.float32)
    kernels = Kernels(SeedKernels())
    layer = Sparse24Linear.from_linear(lin.to(torch.bfloat16), kernels=kernels)
    x = torch.randn(6, 37, dtype=torch.bfloat16)
    with torch.no_grad():
        y = layer(x)
    problem = Problem(6, 21, 37, DType.bf16, bias=True, sparsity="2:4")
    assert layer.problem(6, "bf16") == problem
    assert kernels.used(problem, "cpu") == "torch: the tensors are on cpu; gemmscape kernels run on CUDA GPUs"
    want = x.double() @ layer.dense_weight().detach().double().T + layer.bias.detach().double()
    assert y.dtype == torch.bfloat16 and float((y.double() - want).norm() / want.norm()) < 1e-2


def test_grads_are_dx_on_the_masked_w_and_dw_at_the_kept_positions():
    lin = dense()
    layer = Sparse24Linear.from_linear(lin)
    x = torch.randn(9, 37, dtype=torch.float64, requires_grad=True)
    grad_y = torch.randn(9, 21, dtype=torch.float64)
    layer(x).backward(grad_y)
    w = masked64(lin)
    assert torch.allclose(x.grad, grad_y @ w, rtol=1e-12, atol=1e-12)
    full = grad_y.T @ x.detach()  # dW of the dense layer
    got = semisparse.Sparse24Linear.from_dense(w)  # the same pattern, to scatter the values' gradient with
    scattered = got._dense(layer.values.grad)
    mask = layer.mask()
    assert torch.allclose(scattered, torch.where(mask, full, 0.0), rtol=1e-12, atol=1e-12)
    assert torch.allclose(layer.bias.grad, grad_y.sum(0))


@pytest.mark.parametrize("make", [lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
                                  lambda p: torch.optim.AdamW(p, lr=0.05)])
def test_an_optimizer_step_keeps_the_pattern(make):
    layer = Sparse24Linear.from_linear(dense(fin=38))
    before = layer.mask().clone()
    opt = make(layer.parameters())
    for _ in range(3):
        opt.zero_grad()
        layer(torch.randn(7, 38, dtype=torch.float64)).square().sum().backward()
        opt.step()
    w = layer.dense_weight().detach()
    assert torch.equal(layer.mask(), before) and bool((w[~before] == 0).all()) and bool((w[before] != 0).any())


def test_state_dict_round_trips_and_is_checked_on_load():
    layer = Sparse24Linear.from_linear(dense(fin=45))
    buf = io.BytesIO()
    torch.save(layer.state_dict(), buf)
    state = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert set(state) == {"values", "bias", "metadata", "_extra_state"}
    fresh = Sparse24Linear(45, 21, dtype=torch.float64)
    assert not torch.equal(fresh.mask(), layer.mask())  # a new layer keeps positions 0 and 1
    fresh.load_state_dict(state)
    assert torch.equal(fresh.dense_weight(), layer.dense_weight()) and torch.equal(fresh.mask(), layer.mask())
    x = torch.randn(4, 45, dtype=torch.float64)
    assert torch.equal(fresh(x), layer(x))
    other = Sparse24Linear(45, 22, dtype=torch.float64)
    with pytest.raises(ValueError, match="this layer's W is 2:4 of shape \\[22, 45\\]"):
        other.load_state_dict(state)
    bad = dict(state, _extra_state={"sparsity": "2:4", "shape": [21, 44]})
    with pytest.raises(ValueError, match="of shape \\[21, 44\\]"):
        Sparse24Linear(45, 21, dtype=torch.float64).load_state_dict(bad)
    broken = dict(state, metadata=torch.zeros_like(state["metadata"]))  # every group at positions 0 and 0
    with pytest.raises(ValueError, match="two distinct ascending positions"):
        Sparse24Linear(45, 21, dtype=torch.float64).load_state_dict(broken)


def test_no_grad_autocast_copies_and_pickles():
    layer = Sparse24Linear.from_linear(dense(dtype=torch.float32))
    x = torch.randn(3, 37)
    with torch.no_grad():
        y = layer(x)
    assert y.grad_fn is None and torch.allclose(y, x @ layer.dense_weight().detach().T + layer.bias.detach(), atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = layer(x)
    assert z.dtype == torch.bfloat16 and torch.allclose(z.float(), y, rtol=5e-2, atol=5e-2)
    twin = copy.deepcopy(layer)
    assert torch.equal(twin(x), layer(x)) and twin.metadata.data_ptr() != layer.metadata.data_ptr()
    buf = io.BytesIO()
    torch.save(layer, buf)
    again = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert torch.equal(again(x), layer(x))


class _Stand:
    """A compiled kernel's stand-in: records the tensors by role, computes Y with torch from WC and WE."""

    arg_names = frozenset(("Y", "X", "WC", "B", "WS", "WE", "M", "N", "K"))

    def __init__(self, layer: Sparse24Linear) -> None:
        self.layer, self.calls = layer, []

    def __call__(self, tensors):
        self.calls.append(tensors)
        values, words = tensors["values"], tensors["metadata"].numpy().view(np.uint32)
        positions = sparse24.positions_from_m16n8k32(words, self.layer.out_features)
        c = sparse24.Compressed(values.detach().numpy(), positions, self.layer.in_features)
        w = torch.from_numpy(sparse24.decompress(c))
        y = tensors["x"] @ w.T + (tensors["bias"] if tensors["bias"] is not None else 0)
        tensors["y"].copy_(y)


def test_the_kernel_path_passes_the_kept_halves_and_metadata_by_name(monkeypatch):
    assert OPERANDS[Problem(1, 1, 1).layout]["WC"] == "values" and OPERANDS[Problem(1, 1, 1).layout]["WE"] == "metadata"
    lin = dense(fin=70, dtype=torch.float32)
    layer = Sparse24Linear.from_linear(lin.to(torch.float16), kernels=Kernels(SeedKernels()))
    stand = _Stand(layer)
    asked = []
    monkeypatch.setattr(layer.kernels, "kernel", lambda problem, device: asked.append(problem) or stand)
    layer.values.data = layer.values.data.float()  # the stand-in computes in fp32; the problem is still asked as fp16
    monkeypatch.setattr(semisparse, "DTYPES", {torch.float32: DType.fp16})
    x = torch.randn(5, 70, requires_grad=True)
    y = layer(x)
    assert asked == [Problem(5, 21, 70, DType.fp16, bias=True, sparsity="2:4")] and len(stand.calls) == 1
    got = stand.calls[0]
    assert got["values"].data_ptr() == layer.values.data_ptr() and got["metadata"] is layer.metadata
    assert torch.allclose(y, x.detach() @ layer.dense_weight().detach().T + layer.bias.detach(), atol=1e-5)
    y.sum().backward()  # the backward on torch: the gradient of the values lands on the kept positions
    assert x.grad.shape == x.shape and layer.values.grad.shape == layer.values.shape


def test_the_built_in_seeds_of_a_2_4_problem_are_sparse24_kernels():
    problem = Problem(130, 264, 136, DType.bf16, bias=True, sparsity="2:4")
    spec = SeedKernels().spec_for(problem)
    assert spec.family == "sparse24" and spec.name.startswith("sp24_bf16_bias_")
    found = SeedKernels().find(problem, "NVIDIA H100 80GB HBM3")
    assert [a["name"] for a in found.manifest["kernels"][0]["args"]] == ["Y", "X", "WC", "B", "WS", "WE", "M", "N", "K"]


def test_the_seeds_of_a_large_2_4_layer_are_hopper_sp24_on_sm_90_and_a_skinny_long_k_layer_splits_k():
    big = Problem(2048, 4096, 4096, DType.bf16, sparsity="2:4")
    assert SeedKernels(arch="sm_90").spec_for(big).family == "hopper_sp24"
    assert SeedKernels(arch="sm_80").spec_for(big).family == "sparse24"
    # 4096x14336 at M = 16: the unsplit 16-row seed launches 64 blocks, fewer than the card's SMs
    down, up = (Problem(16, n, k, DType.bf16, sparsity="2:4") for n, k in ((4096, 14336), (14336, 4096)))
    assert SeedKernels().spec_for(down).split_k > 1
    assert SeedKernels().spec_for(up).split_k == 1  # 224 blocks unsplit: no second pass


def test_replace_linear_moves_a_2_4_layer_onto_the_kernels():
    model = nn.Sequential(Sparse24Linear.from_linear(dense()), nn.ReLU(), dense(out=5, fin=21))
    kernels = Kernels(SeedKernels())
    replace_linear(model, kernels)
    assert model[0].kernels is kernels and model[2].kernels is kernels


MODEL = """
import torch

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.ReLU(), torch.nn.Linear(160, 70),
                               torch.nn.ReLU(), torch.nn.Linear(70, 10))
"""


def _run(argv, capsys):
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def test_prune_pattern_2_4_writes_and_load_pruned_restores(tmp_path, capsys):
    model_file = tmp_path / "model.py"
    model_file.write_text(MODEL)
    out = tmp_path / "p.safetensors"
    code, stdout, err = _run(["prune", f"{model_file}:mlp", "--pattern", "2:4", "--layers", "^[02]$", "--out", out],
                             capsys)
    assert code == 0, err
    assert "pruned 2 linear layers" in stdout and "0: W 160x96, two of every four along K kept (2:4)" in err
    from safetensors import safe_open

    with safe_open(str(out), framework="pt") as f:
        meta, names = f.metadata(), set(f.keys())
    assert names == {"0.values", "0.metadata", "0.bias", "2.values", "2.metadata", "2.bias", "4.weight", "4.bias"}
    assert json.loads(meta["gemmscape.pruned"]) == {
        "0": {"sparsity": "2:4", "shape": [160, 96], "density": 0.5, "bias": True},
        "2": {"sparsity": "2:4", "shape": [70, 160], "density": 0.5, "bias": True}}
    from codegen.nn.pruned import load_model_weights, read_patterns

    assert {name: (p, info["dtype"], info["shape"]) for name, (p, info) in read_patterns(out).items()} == {
        "0": ("2:4", "fp32", [160, 96]), "2": ("2:4", "fp32", [70, 160])}  # what tune-model --pruned lists
    reference = load_model_weights(f"{model_file}:mlp")
    model = load_pruned(load_model_weights(f"{model_file}:mlp"), out)
    assert isinstance(model[0], Sparse24Linear) and isinstance(model[2], Sparse24Linear)
    for i in (0, 2):
        want = torch.from_numpy(sparse24.prune24(reference[i].weight.detach().numpy()))
        assert torch.equal(model[i].dense_weight().detach(), want)
    x = torch.randn(3, 96)
    pruned = prune_model(reference, None, None, "^[02]$", pattern="2:4")
    assert torch.equal(model(x), pruned(x))


@pytest.mark.parametrize("args,needle", [
    (["--pattern", "2:4", "--density", "0.5"], "--pattern 2:4 keeps half of each W by itself: drop --density and --block"),
    (["--pattern", "2:4", "--block", "16"], "drop --density and --block"),
    (["--density", "0.5"], "needs both --density and --block (or --pattern 2:4)"),
    ([], "needs both --density and --block"),
    (["--pattern", "1:4"], "argument --pattern: invalid choice"),
])
def test_prune_pattern_misuse_is_one_line_exit_2(tmp_path, capsys, args, needle):
    model_file = tmp_path / "model.py"
    model_file.write_text(MODEL)
    out = tmp_path / "p.safetensors"
    code, _, err = _run(["prune", f"{model_file}:mlp", *args, "--out", out], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_prune_model_refuses_mixed_arguments():
    with pytest.raises(PruneError, match="drop --density and --block"):
        prune_model(nn.Linear(8, 8), 0.5, None, pattern="2:4")
    with pytest.raises(PruneError, match="not '4:8'"):
        prune_model(nn.Linear(8, 8), None, None, pattern="4:8")
    assert isinstance(prune_model(nn.Linear(8, 8), None, None, pattern="2:4"), Sparse24Linear)


def test_where_cublas_won_inference_keeps_the_dense_w_until_the_values_change(monkeypatch):
    layer = Sparse24Linear.from_linear(dense(fin=40, dtype=torch.float32).to(torch.bfloat16),
                                       kernels=Kernels(SeedKernels()))
    monkeypatch.setattr(layer.kernels, "kernel", lambda problem, device: None)
    monkeypatch.setattr(layer.kernels, "used", lambda problem, device: "torch: cuBLAS won (ratio 0.8)")
    x = torch.randn(4, 40, dtype=torch.bfloat16)
    with torch.no_grad():
        first = layer(x)
        kept = layer._kept["w"][1]
        assert torch.equal(layer(x), first) and layer._kept["w"][1] is kept  # made once
        layer.values.mul_(2)  # an in-place update: made anew
        again = layer(x)
    assert layer._kept["w"][1] is not kept and torch.equal(layer._kept["w"][1], layer.dense_weight().detach())
    assert torch.allclose(again.float(), (x.float() @ layer.dense_weight().detach().float().T
                                          + layer.bias.detach().float()), rtol=2e-2, atol=2e-2)
    y = layer(x.requires_grad_())  # with autograd: the dense W made for the call, nothing kept anew
    assert y.grad_fn is not None
