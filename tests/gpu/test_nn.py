"""GPU tier of codegen.nn: the layer runs real gemmscape kernels (the families' built-in seeds,
codegen.nn.bundle.SeedKernels, and a bundle exported from a store) on torch's stream.

Each test asserts which GEMM ran a gemmscape kernel and which fell back (backward falls back until
the families generate the grad_input and grad_weight layouts; once they do, the same tests check
those kernels). Outputs are compared against float64 on odd shapes, with the output memory
NaN-poisoned first. Whole file: well under a minute on an H200.
"""

from __future__ import annotations

import logging

import pytest

from codegen.nn.bundle import SeedKernels
from codegen.problem import DType, Layout, linear_problems

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.fixture(autouse=True)
def _exact_fp32():
    """cuBLAS in true fp32 for the references (no TF32)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def _poison_allocator(*shapes, dtype):
    """Fill blocks of the caching allocator with NaN and free them: outputs allocated next of these
    shapes reuse NaN memory, so an element a kernel does not write shows."""
    junk = [torch.full(s, float("nan"), dtype=dtype, device="cuda") for s in shapes]
    torch.cuda.synchronize()
    del junk


def _rel(got: torch.Tensor, want64: torch.Tensor) -> float:
    return float((got.double() - want64).norm() / want64.norm())


def _expected(seeds: SeedKernels, problem) -> str:
    """What must run ``problem``: a seed's kernel name, or a torch fallback."""
    spec = seeds.spec_for(problem)
    return "torch" if isinstance(spec, str) else spec.name


def _ran(kernels, problem, device) -> str:
    used = kernels.used(problem, device)
    assert used is not None, f"{problem.key} was never asked for"
    return "torch" if used.startswith("torch") else used


@pytest.mark.parametrize("dtype,batch,fin,fout,families", [
    ("fp32", 67, 91, 45, None),
    ("fp32", 33, 136, 72, None),
    ("bf16", 67, 88, 45, None),
    ("bf16", 33, 136, 72, None),
    ("bf16", 67, 91, 45, {"bf16": ("hopper",)}),  # tensor maps, the pack prepass's workspace, a persistent grid
    ("bf16", 130, 136, 264, {"bf16": ("hopper",)}),
])
def test_forward_and_gradients_against_float64(dtype, batch, fin, fout, families, caplog):
    from codegen.nn import Linear, kernels_from

    seeds = SeedKernels(families)
    kernels = kernels_from(seeds)
    torch.manual_seed(0)
    layer = torch.nn.Linear(fin, fout, device="cuda", dtype=TORCH[dtype])
    ours = Linear.from_linear(layer, kernels)
    x = torch.randn(batch, fin, device="cuda", dtype=TORCH[dtype], requires_grad=True)
    dy = torch.randn(batch, fout, device="cuda", dtype=TORCH[dtype])
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, layer.weight, layer.bias))
    y64 = torch.nn.functional.linear(x64, w64, b64)
    y64.backward(dy.double())
    problems = linear_problems(batch, fin, fout, DType(dtype), True)
    tol = DType(dtype).rel_tol
    with caplog.at_level(logging.WARNING, logger="gemmscape.nn"):
        for _ in range(2):  # the second call reuses the loaded kernel and logs nothing new
            _poison_allocator((batch, fout), (batch, fin), (fout, fin), dtype=TORCH[dtype])
            y = ours(x)
            gx, gw, gb = torch.autograd.grad(y, [x, layer.weight, layer.bias], dy)
            torch.cuda.synchronize()
            assert _rel(y, y64.detach()) < tol
            assert _rel(gx, x64.grad) < tol and _rel(gw, w64.grad) < tol and _rel(gb, b64.grad) < tol
    for layout, problem in problems.items():
        assert _ran(kernels, problem, x.device) == _expected(seeds, problem), layout
    assert _ran(kernels, problems[Layout.forward], x.device) != "torch"
    said = [r.getMessage() for r in caplog.records if r.name == "gemmscape.nn"]
    fallbacks = [m for m in said if "runs torch's op instead" in m]
    assert len(fallbacks) == sum(_expected(seeds, p) == "torch" for p in problems.values())
    unjudged = [m for m in said if "without a verdict" in m]  # seeds hold no verdict: said once, not per GEMM
    assert len(unjudged) == 1 and len(said) == len(fallbacks) + 1, said


def test_an_exported_bundle_runs_without_the_store(tmp_path):
    """A kernel stored as a real measurement (bench of a seed on this GPU), exported with
    ``codegen export --bundle``, then loaded by the layer from the bundle alone."""
    from codegen import cli
    from codegen.nn import Linear

    url = f"sqlite:///{tmp_path / 's.db'}"
    spec = SeedKernels().spec_for(linear_problems(48, 96, 80, DType.fp32, True)[Layout.forward])
    assert cli.main(["bench", "--kernel", spec.name, "--m", "48", "--n", "80", "--k", "96", "--bias", "--db", url,
                     "--no-baseline"]) == 0
    assert cli.main(["export", "--bundle", str(tmp_path / "b"), "--db", url]) == 0
    torch.manual_seed(1)
    layer = torch.nn.Linear(96, 80, device="cuda")
    ours = Linear.from_linear(layer, tmp_path / "b")
    x = torch.randn(48, 96, device="cuda")
    with torch.no_grad():
        y = ours(x)
    want = torch.nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
    assert _rel(y, want) < DType.fp32.rel_tol
    assert ours.kernels.used(linear_problems(48, 96, 80, DType.fp32, True)[Layout.forward], x.device) == spec.name


@pytest.mark.parametrize("overlap", [True, False])
def test_cuda_graph_replay_equals_eager(overlap):
    """Captured with dW on the side stream (overlap) or all on one stream: replays equal eager calls."""
    from codegen.nn import Kernels, Linear
    from codegen.nn.step import capture

    kernels = Kernels(SeedKernels(), overlap_backward=overlap)
    torch.manual_seed(2)
    layer = torch.nn.Linear(88, 40, device="cuda")
    ours = Linear.from_linear(layer, kernels)
    x = torch.randn(24, 88, device="cuda", requires_grad=True)
    dy = torch.randn(24, 40, device="cuda")

    def step():
        y = ours(x)
        return (y, *torch.autograd.grad(y, [x, layer.weight, layer.bias], dy))

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
    assert _ran(kernels, linear_problems(24, 88, 40, DType.fp32, True)[Layout.forward], x.device) != "torch"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_backward_runs_dw_on_the_side_stream_and_waits_for_it(dtype, monkeypatch):
    """With overlap (off by default) dW's kernels launch on the layer's side stream and dX's on the
    current one, and the gradients returned are right once the current stream alone is synchronized;
    with overlap off every launch is on the current stream."""
    from codegen import cuda
    from codegen.nn import Kernels, Linear

    streams = []
    launch = cuda.launch_prepared

    def recording(func, grid, block, smem, stream, params, cluster=(1, 1, 1)):
        streams.append(int(stream))
        return launch(func, grid, block, smem, stream, params, cluster)

    monkeypatch.setattr(cuda, "launch_prepared", recording)
    torch.manual_seed(6)
    td = TORCH[dtype]
    layer = torch.nn.Linear(520, 264, device="cuda", dtype=td)
    x = torch.randn(67, 520, device="cuda", dtype=td, requires_grad=True)
    dy = torch.randn(67, 264, device="cuda", dtype=td)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, layer.weight, layer.bias))
    torch.nn.functional.linear(x64, w64, b64).backward(dy.double())
    for overlap in (True, False):
        kernels = Kernels(SeedKernels(), overlap_backward=overlap)
        ours = Linear.from_linear(layer, kernels)
        main = torch.cuda.Stream()
        with torch.cuda.stream(main):
            y = ours(x)
            forward = len(streams)
            gx, gw, gb = torch.autograd.grad(y, [x, layer.weight, layer.bias], dy)
        main.synchronize()  # only the stream the step ran on
        tol = DType(dtype).rel_tol
        assert _rel(gx, x64.grad) < tol and _rel(gw, w64.grad) < tol and _rel(gb, b64.grad) < tol
        problems = linear_problems(67, 520, 264, DType(dtype), True)
        assert all(_ran(kernels, p, x.device) != "torch" for p in problems.values())
        backward = streams[forward:]
        del streams[:]
        assert backward
        side = kernels._side[x.device.index or 0].cuda_stream if overlap else None
        if overlap:
            assert side in backward and main.cuda_stream in backward  # dW there, dX here
        else:
            assert set(backward) == {main.cuda_stream} and not kernels._side


def test_no_grad_and_autocast():
    from codegen.nn import Linear, kernels_from

    kernels = kernels_from(SeedKernels())
    torch.manual_seed(5)
    layer = torch.nn.Linear(136, 72, device="cuda")
    ours = Linear.from_linear(layer, kernels)
    x = torch.randn(33, 136, device="cuda")
    want = torch.nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
    with torch.no_grad():
        y = ours(x)
    assert not y.requires_grad and _rel(y, want) < DType.fp32.rel_tol
    with torch.autocast("cuda", dtype=torch.bfloat16):
        yb = ours(x.requires_grad_())
    assert yb.dtype == torch.bfloat16 and _rel(yb, want) < DType.bf16.rel_tol
    bf16 = linear_problems(33, 136, 72, DType.bf16, True)[Layout.forward]
    assert kernels.used(bf16, x.device) == SeedKernels().spec_for(bf16).name
    yb.float().sum().backward()  # gradients reach the fp32 weight through the cast
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32


def test_a_small_mlp_trains_like_nn_linear():
    """200 SGD steps of a 3-layer MLP on a fixed regression task, gemmscape layers against
    nn.Linear from the same initialisation: every step's loss within 2% of nn.Linear's, the final
    one within 1%, and the loss falls by more than half (so the comparison is of a real training)."""
    from codegen.nn import kernels_from, replace_linear

    def mlp():
        torch.manual_seed(7)
        return torch.nn.Sequential(torch.nn.Linear(40, 128), torch.nn.Tanh(), torch.nn.Linear(128, 128),
                                   torch.nn.Tanh(), torch.nn.Linear(128, 24)).cuda()

    torch.manual_seed(8)
    x = torch.randn(96, 40, device="cuda")
    target = torch.sin(x @ torch.randn(40, 24, device="cuda"))
    kernels = kernels_from(SeedKernels())
    curves = []
    for model in (mlp(), replace_linear(mlp(), kernels)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for _ in range(200):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    ref, ours = curves
    assert ref[-1] < 0.5 * ref[0]
    assert max(abs(a - b) / a for a, b in zip(ref, ours, strict=True)) < 0.02
    assert abs(ref[-1] - ours[-1]) / ref[-1] < 0.01
    for fin, fout in ((40, 128), (128, 128), (128, 24)):
        assert _ran(kernels, linear_problems(96, fin, fout, DType.fp32, True)[Layout.forward], x.device) != "torch"


@pytest.mark.parametrize("batch,fin,fout,dtype", [(32, 4096, 4096, "bf16"), (4097, 4093, 4095, "bf16"),
                                                  (32, 4096, 4096, "fp16")])
def test_kernels_searched_on_the_h200_run_from_their_bundle(tmp_path, batch, fin, fout, dtype):
    """The fastest kernels of the committed H200 tensor-core searches (tests/fixtures/
    tensorcore-...043328Z.db.gz), exported as a bundle: their stored source runs in the layer."""
    import gzip
    import shutil
    from pathlib import Path

    from codegen import cli
    from codegen.nn import Linear

    if torch.cuda.get_device_name() != "NVIDIA H200":
        pytest.skip(f"the bundle's kernels were tuned on an NVIDIA H200, not a {torch.cuda.get_device_name()}")
    gz = Path(__file__).resolve().parents[2] / "tests/fixtures/tensorcore-NVIDIA_H200-2026-12-01T043328Z.db.gz"
    with gzip.open(gz) as src, open(tmp_path / "s.db", "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert cli.main(["export", "--bundle", str(tmp_path / "b"), "--db", f"sqlite:///{tmp_path / 's.db'}"]) == 0
    tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    torch.manual_seed(9)
    layer = torch.nn.Linear(fin, fout, bias=False, device="cuda", dtype=tdtype)
    ours = Linear.from_linear(layer, tmp_path / "b")
    x = torch.randn(batch, fin, device="cuda", dtype=tdtype)
    _poison_allocator((batch, fout), dtype=tdtype)
    with torch.no_grad():
        y = ours(x)
    want = x.double() @ layer.weight.double().t()
    assert _rel(y, want) < DType(dtype).rel_tol
    problem = linear_problems(batch, fin, fout, DType(dtype), False)[Layout.forward]
    assert _ran(ours.kernels, problem, x.device).startswith(f"tc_{dtype}_nobias")


@pytest.mark.parametrize("dtype,families", [("fp32", None), ("bf16", {"bf16": ("hopper", "tensorcore")})])
def test_cached_kernels_follow_new_tensors_batches_and_threads(dtype, families):
    """codegen.nn's per-call cache (kernels looked up per GEMM, launch steps prepared once): alternating
    batch sizes, fresh NaN-poisoned outputs and new inputs on every call, one call from a new thread
    (no context current there) and one on a side stream; forward and gradients each against float64.
    The bf16 forward takes the Hopper seed (tensor maps over new operands each call); every GEMM runs
    a gemmscape kernel."""
    import threading

    from codegen.nn import Linear, kernels_from

    td = TORCH[dtype]
    kernels = kernels_from(SeedKernels(families))
    torch.manual_seed(11)
    layer = torch.nn.Linear(136, 72, device="cuda", dtype=td)
    ours = Linear.from_linear(layer, kernels)
    bound = DType(dtype).rel_tol

    def check(batch: int, seed: int) -> None:
        torch.manual_seed(seed)
        _poison_allocator((batch, 72), (batch, 136), (72, 136), dtype=td)
        x = torch.randn(batch, 136, device="cuda", dtype=td, requires_grad=True)
        dy = torch.randn(batch, 72, device="cuda", dtype=td)
        y = ours(x)
        dx, dw, db = torch.autograd.grad(y, [x, layer.weight, layer.bias], dy)
        x64, w64, dy64 = x.detach().double(), layer.weight.detach().double(), dy.double()
        for got, want in ((y, x64 @ w64.T + layer.bias.detach().double()), (dx, dy64 @ w64), (dw, dy64.T @ x64),
                          (db, dy64.sum(0))):
            assert _rel(got, want) <= bound, (batch, seed)

    for i, batch in enumerate((257, 40, 257, 40, 300)):
        check(batch, 20 + i)
    errors = []
    worker = threading.Thread(target=lambda: errors.append(None) if check(40, 30) is None else None)
    worker.start()
    worker.join()
    assert errors == [None]  # check() raised nothing on the new thread
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        check(257, 31)
    torch.cuda.synchronize()
    for batch in (257, 40, 300):
        for layout, problem in linear_problems(batch, 136, 72, DType(dtype), True).items():
            assert _ran(kernels, problem, torch.device("cuda:0")) != "torch", (batch, layout)


def test_pick_step_writes_a_bundle_of_kernels_that_run_the_step(tmp_path):
    """Two kernels benched per GEMM of a small layer; ``codegen pick-step`` times the train step with each,
    writes a bundle of its picks and the timings; the bundle's layer matches float64."""
    import json

    from codegen import cli
    from codegen.families.simt import Spec as SimtSpec
    from codegen.nn import Linear

    batch, fin, fout = 40, 96, 80
    url = f"sqlite:///{tmp_path / 's.db'}"
    problems = linear_problems(batch, fin, fout, DType.fp32, True)
    tiles = [dict(bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4), dict(bm=32, bn=32, bk=16, wm=16, wn=32, tm=4, tn=4)]
    for layout, problem in problems.items():
        for t in tiles:
            spec = SimtSpec(bias=problem.bias, layout=layout, **t,
                            **({"split_k": 2, "reduce": "last"} if layout is Layout.grad_input else {}))
            assert not spec.check(problem), spec.check(problem)
            assert cli.main(["bench", "--kernel", spec.name, "--m", str(problem.m), "--n", str(problem.n),
                             "--k", str(problem.k), *(["--bias"] if problem.bias else []), "--layout", layout.value,
                             "--db", url, "--no-baseline"]) == 0
    bundle = tmp_path / "b"
    assert cli.main(["pick-step", "--batch", str(batch), "--in", str(fin), "--out", str(fout), "--bias",
                     "--bundle", str(bundle), "--candidates", "2", "--reps", "5", "--db", url]) == 0
    doc = json.loads((bundle / "step-pick.json").read_text())
    assert len(doc["trials"]) == 4 and all(t["status"] == "ok" for t in doc["trials"])  # the store's pick + one per GEMM
    assert doc["final"]["chosen"]["median_us"] > 0 and set(doc["chosen"]) == {lay.value for lay in Layout}
    torch.manual_seed(1)
    base = torch.nn.Linear(fin, fout, device="cuda")
    ours = Linear.from_linear(base, bundle)
    x = torch.randn(batch, fin, device="cuda", requires_grad=True)
    y = ours(x)
    dy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, [x, base.weight, base.bias], dy)
    x64, w64, dy64 = x.double(), base.weight.double(), dy.double()
    for got, want in ((y, x64 @ w64.T + base.bias.double()), (dx, dy64 @ w64), (dw, dy64.T @ x64), (db, dy64.sum(0))):
        assert _rel(got, want) < DType.fp32.rel_tol
    assert {lay.value: ours.kernels.used(problems[lay], x.device) for lay in Layout} == doc["chosen"]
