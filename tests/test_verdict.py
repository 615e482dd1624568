"""CPU tier of "never slower by choice": the one rule that says whether ours beat cuBLAS
(codegen.nn.verdict), the verdicts a bundle's index keeps and reads back (old bundles without them
too), engine-timing verdicts recorded into a bundle (the harness REPLACED where marked: no GPU here),
the layer's choice between ours and torch's op with a fake kernel source, and the options and flags."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from codegen import cli
from codegen.nn import verdict as V
from codegen.nn.bundle import Bundle, KernelFile, verdict_summary, write_bundle
from codegen.problem import DType, Layout, Problem, linear_problems

BIG = Problem(256, 64, 64)  # forward, 256 rows: a cold single call decides
SKINNY = Problem(64, 64, 64)  # forward, 64 rows: engine timing decides a win of ours
DEVICE = {"name": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04", "nvrtc": "13.0"}
RECORDING = Path(__file__).resolve().parents[1] / "search/recordings/replay-simt-skinny-32x4096x4096-fp32.json"


# ---- the rule ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ours,cublas,winner", [
    (1.0, 1.03, "ours"),      # 3% ahead: past the 2% margin
    (1.0, 1.02, "cublas"),    # exactly at 1 + margin: not past it, a tie goes to cuBLAS
    (1.0, 1.015, "cublas"),   # ahead, but within the noise
    (1.0, 0.9, "cublas"),
    (1.0, None, "unknown"),   # no baseline measured
    (None, 1.0, "unknown"),
    (0.0, 1.0, "unknown"),
])
def test_ours_wins_only_past_one_plus_the_margin(ours, cublas, winner):
    v = V.judge(ours, cublas, "cold_single", BIG)
    assert v.winner == winner and v.margin == V.MARGIN == 0.02
    assert v.ratio == (pytest.approx(cublas / ours) if winner != "unknown" else None)
    if winner == "unknown":
        assert v.note


def test_the_margin_is_an_argument_and_is_checked():
    assert V.judge(1.0, 1.005, "engine", margin=0.0).winner == "ours"
    assert V.judge(1.0, 1.05, "engine", margin=0.1).winner == "cublas"
    with pytest.raises(ValueError, match="margin"):
        V.judge(1.0, 1.0, "engine", margin=-0.1)
    with pytest.raises(ValueError, match="timing 'warm'"):
        V.judge(1.0, 1.0, "warm")


def test_a_cold_single_win_of_ours_at_few_rows_is_unknown_but_a_cublas_win_stands():
    v = V.judge(1.0, 1.5, "cold_single", SKINNY)
    assert v.winner == "unknown" and "engine timing" in v.note
    assert V.judge(1.0, 0.8, "cold_single", SKINNY).winner == "cublas"
    assert V.judge(1.0, 1.5, "engine", SKINNY).winner == "ours"
    assert V.judge(1.0, 1.5, "train_step", SKINNY).winner == "ours"
    grad_input = linear_problems(64, 64, 64)[Layout.grad_input]  # training: the cold call stands
    assert V.judge(1.0, 1.5, "cold_single", grad_input).winner == "ours"
    assert V.judge(1.0, 1.5, "cold_single", Problem(129, 64, 64)).winner == "ours"


def test_a_refused_kernel_loses_whatever_its_time():
    v = V.judge(1.0, 2.0, "engine", SKINNY, refused="wrong result (relative error 1e-01)")
    assert v.winner == "cublas" and "wrong result" in v.reason()


def test_verdicts_round_trip_and_are_judged_again_when_read():
    v = V.judge(0.5, 0.6, "engine", SKINNY)
    d = json.loads(json.dumps(v.to_dict()))
    assert set(d) == {"ours_ms", "cublas_ms", "ratio", "timing", "margin", "winner"}
    assert V.Verdict.from_dict(d, SKINNY) == v
    edited = {**d, "winner": "ours", "cublas_ms": 0.4}  # a hand edit cannot make ours the winner
    assert V.Verdict.from_dict(edited, SKINNY).winner == "cublas"
    cold = V.judge(0.5, 0.6, "cold_single", SKINNY).to_dict()
    assert cold["winner"] == "unknown" and V.Verdict.from_dict(cold, SKINNY).winner == "unknown"
    assert V.Verdict.from_dict(None) is None and V.Verdict.from_dict("x") is None


def test_the_reason_torch_runs_names_ratio_margin_and_timing():
    v = V.judge(1.0, 0.95, "engine", SKINNY)
    assert v.reason() == "cuBLAS won (ratio 0.950 at margin 0.02, timing engine)"


def test_which_verdict_decides():
    cold, engine, step = ({"timing": t} for t in ("cold_single", "engine", "train_step"))
    assert V.deciding({"cold_single": cold}) is cold
    assert V.deciding({"cold_single": cold, "train_step": step}) is step
    assert V.deciding({"cold_single": cold, "engine": engine, "train_step": step}) is engine
    assert V.deciding({}) is None


def test_a_store_row_gives_its_cold_single_verdict():
    row = {"median_ms": 1.0, "baselines": {"cublas": {"median_ms": 1.1, "p20_ms": 1.0, "p80_ms": 1.2}}}
    assert V.from_row(row, BIG).winner == "ours" and V.from_row(row, BIG).timing == "cold_single"
    assert V.from_row(row, SKINNY).winner == "unknown"
    assert V.from_row({"median_ms": 1.0, "baselines": {}}, BIG).winner == "unknown"
    assert V.from_row({"median_ms": 1.0, "baselines": {}, "ratio_cublas": 0.9}, BIG).cublas_ms == pytest.approx(0.9)


# ---- bundles ----------------------------------------------------------------------------------------------
def _add(store, problem, ours_ms, cublas_ms):
    """An ok trial of a SIMT kernel for ``problem`` with the cuBLAS baseline (None: none measured)."""
    from codegen.families.simt import Spec
    from codegen.render import render, source_hash

    spec = Spec()
    record = {"name": spec.name, "family": spec.family, "spec": spec.to_dict(), "arch": "sm_90",
              "source": render(spec)}
    store.kernel(record)
    base = {"cublas": {"median_ms": cublas_ms, "p20_ms": cublas_ms, "p80_ms": cublas_ms}} if cublas_ms else {}
    result = {"status": "ok", "evidence": "", "median_ms": ours_ms, "p20_ms": ours_ms, "p80_ms": ours_ms,
              "times_ms": [ours_ms], "tflops": problem.flops / ours_ms / 1e9, "gbps": 1.0, "rel_error": 1e-7,
              "baselines": base, "ratio": {"cublas": cublas_ms / ours_ms} if cublas_ms else {}}
    store.add_trial(None, spec.name, "sm_90", problem, store.device(DEVICE), None, result, spec.to_dict(),
                    source_hash=source_hash(record["source"]))


@pytest.fixture
def judged_store(tmp_path):
    """A store with three problems: ours 10% ahead at 256 rows, cuBLAS ahead at 128x64x64, no baseline at 64
    rows; its URL."""
    from store import Store

    url = f"sqlite:///{tmp_path / 's.db'}"
    with Store(url) as store:
        _add(store, BIG, 1.0, 1.1)
        _add(store, Problem(128, 64, 64), 1.0, 0.97)
        _add(store, SKINNY, 1.0, None)
    return url


def test_a_bundle_index_keeps_each_kernel_s_verdict(judged_store, tmp_path):
    from store import Store

    with Store(judged_store, read_only=True) as store:
        index = write_bundle(store, tmp_path / "b")
    by_key = {e["key"]: e for e in index["kernels"]}
    assert by_key[BIG.key]["verdict"]["winner"] == "ours" and by_key[BIG.key]["verdict"]["timing"] == "cold_single"
    assert by_key["128x64x64_fp32_forward"]["verdict"]["winner"] == "cublas"
    assert by_key[SKINNY.key]["verdict"]["winner"] == "unknown"
    assert set(by_key[BIG.key]["verdicts"]) == {"cold_single"}
    assert index["verdicts"] == {"ours": 1, "cublas": 1, "unknown": 1, "timing": {"cold_single": 3}}
    back = Bundle(tmp_path / "b")
    assert back.index["verdicts"] == index["verdicts"]
    found = back.find(Problem(128, 64, 64), "NVIDIA H200")
    assert isinstance(found, KernelFile) and found.verdict.winner == "cublas"
    assert found.verdict.reason() == "cuBLAS won (ratio 0.970 at margin 0.02, timing cold_single)"


def test_an_engine_verdict_decides_is_saved_and_survives_a_re_export(judged_store, tmp_path):
    from store import Store

    with Store(judged_store, read_only=True) as store:
        write_bundle(store, tmp_path / "b")
    b = Bundle(tmp_path / "b")
    b.set_verdict(SKINNY, "NVIDIA H200", V.judge(0.010, 0.0095, "engine", SKINNY))
    b.save()
    assert Bundle(tmp_path / "b").find(SKINNY, "NVIDIA H200").verdict.timing == "engine"
    with Store(judged_store, read_only=True) as store:
        index = write_bundle(store, tmp_path / "b")  # the same kernels again: engine's verdict is kept
    entry = next(e for e in index["kernels"] if e["key"] == SKINNY.key)
    assert set(entry["verdicts"]) == {"cold_single", "engine"} and entry["verdict"]["timing"] == "engine"
    assert entry["verdict"]["winner"] == "cublas" and index["verdicts"]["cublas"] == 2
    with Store(judged_store, read_only=True) as store:  # a new margin judges the cold single calls anew
        index = write_bundle(store, tmp_path / "c", margin=0.2)
    assert {e["key"]: e["verdict"]["winner"] for e in index["kernels"]}[BIG.key] == "cublas"


def test_a_bundle_without_verdicts_still_loads(judged_store, tmp_path):
    from store import Store

    with Store(judged_store, read_only=True) as store:
        write_bundle(store, tmp_path / "b")
    path = tmp_path / "b" / "index.json"
    index = json.loads(path.read_text())
    for e in index["kernels"]:
        del e["verdict"], e["verdicts"]
    del index["verdicts"]
    path.write_text(json.dumps(index))
    found = Bundle(tmp_path / "b").find(BIG, "NVIDIA H200")
    assert isinstance(found, KernelFile) and found.verdict is None
    assert verdict_summary(index)["unknown"] == 3


def test_the_store_source_answers_with_the_row_s_verdict(judged_store):
    from codegen.nn.bundle import StoreKernels
    from store import Store

    with Store(judged_store, read_only=True) as store:
        found = StoreKernels(store).find(BIG, "NVIDIA H200")
        assert found.verdict.winner == "ours" and found.verdict.cublas_ms == pytest.approx(1.1)


def test_engine_timing_judges_the_few_row_forward_kernels_and_records_it(judged_store, tmp_path, monkeypatch):
    """codegen.nn.timing.engine_verdict REPLACED (no GPU): the bundle's 64- and 128-row forward kernels are
    judged, the 256-row one is not; each verdict is saved in the index, and a second pass judges nothing."""
    torch = pytest.importorskip("torch")
    from codegen.nn import timing
    from store import Store

    with Store(judged_store, read_only=True) as store:
        write_bundle(store, tmp_path / "b")
    judged = []

    def fake(problem, file, **kw):
        judged.append(problem.key)
        return V.judge(0.010, 0.0105, "engine", problem, margin=kw["margin"]), "ok", None

    monkeypatch.setattr(timing, "engine_verdict", fake)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    lines = []
    b = Bundle(tmp_path / "b")
    assert [p.key for p in timing.engine_candidates(b, "NVIDIA H200")] == ["128x64x64_fp32_forward", SKINNY.key]
    assert timing.engine_candidates(b, "NVIDIA H100") == []
    got = timing.judge_in_engine_timing(b, say=lines.append)
    assert sorted(judged) == sorted(["128x64x64_fp32_forward", SKINNY.key]) and len(lines) == 2
    assert all(g.verdict.winner == "ours" for g in got) and "engine" in lines[0]
    back = Bundle(tmp_path / "b")
    assert back.find(SKINNY, "NVIDIA H200").verdict.timing == "engine"
    assert back.index["verdicts"]["ours"] == 3
    assert timing.engine_candidates(back, "NVIDIA H200") == []


def test_copies_and_calls_of_the_engine_harness_live_in_the_package():
    from benchmarks import engine
    from codegen.nn import timing

    assert engine.copies_for is timing.copies_for and engine.calls_for is timing.calls_for
    assert engine.stats is timing.stats and engine.L2_FACTOR == timing.L2_FACTOR


# ---- the command line --------------------------------------------------------------------------------------
def test_tune_linear_bundle_writes_verdicts_and_says_engine_timing_did_not_run(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 's.db'}"
    code = cli.main(["tune-linear", "--batch", "32", "--in", "4096", "--out", "4096", "--budget", "4", "--replay",
                     str(RECORDING), "--db", url, "--quiet", "--bundle", str(tmp_path / "b")])
    out, err = capsys.readouterr()
    assert code == 0
    assert "no engine timing (tuned from a recording, no GPU)" in err
    assert "32x4096x4096_fp32_forward" in out and "unknown (" in out and "cold_single at M <= 128" in out
    assert "ours won 0, cuBLAS 0, unknown 1 (margin 0.02)" in out
    entry = Bundle(tmp_path / "b").entries[0]
    assert entry["verdict"]["timing"] == "cold_single" and entry["verdict"]["ratio"] > 1.02


@pytest.mark.parametrize("argv,needle", [
    (["--bundle", "B", "--no-store"], "--bundle writes the store's kernels: drop --no-store"),
    (["--margin", "-0.1"], "a margin lies in [0, 1)"),
    (["--margin", "x"], "'x' is not a number"),
    (["--layout", "sideways"], "invalid choice"),
])
def test_tune_linear_verdict_usage_errors(argv, needle, tmp_path, capsys):
    argv = [a.replace("B", str(tmp_path / "b")) if a == "B" else a for a in argv]
    try:
        code = cli.main(["tune-linear", "--batch", "8", "--in", "64", "--out", "64", "--replay", str(RECORDING),
                         *argv])
    except SystemExit as stop:
        code = stop.code
    assert code == 2 and needle in capsys.readouterr().err


def test_export_bundle_takes_a_margin_and_a_single_export_refuses_it(judged_store, tmp_path, capsys):
    code = cli.main(["export", "--bundle", str(tmp_path / "b"), "--db", judged_store, "--margin", "0.15"])
    _, err = capsys.readouterr()
    assert code == 0 and "verdicts against cuBLAS (margin 0.15): ours 0, cuBLAS 2, unknown 1" in err
    assert {e["verdict"]["margin"] for e in Bundle(tmp_path / "b").entries} == {0.15}
    code = cli.main(["export", "--best", "--m", "256", "--n", "64", "--k", "64", "--out", str(tmp_path / "o"),
                     "--db", judged_store, "--margin", "0.1"])
    assert code == 2 and "--margin judges a bundle's verdicts" in capsys.readouterr().err


def test_tune_linear_layout_and_tune_model_batches(tmp_path, capsys, monkeypatch):
    from codegen import worker
    from codegen.cli import layer as cli_layer

    seen = []
    monkeypatch.setattr(cli_layer, "run_tuning", lambda args, problems: seen.append(problems) or 0)
    monkeypatch.setattr(worker, "require_gpu", lambda: None)  # REPLACED: no GPU here, and none is used
    assert cli.main(["tune-linear", "--batch", "16", "--in", "64", "--out", "96", "--layout", "forward"]) == 0
    assert [p.layout for p in seen[-1]] == [Layout.forward]
    assert "forward GEMM" in capsys.readouterr().err
    pytest.importorskip("torch")
    (tmp_path / "m.py").write_text("import torch\ndef make():\n    return torch.nn.Sequential(torch.nn.Linear(64, 96))\n")
    assert cli.main(["tune-model", f"{tmp_path / 'm.py'}:make", "--batch", "1", "16", "--layout", "forward",
                     "--layout", "grad_input"]) == 0
    assert sorted((p.m, p.layout.value) for p in seen[-1]) == [(1, "forward"), (1, "grad_input"), (16, "forward"),
                                                               (16, "grad_input")]
    assert "1 linear layer, 2 distinct shapes at batches 1, 16" in capsys.readouterr().err


# ---- the layer's choice (torch; a fake source and a fake compiled kernel: no GPU) ----------------------------
@pytest.fixture
def fake_gpu(monkeypatch):
    """codegen.nn with _Compiled REPLACED by a stand-in and a device name: ``Source`` answers each problem
    with a KernelFile whose verdict the test sets (by problem key; absent: no verdict)."""
    torch = pytest.importorskip("torch")
    from codegen.nn import layer as nn

    class Loaded:
        def __init__(self, file, problem, device):
            self.manifest, self.problem = file.manifest, problem

    monkeypatch.setattr(nn, "_Compiled", Loaded)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU")

    class Source:
        location = "fake"

        def __init__(self, verdicts):
            self.verdicts = verdicts

        def find(self, problem, device):
            return KernelFile({"name": f"k_{problem.key}"}, "", "fake source", self.verdicts.get(problem.key))

    return nn, Source, torch.device("cuda", 0)


def test_where_cublas_won_torch_runs_and_the_reason_is_reported_once(fake_gpu, caplog):
    nn, Source, dev = fake_gpu
    problem = linear_problems(16, 64, 64, DType.bf16)[Layout.forward]
    lost = V.judge(1.0, 0.95, "engine", problem)
    kernels = nn.Kernels(Source({problem.key: lost}))
    with caplog.at_level(logging.WARNING, logger="gemmscape.nn"):
        assert kernels.kernel(problem, dev) is None and kernels.kernel(problem, dev) is None
    said = [r.getMessage() for r in caplog.records if r.name == "gemmscape.nn"]
    assert len(said) == 1 and "cuBLAS won (ratio 0.950 at margin 0.02, timing engine)" in said[0]
    assert kernels.used(problem, dev) == "torch: cuBLAS won (ratio 0.950 at margin 0.02, timing engine)"
    assert kernels.fallbacks == {(problem.key, str(dev)): "cuBLAS won (ratio 0.950 at margin 0.02, timing engine)"}
    everywhere = nn.kernels_from(kernels, ours_everywhere=True)
    assert everywhere is not kernels and everywhere.source is kernels.source
    assert everywhere.kernel(problem, dev).manifest["name"] == f"k_{problem.key}"
    assert everywhere.used(problem, dev) == f"k_{problem.key}" and not everywhere.fallbacks


def test_ours_runs_where_it_won_and_unjudged_kernels_run_said_once(fake_gpu, caplog):
    nn, Source, dev = fake_gpu
    gemms = linear_problems(16, 64, 64, DType.bf16)
    won = V.judge(1.0, 1.2, "engine", gemms[Layout.forward])
    kernels = nn.Kernels(Source({gemms[Layout.forward].key: won}))
    with caplog.at_level(logging.WARNING, logger="gemmscape.nn"):
        for problem in gemms.values():
            assert kernels.kernel(problem, dev) is not None
    said = [r.getMessage() for r in caplog.records if r.name == "gemmscape.nn"]
    assert len(said) == 1 and "without a verdict against cuBLAS" in said[0] and "said once" in said[0]
    assert set(kernels.unjudged) == {(gemms[lay].key, str(dev)) for lay in (Layout.grad_input, Layout.grad_weight)}
    assert all("holds no verdict" in why for why in kernels.unjudged.values()) and not kernels.fallbacks


def test_a_call_runs_ours_only_if_one_of_its_gemms_does(fake_gpu):
    nn, Source, dev = fake_gpu
    torch = pytest.importorskip("torch")
    gemms = linear_problems(16, 64, 64, DType.bf16)
    lost = {p.key: V.judge(1.0, 0.9, "engine", p) for p in gemms.values()}
    kernels = nn.Kernels(Source(lost))
    args = (16, 64, 64, torch.bfloat16, torch.bfloat16, dev, False)
    assert nn._runs_ours(kernels, *args, grad=False) is False
    assert nn._runs_ours(kernels, *args, grad=True) is False
    assert len(kernels.fallbacks) == 3
    mixed = nn.Kernels(Source({**lost, gemms[Layout.grad_weight].key: V.judge(1.0, 1.2, "train_step")}))
    assert nn._runs_ours(mixed, *args, grad=False) is False and nn._runs_ours(mixed, *args, grad=True) is True
    assert nn._runs_ours(nn.Kernels(Source(lost), ours_everywhere=True), *args, grad=False) is True


def test_a_layer_whose_gemms_all_run_torch_is_f_linear_itself(monkeypatch):
    """On the CPU every GEMM falls back: the layer calls F.linear (autograd's own graph, no Function of
    ours), so its outputs, gradients and graph equal nn.Linear's."""
    torch = pytest.importorskip("torch")
    from codegen.nn import layer as nn

    def refuse(*a, **kw):
        raise AssertionError("codegen.nn's autograd Function ran on a call whose GEMMs all run torch's op")

    monkeypatch.setattr(nn._LinearFunction, "apply", refuse)
    monkeypatch.setattr(nn, "linear_forward", refuse)
    torch.manual_seed(0)
    ref = torch.nn.Linear(12, 20)
    ours = nn.Linear.from_linear(ref, None)
    x = torch.randn(2, 3, 12, requires_grad=True)
    y_ref, y = ref(x), ours(x)
    assert torch.equal(y, y_ref) and type(y.grad_fn) is type(y_ref.grad_fn)
    with torch.no_grad():
        assert torch.equal(ours(x), ref(x))


def test_ours_everywhere_passes_through_the_options_and_pickling(tmp_path):
    torch = pytest.importorskip("torch")
    from codegen.nn import Kernels, Linear, kernels_from, replace_linear

    model = replace_linear(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)), None,
                           ours_everywhere=True)
    assert model[0].kernels is model[1].kernels and model[0].kernels.ours_everywhere
    assert Linear(4, 4, ours_everywhere=True).kernels.ours_everywhere
    assert not Linear(4, 4).kernels.ours_everywhere
    assert Linear.from_linear(torch.nn.Linear(4, 4), None, ours_everywhere=True).kernels.ours_everywhere
    k = Kernels(None)
    assert kernels_from(k) is k and kernels_from(k, ours_everywhere=False) is k
    torch.save(model, tmp_path / "m.pt")
    assert torch.load(tmp_path / "m.pt", weights_only=False)[0].kernels.ours_everywhere


def test_benchmarks_take_ours_everywhere():
    pytest.importorskip("torch")
    from benchmarks import engine

    args = engine.parser().parse_args(["--ours-everywhere"])
    kernels, selection = engine.kernels_of(args)
    assert kernels.ours_everywhere and "ours everywhere" in selection
    assert not engine.kernels_of(engine.parser().parse_args([]))[0].ours_everywhere
    from benchmarks import linear_train, model

    assert linear_train.parser().parse_args(["--ours-everywhere"]).ours_everywhere
    assert model.parse(["--ours-everywhere"]).ours_everywhere and not model.parse([]).ours_everywhere


def test_the_train_step_judges_each_gemm_against_torch_s_op_in_the_step():
    """codegen.nn.step.judge with the step REPLACED by one whose time depends on which GEMMs run ours: the
    forward saves 5% of the step, grad_input 0.5% (within the margin), grad_weight costs 2.5%."""
    from codegen.nn import step as steps

    problems = linear_problems(32, 64, 64, DType.bf16)
    cost = {problems[Layout.forward].key: 10.0, problems[Layout.grad_input].key: 1.0,
            problems[Layout.grad_weight].key: -5.0}

    class Step:
        def __init__(self):
            self.problems, self.calls = problems, []

        def times(self, files, reps):
            self.calls.append(sorted(files))
            return [200.0 - sum(cost[k] for k in files)] * reps, "ok"

    step = Step()
    files = {lay: KernelFile({"name": f"k_{lay.value}"}, "", "x") for lay in Layout}
    got = steps.judge(step, files, reps=10, rounds=2)
    winners = {lay: v.winner for lay, (v, status) in got.items()}
    assert winners == {Layout.forward: "ours", Layout.grad_input: "cublas", Layout.grad_weight: "cublas"}
    assert all(v.timing == "train_step" for v, _ in got.values())
    assert len(step.calls) == 3 * 2 * 2  # per GEMM: rounds x (without it, with it)

    class Broken(Step):
        def times(self, files, reps):
            return ([], "fallback: x") if len(files) < 3 else ([1.0] * reps, "ok")

    assert all(v is None and "torch: fallback" in status for v, status in steps.judge(Broken(), files, 4).values())


def test_pick_step_takes_verdict_step_and_a_margin(capsys):
    with pytest.raises(SystemExit):
        cli.main(["pick-step", "--help"])
    out = capsys.readouterr().out
    assert "--verdict-step" in out and "--margin" in out


def test_replace_linear_leaves_torch_a_layer_where_cublas_won_every_gemm(judged_store, tmp_path, caplog):
    """64 -> 32: the bundle's only GEMM of it lost to cuBLAS, so the layer stays torch's nn.Linear (said
    once); 64 -> 64 has a GEMM ours won and is swapped; ours_everywhere swaps both."""
    pytest.importorskip("torch")
    from torch import nn

    from codegen.nn.layer import Linear, replace_linear
    from store import Store

    with Store(judged_store) as store:
        _add(store, Problem(128, 32, 64), 1.0, 0.9)
        write_bundle(store, tmp_path / "b")
    bundle = Bundle(tmp_path / "b")
    assert bundle.cublas_won_all(64, 32, "fp32", False) and not bundle.cublas_won_all(64, 64, "fp32", False)
    assert not bundle.cublas_won_all(64, 32, "fp32", True) and not bundle.cublas_won_all(64, 16, "fp32", False)

    def model():
        return nn.Sequential(nn.Linear(64, 32, bias=False), nn.Linear(64, 64, bias=False), nn.Linear(64, 32, bias=False))

    original = model()
    kept = original[0]
    with caplog.at_level(logging.WARNING, logger="gemmscape.nn"):
        swapped = replace_linear(original, bundle)
    assert [type(c) for c in swapped] == [nn.Linear, Linear, nn.Linear] and swapped[0] is kept
    assert [r.getMessage() for r in caplog.records].count(
        f"gemmscape: nn.Linear(64, 32, fp32) stays torch's: cuBLAS won every GEMM {bundle.location} holds for it") == 1
    assert all(type(c) is Linear for c in replace_linear(model(), bundle, ours_everywhere=True))
