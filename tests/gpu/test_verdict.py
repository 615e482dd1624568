"""GPU tier of "never slower by choice": a bundle whose verdicts say cuBLAS won leaves the layer on
torch's op (plain F.linear, no autograd Function of ours) and ``ours_everywhere`` overrides it; engine
timing judges a real kernel and records the verdict in the bundle. The bundles are written here from
the families' built-in seeds (codegen.nn.bundle.SeedKernels) with the verdicts each test sets."""

from __future__ import annotations

import json

import pytest

from codegen.nn import verdict as V
from codegen.nn.bundle import BUNDLE_FORMAT, Bundle, SeedKernels, layer_shape
from codegen.problem import DType, Layout, linear_problems

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

BATCH, FIN, FOUT = 64, 128, 256


def _bundle(folder, problems, winners: dict) -> Bundle:
    """A bundle of the seeds' kernels for ``problems``, each with an engine/train-step verdict whose
    winner is ``winners[layout]`` (a made-up timing pair on either side of the margin)."""
    device = torch.cuda.get_device_name()
    seeds = SeedKernels()
    entries = []
    for layout, problem in problems.items():
        file = seeds.find(problem, device)
        assert not isinstance(file, str), file
        name = file.manifest["name"]
        (folder / problem.key).mkdir(parents=True)
        (folder / problem.key / f"{name}.cu").write_text(file.source)
        (folder / problem.key / f"{name}.json").write_text(json.dumps(file.manifest))
        cublas_ms = 1.1 if winners[layout] == "ours" else 0.95
        timing = "engine" if layout is Layout.forward else "train_step"
        verdict = V.judge(1.0, cublas_ms, timing, problem)
        assert verdict.winner == winners[layout]
        entries.append({"problem": problem.to_dict(), "key": problem.key, "layer": layer_shape(problem),
                        "dtype": problem.dtype.value, "layout": layout.value, "bias": problem.bias, "device": device,
                        "recorded": False, "kernel": name, "family": file.manifest["spec"]["family"],
                        "manifest": f"{problem.key}/{name}.json", "source": f"{problem.key}/{name}.cu",
                        "median_ms": 1.0, "tflops": 1.0, "verdict": verdict.to_dict(),
                        "verdicts": {timing: verdict.to_dict()}})
    (folder / "index.json").write_text(json.dumps({"format": BUNDLE_FORMAT, "kernels": entries, "skipped": []}))
    return Bundle(folder)


def _step(layer, x, dy):
    y = layer(x)
    return (y, *torch.autograd.grad(y, [x, layer.weight, layer.bias], dy)), y.grad_fn


def test_where_cublas_won_everywhere_the_layer_is_f_linear_and_ours_everywhere_overrides(tmp_path):
    from codegen.nn import Linear, kernels_from

    problems = linear_problems(BATCH, FIN, FOUT, DType.bf16, True)
    bundle = _bundle(tmp_path / "b", problems, {layout: "cublas" for layout in Layout})
    torch.manual_seed(0)
    base = torch.nn.Linear(FIN, FOUT, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(BATCH, FIN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(BATCH, FOUT, device="cuda", dtype=torch.bfloat16)
    want, want_fn = _step(base, x, dy)

    kernels = kernels_from(bundle)
    got, got_fn = _step(Linear.from_linear(base, kernels), x, dy)
    assert type(got_fn) is type(want_fn) and "LinearFunction" not in type(got_fn).__name__
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))  # nn.Linear's own ops: bit-identical
    for problem in problems.values():
        assert kernels.used(problem, x.device).startswith("torch: cuBLAS won (ratio 0.950 at margin 0.02, timing ")

    everywhere = kernels_from(bundle, ours_everywhere=True)
    mine, mine_fn = _step(Linear.from_linear(base, everywhere), x, dy)
    assert "LinearFunction" in type(mine_fn).__name__
    for problem in problems.values():
        assert everywhere.used(problem, x.device) == bundle.find(problem, torch.cuda.get_device_name()).manifest["name"]
    exact = [want[0].double(), *(t.double() for t in want[1:])]
    for name, a, b in zip(("y", "dx", "dw", "db"), mine, exact, strict=True):
        assert float((a.double() - b).norm() / b.norm()) < 2e-2, name


def test_a_forward_that_won_runs_ours_and_backward_gemms_that_lost_run_torch(tmp_path):
    from codegen.nn import Linear, kernels_from

    problems = linear_problems(BATCH, FIN, FOUT, DType.bf16, True)
    winners = {Layout.forward: "ours", Layout.grad_input: "cublas", Layout.grad_weight: "cublas"}
    kernels = kernels_from(_bundle(tmp_path / "b", problems, winners))
    torch.manual_seed(1)
    base = torch.nn.Linear(FIN, FOUT, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(BATCH, FIN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    _, fn = _step(Linear.from_linear(base, kernels), x, torch.randn(BATCH, FOUT, device="cuda", dtype=torch.bfloat16))
    assert "LinearFunction" in type(fn).__name__
    assert not kernels.used(problems[Layout.forward], x.device).startswith("torch")
    assert kernels.used(problems[Layout.grad_input], x.device).startswith("torch: cuBLAS won")
    assert kernels.used(problems[Layout.grad_weight], x.device).startswith("torch: cuBLAS won")
    with torch.no_grad():  # inference: the forward alone, ours
        assert Linear.from_linear(base, kernels)(x).shape == (BATCH, FOUT)


def test_engine_timing_judges_a_seed_kernel_and_records_the_verdict(tmp_path):
    from codegen.nn.timing import engine_candidates, engine_verdict, judge_in_engine_timing

    problems = linear_problems(16, 4096, 4096, DType.bf16, False)  # 32 MiB weights: copies past L2
    forward = {Layout.forward: problems[Layout.forward]}
    bundle = _bundle(tmp_path / "b", forward, {Layout.forward: "ours"})
    device = torch.cuda.get_device_name()
    entry = bundle.entries[0]
    entry["verdicts"] = {"cold_single": V.judge(1.0, 1.5, "cold_single", forward[Layout.forward]).to_dict()}
    entry["verdict"] = V.deciding(entry["verdicts"])
    bundle.save()
    bundle = Bundle(tmp_path / "b")
    assert engine_candidates(bundle, device) == [forward[Layout.forward]]
    verdict, status, timing = engine_verdict(forward[Layout.forward], bundle.find(forward[Layout.forward], device),
                                             reps=10, rounds=2)
    assert status == "ok" and verdict.timing == "engine" and verdict.winner in ("ours", "cublas")
    assert verdict.ours_ms > 0 and verdict.cublas_ms > 0 and not timing.wrong
    assert timing.engine["copies"] * timing.engine["weight_bytes"] >= 4 * timing.engine["l2_bytes"]
    judged = judge_in_engine_timing(bundle, say=lambda line: None)
    assert len(judged) == 1 and judged[0].verdict is not None
    back = Bundle(tmp_path / "b")
    assert back.find(forward[Layout.forward], device).verdict.timing == "engine"
    assert engine_candidates(back, device) == []
