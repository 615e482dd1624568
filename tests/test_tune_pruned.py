"""CPU tier: a pruned model's GEMMs tuned and bundled per pattern. ``codegen tune-model MODEL --pruned
FILE`` (run_tuning REPLACED: what would be tuned) lists each pruned layer's three block-sparse GEMMs
on the file's pattern and the other layers' dense ones; ``tune`` searches the block-sparse problems in
the families that generate them (run_search REPLACED, a stand-in measurer); a bundle written from a
store holding kernels for two layers of one shape and two patterns gives each ``BlockSparseLinear``
its own three kernels, with verdicts against dense cuBLAS (the compiled kernel REPLACED: no GPU);
and where dense cuBLAS won an inference forward the layer keeps its dense W between calls."""

from __future__ import annotations

import textwrap

import pytest

from codegen import cli
from codegen.problem import DType, Layout

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
from codegen.nn import verdict as V  # noqa: E402
from codegen.nn.bundle import Bundle, SeedKernels, write_bundle  # noqa: E402
from codegen.nn.pruned import load_model_weights, prune_model, pruned_layers, read_patterns, save_pruned  # noqa: E402
from codegen.nn.sparse import BlockSparseLinear, load_pruned  # noqa: E402
from codegen.nn.tune import LayerShape, SparseShape, layer_problems, linear_layers, load_model  # noqa: E402

MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 128, bias=False), nn.ReLU(), nn.Linear(64, 128, bias=False), nn.ReLU(),
                             nn.Linear(128, 32)).to(torch.bfloat16)

    def other():
        return nn.Sequential(nn.Linear(64, 96))
""")
DEVICE = "NVIDIA H200"


@pytest.fixture
def pruned(tmp_path):
    """The model file and its layers 0 and 2 (two W of 128x64, each its own pattern) pruned to blocks
    of 16 at density 0.5, as `codegen prune` writes them."""
    (tmp_path / "model.py").write_text(MODEL)
    target = f"{tmp_path / 'model.py'}:mlp"
    model = prune_model(load_model_weights(target), 0.5, 16, layers=r"^(0|2)$")
    save_pruned(model, tmp_path / "p.safetensors")
    return target, tmp_path / "p.safetensors"


def run(argv, capsys):
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def tuned(monkeypatch):
    """cli's run_tuning REPLACED by a recorder, and no GPU asked for."""
    from codegen import worker
    from codegen.cli import layer as cli_layer

    seen = []
    monkeypatch.setattr(cli_layer, "run_tuning", lambda args, problems: seen.append(problems) or 0)
    monkeypatch.setattr(worker, "require_gpu", lambda: None)
    return seen


# ---- what tune-model tunes ---------------------------------------------------------------------------------
def test_tune_model_pruned_tunes_each_pattern_s_three_gemms_and_the_rest_dense(pruned, tuned, capsys):
    target, file = pruned
    code, _, err = run(["tune-model", target, "--pruned", file, "--batch", "8", "16"], capsys)
    assert code == 0, err
    assert "3 linear layers (2 with a block-sparse W), 6 distinct shapes at batches 8, 16" in err
    problems = tuned[-1]
    patterns = {name: p.hash for name, (p, _) in read_patterns(file).items()}
    assert len(set(patterns.values())) == 2
    sparse_ = [p for p in problems if p.sparse]
    dense = [p for p in problems if not p.sparse]
    assert len(sparse_) == 2 * 2 * 3 and len(dense) == 2 * 3
    assert {p.pattern for p in sparse_} == set(patterns.values())
    assert all(p.block == 16 and p.density == 0.5 and p.dtype is DType.bf16 for p in sparse_)
    assert {(p.m, p.n, p.k) for p in dense if p.layout is Layout.forward} == {(8, 32, 128), (16, 32, 128)}
    # the keys a BlockSparseLinear loaded from the file looks its kernels up by
    model = load_pruned(load_model(target), file)
    for name, layer in pruned_layers(model).items():
        for batch in (8, 16):
            for problem in layer.problems(batch).values():
                assert problem in problems and problems[problem] == [name]


def test_layers_narrows_and_layout_picks_the_gemms(pruned, tuned, capsys):
    target, file = pruned
    code, _, err = run(["tune-model", target, "--pruned", file, "--batch", "1", "--layers", "^0$",
                        "--layout", "forward"], capsys)
    assert code == 0, err
    [problem] = tuned[-1]
    assert problem.sparse and problem.layout is Layout.forward and problem.m == 1
    assert problem.pattern == read_patterns(file)["0"][0].hash
    assert "1 linear layer (1 with a block-sparse W), 1 distinct shape at batch 1" in err


def test_a_model_already_holding_block_sparse_layers_is_tuned_on_their_patterns(pruned):
    target, file = pruned
    model = load_pruned(load_model(target), file)
    shapes = linear_layers(model, 4)
    kinds = sorted((type(s).__name__, tuple(names)) for s, names in shapes.items())
    assert kinds == [("LayerShape", ("4",)), ("SparseShape", ("0",)), ("SparseShape", ("2",))]
    [s0] = [s for s, names in shapes.items() if names == ["0"]]
    assert s0.pattern == model[0].pattern_hash and s0.describe().endswith(f"pattern {s0.pattern[:8]}")
    assert set(layer_problems({s0: ["0"]})) == set(model[0].problems(4).values())


@pytest.mark.parametrize("extra,needle", [
    (["--pruned", "missing.safetensors"], "no such file"),
    (["--pruned", "NOT_PRUNED"], "is not a pruned model written by `codegen prune`"),
    (["--layers", "nothing_matches"], "matches no linear layer"),
    (["--layers", "("], "is not a regular expression"),
])
def test_misuse_is_one_line_exit_2(pruned, tuned, capsys, tmp_path, extra, needle):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2, 2)}, str(tmp_path / "plain.safetensors"))
    target, _ = pruned
    extra = [str(tmp_path / "plain.safetensors") if a == "NOT_PRUNED" else a for a in extra]
    code, _, err = run(["tune-model", target, "--batch", "8", *extra], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and not tuned


def test_a_pruned_file_of_another_model_is_refused(pruned, tuned, capsys):
    target, file = pruned
    code, _, err = run(["tune-model", target.replace(":mlp", ":other"), "--pruned", file, "--batch", "8"], capsys)
    assert code == 2 and "does not have as a linear layer of that shape" in err and not tuned


# ---- tuning the block-sparse problems -------------------------------------------------------------------------
def test_tune_searches_each_block_sparse_gemm_in_the_families_that_generate_it(pruned, monkeypatch):
    from codegen.nn.tune import tune
    from codegen.spec import DeviceLimits
    from search import runner
    from search.fit import generated
    from search.space import space_for

    target, file = pruned
    [shape] = [s for s in linear_layers(load_model(target), 8, pruned=read_patterns(file), layers="^0$")]
    problems = layer_problems({shape: ["0"]})
    searched = []

    class Summary:
        best, stopped = {"kernel": "k", "tflops": 1.0, "ratio": {}}, "budget reached"

    monkeypatch.setattr(runner, "run_search", lambda problem, space, measurer, **kw: searched.append(
        (problem, space.family)) or Summary())

    class Measurer:
        limits = DeviceLimits.for_arch(90)

        def __init__(self, problem):
            self.problem = problem

        def switch(self, problem):
            self.problem = problem

        def close(self):
            pass

    lines = []
    results = tune(problems, None, Measurer, budget=2, progress=False, say=lines.append)
    assert {p for p, _ in searched} == set(problems)
    by_layout = {layout: {f for p, f in searched if p.layout is layout} for layout in Layout}
    assert by_layout[Layout.forward] >= {"tensorcore", "direct"}
    assert by_layout[Layout.grad_input] == by_layout[Layout.grad_weight] == {"tensorcore"}  # Hopper: blocks of 64
    for r in results:  # a family skipped says why, and really generates nothing for the GEMM
        if r.skipped:
            space = space_for(r.family, r.problem.dtype, block=r.problem.block, layout=r.problem.layout)
            assert r.problem.layout is not Layout.forward and generated(r.problem, space) is not None


# ---- a bundle per pattern, found by the pruned layers ------------------------------------------------------------
def _add(store, problem, ours_ms, cublas_ms):
    """An ok trial of the built-in seed kernel for ``problem`` with a dense cuBLAS baseline."""
    from codegen.render import render, source_hash

    spec = SeedKernels(arch="sm_90").spec_for(problem)
    record = {"name": spec.name, "family": spec.family, "spec": spec.to_dict(), "arch": "sm_90",
              "source": render(spec)}
    store.kernel(record)
    base = {"cublas": {"median_ms": cublas_ms, "p20_ms": cublas_ms, "p80_ms": cublas_ms}}
    result = {"status": "ok", "evidence": "", "median_ms": ours_ms, "p20_ms": ours_ms, "p80_ms": ours_ms,
              "times_ms": [ours_ms], "tflops": problem.flops / ours_ms / 1e9, "gbps": 1.0, "rel_error": 1e-3,
              "baselines": base, "ratio": {"cublas": cublas_ms / ours_ms}}
    store.add_trial(None, spec.name, "sm_90", problem, store.device({"name": DEVICE, "sm": "sm_90"}), None, result, spec.to_dict(),
                    source_hash=source_hash(record["source"]))


@pytest.fixture
def bundle(pruned, tmp_path):
    """A bundle from a store holding, for each pruned layer at batch 256, a forward that beat dense cuBLAS,
    a grad_input that lost to it and a grad_weight that beat it."""
    from store import Store

    target, file = pruned
    shapes = linear_layers(load_model(target), 256, pruned=read_patterns(file), layers="^(0|2)$")
    wins = {Layout.forward: (1.0, 1.5), Layout.grad_input: (1.0, 0.9), Layout.grad_weight: (1.0, 1.2)}
    with Store(f"sqlite:///{tmp_path / 's.db'}") as store:
        for problem in layer_problems(shapes):
            _add(store, problem, *wins[problem.layout])
        write_bundle(store, tmp_path / "bundle")
    return Bundle(tmp_path / "bundle")


def test_a_bundle_keys_kernels_by_pattern_and_each_pruned_layer_finds_its_three(pruned, bundle, monkeypatch):
    from codegen.nn import layer as nn_layer

    monkeypatch.setattr(nn_layer, "_Compiled", lambda found, problem, device: ("compiled", problem.key))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: DEVICE)
    target, file = pruned
    model = load_pruned(load_model(target), file, kernels=bundle)
    assert len(bundle.entries) == 6 and bundle.index["verdicts"]["cublas"] == 2
    cuda = torch.device("cuda", 0)
    keys = set()
    for layer in pruned_layers(model).values():
        problems = layer.problems(256)
        assert layer.kernels.source is bundle
        assert layer.kernels.kernel(problems[Layout.forward], cuda) == ("compiled", problems[Layout.forward].key)
        assert layer.kernels.kernel(problems[Layout.grad_weight], cuda)[0] == "compiled"
        assert layer.kernels.kernel(problems[Layout.grad_input], cuda) is None
        why = layer.kernels.fallbacks[(problems[Layout.grad_input].key, str(cuda))]
        assert why.startswith("cuBLAS won (ratio 0.900") and "cold_single" in why
        keys |= {p.key for p in problems.values()}
        assert all(layer.pattern_hash[:8] in p.key for p in problems.values())
    assert keys == {e["key"] for e in bundle.entries}
    # replace_linear on the pruned model (loaded without kernels) gives its block-sparse layers the bundle too
    from codegen.nn import replace_linear

    again = replace_linear(load_pruned(load_model(target), file), bundle)
    for layer in pruned_layers(again).values():
        assert layer.kernels.source is bundle
        assert layer.kernels.kernel(layer.problem(Layout.forward, 256, "bf16"), cuda)[0] == "compiled"
    # a dense layer of a pruned layer's shape is not "cuBLAS won every GEMM": those GEMMs are another layer's
    assert not bundle.cublas_won_all(64, 128, "bf16", False)


def test_a_few_row_forward_is_judged_by_engine_timing_not_its_cold_single_win():
    problem = SparseShape.of(16, _pattern(), DType.bf16, False).problems()[Layout.forward]
    assert V.judge(1.0, 5.0, "cold_single", problem).winner == "unknown"
    assert V.judge(1.0, 5.0, "engine", problem).winner == "ours"
    assert V.judge(1.0, 1.01, "engine", problem).winner == "cublas"


def _pattern():
    from codegen import sparse

    return sparse.Pattern.random(128, 64, 16, 0.5, seed=3)


# ---- where dense cuBLAS won: the dense W kept for inference ---------------------------------------------------
def test_where_dense_cublas_won_an_inference_forward_keeps_the_dense_w_while_the_blocks_stand(monkeypatch):
    from codegen.nn import sparse as nn_sparse

    torch.manual_seed(0)
    layer = BlockSparseLinear(64, 128, _pattern(), bias=True)

    def kernel(problem, device):  # what Kernels does for a problem whose verdict says dense cuBLAS won
        won = problem.layout is Layout.forward
        layer.kernels._compiled[(problem, str(device))] = "cuBLAS won (ratio 0.500 at margin 0.02, timing engine)" \
            if won else "no kernel"
        return None

    monkeypatch.setattr(layer.kernels, "kernel", kernel)
    made = []
    scatter = nn_sparse.blocks_to_dense
    monkeypatch.setattr(nn_sparse, "blocks_to_dense", lambda *a: made.append(1) or scatter(*a))
    x = torch.randn(5, 64)

    def reference():  # W expanded by codegen.sparse (numpy), not by the layer's own scatter
        w = torch.from_numpy(layer.pattern.expand(layer.blocks.detach().double().numpy()))
        return torch.nn.functional.linear(x.double(), w, layer.bias.detach().double())

    with torch.no_grad():
        first = layer(x)
        torch.testing.assert_close(layer(x).double(), reference(), rtol=1e-5, atol=1e-6)
        assert torch.equal(first, layer(x))
    assert len(made) == 1
    with torch.no_grad():
        layer.blocks.mul_(2)  # an in-place change (as an optimizer step): W is made anew
        torch.testing.assert_close(layer(x).double(), reference(), rtol=1e-5, atol=1e-6)
    assert len(made) == 2
    y = layer(x.requires_grad_())  # a train step: nothing kept, W scattered from the blocks as always
    y.sum().backward()
    assert len(made) >= 3 and layer.blocks.grad is not None
    keeps = layer._kept["w"][1]
    layer.load_state_dict(layer.state_dict())  # loaded values: the version moves on
    with torch.no_grad():
        layer(x)
    assert layer._kept["w"][1] is not keeps


def test_where_no_verdict_said_so_the_dense_w_is_not_kept(monkeypatch):
    torch.manual_seed(0)
    layer = BlockSparseLinear(64, 128, _pattern(), bias=False)
    with torch.no_grad():
        layer(torch.randn(3, 64))  # the CPU: torch runs, for want of a GPU, not for a verdict
    assert not layer._kept and not layer._cublas_won


def test_tune_model_lists_dense_and_sparse_shapes_apart():
    shape = LayerShape(8, 64, 128, DType.bf16, False)
    sparse_shape = SparseShape.of(8, _pattern(), DType.bf16, False)
    both = layer_problems({shape: ["a"], sparse_shape: ["b"]})
    assert len(both) == 6 and sum(p.sparse for p in both) == 3
    assert {p.pattern for p in both if p.sparse} == {sparse_shape.pattern}


# ---- 2:4 layers: the forward alone ----------------------------------------------------------------------------
@pytest.fixture
def pruned24(tmp_path):
    """The model file and its layers 0 (W 128x64, no bias) and 4 (W 32x128, a bias) pruned to 2:4 (bf16
    values), as `codegen prune --pattern 2:4` writes them; layer 2 (W 128x64) stays dense."""
    (tmp_path / "model.py").write_text(MODEL)
    target = f"{tmp_path / 'model.py'}:mlp"
    model = prune_model(load_model_weights(target), None, None, layers=r"^(0|4)$", pattern="2:4")
    save_pruned(model, tmp_path / "p24.safetensors")
    return target, tmp_path / "p24.safetensors"


def _sp24(batch, out, fin, bias, dtype=DType.bf16):
    from codegen.problem import Problem

    return Problem(batch, out, fin, dtype, Layout.forward, bias, sparsity="2:4")


def test_a_2_4_file_s_layers_are_tuned_as_their_2_4_forward_alone(pruned24, tuned, capsys):
    from codegen.nn.pruned import sparse24_layers

    target, file = pruned24
    assert {name: (p, info["dtype"]) for name, (p, info) in read_patterns(file).items()} == {
        "0": ("2:4", "bf16"), "4": ("2:4", "bf16")}
    code, _, err = run(["tune-model", target, "--pruned", file, "--batch", "8", "16"], capsys)
    assert code == 0, err
    assert "3 linear layers (2 with a 2:4 W), 6 distinct shapes at batches 8, 16" in err
    assert "  8x64->128 bf16, W 2:4: its forward alone (its grad GEMMs on torch): 0\n" in err
    assert "the 2:4 layers 0, 4: grad_input and grad_weight not tuned, on torch: a 2:4 W's backward is not " \
           "generated" in err and err.count("backward is not generated\n") == 1
    problems = tuned[-1]
    structured = {p: names for p, names in problems.items() if p.structured}
    assert structured == {_sp24(b, 128, 64, False): ["0"] for b in (8, 16)} | \
        {_sp24(b, 32, 128, True): ["4"] for b in (8, 16)}
    dense = [p for p in problems if not p.structured]
    assert len(dense) == 2 * 3 and all(problems[p] == ["2"] and not p.sparse for p in dense)
    # exactly the problems a Sparse24Linear loaded from the file looks its kernel up by
    model = load_pruned(load_model(target), file)
    assert set(sparse24_layers(model)) == {"0", "4"}
    for name, layer in sparse24_layers(model).items():
        for batch in (8, 16):
            assert problems[layer.problem(batch, "bf16")] == [name]


def test_a_model_holding_sparse24_layers_is_listed_as_the_file_is(pruned24):
    from codegen.nn.tune import Sparse24Shape

    target, file = pruned24
    model = load_pruned(load_model(target), file)
    shapes = linear_layers(model, 4)
    assert shapes == linear_layers(load_model(target), 4, pruned=read_patterns(file))
    assert shapes == {Sparse24Shape(4, 64, 128, DType.bf16, False): ["0"], LayerShape(4, 64, 128, DType.bf16, False): ["2"],
                      Sparse24Shape(4, 128, 32, DType.bf16, True): ["4"]}
    assert set(layer_problems(shapes)) >= {model[0].problem(4, "bf16"), model[4].problem(4, "bf16")}
    assert [p.layout for p in layer_problems({s: n for s, n in shapes.items() if isinstance(s, Sparse24Shape)})] == \
        [Layout.forward, Layout.forward]


def test_a_2_4_layer_s_forward_alone_is_no_note_and_its_backward_alone_is_nothing_to_tune(pruned24, tuned, capsys):
    target, file = pruned24
    code, _, err = run(["tune-model", target, "--pruned", file, "--batch", "8", "--layout", "forward"], capsys)
    assert code == 0 and "not tuned" not in err and len(tuned[-1]) == 3
    code, _, err = run(["tune-model", target, "--pruned", file, "--batch", "8", "--layers", "^(0|4)$",
                        "--layout", "grad_input", "--layout", "grad_weight"], capsys)
    assert code == 2 and len(tuned) == 1
    assert err.strip().splitlines()[-1].endswith("no GEMM to tune: the layers chosen are 2:4, whose backward runs on "
                                                  "torch (tune their forward)")


def test_a_2_4_layer_in_fp32_is_a_one_line_usage_error(pruned24, tuned, capsys, tmp_path):
    target, file = pruned24
    code, _, err = run(["tune-model", target, "--pruned", file, "--batch", "8", "--dtype", "fp32"], capsys)
    assert code == 2 and not tuned and len(err.strip().splitlines()) == 1
    assert "layer 0 is 2:4 sparse, whose kernels compute fp16 or bf16 only (--dtype fp32): give --dtype bf16 or fp16" in err
    # an fp32 model pruned to 2:4 keeps fp32 values: the same, until --dtype names what it runs in
    fp32 = prune_model(load_model_weights(target).float(), None, None, layers="^4$", pattern="2:4")
    save_pruned(fp32, tmp_path / "f32.safetensors")
    code, _, err = run(["tune-model", target, "--pruned", tmp_path / "f32.safetensors", "--batch", "8"], capsys)
    assert code == 2 and not tuned and "layer 4 is 2:4 sparse" in err and "(its values are fp32)" in err
    code, _, err = run(["tune-model", target, "--pruned", tmp_path / "f32.safetensors", "--batch", "8", "--dtype",
                        "bf16", "--layers", "^4$"], capsys)
    assert code == 0, err
    assert list(tuned[-1]) == [_sp24(8, 32, 128, True)]
    # a dense layer in fp32 beside it is no error: the model's layers 0 and 2 stay nn.Linear
    assert LayerShape(8, 64, 128, DType.fp32, False) in linear_layers(load_model(target), 8, DType.fp32, layers="^0$")


class _Measurer:
    """A stand-in GPU measurer on sm_90 (no GPU): what tune and the seeding read of one."""

    def __init__(self, problem):
        from codegen.spec import DeviceLimits

        self.problem, self.limits = problem, DeviceLimits.for_arch(90)
        self.device = {"name": DEVICE, "sm": "sm_90"}

    def switch(self, problem):
        self.problem = problem

    def close(self):
        pass


def test_tune_searches_a_2_4_forward_in_the_2_4_families_and_skips_a_dense_family_asked(monkeypatch):
    from codegen.nn.tune import Sparse24Shape, tune
    from search import runner

    searched = []

    class Summary:
        best, stopped = {"kernel": "k", "tflops": 1.0, "ratio": {}}, "budget reached"

    monkeypatch.setattr(runner, "run_search", lambda problem, space, measurer, **kw: searched.append(
        (problem, space.family, space.sparsity if hasattr(space, "sparsity") else None)) or Summary())
    problems = layer_problems({Sparse24Shape(16, 96, 160, DType.bf16, True): ["0"]})
    assert list(problems) == [_sp24(16, 160, 96, True)]
    results = tune(problems, None, _Measurer, budget=2, progress=False, say=lambda line: None)
    assert {f for _, f, _ in searched} == {"sparse24", "hopper_sp24"} and all(r.summary for r in results)
    searched.clear()
    lines = []
    mixed = {**problems, **layer_problems({LayerShape(16, 96, 160, DType.bf16, True): ["1"]})}
    results = tune(mixed, ["tensorcore", "sparse24"], _Measurer, budget=2, progress=False, say=lines.append)
    assert {(p.structured, f) for p, f, _ in searched} == {(True, "sparse24"), (False, "tensorcore")}
    skipped = {(r.problem.structured, r.family) for r in results if r.skipped}
    assert (True, "tensorcore") in skipped and (False, "sparse24") in skipped
    assert any(line.startswith(f"skip {_sp24(16, 160, 96, True).key}: the tensorcore family") for line in lines)


def test_tune_model_bundles_a_2_4_forward_that_sparse24linear_runs(pruned24, monkeypatch, capsys, tmp_path):
    """tune-model --pruned --bundle end to end, the search and the GPU REPLACED: the fake search stores
    the built-in seed kernel with a dense cuBLAS baseline; the bundle's 2:4 forwards are what the
    file's Sparse24Linear layers find (the compiled kernel REPLACED), their verdicts as for any forward."""
    from codegen import worker
    from codegen.cli import layer as cli_layer
    from codegen.nn import layer as nn_layer
    from codegen.nn.pruned import sparse24_layers
    from codegen.nn.timing import engine_candidates
    from search import parallel, runner

    class Summary:
        stopped = "budget reached"

        def __init__(self, problem):
            self.best = {"kernel": "k", "tflops": 1.0, "ratio": {"cublas": 1.5}}

    def search(problem, space, measurer, *, store, **kw):
        _add(store, problem, 1.0, 1.5 if problem.m > 128 else 2.0)  # ours wins each in its cold single calls
        return Summary(problem)

    monkeypatch.setattr(worker, "require_gpu", lambda: None)
    monkeypatch.setattr(cli_layer, "check_cache", lambda: None)
    monkeypatch.setattr(parallel, "gpu_measurer", lambda problem, *a, **kw: _Measurer(problem))
    monkeypatch.setattr(runner, "run_search", search)
    target, file = pruned24
    out = tmp_path / "bundle"
    code, stdout, err = run(["tune-model", target, "--pruned", file, "--batch", "16", "256", "--layers", "^(0|4)$",
                             "--bundle", out, "--db", f"sqlite:///{tmp_path / 't.db'}", "--budget", "2", "--quiet",
                             "--family", "sparse24"], capsys)
    assert code == 0, err
    assert "grad_input and grad_weight not tuned" in err and "no engine timing" in err
    bundle = Bundle(out)
    keys = {_sp24(b, n, k, bias).key for b in (16, 256) for n, k, bias in ((128, 64, False), (32, 128, True))}
    assert {e["key"] for e in bundle.entries} == keys and all(k.endswith("_sp24") for k in keys)
    assert all(stdout.count(k) == 2 for k in keys)  # a row each in the tuning table and the verdict table
    assert "wrote 4 kernels" in stdout and "ours won 2, cuBLAS 0, unknown 2" in stdout
    # the forwards of at most 128 rows are left to engine timing: a cold single win of ours is not trusted
    assert set(engine_candidates(bundle, DEVICE)) == {_sp24(16, 128, 64, False), _sp24(16, 32, 128, True)}
    winners = {e["key"]: e["verdict"]["winner"] for e in bundle.entries}
    assert winners == {k: "unknown" if k.startswith("16x") else "ours" for k in keys}
    monkeypatch.setattr(nn_layer, "_Compiled", lambda found, problem, device: ("compiled", problem.key))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: DEVICE)
    cuda = torch.device("cuda", 0)
    from codegen.nn import replace_linear

    for model in (load_pruned(load_model(target), file, kernels=bundle),
                  replace_linear(load_pruned(load_model(target), file), bundle)):
        for layer in sparse24_layers(model).values():
            assert layer.kernels.source is bundle
            for batch in (16, 256):
                problem = layer.problem(batch, "bf16")
                assert layer.kernels.kernel(problem, cuda) == ("compiled", problem.key)


def test_a_2_4_layer_without_its_values_is_a_damaged_file(pruned24, tuned, capsys, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    target, file = pruned24
    with safe_open(str(file), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys() if k != "4.values"}
    save_file(tensors, str(tmp_path / "damaged.safetensors"), metadata=meta)
    code, _, err = run(["tune-model", target, "--pruned", tmp_path / "damaged.safetensors", "--batch", "8"], capsys)
    assert code == 2 and not tuned and len(err.strip().splitlines()) == 1
    assert "layer 4 is 2:4 but lacks its shape or one of 4.values, 4.metadata" in err and "(a damaged file)" in err
