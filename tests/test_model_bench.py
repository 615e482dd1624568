"""benchmarks.model on the CPU: its arguments, config, records and table (no transformers needed), and
with transformers installed a whole --tiny run on the CPU (every GEMM on torch's op there)."""

from __future__ import annotations

import json

import pytest

from benchmarks import model as bench


def test_the_defaults_are_llama_3_8b_dims_at_2048_tokens():
    args = bench.parse([])
    assert (args.layers, args.vocab, args.tokens, args.batch, args.dtype) == (2, 32000, 2048, 1, "bf16")
    assert args.phases == ["prefill", "train"] and not args.ours_everywhere and args.bundle is None
    cfg = bench.config_dict()
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == \
        (4096, 14336, 32, 8)
    assert cfg["num_hidden_layers"] == 2 and cfg["vocab_size"] == 32000 and not cfg["attention_bias"]


def test_tiny_takes_its_own_defaults_unless_given():
    args = bench.parse(["--tiny", "--device", "cpu"])
    assert (args.vocab, args.tokens) == (bench.TINY_DEFAULTS["vocab"], bench.TINY_DEFAULTS["tokens"])
    assert bench.parse(["--tiny", "--tokens", "8"]).tokens == 8
    assert bench.config_dict(3, 99, tiny=True)["hidden_size"] == 64


@pytest.mark.parametrize("argv,needle", [
    (["--tokens", "0"], "--tokens must be at least 1"),
    (["--device", "cpu"], "only with --tiny"),
    (["--phases", "decode"], "invalid choice"),
    (["--bundle", "b", "--db", "sqlite:///x.db"], "not allowed with argument"),
])
def test_usage_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse(argv)
    assert stop.value.code == 2 and needle in capsys.readouterr().err


def test_a_record_gives_the_ratio_to_the_dense_model_and_what_ran():
    args = bench.parse(["--bundle", "b"])
    gemms = {"ours": {"2048x4096x4096_bf16_forward": "hp_a"}, "torch": {"2048x1024x4096_bf16_forward": "cuBLAS won"}}
    check = {"max_abs_diff": 0.0, "bit_identical": True, "finite": True}
    r = bench.record(bench.problem(args, "prefill"), [10.0, 11.0, 12.0], [11.0, 12.0, 13.0], gemms, check,
                     {"path": "b", "verdicts": {"ours": 1}}, fallbacks=1)
    assert r["problem"] == {"model": "llama3-8b-dims", "layers": 2, "phase": "prefill", "batch": 1, "tokens": 2048,
                            "dtype": "bf16", "density": 1.0}
    assert r["timing"] == "eager" and r["ratio"]["dense"] == pytest.approx(12.0 / 11.0)
    assert r["ours"]["median_ms"] == 11.0 and r["baselines"]["dense"]["p80_ms"] == 13.0
    assert r["ours"]["kernel"] == "hp_a" and r["ours"]["fallbacks"] == 1 and r["ours"]["bundle"]["path"] == "b"
    assert r["ours"]["cublas_won"] == 1
    line = bench.table([r]).splitlines()[1]
    assert "prefill" in line and "1.091" in line and "bit-identical" in line
    bad = bench.record(bench.problem(args, "train"), [1.0], [1.0], gemms, {**check, "finite": False}, {}, 0)
    assert bad["ratio"]["dense"] is None and bad["ours"]["status"] == "wrong_result"


def test_the_gemm_report_names_ours_and_torch_with_the_reason():
    from codegen.nn.tune import LayerShape
    from codegen.problem import DType, Layout

    shape = LayerShape(8, 16, 32, DType.bf16, False)
    problems = shape.problems()

    class Kernels:
        fallbacks = {(problems[Layout.grad_weight].key, "cuda:0"): "no kernel"}

        def used(self, problem, device):
            return {Layout.forward: "k_fwd", Layout.grad_input: "torch: cuBLAS won (ratio 0.9)"}.get(problem.layout)

    prefill = bench.gemm_report(Kernels(), {shape: ["l"]}, "prefill", "cuda:0")
    assert prefill == {"ours": {problems[Layout.forward].key: "k_fwd"}, "torch": {}}
    train = bench.gemm_report(Kernels(), {shape: ["l"]}, "train", "cuda:0")
    assert train["torch"] == {problems[Layout.grad_input].key: "cuBLAS won (ratio 0.9)",
                              problems[Layout.grad_weight].key: "no kernel"}


def test_the_decode_factory_gives_the_engine_s_layers():
    pytest.importorskip("torch")
    from benchmarks.engine import LAYERS
    from codegen.nn.tune import linear_layers

    shapes = linear_layers(bench.llama3_8b_decode_layers(), 16)
    assert [(s.out_features, s.in_features) for s in shapes] == list(LAYERS)
    assert all(s.batch == 16 and s.dtype.value == "bf16" and not s.bias for s in shapes)


def test_a_tiny_run_on_the_cpu(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers", reason="benchmarks.model builds its model with HF transformers")
    code = bench.main(["--tiny", "--device", "cpu", "--reps", "2", "--rounds", "1", "--out", str(tmp_path)])
    assert code == 0
    [path] = tmp_path.glob("model-cpu-*.json")
    doc = json.loads(path.read_text())
    assert doc["suite"] == "model" and doc["device"] == "cpu" and "transformers" in doc["versions"]
    assert [r["problem"]["phase"] for r in doc["records"]] == ["prefill", "train"]
    for r in doc["records"]:
        assert r["ours"]["check"]["bit_identical"] and r["ours"]["gemms"]["ours"] == {}
        assert all("CUDA GPUs" in why for why in r["ours"]["gemms"]["torch"].values())
    assert len(doc["records"][1]["ours"]["gemms"]["torch"]) == 3 * len(doc["records"][0]["ours"]["gemms"]["torch"])
    assert "bit-identical" in capsys.readouterr().out


def test_tune_model_takes_the_factory(capsys, monkeypatch):
    """codegen tune-model benchmarks/model.py:llama3_8b_dims (run_tuning REPLACED: what would be tuned)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pathlib import Path

    from codegen import cli, worker
    from codegen.cli import layer as cli_layer

    seen = {}
    monkeypatch.setattr(cli_layer, "run_tuning", lambda args, problems: seen.setdefault("p", problems) and 0)
    monkeypatch.setattr(worker, "require_gpu", lambda: None)  # REPLACED: no GPU here, and none is used
    path = Path(bench.__file__)
    assert cli.main(["tune-model", f"{path}:llama3_8b_dims", "--batch", "2048", "--family", "hopper"]) == 0
    assert "15 linear layers, 5 distinct shapes at batch 2048" in capsys.readouterr().err
    assert len(seen["p"]) == 15


def test_measure_lets_each_side_go_first_in_half_the_rounds(monkeypatch):
    """A fixed order would time the second side hotter (clocks fall under sustained load): the rounds
    alternate which model is timed first."""
    torch = pytest.importorskip("torch")
    from benchmarks import model as bench

    order = []
    monkeypatch.setattr(bench, "step_fn", lambda m, ids, phase: lambda: order.append(m))
    ours, dense = bench.measure("dense", "ours", torch.zeros(1, 2, dtype=torch.long), "prefill", reps=4, rounds=4)
    assert len(ours) == len(dense) == 4
    assert order[2:] == ["dense", "ours", "ours", "dense", "dense", "ours", "ours", "dense"]  # after one warm-up each
