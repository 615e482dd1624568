"""GPU tier for Hopper thread-block cluster pairs (``cluster=2``: two blocks along M sharing W's tile by
TMA multicast, launched with cuLaunchKernelEx): correct against float64 with NaN-poisoned outputs on
odd and aligned shapes (an odd count of m-tiles leaves the last pair's second block past M), both
16-bit types, bias, persistent or not, one or two consumer warpgroups, the pack prepass; the
measured cubin runs the multicast load; an export runs from its manifest alone (cluster launch
built from the manifest). A hang (the empty/full handshake across the pair) shows as the
evaluator's timeout status; codegen.nn.Linear runs an exported pair from its bundle."""

from __future__ import annotations

import json

import numpy as np
import pytest

from codegen import sass
from codegen.data import to_float64, to_storage
from codegen.evaluate import Evaluator
from codegen.export import export_files
from codegen.families.hopper import Spec
from codegen.problem import DType, Problem
from tests.gpu.test_export_and_search import _launch_from_manifest
from tests.gpu.test_hopper import MISALIGNED, QUICK, _compute_cap
from tests.gpu.test_kernels import assert_correct_on

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_compute_cap() != "9.0", reason="the hopper family needs an sm_90 GPU")]

#: K a multiple of 8. M: one row (a pair with one m-tile), 2 m-tiles (one whole pair), odd counts of
#: m-tiles (the last pair half past M), many pairs (a persistent grid loops).
SHAPES = [(1, 1, 8), (67, 45, 88), (130, 250, 72), (257, 129, 4096), (385, 520, 200), (1000, 1000, 1000),
          (4096, 4096, 4096)]

VARIANTS = [
    dict(bm=128, bn=256, consumers=2, stages=4),  # the default tile, paired
    dict(bm=128, bn=256, consumers=2, stages=4, persistent=True),
    dict(bm=256, bn=128, consumers=2, stages=4, persistent=True, group_m=16),
    dict(bm=128, bn=128, consumers=1, stages=5),
    dict(bm=64, bn=96, consumers=1, stages=4, persistent=True, group_m=1),  # N not a power of two
]
CASES = [(DType.bf16, bias, v) for v in VARIANTS for bias in (False, True)] + [
    (DType.fp16, bias, v) for v in VARIANTS[:3] for bias in (False, True)
]


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(baseline=False, timing=QUICK, timeout_s=120.0) as ev:
        yield ev


@pytest.mark.parametrize("dtype,bias,params", CASES,
                         ids=[Spec(dtype=d, bias=b, cluster=2, **v).name for d, b, v in CASES])
def test_pairs_are_correct_on_odd_and_aligned_shapes(evaluator, dtype, bias, params):
    assert_correct_on(evaluator, Spec(dtype=dtype, bias=bias, cluster=2, **params), SHAPES)


@pytest.mark.parametrize("dtype,persistent", [(DType.bf16, False), (DType.fp16, True)])
def test_pairs_take_misaligned_k_through_the_pack_prepass(evaluator, dtype, persistent):
    assert_correct_on(evaluator, Spec(dtype=dtype, bias=True, cluster=2, prepass="pack", persistent=persistent),
                      MISALIGNED)


def test_the_measured_cubin_multicasts_w(evaluator):
    spec = Spec(cluster=2, bias=True)
    result, built = evaluator.evaluate(spec, Problem(640, 512, 512, DType.bf16, bias=True))
    assert result["status"] == "ok", result["evidence"]
    try:
        text = sass.disassemble(built.compiled.cubin)
    except sass.SassError as e:
        pytest.skip(f"no disassembler on this machine: {e}")
    code = sass.functions(text)[spec.name]
    assert code.count("UTMALDG.2D.MULTICAST") == 1 and sass.opcodes(text, spec.name)["HGMMA"] == 4


@pytest.mark.parametrize("dtype,params", [(DType.bf16, dict(persistent=True)),
                                          (DType.fp16, dict(bm=128, bn=128, consumers=1, prepass="pack"))])
def test_exported_pair_runs_from_its_manifest_alone(dtype, params):
    k = 91 if params.get("prepass") == "pack" else 88
    problem = Problem(387, 300, k, dtype, bias=True)  # 4 m-tiles of 128 (the last partial): 2 pairs
    spec = Spec(dtype=dtype, bias=True, cluster=2, **params)
    cu, js = export_files(spec, problem, None, "sm_90")
    manifest = json.loads(js)
    assert manifest["kernels"][-1]["cluster"] == [2, 1, 1]
    rng = np.random.default_rng()
    x, w, b = (to_storage(rng.uniform(-1, 1, shape).astype(np.float32), dtype) for shape in ((387, k), (300, k), 300))
    y = to_float64(_launch_from_manifest(cu, manifest, x, w, b), dtype)
    ref = to_float64(x, dtype) @ to_float64(w, dtype).T + to_float64(b, dtype)
    assert np.isfinite(y).all()
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < dtype.rel_tol


def test_the_layer_runs_an_exported_pair(tmp_path):
    """A pair kernel benched into a store, exported as a bundle, run by codegen.nn.Linear (a cluster
    launch from its manifest) against float64, the output memory NaN-poisoned first."""
    import torch

    from codegen import cli
    from codegen.nn import Linear
    from codegen.problem import Layout, linear_problems

    batch, fin, fout = 385, 200, 264  # 4 m-tiles of 128: 2 pairs, the last pair's second block past M
    spec = Spec(cluster=2, bias=True, persistent=True)
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert cli.main(["bench", "--kernel", spec.name, "--dtype", "bf16", "--m", str(batch), "--n", str(fout), "--k", str(fin), "--bias",
                     "--db", url, "--no-baseline"]) == 0
    assert cli.main(["export", "--bundle", str(tmp_path / "b"), "--db", url]) == 0
    torch.manual_seed(3)
    layer = torch.nn.Linear(fin, fout, device="cuda", dtype=torch.bfloat16)
    ours = Linear.from_linear(layer, tmp_path / "b")
    x = torch.randn(batch, fin, device="cuda", dtype=torch.bfloat16)
    junk = torch.full((batch, fout), float("nan"), dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    del junk
    with torch.no_grad():
        y = ours(x)
    want = torch.nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
    assert torch.isfinite(y).all()
    assert float((y.double() - want).norm() / want.norm()) < DType.bf16.rel_tol
    problem = linear_problems(batch, fin, fout, DType.bf16, True)[Layout.forward]
    assert ours.kernels.used(problem, x.device) == spec.name
