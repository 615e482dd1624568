"""CPU tier of the linear-layer tooling: tune-linear and tune-model (search answered by a replayed
H200 recording, or replaced where marked), export --bundle and its index, the bundle and store
lookups, and codegen.nn's fallback to torch (no GPU here: every GEMM falls back, once logged)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from codegen import cli
from codegen.cli import layer as cli_layer
from codegen.nn.bundle import Bundle, BundleError, StoreKernels, layer_shape
from codegen.nn.tune import LayerShape, layer_problems
from codegen.problem import DType, Layout, Problem, linear_problems
from search.fit import generated

torch = pytest.importorskip("torch")
from codegen.nn import layer as nn  # noqa: E402  (after torch: the layer needs it)

F = torch.nn.functional

RECORDING = Path(__file__).resolve().parents[1] / "search/recordings/replay-simt-skinny-32x4096x4096-fp32.json"
LAYER = ["--batch", "32", "--in", "4096", "--out", "4096"]


def run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A store where tune-linear tuned 32x4096->4096 fp32 from the replayed H200 sweep (forward
    only: the recording holds no other GEMM), and a bundle exported from it."""
    folder = tmp_path_factory.mktemp("tuned")
    url = f"sqlite:///{folder / 's.db'}"
    assert cli.main(["tune-linear", *LAYER, "--budget", "8", "--replay", str(RECORDING), "--db", url, "--quiet"]) == 0
    assert cli.main(["export", "--bundle", str(folder / "bundle"), "--db", url]) == 0
    return url, folder / "bundle"


# ---- shapes and problems ------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", list(Layout))
def test_layer_shape_inverts_linear_problems(layout):
    problem = linear_problems(24, 40, 56, DType.bf16, True)[layout]
    assert layer_shape(problem) == {"batch": 24, "in": 40, "out": 56}


def test_identical_layers_share_their_gemms():
    a = LayerShape(32, 64, 128, DType.fp32, True)
    b = LayerShape(32, 128, 64, DType.fp32, False)
    problems = layer_problems({a: ["l0", "l2"], b: ["l1"]})
    assert len(problems) == 6
    assert problems[a.problems()[Layout.forward]] == ["l0", "l2"]
    # 64->128's grad_input is 32x64x128, b's forward is 32x64x128 too but with another layout: distinct
    assert problems[b.problems()[Layout.forward]] == ["l1"]


class _RefusingSpec:
    def __init__(self, problem):
        self.problem = problem

    def check(self, problem, limits=None):
        return [] if problem.layout is Layout.forward else [f"the {problem.layout.value} layout is not generated yet"]


class _Space:
    family = "simt"
    dims = {"a": (1, 2, 3)}

    def spec(self, point, problem):
        return _RefusingSpec(problem)


def test_generated_gives_the_reason_a_family_refuses_a_problem():
    space = _Space()
    assert generated(linear_problems(32, 64, 64)[Layout.forward], space) is None
    assert generated(linear_problems(32, 64, 64)[Layout.grad_input], space) == \
        "the grad_input layout is not generated yet"


def test_generated_on_the_real_simt_space_finds_a_forward_kernel():
    from search.space import space_for

    assert generated(Problem(32, 4096, 4096), space_for("simt", DType.fp32)) is None


# ---- tune-linear, tune-model --------------------------------------------------------------------------
def test_tune_linear_tunes_what_it_can_and_skips_the_rest(tuned, capsys):
    url, _ = tuned
    code, out, err = run(["tune-linear", *LAYER, "--budget", "8", "--replay", str(RECORDING), "--db", url, "--quiet"],
                         capsys)
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) == {"forward", "grad_input", "grad_weight"}
    assert "simt_fp32" in rows["forward"] and "TFLOP" not in rows["forward"]
    assert "skipped" in rows["grad_input"] and "skipped" in rows["grad_weight"]
    assert err.count("skip ") == 2 and "32x4096x4096_fp32_grad_input" in err


def test_tune_linear_skips_a_layout_the_family_does_not_generate(tmp_path, capsys, monkeypatch, gpu_said_present):
    """Without --replay each GEMM gets a GPU measurer; here gpu_measurer is REPLACED by the replayed
    recording (forward only), and ``generated`` is REPLACED to refuse the backward layouts, so the
    test does not depend on what the families generate today."""
    from search import fit, parallel
    from search.measure import ReplayMeasurer

    asked = []

    def fake_measurer(problem, gpus=None, **kw):
        asked.append(problem)
        return ReplayMeasurer(RECORDING, problem)

    def fake_generated(problem, space, *a, **kw):
        return None if problem.layout is Layout.forward else f"fake: no {problem.layout.value}"

    monkeypatch.setattr(parallel, "gpu_measurer", fake_measurer)
    monkeypatch.setattr(fit, "generated", fake_generated)
    url = f"sqlite:///{tmp_path / 's.db'}"
    code, out, err = run(["tune-linear", *LAYER, "--budget", "5", "--db", url, "--quiet", "--no-baseline"], capsys)
    assert code == 0
    assert asked == [Problem(32, 4096, 4096)]
    assert "skip 32x4096x4096_fp32_grad_input: the simt family generates no kernel for it (fake: no grad_input)" in err
    assert "skip 4096x4096x32_fp32_grad_weight" in err
    assert "skipped (simt): fake: no grad_weight" in out


class _FakeSummary:
    def __init__(self, kernel: str, tflops: float) -> None:
        self.best, self.stopped = {"kernel": kernel, "tflops": tflops, "ratio": {}}, ""


@pytest.mark.parametrize("sm,searched", [(90, {"tensorcore", "hopper"}), (80, {"tensorcore"})])
def test_a_16_bit_layer_is_tuned_in_both_tensor_core_families_by_default(monkeypatch, sm, searched):
    """No family named: each GEMM of a bf16 layer is searched in every family a default search takes
    (search.fit), fastest first: the Hopper family, then the tensor-core family; on a GPU without sm_90 the Hopper searches are skipped with their reason,
    once the measurer says what the GPU is. run_search is REPLACED by a recorder (no GPU here)."""
    from codegen.nn import tune as tune_mod
    from codegen.spec import DeviceLimits
    from search import runner

    ran = []

    def fake_run_search(problem, space, measurer, **kw):
        ran.append((problem.layout, space.family))
        return _FakeSummary(f"{space.family}-{problem.layout.value}", {"hopper": 2.0}.get(space.family, 1.0))

    class Measurer:
        limits = DeviceLimits.for_arch(sm)

        def close(self):
            pass

    monkeypatch.setattr(runner, "run_search", fake_run_search)
    said = []
    problems = layer_problems({LayerShape(256, 512, 512, DType.bf16, True): ["layer"]})
    results = tune_mod.tune(problems, None, lambda p: Measurer(), budget=3, progress=False, say=said.append)
    assert [(r.problem.layout, r.family) for r in results] == [(p.layout, f) for p in problems
                                                               for f in ("hopper", "tensorcore")]
    assert {f for _, f in ran} == searched and len(ran) == 3 * len(searched)
    skipped = [r for r in results if r.skipped]
    assert len(skipped) == 3 - 3 * (len(searched) - 1) and all("sm_90" in r.skipped for r in skipped)
    table = cli_layer.tuning_table(results).splitlines()
    marked = [line for line in table if line.endswith(" *")]
    assert len(marked) == (3 if sm == 90 else 0) and all("hopper-" in line for line in marked)
    assert tune_mod.tune(layer_problems({LayerShape(8, 64, 64, DType.fp32, False): ["x"]}), None,
                         lambda p: Measurer(), budget=1, progress=False, say=said.append)[0].family == "simt"


def test_tune_linear_takes_several_families_and_refuses_one_a_recording_lacks(capsys, monkeypatch, gpu_said_present):
    seen = {}

    def record(problems, families, *a, **kw):
        seen["families"] = families
        return []

    monkeypatch.setattr("codegen.nn.tune.tune", record)
    monkeypatch.setattr(cli_layer, "check_cache", lambda: None)
    code, out, err = run(["tune-linear", *LAYER, "--dtype", "bf16", "--family", "hopper", "--family", "tensorcore",
                          "--family", "hopper", "--no-store", "--quiet"], capsys)
    assert seen["families"] == ["hopper", "tensorcore"]
    code, out, err = run(["tune-linear", *LAYER, "--family", "tensorcore", "--replay", str(RECORDING), "--no-store"],
                         capsys)
    assert code == 2 and "records the simt family, not tensorcore" in err


@pytest.mark.parametrize("argv,needle", [
    (["tune-linear", "--in", "64", "--out", "64"], "--batch"),
    (["tune-linear", *LAYER, "--budget", "0"], "must be at least 1"),
    (["tune-linear", *LAYER, "--dtype", "fp64"], "invalid choice"),
])
def test_tune_linear_usage_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2 and needle in capsys.readouterr().err


MODEL = """
import torch

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 256)
        self.down = torch.nn.Linear(256, 64, bias=False)

def make():
    return torch.nn.Sequential(Block(), torch.nn.ReLU(), Block(), torch.nn.Linear(64, 10))
"""


@pytest.fixture
def captured(monkeypatch, gpu_said_present):
    """run_tuning REPLACED by a recorder (and a GPU said to be there): these tests check what
    tune-model asks to tune."""
    seen = {}

    def record(args, problems):
        seen["problems"], seen["args"] = problems, args
        return 0

    monkeypatch.setattr(cli_layer, "run_tuning", record)
    return seen


def test_tune_model_groups_identical_layers(tmp_path, capsys, captured):
    (tmp_path / "model.py").write_text(MODEL)
    code, _, err = run(["tune-model", f"{tmp_path / 'model.py'}:make", "--batch", "128", "--dtype", "bf16",
                        "--budget", "3"], capsys)
    assert code == 0
    assert "5 linear layers, 3 distinct shapes at batch 128" in err
    assert "128x64->256 bf16 +bias: 0.up, 2.up" in err
    problems = captured["problems"]
    assert len(problems) == 9 and captured["args"].budget == 3
    assert problems[Problem(128, 256, 64, DType.bf16, Layout.forward, True)] == ["0.up", "2.up"]
    assert problems[Problem(256, 64, 128, DType.bf16, Layout.grad_weight, True)] == ["0.up", "2.up"]
    assert problems[Problem(128, 10, 64, DType.bf16, Layout.forward, True)] == ["3"]


def test_tune_model_reads_a_saved_module(tmp_path, capsys, captured):
    torch.save(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)), tmp_path / "m.pt")
    code, _, err = run(["tune-model", str(tmp_path / "m.pt"), "--batch", "4"], capsys)
    assert code == 0 and "2 linear layers, 1 distinct shape" in err
    assert {p.dtype for p in captured["problems"]} == {DType.fp32} and len(captured["problems"]) == 3


@pytest.mark.parametrize("target,needle,code", [
    ("model.py", "name the factory", 2),
    ("model.py:nothing", "has no nothing", 2),
    ("missing.py:make", "no file", 2),
    ("empty.py:make", "has no nn.Linear layer", 1),
])
def test_tune_model_errors_are_one_line(tmp_path, capsys, captured, target, needle, code):
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "empty.py").write_text("import torch\ndef make():\n    return torch.nn.ReLU()\n")
    got, _, err = run(["tune-model", str(tmp_path / target), "--batch", "4"], capsys)
    assert got == code and needle in err and len(err.strip().splitlines()) == 1
    assert "problems" not in captured


# ---- export --bundle and the lookups -----------------------------------------------------------------
def test_the_bundle_index_lists_each_tuned_kernel(tuned):
    _, bundle = tuned
    index = json.loads((bundle / "index.json").read_text())
    assert index["format"] == "gemmscape-bundle/1" and index["skipped"] == []
    [entry] = index["kernels"]
    assert entry["key"] == "32x4096x4096_fp32_forward" and entry["layout"] == "forward" and entry["bias"] is False
    assert entry["layer"] == {"batch": 32, "in": 4096, "out": 4096} and entry["recorded"] is True
    manifest = json.loads((bundle / entry["manifest"]).read_text())
    assert manifest["name"] == entry["kernel"] and manifest["problem"]["m"] == 32
    assert (bundle / entry["source"]).read_text().count("extern \"C\"") >= 1


def test_a_bundle_finds_by_problem_and_device(tuned):
    _, bundle = tuned
    b = Bundle(bundle)
    [device] = b.devices()
    found = b.find(Problem(32, 4096, 4096), device)
    assert not isinstance(found, str) and found.manifest["problem"]["k"] == 4096 and "__global__" in found.source
    assert "not on NVIDIA H200" in b.find(Problem(32, 4096, 4096), "NVIDIA H200")
    assert "no kernel for 32x4096x4096_bf16_forward" in b.find(Problem(32, 4096, 4096, DType.bf16), device)
    assert "no kernel" in b.find(linear_problems(32, 4096, 4096)[Layout.grad_input], device)


def test_the_store_finds_what_the_bundle_holds(tuned):
    from store import Store

    url, bundle = tuned
    b = Bundle(bundle)
    [device] = b.devices()
    kernels = StoreKernels(Store(url, read_only=True))
    found = kernels.find(Problem(32, 4096, 4096), device)
    assert not isinstance(found, str)
    assert found.manifest["name"] == b.find(Problem(32, 4096, 4096), device).manifest["name"]
    assert "not on other" in kernels.find(Problem(32, 4096, 4096), "other")
    assert "no ok kernel" in kernels.find(Problem(32, 4096, 4095), device)


def test_a_folder_that_is_no_bundle_is_refused(tmp_path):
    with pytest.raises(BundleError, match="index.json is missing"):
        Bundle(tmp_path)
    (tmp_path / "index.json").write_text("{}")
    with pytest.raises(BundleError, match="not a gemmscape bundle"):
        Bundle(tmp_path)


def test_export_bundle_usage(tuned, tmp_path, capsys):
    url, _ = tuned
    code, _, err = run(["export", "--bundle", str(tmp_path / "b"), "--best", "--db", url], capsys)
    assert code == 2 and "drop --best" in err
    code, _, err = run(["export", "--db", url], capsys)
    assert code == 2 and "give --out DIR (one kernel) or --bundle DIR" in err
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    from store import Store

    Store(empty).close()
    code, _, err = run(["export", "--bundle", str(tmp_path / "b"), "--db", empty], capsys)
    assert code == 1 and "nothing tuned yet" in err


# ---- codegen.nn on the CPU: every GEMM falls back to torch ---------------------------------------------
def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(13, 31), torch.nn.GELU(), torch.nn.Linear(31, 7, bias=False))


def test_on_the_cpu_the_layer_equals_nn_linear_with_one_reason_per_gemm(tuned, caplog):
    from codegen.nn import Linear, replace_linear

    _, bundle = tuned
    ref, ours = _mlp(), _mlp()
    replace_linear(ours, bundle)
    assert isinstance(ours[0], Linear) and isinstance(ours[2], Linear)
    assert ours[0].weight is not None and ours[0].kernels is ours[2].kernels
    x = torch.randn(5, 13)
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    with caplog.at_level(logging.WARNING, logger="gemmscape.nn"):
        for _ in range(3):
            yr, yo = ref(xr), ours(xo)
            assert torch.equal(yr, yo)
            yr.square().sum().backward()
            yo.square().sum().backward()
    assert torch.equal(xr.grad, xo.grad)
    for a, b in zip(ref.parameters(), ours.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    reasons = [r.getMessage() for r in caplog.records if r.name == "gemmscape.nn"]
    assert len(reasons) == 6, reasons  # two layers x three GEMMs, each said once over three steps
    assert all("on cpu" in r and "gemmscape kernels run on CUDA GPUs" in r for r in reasons)
    assert sum("5x31x13_fp32_forward_bias" in r for r in reasons) == 1
    assert sum("31x13x5_fp32_grad_weight_bias" in r for r in reasons) == 1


def test_no_grad_autocast_and_leading_dims_on_the_cpu():
    from codegen.nn import Linear

    torch.manual_seed(1)
    layer = torch.nn.Linear(12, 20)
    ours = Linear.from_linear(layer, None)
    x = torch.randn(2, 3, 12)
    with torch.no_grad():
        assert torch.equal(ours(x), layer(x)) and ours(x).shape == (2, 3, 20)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = ours(x), layer(x)
    assert got.dtype == want.dtype == torch.bfloat16 and torch.equal(got, want)


def test_a_fresh_linear_is_an_nn_linear(tuned):
    from codegen.nn import Linear

    layer = Linear(6, 4, kernels=tuned[1])
    assert isinstance(layer, torch.nn.Linear) and set(layer.state_dict()) == {"weight", "bias"}
    assert "kernels=" in repr(layer) and str(tuned[1]) in repr(layer)


def test_kernels_from_takes_bundles_stores_and_urls(tuned, tmp_path):
    from codegen.nn import Kernels, kernels_from

    url, bundle = tuned
    assert isinstance(kernels_from(bundle).source, Bundle)
    assert isinstance(kernels_from(str(bundle / "index.json")).source, Bundle)
    assert isinstance(kernels_from(url).source, StoreKernels)
    k = Kernels(None)
    assert kernels_from(k) is k
    with pytest.raises(TypeError, match="not int"):
        kernels_from(3)
    with pytest.raises(BundleError):
        kernels_from(tmp_path)


# ---- the launch a manifest asks for, with the driver REPLACED by a recorder (no GPU here) ---------------
def _decode(step: dict, params: int) -> list:
    """A launch's argument values read back through its pointer array (the kernel's view): each slot
    points at a c_int (M, N, K), a pointer, or a tensor map's 128 bytes, as the manifest names it."""
    import ctypes

    slots = (ctypes.c_void_p * len(step["args"])).from_address(params)
    kinds = [(ctypes.c_ubyte * 128) if "tensor_map" in a else ctypes.c_int if a["name"] in ("M", "N", "K") else ctypes.c_void_p
             for a in step["args"]]
    return [kind.from_buffer_copy(kind.from_address(slot)) for kind, slot in zip(kinds, slots, strict=True)]


def _compiled(monkeypatch, problem, families, launches, maps):
    """codegen.nn's launcher for ``problem``'s built-in seed with cuda.launch_prepared, the tensor-map
    encoder, the context and the stream replaced by recorders (CPU tensors give the pointers); each
    launch is recorded into ``launches`` with its arguments as read through its pointer array, and
    each map encoded into ``maps`` (the recorder's map holds its base address). Kernels prepared in
    one test share the recorder, each function named <kernel>#<step>."""
    import ctypes

    from codegen import cuda
    from codegen.nn import layer as nn
    from codegen.nn.bundle import SeedKernels

    file = SeedKernels(families).find(problem, "any")
    assert not isinstance(file, str), file
    record = cuda.launch_prepared
    if not hasattr(record, "steps"):
        def record(func, grid, block, smem, stream, params, cluster=(1, 1, 1)):
            step = record.steps[func]
            record.launches.append({"func": func, "grid": list(grid), "block": list(block), "smem": smem,
                                    "stream": stream, "cluster": cluster, "names": [a["name"] for a in step["args"]],
                                    "args": _decode(step, params)})

        def encode(enc, address):
            record.maps.append((enc, address))
            return (ctypes.c_ubyte * 128).from_buffer_copy(address.to_bytes(8, "little") * 16)

        record.steps = {}
        monkeypatch.setattr(cuda, "launch_prepared", record)
        monkeypatch.setattr(cuda, "encode_tensor_map", encode)
        monkeypatch.setattr(nn, "_make_current", lambda ctx: None)
        monkeypatch.setattr(nn, "_current_stream", lambda index: 0)
    record.launches, record.maps = launches, maps
    names = [f"{file.manifest['name']}#{i}" for i in range(len(file.manifest["kernels"]))]
    record.steps.update(zip(names, file.manifest["kernels"], strict=True))
    k = nn._Compiled.__new__(nn._Compiled)
    k.cuda, k.manifest, k.problem, k.device, k.ctx, k.sms = cuda, file.manifest, problem, torch.device("cpu"), None, 132
    k.functions = names
    k.workspace, k.zero_first, k.maps = file.manifest["workspace_bytes"], file.manifest["zero_output_first"], {}
    k.prepare()
    return file.manifest, k


def _recorded_launches(monkeypatch, problem, families, tensors):
    """One call of codegen.nn's launcher for ``problem``'s built-in seed, the driver replaced (``_compiled``)."""
    launches, maps = [], []
    manifest, k = _compiled(monkeypatch, problem, families, launches, maps)
    k(tensors)
    return manifest, launches, maps


def test_the_forward_launch_passes_each_operand_where_the_manifest_names_it(monkeypatch):
    problem = linear_problems(67, 91, 45, DType.fp32, True)[Layout.forward]
    t = {"y": torch.full((67, 45), float("nan")), "x": torch.randn(67, 91), "weight": torch.randn(45, 91),
         "bias": torch.randn(45)}
    manifest, launches, maps = _recorded_launches(monkeypatch, problem, None, t)
    assert len(launches) == len(manifest["kernels"]) and not maps
    step, launch = manifest["kernels"][0], launches[0]
    assert launch["grid"] == step["grid_for_problem"] and launch["block"] == step["block"]
    assert launch["smem"] == step["dynamic_smem_bytes"]
    by_name = {a["name"]: v for a, v in zip(step["args"], launch["args"], strict=True)}
    assert by_name["Y"].value == t["y"].data_ptr() and by_name["X"].value == t["x"].data_ptr()
    assert by_name["W"].value == t["weight"].data_ptr() and by_name["B"].value == t["bias"].data_ptr()
    assert (by_name["M"].value, by_name["N"].value, by_name["K"].value) == (67, 45, 91)
    if manifest["zero_output_first"]:
        assert torch.count_nonzero(t["y"]) == 0


@pytest.mark.parametrize("dtype", [DType.fp32, DType.bf16])
def test_the_backward_launches_pass_each_gradient_where_the_manifest_names_it(monkeypatch, dtype):
    """grad_input (DX, DY, W) and grad_weight (DW, DY, X, and DB, in the GEMM's kernel or the db kernel) from the
    seeds."""
    td = torch.float32 if dtype is DType.fp32 else torch.bfloat16
    gemms = linear_problems(67, 91, 45, dtype, True)
    t = {"grad_x": torch.full((67, 91), float("nan"), dtype=td), "grad_y": torch.randn(67, 45).to(td),
         "weight": torch.randn(45, 91).to(td), "grad_weight": torch.full((45, 91), float("nan"), dtype=td),
         "x": torch.randn(67, 91).to(td), "grad_bias": torch.full((45,), float("nan"), dtype=td)}
    want = {Layout.grad_input: {"DX": "grad_x", "DY": "grad_y", "W": "weight"},
            Layout.grad_weight: {"DW": "grad_weight", "DY": "grad_y", "X": "x", "DB": "grad_bias"}}
    for layout, names in want.items():
        manifest, launches, _ = _recorded_launches(monkeypatch, gemms[layout], None, t)
        seen = {}
        for step, launch in zip(manifest["kernels"], launches, strict=True):
            for a, v in zip(step["args"], launch["args"], strict=True):
                if a["name"] in names:
                    seen[a["name"]] = v.value
        assert seen == {arg: t[role].data_ptr() for arg, role in names.items()}, layout
        if layout is Layout.grad_weight:  # db by its own kernel, or by a one-split GEMM kernel itself
            db_by = [s["symbol"] for s in manifest["kernels"] if "DB" in {a["name"] for a in s["args"]}]
            assert len(db_by) == 1 and (db_by[0].endswith("_db") or manifest["kernels"] == [
                s for s in manifest["kernels"] if s["symbol"] == db_by[0]]), db_by


def test_tensor_maps_are_encoded_over_their_operands_and_a_persistent_grid_is_capped(monkeypatch):
    """The hopper seed for 67x45x91: a pack prepass into the workspace, then a persistent kernel
    reading tensor maps (over the workspace)."""
    problem = linear_problems(67, 91, 45, DType.bf16, True)[Layout.forward]
    t = {"y": torch.empty((67, 45), dtype=torch.bfloat16), "x": torch.randn(67, 91).bfloat16(),
         "weight": torch.randn(45, 91).bfloat16(), "bias": torch.randn(45).bfloat16()}
    manifest, launches, maps = _recorded_launches(monkeypatch, problem, {"bf16": ("hopper",)}, t)
    kinds = [a for step in manifest["kernels"] for a in step["args"] if "tensor_map" in a]
    assert kinds and len(maps) == len(kinds)
    assert manifest["workspace_bytes"] > 0
    addresses = {enc["operand"]: address for enc, address in maps}
    pointers = {a["name"]: v.value for step, launch in zip(manifest["kernels"], launches, strict=True)
                for a, v in zip(step["args"], launch["args"], strict=True) if a["name"] == "WS"}
    assert addresses.get("WS") == pointers.get("WS") is not None  # the maps view the workspace the pack wrote
    for step, launch in zip(manifest["kernels"], launches, strict=True):
        per_sm = int(step.get("persistent") or 0)
        want = min(step["grid_for_problem"][0], 132 * per_sm) if per_sm else step["grid_for_problem"][0]
        assert launch["grid"][0] == want
    assert any(step.get("persistent") for step in manifest["kernels"])


def test_a_bundle_from_a_committed_h200_store(tmp_path, capsys):
    """tests/fixtures/tensorcore-...043328Z.db.gz holds real H200 searches (2026-12-01): its
    bundle lists each problem's fastest kernel with its stored source, found by problem and device."""
    import gzip
    import shutil

    gz = Path(__file__).resolve().parents[1] / "tests/fixtures/tensorcore-NVIDIA_H200-2026-12-01T043328Z.db.gz"
    with gzip.open(gz) as src, open(tmp_path / "s.db", "wb") as dst:
        shutil.copyfileobj(src, dst)
    code, out, _ = run(["export", "--bundle", str(tmp_path / "b"), "--db", f"sqlite:///{tmp_path / 's.db'}"], capsys)
    assert code == 0 and "wrote 13 kernels (13 problems, 1 device)" in out
    b = Bundle(tmp_path / "b")
    assert b.devices() == ["NVIDIA H200"]
    found = b.find(Problem(4096, 4096, 4096, DType.bf16), "NVIDIA H200")
    assert found.manifest["name"].startswith("tc_bf16_nobias") and found.manifest["source_rerendered"] is False
    assert found.manifest["measured"]["device"]["name"] == "NVIDIA H200"
    assert "no kernel for 4096x4096x4096_bf16_forward_bias" in b.find(Problem(4096, 4096, 4096, DType.bf16, bias=True),
                                                                       "NVIDIA H200")


def test_a_model_factory_is_built_on_the_meta_device(tmp_path):
    from codegen.nn.tune import linear_layers, load_model

    (tmp_path / "big.py").write_text("import torch\ndef make():\n    return torch.nn.Linear(50000, 50000)\n")
    model = load_model(f"{tmp_path / 'big.py'}:make")  # 10 GB of fp32 weights if it were allocated
    assert model.weight.device.type == "meta"
    assert list(linear_layers(model, 8)) == [LayerShape(8, 50000, 50000, DType.fp32, True)]


def test_a_replaced_model_can_be_copied_and_saved(tuned, tmp_path):
    import copy

    from codegen.nn import Linear, replace_linear

    model = replace_linear(_mlp(), tuned[1])
    twin = copy.deepcopy(model)
    assert twin[0].kernels is model[0].kernels and twin[0].weight is not model[0].weight
    torch.save(model, tmp_path / "m.pt")
    back = torch.load(tmp_path / "m.pt", weights_only=False)
    assert isinstance(back[0], Linear) and isinstance(back[0].kernels.source, Bundle)
    x = torch.randn(3, 13)
    assert torch.equal(back(x), model(x))


def test_built_in_seeds_put_the_hopper_family_first_for_large_16_bit_forward_layers():
    from codegen.nn.bundle import SeedKernels

    seeds = SeedKernels()
    big = linear_problems(4096, 4096, 4096, DType.bf16, True)
    assert seeds.spec_for(big[Layout.forward]).family == "hopper"
    assert seeds.spec_for(big[Layout.grad_input]).family == "hopper"
    assert seeds.spec_for(big[Layout.grad_weight]).family == "hopper"
    odd = linear_problems(4096, 4095, 4096, DType.bf16, True)  # in = 4095: rows TMA cannot read
    assert seeds.spec_for(odd[Layout.grad_input]).family == "tensorcore"
    assert seeds.spec_for(linear_problems(32, 4096, 4096, DType.bf16)[Layout.forward]).family == "tensorcore"
    assert SeedKernels(arch="sm_80").spec_for(big[Layout.forward]).family == "tensorcore"


# ---- the prepared per-call path: the same launches, call after call, with the driver REPLACED ----------
ROLES = {Layout.forward: {"Y": "y", "X": "x", "W": "weight", "B": "bias"},
         Layout.grad_input: {"DX": "grad_x", "DY": "grad_y", "W": "weight"},
         Layout.grad_weight: {"DW": "grad_weight", "DY": "grad_y", "X": "x", "DB": "grad_bias"}}


def _tensors(seed: int, m: int, k: int, n: int, td) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"y": torch.full((m, n), float("nan"), dtype=td), "x": torch.randn(m, k, generator=g).to(td),
            "weight": torch.randn(n, k, generator=g).to(td), "bias": torch.randn(n, generator=g).to(td),
            "grad_x": torch.full((m, k), float("nan"), dtype=td), "grad_y": torch.randn(m, n, generator=g).to(td),
            "grad_weight": torch.full((n, k), float("nan"), dtype=td), "grad_bias": torch.full((n,), float("nan"), dtype=td)}


@pytest.mark.parametrize(("dtype", "layout", "families"), [
    (DType.fp32, Layout.forward, None), (DType.bf16, Layout.forward, None), (DType.bf16, Layout.forward, {"bf16": ("hopper",)}),
    (DType.fp32, Layout.grad_input, None), (DType.bf16, Layout.grad_weight, None), (DType.fp32, Layout.grad_weight, None)])
def test_each_call_launches_what_the_manifest_asks_with_this_call_s_pointers(monkeypatch, dtype, layout, families):
    """Three calls on the same prepared kernel with three sets of tensors: every launch carries the
    manifest's grid (a persistent one capped at the SM count), block and shared memory, M, N, K as
    ints, and each pointer and tensor map (the recorder's map holds its base address) over THIS call's
    tensors, read back through the prepared pointer array; the workspace is one per call, shared by
    its steps and the maps over it; a slot the layout gives no tensor stays null."""
    m, k, n = 67, 91, 45
    td = torch.float32 if dtype is DType.fp32 else torch.bfloat16
    problem = linear_problems(m, k, n, dtype, True)[layout]
    launches, maps = [], []
    manifest, compiled = _compiled(monkeypatch, problem, families, launches, maps)
    dims = {"M": problem.m, "N": problem.n, "K": problem.k}
    seen_pointers = []
    for seed in (1, 2, 3):
        t = _tensors(seed, m, k, n, td)
        before = len(launches)
        compiled(t)
        calls = launches[before:]
        assert len(calls) == len(manifest["kernels"])
        workspace = set()
        for step, launch in zip(manifest["kernels"], calls, strict=True):
            grid = list(step["grid_for_problem"])
            if step.get("persistent"):
                grid[0] = min(grid[0], 132)
            assert (launch["grid"], launch["block"], launch["smem"]) == (grid, step["block"], step["dynamic_smem_bytes"])
            for a, v in zip(step["args"], launch["args"], strict=True):
                name = a["name"]
                if "tensor_map" in a:
                    base = bytes(v)[:8]
                    operand = a["tensor_map"]["operand"]
                    if operand == "WS":
                        workspace.add(int.from_bytes(base, "little"))
                    else:
                        assert int.from_bytes(base, "little") == t[ROLES[layout][operand]].data_ptr(), name
                elif name in dims:
                    assert v.value == dims[name], name
                elif name == "WS":
                    assert (v.value is not None) == bool(manifest["workspace_bytes"])
                    if v.value is not None:
                        workspace.add(v.value)
                elif name in ROLES[layout]:
                    assert v.value == t[ROLES[layout][name]].data_ptr(), name
                    seen_pointers.append((seed, name, v.value))
                else:  # a slot the layout has no tensor for (B in backward kernels): null, as always
                    assert v.value is None, name
        assert len(workspace) == (1 if manifest["workspace_bytes"] else 0)
        if manifest["zero_output_first"]:
            assert torch.count_nonzero(t[nn.OUTPUT[layout]]) == 0
    by_seed = {s: {(name, p) for s2, name, p in seen_pointers if s2 == s} for s in (1, 2, 3)}
    assert by_seed[1] and by_seed[1].isdisjoint(by_seed[2]) and by_seed[2].isdisjoint(by_seed[3])


def test_the_layer_passes_each_call_s_new_tensors_through_its_cached_gemms(monkeypatch):
    """The layer's three GEMMs on the seeds' kernels (driver replaced), twice with new tensors of the
    same shape: every pointer each launch passes is the tensor of its own call (inputs given, outputs
    returned), and each GEMM was looked up once."""
    gemms = linear_problems(24, 40, 56, DType.bf16, True)
    launches, maps, loaded, asked = [], [], {}, []
    for problem in gemms.values():
        loaded[problem] = _compiled(monkeypatch, problem, None, launches, maps)[1]
    layout_of = {k.manifest["name"]: p.layout for p, k in loaded.items()}
    kernels = nn.Kernels(None)
    monkeypatch.setattr(kernels, "_load", lambda problem, device: asked.append(problem) or loaded[problem])
    for seed in (7, 8):
        t = _tensors(seed, 24, 40, 56, torch.bfloat16)
        start = len(launches)
        y = nn.linear_forward(kernels, t["x"], t["weight"], t["bias"])
        dx = nn.linear_grad_input(kernels, t["grad_y"], t["weight"])
        dw, db, held = nn.linear_grad_weight(kernels, t["grad_y"], t["x"], True)
        assert held is None  # no side stream asked for: ran on the current one
        mine = {**t, "y": y, "grad_x": dx, "grad_weight": dw, "grad_bias": db}
        checked = set()
        for launch in launches[start:]:
            layout = layout_of[launch["func"].split("#")[0]]
            for name, v in zip(launch["names"], launch["args"], strict=True):
                if name in ROLES[layout]:
                    assert v.value == mine[ROLES[layout][name]].data_ptr(), (layout, name)
                    checked.add((layout, name))
        assert {("forward", "Y"), ("forward", "X"), ("grad_input", "DX"), ("grad_weight", "DW")} <= \
            {(layout.value, name) for layout, name in checked}
    assert sorted(p.layout.value for p in asked) == sorted(layout.value for layout in gemms)  # one lookup per GEMM


def test_a_new_batch_size_gets_its_own_problems_and_kernels(monkeypatch):
    """The per-call cache is keyed by the whole GEMM (layout, batch, in, out, dtypes, bias, device):
    a second batch size is looked up anew, a repeated one is not."""
    found = []

    class Source:
        def find(self, problem, device_name):
            found.append(problem)
            return problem  # stands for a KernelFile

    class Loaded:
        def __init__(self, file, problem, device):
            self.problem, self.device = problem, device
            self.manifest = {"name": f"k{problem.m}"}

    monkeypatch.setattr(nn, "_Compiled", Loaded)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU")
    kernels = nn.Kernels(Source())
    dev = torch.device("cuda", 0)
    a = nn._gemm(kernels, Layout.forward, 32, 4096, 1024, torch.bfloat16, torch.bfloat16, dev, True)
    b = nn._gemm(kernels, Layout.forward, 32, 4096, 1024, torch.bfloat16, torch.bfloat16, dev, True)
    c = nn._gemm(kernels, Layout.forward, 64, 4096, 1024, torch.bfloat16, torch.bfloat16, dev, True)
    d = nn._gemm(kernels, Layout.forward, 32, 4096, 1024, torch.bfloat16, torch.bfloat16, dev, False)
    assert a is b and a[1] is b[1] and len({id(a[1]), id(c[1]), id(d[1])}) == 3
    assert (a[0].m, a[0].k, a[0].n, c[0].m, a[0].bias, d[0].bias) == (32, 4096, 1024, 64, True, False)
    assert found == [a[0], c[0], d[0]]
    assert kernels.used(c[0], dev) == "k64"


def test_a_kernel_argument_the_layer_does_not_know_makes_the_kernel_unusable():
    """Found when the kernel is prepared (a fallback with its reason), not at a call."""
    problem = linear_problems(8, 16, 24, DType.fp32, True)[Layout.forward]
    step = {"args": [{"name": "Y"}, {"name": "Q"}], "block": [128, 1, 1], "grid_for_problem": [1, 1, 1],
            "dynamic_smem_bytes": 0}
    with pytest.raises(nn._Unusable, match="kernel argument 'Q' is not one codegen.nn knows for the forward layout"):
        nn._Step("f", step, problem, 132, "k")
