"""benchmarks/linear_train.py without a GPU: its cases, statistics, records (DESIGN.md format) and
table, from made-up timings (labelled as such); the GPU part is run on the device."""

from __future__ import annotations

import pytest

from benchmarks import linear_train as lt


def test_the_cases_cover_the_issue_s_grid():
    cs = lt.cases(lt.BATCHES, lt.DTYPES, lt.MODES)
    assert len(cs) == 8 and {(c.batch, c.dtype, c.mode) for c in cs} >= {(32, "bf16", "train"), (4096, "fp32", "forward")}
    assert all(c.bias and c.features == 4096 for c in cs)
    train = lt.Case(32, "bf16", "train")
    assert train.flops == 3 * lt.Case(32, "bf16", "forward").flops == 3 * 2.0 * 32 * 4096 * 4096
    assert train.problem() == {"m": 32, "n": 4096, "k": 4096, "dtype": "bf16", "layout": "train", "bias": True,
                               "density": 1.0, "block": None}


def test_stats_give_the_median_and_the_range():
    s = lt.stats([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s["median_ms"], s["min_ms"], s["max_ms"], s["reps"]) == (3.0, 1.0, 5.0, 5)
    assert s["p20_ms"] == 2.0 and s["p80_ms"] == 4.0


def test_a_record_says_which_gemm_ran_what():
    """Made-up timings: ours 0.1 ms, nn.Linear 0.25 ms."""
    case = lt.Case(32, "bf16", "train")
    gemms = {"forward": "tc_bf16_bias_x", "grad_input": "torch: no kernel", "grad_weight": "torch: no kernel"}
    r = lt.record(case, [0.1] * 10, [0.25] * 10, gemms, {"y": 1e-3}, "hand-picked")
    assert r["ratio"]["torch_linear"] == pytest.approx(2.5)
    assert r["baselines"]["torch_linear"]["median_ms"] == 0.25 and r["ours"]["median_ms"] == 0.1
    assert r["ours"]["kernel"] == "tc_bf16_bias_x" and r["ours"]["gemms"] == gemms
    assert r["ours"]["tflops"] == pytest.approx(case.flops / 1e-4 / 1e12)
    assert r["ours"]["search"] == {"sampler": None, "selection": "hand-picked"}
    line = lt.table([r]).splitlines()[1]
    assert "250.0" in line and "100.0" in line and "2.50" in line
    assert "forward: gemmscape, grad_input: torch, grad_weight: torch" in line


def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the benchmark would run")
    assert lt.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_outputs_past_the_dtype_bound_make_the_record_wrong_and_drop_its_ratio():
    """Made-up errors: bf16's bound against float64 is 1e-2; NaN never passes; torch's own error is
    recorded beside ours but never judged."""
    case = lt.Case(32, "bf16", "train")
    gemms = {"forward": "k", "grad_input": "k", "grad_weight": "k"}
    ok = lt.record(case, [0.1] * 5, [0.2] * 5, gemms, {"y": 3e-3, "dx": 9e-3, "y_torch_linear": 0.5}, "x")
    assert ok["ours"]["status"] == "ok" and ok["ratio"]["torch_linear"] == pytest.approx(2.0)
    bad = lt.record(case, [0.1] * 5, [0.2] * 5, gemms, {"y": 3e-3, "dw": 0.02, "db": float("nan")}, "x")
    assert bad["ours"]["status"] == "wrong_result: dw, db" and bad["ratio"]["torch_linear"] is None
    assert "WRONG_RESULT: DW, DB" in lt.table([bad]).splitlines()[1]


def test_the_float64_reference_is_the_layer_s_three_gemms():
    torch = pytest.importorskip("torch")
    x, w, b, dy = torch.randn(5, 7), torch.randn(3, 7), torch.randn(3), torch.randn(5, 3)
    ref = lt.reference(lt.Case(5, "fp32", "train", features=7), x, w, b, dy)
    assert list(ref) == ["y", "dx", "dw", "db"]
    assert torch.allclose(ref["y"], (x @ w.T + b).double(), atol=1e-5)
    assert torch.allclose(ref["dx"], (dy @ w).double(), atol=1e-5) and ref["dw"].shape == (3, 7)
    assert list(lt.reference(lt.Case(5, "fp32", "forward", features=7), x, w, None, dy)) == ["y"]


def test_graphs_add_cuda_graph_records_beside_the_eager_ones():
    """--graphs: each case timed as eager calls and as CUDA graph replays; a record says which, and the
    float64 gate judges both alike (made-up timings and errors)."""
    assert lt.timings(lt.parser().parse_args([])) == ("eager",)
    args = lt.parser().parse_args(["--graphs", "--batches", "32", "--modes", "train"])
    assert args.graphs and args.batches == [32] and lt.timings(args) == ("eager", "cuda_graph")
    case = lt.Case(32, "bf16", "train")
    gemms = {"forward": "k", "grad_input": "k", "grad_weight": "k"}
    eager = lt.record(case, [0.3] * 5, [0.2] * 5, gemms, {"y": 3e-3}, "x")
    graph = lt.record(case, [0.1] * 5, [0.2] * 5, gemms, {"y": 3e-3}, "x", "cuda_graph")
    wrong = lt.record(case, [0.1] * 5, [0.2] * 5, gemms, {"y": float("nan")}, "x", "cuda_graph")
    assert (eager["timing"], graph["timing"]) == ("eager", "cuda_graph")
    assert graph["ratio"]["torch_linear"] == pytest.approx(2.0) and eager["ratio"]["torch_linear"] == pytest.approx(2 / 3)
    assert wrong["ours"]["status"] == "wrong_result: y" and wrong["ratio"]["torch_linear"] is None
    lines = lt.table([eager, graph]).splitlines()
    assert "timing" in lines[0] and " eager " in lines[1] and " cuda_graph " in lines[2] and "2.00" in lines[2]


def test_train_records_say_how_the_backward_ran():
    """--backward: train records carry ``ours.backward`` (overlap or serial), forward records do not."""
    assert lt.parser().parse_args([]).backward == ["serial"]
    assert lt.parser().parse_args(["--backward", "overlap", "serial"]).backward == ["overlap", "serial"]
    with pytest.raises(SystemExit):
        lt.parser().parse_args(["--backward", "parallel"])
    gemms = {"forward": "k", "grad_input": "k", "grad_weight": "k"}
    train = lt.record(lt.Case(32, "fp32", "train"), [0.1] * 5, [0.2] * 5, gemms, {"y": 1e-7}, "x", "cuda_graph", "serial")
    forward = lt.record(lt.Case(32, "fp32", "forward"), [0.1] * 5, [0.2] * 5, {"forward": "k"}, {"y": 1e-7}, "x",
                        "eager", "serial")
    assert train["ours"]["backward"] == "serial" and "backward" not in forward["ours"]
    lines = lt.table([train, forward]).splitlines()
    assert "backward" in lines[0] and " serial " in lines[1] and " - " in lines[2]
