"""benchmarks.sparse_model on the CPU: its arguments, records, checks, the alternating rounds, the static
cache's handling across transformers releases, the decoder-layers step and its stand-in without GEMMs,
how docs/measurements.md renders its records, and with transformers installed a whole --tiny run on the
CPU (every GEMM on torch there: the final hidden states and gradients of the pruned model equal its
dense twin's)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from benchmarks import sparse_model as bench


def test_the_defaults_are_llama_3_8b_dims_pruned_in_the_mlp():
    args = bench.parse([])
    assert (args.layers, args.vocab, args.tokens, args.context, args.dtype) == (2, 32000, 2048, 1024, "bf16")
    assert args.densities == [0.25, 0.1] and args.block == 64 and args.prune == "mlp"
    assert args.decode_batches == [1, 16] and args.engine_batches == [1, 16, 64]
    assert args.phases == ["decode", "prefill", "train", "engine"] and args.rounds >= 6 and args.reps >= args.rounds
    assert args.train_layer == "model.layers.0.mlp.up_proj"
    tiny = bench.parse(["--tiny", "--device", "cpu", "--context", "8"])
    assert (tiny.block, tiny.vocab, tiny.tokens, tiny.context) == (16, 128, 32, 8)


@pytest.mark.parametrize("argv,needle", [
    (["--rounds", "5"], "--rounds at least 6"),
    (["--reps", "4"], "--reps at least --rounds"),
    (["--densities", "0"], "--densities lie in (0, 1]"),
    (["--decode-batches", "0"], "--decode-batches must be at least 1"),
    (["--device", "cpu"], "only with --tiny"),
    (["--bundle", "b", "--seeds", "direct"], "not allowed with argument"),
    (["--block", "48"], "invalid choice"),
])
def test_usage_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse(argv)
    assert stop.value.code == 2 and needle in capsys.readouterr().err


def test_a_model_record_has_the_ratio_to_the_dense_twin_only_where_every_check_passed():
    args = bench.parse([])
    prob = bench.problem(args, "decode", 0.25, 16, 1)
    assert prob == {"model": "llama3-8b-dims", "layers": 2, "phase": "decode", "batch": 16, "tokens": 1,
                    "dtype": "bf16", "density": 0.25, "block": 64, "scope": "decoder layers (no embedding, no lm_head)"}
    assert bench.problem(args, "prefill", 0.1, 1, 2048)["scope"] == prob["scope"]
    assert "scope" not in bench.problem(args, "train", 0.1, 1, 2048, layer="model.layers.0.mlp.down_proj")
    gemms = {"ours": {"16x14336x4096_bf16_forward_bsr64_d0.25_abcd1234": "dr_a"}, "torch": {}, "verdicts": {}}
    r = bench.record(prob, [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], "graph", gemms, {"hidden": {"ok": True}})
    assert r["ratio"]["dense"] == pytest.approx(2.5) and r["timing"] == "graph" and "non_gemm" not in r
    assert r["ours"]["kernel"] == "dr_a" and r["ours"]["status"] == "ok" and r["baselines"]["dense"]["median_ms"] == 5.0
    bad = bench.record(prob, [1.0], [4.0], "graph", gemms, {"y": {"ok": True}, "dx": {"ok": False}})
    assert bad["ratio"]["dense"] is None and bad["ours"]["status"] == "wrong_result"
    assert "WRONG" in bench.line(bad) and "2.50x" in bench.line(r)


def test_the_non_gemm_part_is_recorded_beside_the_baseline_not_as_one():
    args = bench.parse([])
    gemms = {"ours": {}, "torch": {}, "verdicts": {}}
    r = bench.record(bench.problem(args, "decode", 0.25, 1, 1), [2.0], [4.0], "graph", gemms, {"hidden": {"ok": True}},
                     non_gemm=[1.0, 1.0, 1.0])
    assert list(r["baselines"]) == ["dense"] and list(r["ratio"]) == ["dense"] and r["ratio"]["dense"] == 2.0
    rest = r["non_gemm"]
    assert rest["median_ms"] == 1.0 and {"p20_ms", "p80_ms"} <= set(rest) and "without a GEMM" in rest["what"]
    assert rest["gemm_share_dense"] == pytest.approx(0.75) and rest["gemm_share_ours"] == pytest.approx(0.5)
    assert "non-GEMM 1000.0 us (GEMM share: dense 75%, ours 50%)" in bench.line(r)
    bad = bench.record(bench.problem(args, "decode", 0.25, 1, 1), [2.0], [4.0], "graph", gemms,
                       {"hidden": {"ok": False}}, non_gemm=[1.0])
    assert bad["non_gemm"]["gemm_share_ours"] is None and bad["non_gemm"]["gemm_share_dense"] == pytest.approx(0.75)
    assert "WRONG" in bench.line(bad) and "dense 75%)" in bench.line(bad)


def test_checks_pass_within_bf16_rounding_and_fail_past_it_or_on_nan():
    torch = pytest.importorskip("torch")
    from benchmarks import sparse_phases as ph

    ref = torch.randn(4, 64, dtype=torch.bfloat16)
    assert ph.check(ref, ref.clone())["bit_identical"] and ph.check(ref, ref.clone())["ok"]
    near = ref.float() * (1 + 2 ** -8)
    got = ph.check(ref, near.to(torch.bfloat16))
    assert got["ok"] and got["rel_error"] < 1e-2
    far = ref.clone()
    far[0, 0] += 10 * ref.float().abs().max().to(torch.bfloat16)
    assert not ph.check(ref, far)["ok"]
    nan = ref.clone()
    nan[1, 1] = float("nan")
    assert not ph.check(ref, nan)["finite"] and not ph.check(ref, nan)["ok"]


def test_each_side_goes_first_in_half_the_rounds():
    pytest.importorskip("torch")
    from benchmarks import sparse_phases as ph

    order = []
    times = ph.alternate({"dense": lambda: order.append("d"), "ours": lambda: order.append("o")}, 12, 6, cuda=False)
    assert len(times["dense"]) == len(times["ours"]) == 12
    starts = [order[i] for i in range(0, len(order), 6)]  # 6 rounds, each 2 sides x (1 untimed + 2 timed)
    assert starts == ["d", "o"] * 3


def test_the_kernel_profile_keeps_gpu_kernels_per_step_longest_first():
    from types import SimpleNamespace as E

    from benchmarks import sparse_phases as ph

    events = [E(key="aten::mm", device_type="DeviceType.CPU", device_time_total=900.0, count=20),  # its kernels' sum
              E(key="hsp24_fwd", device_type="DeviceType.CUDA", device_time_total=400.0, count=10),
              E(key="gemm_dx", device_type="DeviceType.CUDA", device_time_total=1200.0, count=10),
              E(key="memset", device_type="DeviceType.CUDA", device_time_total=30.0, count=20),
              E(key="idle", device_type="DeviceType.CUDA", device_time_total=0.0, count=1)]
    got = ph.per_kernel(events, steps=10, top=2)
    assert [k["kernel"] for k in got["kernels"]] == ["gemm_dx", "hsp24_fwd"]
    assert got["kernels"][0] == {"kernel": "gemm_dx", "us_per_step": 120.0, "calls_per_step": 1.0}
    assert got["others_us"] == 3.0 and got["total_us"] == 163.0


def test_rewind_sets_each_cache_layer_back_to_the_context():
    torch = pytest.importorskip("torch")
    from benchmarks import sparse_phases as ph

    tensor_layer = SimpleNamespace(cumulative_length=torch.tensor(17))
    int_layer = SimpleNamespace(cumulative_length_int=9, cumulative_length=3)
    ph.rewind(SimpleNamespace(layers=[tensor_layer, int_layer]), 16)
    assert int(tensor_layer.cumulative_length) == 16 and int_layer.cumulative_length_int == 16
    assert int_layer.cumulative_length == 16
    ph.rewind(SimpleNamespace(), 16)  # transformers 4: the cache position given is the slot, nothing to rewind


def test_a_static_cache_that_takes_no_argument_set_is_one_line(monkeypatch):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from benchmarks import sparse_phases as ph

    class Picky:
        def __init__(self, **kwargs):
            raise TypeError(f"unexpected {sorted(kwargs)[0]}\nmore")

    monkeypatch.setattr(transformers, "StaticCache", Picky)
    with pytest.raises(ph.DecodeError) as e:
        ph.static_cache(SimpleNamespace(config=None), 1, 8, "cpu", None)
    assert "takes none of the argument sets tried" in str(e.value) and "\n" not in str(e.value)


def test_the_gemm_report_names_what_ran_for_each_pruned_layer():
    torch = pytest.importorskip("torch")
    from codegen import sparse
    from codegen.nn.sparse import BlockSparseLinear
    from codegen.problem import Layout

    layer = BlockSparseLinear(64, 96, sparse.Pattern.random(96, 64, 16, 0.5, seed=1), bias=False,
                              dtype=torch.bfloat16)
    problems = layer.problems(8)

    class Kernels:
        source = None
        fallbacks = {(problems[Layout.grad_weight].key, "cpu"): "no kernel"}

        def used(self, problem, device):
            return {Layout.forward: "dr_k", Layout.grad_input: "torch: cuBLAS won (ratio 0.9)"}.get(problem.layout)

    cpu = torch.device("cpu")
    decode = bench.gemm_report(Kernels(), {"l": layer}, "decode", 8, cpu)
    assert decode == {"ours": {problems[Layout.forward].key: "dr_k"}, "torch": {}, "verdicts": {}}
    train = bench.gemm_report(Kernels(), {"l": layer}, "train", 8, cpu)
    assert train["torch"] == {problems[Layout.grad_input].key: "cuBLAS won (ratio 0.9)",
                              problems[Layout.grad_weight].key: "no kernel"}


def test_the_gemm_report_gives_each_gemm_s_verdict_from_a_bundle(tmp_path):
    torch = pytest.importorskip("torch")
    from codegen import sparse
    from codegen.nn import verdict as V
    from codegen.nn.bundle import BUNDLE_FORMAT, Bundle
    from codegen.nn.sparse import BlockSparseLinear
    from codegen.problem import Layout

    layer = BlockSparseLinear(64, 96, sparse.Pattern.random(96, 64, 16, 0.5, seed=2), bias=False,
                              dtype=torch.bfloat16)
    forward = layer.problem(Layout.forward, 4, "bf16")
    verdict = V.judge(1.0, 3.0, "engine", forward).to_dict()
    entry = {"problem": forward.to_dict(), "key": forward.key, "device": "cpu", "median_ms": 1.0, "verdict": verdict}
    (tmp_path / "index.json").write_text(json.dumps({"format": BUNDLE_FORMAT, "kernels": [entry]}))

    class Kernels:
        source, fallbacks = Bundle(tmp_path), {}

        def used(self, problem, device):
            return "dr_k"

    got = bench.gemm_report(Kernels(), {"l": layer}, "decode", 4, torch.device("cpu"))
    assert got["verdicts"] == {forward.key: verdict} and verdict["winner"] == "ours"


def test_the_model_is_built_on_the_cpu_as_codegen_prune_builds_it():
    """The benchmark prunes weights built on the CPU, as `codegen prune benchmarks/model.py:...` calls the
    factory (torch's default device): the same seed gives the same weights, so the same patterns."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks.model import build, config_dict

    cfg = config_dict(1, 64, tiny=True)
    a, b = build(cfg, seed=3, device="cpu").state_dict(), build(cfg, seed=3).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _ops(step):
    """The aten ops ``step()`` runs (by name), and its output."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with Ops() as ops:
        out = step()
    return ops.names, out


def test_the_decoder_layers_step_and_its_stand_in_without_gemms():
    """decode_call and prefill_call time the base model on precomputed embeddings (no embedding lookup, no
    lm_head: hidden states out); the stand-in model runs the same steps with every linear layer of its
    decoder layers a NoGemmLinear (called, zeros of the right shape) and no matrix product left but attention's."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks import sparse_phases as ph
    from benchmarks.model import build, config_dict

    cpu = torch.device("cpu")
    dense = build(config_dict(2, 128, tiny=True), seed=0, device="cpu")
    stub, stubs = ph.no_gemm_model(dense, cpu)
    assert len(stubs) == 14 and all(isinstance(s, ph.no_gemm_stub()) for s in stubs.values())
    assert {n.rsplit(".", 1)[1] for n in stubs} == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                     "down_proj"}
    assert not any(isinstance(m, torch.nn.Linear) for m in stub.model.layers.modules())
    assert isinstance(stub.lm_head, torch.nn.Linear) and isinstance(dense.model.layers[0].mlp.up_proj, torch.nn.Linear)
    assert stubs["model.layers.0.mlp.up_proj"].out_features == 224
    gemm = {"aten.mm", "aten.addmm", "aten.linear", "aten.matmul", "aten.bmm"}
    for make, shape in ((lambda m: ph.decode_call(m, 2, 8, 128, cpu, 0), (2, 1, 64)),
                        (lambda m: ph.prefill_call(m, 16, 128, cpu, 0), (1, 16, 64))):
        head = dense.lm_head.forward
        dense.lm_head.forward = lambda *a: pytest.fail("the lm_head is not part of the step")
        try:
            ops, out = _ops(make(dense))
        finally:
            dense.lm_head.forward = head
        assert tuple(out.shape) == shape and out.dtype == torch.bfloat16 and "aten.mm" in ops
        before = {n: s.calls for n, s in stubs.items()}
        ops, got = _ops(make(stub))
        assert tuple(got.shape) == shape and got.dtype == torch.bfloat16 and bool(torch.isfinite(got).all())
        assert not ops & gemm, ops & gemm
        assert all(s.calls > before[n] for n, s in stubs.items())
    step = ph.decode_call(dense, 2, 8, 128, cpu, 0)
    assert torch.equal(step(), step())  # the cache rewound: the same slot each call
    zeros = ph.no_gemm_stub()(8, 5)(torch.ones(3, 2, 8, dtype=torch.float16))
    assert zeros.shape == (3, 2, 5) and zeros.dtype == torch.float16 and not zeros.any()


def test_a_tiny_run_on_the_cpu(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers", reason="benchmarks.sparse_model builds its model with HF transformers")
    pytest.importorskip("safetensors")
    from codegen.nn.pruned import read_patterns

    code = bench.main(["--tiny", "--device", "cpu", "--reps", "2", "--rounds", "2", "--context", "8",
                       "--write-pruned", str(tmp_path / "pruned"), "--out", str(tmp_path)])
    assert code == 0
    [path] = tmp_path.glob("sparse_model-cpu-*.json")
    doc = json.loads(path.read_text())
    assert doc["suite"] == "sparse_model" and "transformers" in doc["versions"] and doc["pruned"]["block"] == 16
    phases = [(r["problem"]["density"], r["problem"]["phase"], r["problem"]["batch"]) for r in doc["records"]]
    assert phases == [(d, p, b) for d in (0.25, 0.1) for p, b in (("decode", 1), ("decode", 16), ("prefill", 1),
                                                                   ("train", 1))]
    assert doc["scope"]["decode"] == doc["scope"]["prefill"] == "decoder layers (no embedding, no lm_head)"
    assert "final RMSNorm" in doc["scope"]["how"]
    for r in doc["records"]:
        assert r["ratio"]["dense"] is not None and r["ours"]["status"] == "ok" and list(r["baselines"]) == ["dense"]
        assert all(c["bit_identical"] for c in r["ours"]["check"].values())  # torch on both sides: the same W
        assert r["ours"]["gemms"]["ours"] == {} and all("CUDA GPUs" in why for why in r["ours"]["gemms"]["torch"].values())
    decode, prefill, train = doc["records"][0], doc["records"][2], doc["records"][3]
    assert decode["timing"] == "eager" and decode["ours"]["note"] == "no CUDA graphs on the CPU"
    for r in (decode, prefill):
        assert r["problem"]["scope"] == "decoder layers (no embedding, no lm_head)" and set(r["ours"]["check"]) == {"hidden"}
        rest = r["non_gemm"]
        assert rest["median_ms"] > 0 and rest["gemm_share_dense"] == pytest.approx(
            1 - rest["median_ms"] / r["baselines"]["dense"]["median_ms"])
        assert rest["gemm_share_ours"] == pytest.approx(1 - rest["median_ms"] / r["ours"]["median_ms"])
    assert "non_gemm" not in train and "scope" not in train["problem"]
    assert len(decode["ours"]["gemms"]["torch"]) == 6  # gate, up and down of 2 layers, each its own pattern
    assert train["problem"]["layer"] == "model.layers.0.mlp.up_proj" and train["problem"]["layers"] == 1
    assert set(train["ours"]["check"]) == {"y", "dx", "dw_kept_blocks"} and len(train["ours"]["gemms"]["torch"]) == 3
    queued = train["back_to_back"]
    assert queued["steps_per_sample"] == bench.TRAIN_QUEUED and queued["ours"]["median_ms"] > 0
    assert queued["ratio_dense"] == pytest.approx(queued["dense"]["median_ms"] / queued["ours"]["median_ms"])
    written = read_patterns(tmp_path / "pruned" / "pruned-d0.25.safetensors")
    assert {p.hash[:8] for p, _ in written.values()} == {k.rsplit("_", 1)[1] for k in decode["ours"]["gemms"]["torch"]}
    out = capsys.readouterr().out
    assert "engine: needs a GPU" in out and "wrote" in out and "non-GEMM" in out


def test_measurements_render_the_records_in_the_model_and_engine_tables(tmp_path):
    from benchmarks import measurements

    stats = {"median_ms": 0.01, "p20_ms": 0.009, "p80_ms": 0.011}
    model_rec = {"problem": {"model": "llama3-8b-dims", "layers": 2, "phase": "decode", "batch": 16, "tokens": 1,
                             "dtype": "bf16", "density": 0.1, "block": 64}, "timing": "graph",
                 "ours": {**stats, "gemms": {"ours": {"a": "k"}, "torch": {}}, "check": {"logits": {
                     "max_abs_diff": 0.004, "bit_identical": False, "ok": True}}},
                 "baselines": {"dense": {**stats, "median_ms": 0.03}}, "ratio": {"dense": 3.0}}
    engine_rec = {"problem": {"m": 16, "n": 14336, "k": 4096, "dtype": "bf16", "layout": "forward", "bias": False,
                              "block": 64, "density": 0.1, "pattern": "abcd" * 4}, "timing": "engine",
                  "ours": {**stats, "ran": "dr_k"}, "baselines": {"cublas": {**stats, "median_ms": 0.05}},
                  "ratio": {"cublas": 5.0}}
    doc = {"suite": "sparse_model", "device": "NVIDIA H200", "date": "2026-12-06T000000Z",
           "records": [model_rec, engine_rec]}
    (tmp_path / "sparse_model-NVIDIA_H200-2026-12-06T000000Z.json").write_text(json.dumps(doc))
    table = measurements.model(tmp_path, "base")
    row = next(line for line in table.splitlines() if "decode" in line)
    assert "decode 16×1, blocks of 64 at density 0.1" in row and "max diff 0.004" in row
    assert "3.00×" in row and "graph (whole model)" in row
    model_rec["problem"]["scope"] = "decoder layers (no embedding, no lm_head)"
    model_rec["non_gemm"] = {**stats, "gemm_share_dense": 0.6, "gemm_share_ours": 0.1}
    scoped = tmp_path / "scoped"  # a folder of its own: measurements reads each file once
    scoped.mkdir()
    (scoped / "sparse_model-NVIDIA_H200-2026-12-06T000000Z.json").write_text(json.dumps(doc))
    row = next(line for line in measurements.model(scoped, "base").splitlines() if "decode" in line)
    assert "graph (decoder layers)" in row and "3.00×" in row
    model_rec["back_to_back"] = {"steps_per_sample": 10, "ours": stats, "dense": {**stats, "median_ms": 0.02},
                                 "ratio_dense": 2.0}
    queued = tmp_path / "queued"
    queued.mkdir()
    (queued / "sparse_model-NVIDIA_H200-2026-12-06T000000Z.json").write_text(json.dumps(doc))
    rows = [line for line in measurements.model(queued, "base").splitlines() if "decode" in line]
    assert len(rows) == 2 and "back to back" not in rows[0] and "3.00×" in rows[0]
    assert "back to back" in rows[1] and "2.00×" in rows[1] and "10 steps a sample" in rows[1]
    engine = measurements.engine(tmp_path, "base")
    row = next(line for line in engine.splitlines() if "14336" in line)
    assert "16×14336×4096, blocks of 64 at density 0.1" in row and "5.00×" in row and "`dr_k`" in row
    assert "decode" not in engine
