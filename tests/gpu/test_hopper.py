"""GPU tier for the Hopper family (wgmma + TMA, sm_90 only): correct on awkward shapes for both
16-bit types, with and without bias, persistent or not, one or two consumer warpgroups (float64
reference, NaN-poisoned outputs, the odd probe on every evaluation); rows that break TMA's 16-byte
pitch through the pack prepass, refused without it; the measured cubin's SASS runs HGMMA; an export
runs from its manifest alone (tensor maps encoded from it); bench and search through the CLI. Split-K
(small batches) on M of 1, 32 and 130, N off the tile and odd, K ending in a partial k-tile and K of
fewer k-tiles than splits (the validation poisons the workspace too: an unwritten partial sum is NaN).
A fragments through registers (``a_regs``, ``-k a_regs``) on the same shapes."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from codegen import sass
from codegen.data import to_float64, to_storage
from codegen.evaluate import Evaluator
from codegen.export import export_files
from codegen.families.hopper import Spec
from codegen.problem import DType, Problem
from tests.gpu.test_export_and_search import _launch_from_manifest
from tests.gpu.test_kernels import assert_correct_on


@functools.cache
def _compute_cap() -> str:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ""
    out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=30)
    return out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else ""


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_compute_cap() != "9.0", reason="the hopper family needs an sm_90 GPU")]

QUICK = {"reps_min": 3, "reps_max": 3, "target_ms": 1.0}
#: K a multiple of 8 (16-byte rows): M, N odd or tiny, K ending in a partial k-tile or not.
ALIGNED = [(1, 1, 8), (67, 45, 88), (130, 250, 72), (257, 129, 4096), (1000, 1000, 1000), (4096, 4096, 4096)]
#: K that breaks 16-byte rows: only the pack prepass takes these.
MISALIGNED = [(1, 1, 1), (67, 45, 91), (129, 257, 4093), (4097, 4095, 4093)]

VARIANTS = [
    dict(bm=64, bn=64, consumers=1, stages=2),  # the simplest pipeline: one consumer, two stages
    dict(bm=128, bn=128, consumers=1, stages=4),  # two m64 blocks per consumer
    dict(bm=128, bn=256, consumers=2, stages=4),  # the default
    dict(bm=128, bn=256, consumers=2, stages=4, persistent=True),
    dict(bm=256, bn=128, consumers=2, stages=4, persistent=True, group_m=16),
    dict(bm=128, bn=96, consumers=2, stages=6, persistent=True, group_m=1),  # N not a power of two
    dict(bm=64, bn=256, consumers=1, stages=3, persistent=True),
]
CASES = [(DType.bf16, bias, v) for v in VARIANTS for bias in (False, True)] + [
    (DType.fp16, bias, v) for v in VARIANTS[1:4] for bias in (False, True)
]


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(baseline=False, timing=QUICK, timeout_s=120.0) as ev:
        yield ev


@pytest.mark.parametrize("dtype,bias,params", CASES, ids=[Spec(dtype=d, bias=b, **v).name for d, b, v in CASES])
def test_correct_on_aligned_shapes(evaluator, dtype, bias, params):
    assert_correct_on(evaluator, Spec(dtype=dtype, bias=bias, **params), ALIGNED)


PACKED = [(DType.bf16, True, VARIANTS[2]), (DType.fp16, False, VARIANTS[4]), (DType.bf16, False, VARIANTS[1])]


@pytest.mark.parametrize("dtype,bias,params", PACKED,
                         ids=[Spec(dtype=d, bias=b, prepass="pack", **v).name for d, b, v in PACKED])
def test_misaligned_k_runs_through_the_pack_prepass(evaluator, dtype, bias, params):
    assert_correct_on(evaluator, Spec(dtype=dtype, bias=bias, prepass="pack", **params), MISALIGNED)
    result, _ = evaluator.evaluate(Spec(dtype=dtype, bias=bias, **params), Problem(129, 257, 4093, dtype, bias=bias))
    assert result["status"] == "invalid" and "prepass='pack'" in result["evidence"]


#: (m, n, k) for split-K: tiny and small batches, N not a multiple of bn (odd N: scalar partial stores),
#: K of 1 and 2 k-tiles (most splits have none) and K ending in a partial k-tile.
SPLIT_SHAPES = [(1, 45, 8), (1, 1000, 200), (32, 257, 4096), (32, 4096, 1000), (130, 250, 72), (130, 300, 4160)]
SPLITS = [
    dict(bm=64, bn=128, consumers=1, stages=6, group_m=4, split_k=4),  # the space's small-M seeds
    dict(bm=64, bn=256, consumers=1, stages=4, group_m=4, split_k=8),
    dict(bm=128, bn=96, consumers=2, stages=6, group_m=1, split_k=16),
    dict(bm=128, bn=256, consumers=2, stages=4, split_k=2),
]
SPLIT_CASES = [(DType.bf16, bias, v) for v in SPLITS for bias in (False, True)] + [
    (DType.fp16, bias, SPLITS[1]) for bias in (False, True)
]


@pytest.mark.parametrize("dtype,bias,params", SPLIT_CASES,
                         ids=[Spec(dtype=d, bias=b, **v).name for d, b, v in SPLIT_CASES])
def test_split_k_is_correct_on_small_batches(evaluator, dtype, bias, params):
    assert_correct_on(evaluator, Spec(dtype=dtype, bias=bias, **params), SPLIT_SHAPES)


def test_split_k_with_the_pack_prepass(evaluator):
    """The packed rows follow the partial sums in the workspace."""
    for dtype, params in ((DType.bf16, SPLITS[0]), (DType.fp16, SPLITS[3])):
        assert_correct_on(evaluator, Spec(dtype=dtype, bias=True, prepass="pack", **params),
                          MISALIGNED + [(32, 257, 91), (130, 250, 1001)])


#: A fragments through registers (``a_regs``): one and two consumers, one to four m64 blocks per
#: consumer, persistent, split-K and the cluster pair; on the aligned shapes (M = 1, 67 x 45 x 88:
#: K ending in a partial k-tile) and through the pack prepass on the misaligned ones (K = 1, 91, 4093).
A_REGS = [
    dict(bm=64, bn=64, consumers=1, stages=2),
    dict(bm=128, bn=128, consumers=1, stages=4),  # two m64 blocks per consumer
    dict(bm=128, bn=256, consumers=2, stages=4),
    dict(bm=128, bn=256, consumers=2, stages=4, persistent=True),
    dict(bm=256, bn=128, consumers=2, stages=4, persistent=True, group_m=16),
    dict(bm=128, bn=96, consumers=2, stages=6, persistent=True, group_m=1),
    dict(bm=256, bn=64, consumers=1, stages=4),  # four m64 blocks per consumer
    dict(bm=128, bn=256, consumers=2, stages=4, cluster=2, persistent=True),
]
A_REGS_CASES = [(DType.bf16, bias, v) for v in A_REGS for bias in (False, True)] + [
    (DType.fp16, bias, v) for v in A_REGS[1:4] for bias in (False, True)
]


@pytest.mark.parametrize("dtype,bias,params", A_REGS_CASES,
                         ids=[Spec(dtype=d, bias=b, a_regs=True, **v).name for d, b, v in A_REGS_CASES])
def test_a_regs_is_correct_on_aligned_shapes(evaluator, dtype, bias, params):
    spec = Spec(dtype=dtype, bias=bias, a_regs=True, **params)
    assert not spec.check(), spec.check()
    assert_correct_on(evaluator, spec, ALIGNED)


#: Swapped operands (W's tile as wgmma's A, X's rows as its N): small and large bm, one and two consumers.
SWAP = [
    dict(bm=32, bn=128, consumers=1, stages=6),
    dict(bm=64, bn=64, consumers=1, stages=4),
    dict(bm=128, bn=256, consumers=2, stages=4, persistent=True),
    dict(bm=256, bn=64, consumers=1, stages=4),
]
SWAP_CASES = [(DType.bf16, bias, v) for v in SWAP for bias in (False, True)] + [(DType.fp16, True, SWAP[0])]


@pytest.mark.parametrize("dtype,bias,params", SWAP_CASES,
                         ids=[Spec(dtype=d, bias=b, swap=True, **v).name for d, b, v in SWAP_CASES])
def test_swap_is_correct_on_aligned_shapes(evaluator, dtype, bias, params):
    spec = Spec(dtype=dtype, bias=bias, swap=True, **params)
    assert not spec.check(), spec.check()
    assert_correct_on(evaluator, spec, ALIGNED)


A_REGS_PACKED = [(DType.bf16, True, A_REGS[2]), (DType.fp16, False, A_REGS[1]), (DType.bf16, False, A_REGS[6])]


@pytest.mark.parametrize("dtype,bias,params", A_REGS_PACKED,
                         ids=[Spec(dtype=d, bias=b, prepass="pack", a_regs=True, **v).name for d, b, v in A_REGS_PACKED])
def test_a_regs_takes_misaligned_k_through_the_pack_prepass(evaluator, dtype, bias, params):
    assert_correct_on(evaluator, Spec(dtype=dtype, bias=bias, prepass="pack", a_regs=True, **params), MISALIGNED)


A_REGS_SPLITS = [(DType.bf16, False, SPLITS[0]), (DType.bf16, True, SPLITS[2]), (DType.fp16, True, SPLITS[1])]


@pytest.mark.parametrize("dtype,bias,params", A_REGS_SPLITS,
                         ids=[Spec(dtype=d, bias=b, a_regs=True, **v).name for d, b, v in A_REGS_SPLITS])
def test_a_regs_with_split_k_is_correct_on_small_batches(evaluator, dtype, bias, params):
    assert_correct_on(evaluator, Spec(dtype=dtype, bias=bias, a_regs=True, **params), SPLIT_SHAPES)


@pytest.mark.parametrize("spec,expected", [
    (Spec(bias=True, persistent=True), {"HGMMA": 4, "UTMALDG": 2, "HMMA": 0}),
    (Spec(bias=True, persistent=True, a_regs=True), {"HGMMA": 4, "LDSM": 4, "HMMA": 0}),  # A from registers
], ids=["a_from_shared_memory", "a_regs"])
def test_the_measured_cubin_runs_hgmma(evaluator, spec, expected):
    result, built = evaluator.evaluate(spec, Problem(512, 512, 512, DType.bf16, bias=True))
    assert result["status"] == "ok", result["evidence"]
    try:
        text = sass.disassemble(built.compiled.cubin)
    except sass.SassError as e:
        pytest.skip(f"no disassembler on this machine: {e}")
    ops = sass.opcodes(text, spec.name)
    assert {op: ops[op] for op in expected} == expected


@pytest.mark.parametrize("dtype,params", [(DType.bf16, dict(persistent=True, prepass="pack")),
                                          (DType.fp16, dict(bm=128, bn=128, consumers=1)),
                                          (DType.bf16, dict(SPLITS[0], prepass="pack"))])
def test_exported_kernel_runs_from_its_manifest_alone(dtype, params):
    k = 91 if params.get("prepass") == "pack" else 88
    problem = Problem(67, 45, k, dtype, bias=True)
    spec = Spec(dtype=dtype, bias=True, **params)
    cu, js = export_files(spec, problem, None, "sm_90")
    manifest = json.loads(js)
    assert any("tensor_map" in a for kernel in manifest["kernels"] for a in kernel["args"])
    rng = np.random.default_rng()
    x, w, b = (to_storage(rng.uniform(-1, 1, shape).astype(np.float32), dtype) for shape in ((67, k), (45, k), 45))
    y = to_float64(_launch_from_manifest(cu, manifest, x, w, b), dtype)
    ref = to_float64(x, dtype) @ to_float64(w, dtype).T + to_float64(b, dtype)
    assert np.isfinite(y).all()
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < dtype.rel_tol


def test_bench_and_search_through_the_cli(tmp_path):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    bench = subprocess.run(
        [sys.executable, "-m", "codegen", "bench", "--family", "hopper", "--dtype", "bf16", "--m", "1000", "--n", "1000",
         "--k", "1000", "--bias", "--bn", "128", "--persistent", "--db", db, "--no-baseline"],
        capture_output=True, text=True, timeout=600)
    assert bench.returncode == 0, bench.stderr[-2000:] + bench.stdout[-2000:]
    assert " ok " in bench.stdout and "hp_bf16_bias_128x128x64_c2_s4_g8_ps" in bench.stdout
    search = subprocess.run(
        [sys.executable, "-m", "codegen", "search", "--family", "hopper", "--dtype", "fp16", "--m", "1024", "--n", "768",
         "--k", "1000", "--budget", "6", "--db", db, "--quiet", "--json", "--no-baseline"],
        capture_output=True, text=True, timeout=600)
    assert search.returncode == 0, search.stderr[-2000:]
    summary = json.loads(search.stdout.strip().splitlines()[-1])
    assert summary["evaluated"] == 6 and summary["best"]["kernel"].startswith("hp_fp16_nobias_")
    from store import Store

    rows = [r for r in Store(db, read_only=True).trials() if r["status"] not in ("invalid",)]
    assert len(rows) == 7 and all(r["status"] == "ok" for r in rows), [(r["kernel"], r["status"]) for r in rows]
