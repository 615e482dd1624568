"""CPU tier: ``codegen prune`` (a model's linear layers pruned to block-sparse W, written as
safetensors with each layer's pattern), its usage errors (one line, exit 2, nothing written), and
``load_pruned`` putting the file back into the model."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from codegen import cli, sparse

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")
from codegen.nn.pruned import PruneError, load_model_weights, prune_model, save_pruned  # noqa: E402
from codegen.nn.sparse import BlockSparseLinear, load_pruned  # noqa: E402

MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(96, 160), nn.ReLU(), nn.Linear(160, 70), nn.ReLU(), nn.Linear(70, 10))

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 32)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.c(self.b(self.a(x)))

    def tied():
        torch.manual_seed(1)
        return Tied()

    not_a_model = 3
""")


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    return path


def run(argv, capsys):
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as stop:  # the parser's own errors
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def fresh(model_file, name="mlp"):
    return load_model_weights(f"{model_file}:{name}")


def test_prune_writes_the_weights_and_each_layer_s_pattern(model_file, tmp_path, capsys):
    out = tmp_path / "pruned.safetensors"
    code, stdout, err = run(["prune", f"{model_file}:mlp", "--density", "0.5", "--block", "16", "--layers", "^[02]$",
                             "--out", out], capsys)
    assert code == 0, err
    assert "pruned 2 linear layers" in stdout and "0: W 160x96, 30 of 60 blocks of 16 kept" in err
    from safetensors import safe_open

    with safe_open(str(out), framework="pt") as f:
        meta, names = f.metadata(), set(f.keys())
        tensors = {k: f.get_tensor(k) for k in names}
    assert names == {"0.blocks", "0.bias", "0.indptr", "0.indices", "2.blocks", "2.bias", "2.indptr", "2.indices",
                     "4.weight", "4.bias"}
    layers = json.loads(meta["gemmscape.pruned"])
    assert meta["format"] == "gemmscape-pruned/1" and set(layers) == {"0", "2"}
    dense = fresh(model_file)
    for name, layer in (("0", dense[0]), ("2", dense[2])):
        pattern, kept = sparse.prune_blocks(layer.weight.detach().numpy(), 16, 0.5)
        assert layers[name] == {"block": 16, "shape": [layer.out_features, layer.in_features],
                                "density": pattern.density, "nnzb": pattern.nnzb, "pattern": pattern.hash, "bias": True}
        assert tensors[f"{name}.indptr"].dtype == torch.int32
        np.testing.assert_array_equal(tensors[f"{name}.indptr"].numpy(), pattern.indptr)
        np.testing.assert_array_equal(tensors[f"{name}.indices"].numpy(), pattern.indices)
        np.testing.assert_array_equal(tensors[f"{name}.blocks"].numpy(), kept)
    assert torch.equal(tensors["4.weight"], dense[4].weight.detach())
    import os

    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # as any file written, not the temporary file's 0o600


def test_load_pruned_puts_the_file_back_into_the_model(model_file, tmp_path, capsys):
    out = tmp_path / "pruned.safetensors"
    assert run(["prune", f"{model_file}:mlp", "--density", "0.25", "--block", "32", "--layers", "^0$|^2$", "--out", out],
               capsys)[0] == 0
    expected = prune_model(fresh(model_file), 0.25, 32, "^0$|^2$")
    x = torch.randn(5, 96)
    model = load_pruned(fresh(model_file), out)
    assert isinstance(model[0], BlockSparseLinear) and isinstance(model[4], torch.nn.Linear)
    assert model[0].pattern_hash == expected[0].pattern_hash and model[0].kernels is model[2].kernels
    torch.testing.assert_close(model(x), expected(x))
    with torch.device("meta"):  # a model built for its shapes only takes the file's values
        shapes_only = fresh(model_file)
    torch.testing.assert_close(load_pruned(shapes_only, out)(x), expected(x))
    other = torch.nn.Sequential(torch.nn.Linear(96, 161))
    with pytest.raises(PruneError, match="prunes layer 0 of W 160x96, which the model does not have"):
        load_pruned(other, out)
    plain = tmp_path / "plain.safetensors"
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(plain))
    with pytest.raises(PruneError, match="not a pruned model written by `codegen prune`"):
        load_pruned(fresh(model_file), plain)


def test_a_saved_module_and_tied_weights(model_file, tmp_path, capsys):
    saved = tmp_path / "model.pt"
    torch.save(fresh(model_file), saved)
    out = tmp_path / "p.safetensors"
    assert run(["prune", saved, "--density", "1", "--block", "32", "--layers", "^0$", "--out", out], capsys)[0] == 0
    tied = tmp_path / "tied.safetensors"  # one weight in two layers: each name gets its own copy
    code, _, err = run(["prune", f"{model_file}:tied", "--density", "0.5", "--block", "16", "--layers", "^c$",
                        "--out", tied], capsys)
    assert code == 0, err
    model = load_pruned(fresh(model_file, "tied"), tied)
    assert isinstance(model.c, BlockSparseLinear) and isinstance(model.b, torch.nn.Linear)
    torch.testing.assert_close(model.b.weight, fresh(model_file, "tied").a.weight)
    x = torch.randn(3, 64)
    torch.testing.assert_close(model(x), prune_model(fresh(model_file, "tied"), 0.5, 16, "^c$")(x))


@pytest.mark.parametrize("args,needle", [
    (["--density", "0"], "argument --density: must lie in (0, 1]"),
    (["--density", "1.5"], "argument --density: must lie in (0, 1]"),
    (["--density", "x"], "argument --density: 'x' is not a number"),
    (["--block", "48"], "argument --block: invalid choice: 48"),
    (["--block", "16", "--layers", "."], "a block of 16 does not fit layer 4, whose W is 10x70"),
    (["--block", "64", "--layers", "^2$"], None),  # W 70x160: fits
    (["--block", "128"], "argument --block: invalid choice: 128"),
    (["--layers", "attention"], "--layers 'attention' matches no nn.Linear layer of the model (its layers: 0, 2, 4)"),
    (["--layers", "("], "--layers '(' is not a regular expression"),
])
def test_misuse_is_one_line_exit_2_and_writes_nothing(model_file, tmp_path, capsys, args, needle):
    out = tmp_path / "p.safetensors"
    base = {"--density": "0.5", "--block": "16"}
    given = dict(zip(args[::2], args[1::2], strict=True))
    argv = ["prune", f"{model_file}:mlp", *(x for k, v in {**base, **given}.items() for x in (k, v)), "--out", out]
    code, _, err = run(argv, capsys)
    if needle is None:
        assert code == 0 and out.exists()
        return
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists() and not list(tmp_path.glob(".p.safetensors.*"))


@pytest.mark.parametrize("model,needle", [
    ("{dir}/missing.py:mlp", "no file"),
    ("{file}:nothing", "has no nothing"),
    ("{file}:not_a_model", "gives a int, not a torch.nn.Module"),
    ("{file}", "name the factory"),
])
def test_a_model_that_cannot_be_read(model_file, tmp_path, capsys, model, needle):
    out = tmp_path / "p.safetensors"
    target = model.format(dir=tmp_path, file=model_file)
    code, _, err = run(["prune", target, "--density", "0.5", "--block", "16", "--out", out], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_out_must_be_a_file_that_can_be_written(model_file, tmp_path, capsys):
    code, _, err = run(["prune", f"{model_file}:mlp", "--density", "0.5", "--block", "16", "--layers", "^0$",
                        "--out", tmp_path], capsys)
    assert code == 2 and "is a folder, not a file" in err


def test_prune_model_refuses_before_replacing_anything(model_file):
    model = fresh(model_file)
    with pytest.raises(PruneError, match="does not fit layer 4"):
        prune_model(model, 0.5, 16)
    assert not any(isinstance(m, BlockSparseLinear) for m in model.modules())
    single = prune_model(torch.nn.Linear(64, 32), 0.5, 16)  # a model that is one layer comes back replaced
    assert isinstance(single, BlockSparseLinear)


def test_save_pruned_leaves_nothing_on_error(tmp_path, monkeypatch):
    import safetensors.torch as st

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(st, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save_pruned(prune_model(torch.nn.Linear(64, 32), 0.5, 16), tmp_path / "x.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_prune_is_a_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "prune" in capsys.readouterr().out
