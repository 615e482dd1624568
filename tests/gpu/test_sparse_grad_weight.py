"""GPU tier: the weight gradient of a block-sparse W sampled at its kept blocks (tensor-core, SIMT and
Hopper families) is correct on awkward layers: N and K that end inside a block (padded last block row and
column), empty block rows, batches of one row and of odd length, a large sparse layer; on Hopper also tiles
of two consumer warpgroups at every fill (one consumer's blocks only, both partly or wholly filled); dW (the
kept blocks) and db NaN-poisoned before each run and checked against float64, the odd-shape probe run
with each; a plan that leaves dW unwritten is caught."""

from __future__ import annotations

import numpy as np
import pytest

import codegen.evaluate as evaluate
from codegen import sparse
from codegen.evaluate import Evaluator
from codegen.families.hopper import Spec as HopperSpec
from codegen.families.simt import Spec as SimtSpec
from codegen.families.simt import sampled_defaults as simt_defaults
from codegen.families.tensorcore import Spec as TcSpec
from codegen.families.tensorcore import sampled_defaults as tc_defaults
from codegen.launch import LaunchPlan
from codegen.problem import DType, Layout

pytestmark = pytest.mark.gpu

GW = Layout.grad_weight
QUICK = {"reps_min": 2, "reps_max": 2, "target_ms": 1.0}
#: (batch, in, out, density) of a layer whose W [out, in] is block-sparse: ragged in and out, one row,
#: odd batches, 16-byte rows (the cp.async path), a large layer at density 0.1.
LAYERS = [(91, 45, 67, 0.5), (1, 100, 130, 0.5), (333, 1023, 1021, 0.3), (40, 96, 128, 0.5), (4096, 4096, 4096, 0.1)]


def pattern_of(out: int, fin: int, block: int, density: float, seed: int = 3) -> sparse.Pattern:
    """A random pattern of that density with its first two block rows emptied (where it has more than
    two) and the padded corner block kept."""
    mask = sparse.Pattern.random(out, fin, block, density, seed).mask()
    mask[: 2 if mask.shape[0] > 2 else 1] = False
    mask[-1, -1] = True
    return sparse.Pattern.from_mask(mask, out, fin, block)


CASES = [
    *(TcSpec(dtype=dt, layout=GW, block=b, bias=bias, **tc_defaults(b))
      for dt in (DType.bf16, DType.fp16) for b in (16, 32, 64) for bias in (False, True)),
    TcSpec(layout=GW, block=64, bm=32, bn=16, bk=32, wm=16, wn=16, group_m=1, epilogue="direct", bias=True),
    TcSpec(dtype=DType.fp16, layout=GW, block=32, bm=32, bn=32, bk=64, wm=16, wn=16, warps_k=2, group_m=1, smem="pad"),
    TcSpec(layout=GW, block=32, bm=32, bn=32, wm=16, wn=16, group_m=1, mma="wmma", smem="pad", bias=True),
    TcSpec(layout=GW, block=64, bm=64, bn=64, bk=64, wm=32, wn=32, stages=3, group_m=1),
    *(SimtSpec(dtype=dt, layout=GW, block=b, bias=True, **simt_defaults(b))
      for dt in (DType.fp32, DType.bf16) for b in (16, 32, 64)),
    SimtSpec(layout=GW, block=32, **{**simt_defaults(32), "bk": 16}, copy="async", stages=3, pad=4),
    SimtSpec(dtype=DType.bf16, layout=GW, block=32, bm=32, bn=16, wm=16, wn=16, tm=2, tn=4, bk=16, copy="async",
             stages=2, pad=8, vec=8, group_m=1, bias=True),
    SimtSpec(layout=GW, block=64, bm=32, bn=64, wm=32, wn=32, tm=4, tn=8, bk=1, pad=0, vec=1, stages=0, group_m=1),
]


#: Hopper: blocks of 64, tiles of one to four kept blocks of a row per consumer warpgroup (one or two sharing
#: dY's box) on a persistent grid. Layers whose out and in are multiples of 8 (TMA's 16-byte rows; the batch is
#: free): ragged in and out, one row, an odd batch, rows of many kept blocks (groups of a row, a short last
#: group: rows of 10 leave a two-consumer tile of 8 a last one of 2, its second consumer idle), more tiles than
#: the grid (a large layer).
HOPPER_LAYERS = [(91, 72, 136, 0.5), (1, 96, 128, 0.5), (333, 1016, 1024, 0.3), (77, 600, 256, 1.0),
                 (2048, 4096, 4096, 0.25)]
SAMPLED_HOPPER = dict(layout=GW, block=64, bm=64, consumers=1, persistent=True, group_m=1)
TWO_CONSUMERS = {**SAMPLED_HOPPER, "consumers": 2}
HOPPER_CASES = [
    HopperSpec(bn=256, stages=4, **SAMPLED_HOPPER),
    HopperSpec(bn=256, stages=4, bias=True, **SAMPLED_HOPPER),
    HopperSpec(bn=128, stages=3, ctas=2, dtype=DType.fp16, **SAMPLED_HOPPER),
    HopperSpec(bn=64, stages=6, ctas=2, **SAMPLED_HOPPER),
    HopperSpec(bn=192, stages=4, bias=True, dtype=DType.fp16, **SAMPLED_HOPPER),
    HopperSpec(bn=192, stages=3, ctas=2, **SAMPLED_HOPPER),  # the widest tile two blocks per multiprocessor compile
    # two consumer warpgroups, dY's box shared: tiles of 8, 6, 4 and 2 kept blocks
    HopperSpec(bn=256, stages=3, **TWO_CONSUMERS),
    HopperSpec(bn=256, stages=3, bias=True, dtype=DType.fp16, **TWO_CONSUMERS),
    HopperSpec(bn=192, stages=4, **TWO_CONSUMERS),
    HopperSpec(bn=128, stages=5, bias=True, **TWO_CONSUMERS),
    HopperSpec(bn=64, stages=4, ctas=2, dtype=DType.fp16, **TWO_CONSUMERS),
]
#: Kept blocks of each block row of FILLS' W (14 block columns): empty rows, fewer than one consumer's GROUP + 1
#: (the second consumer idle in every tile of bn 256), exactly GROUP, GROUP + 1, a full tile of 8, one more
#: (a short last tile), counts that are not multiples of 8, and a full row.
FILL_COUNTS = (0, 1, 3, 4, 5, 8, 0, 9, 11, 13, 14)


def fills_pattern(counts=FILL_COUNTS, cols: int = 14, seed: int = 5) -> sparse.Pattern:
    """W [out, in] whose block row r keeps counts[r] blocks at random columns, out and in ragged (the last block
    row and column padded, multiples of 8 for TMA's rows) and the padded corner block kept."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((len(counts), cols), dtype=bool)
    for r, n in enumerate(counts):
        mask[r, rng.choice(cols, size=n, replace=False)] = True
    if not mask[-1, -1]:
        mask[-1, np.flatnonzero(mask[-1])[0]], mask[-1, -1] = False, True
    return sparse.Pattern.from_mask(mask, len(counts) * 64 - 8, cols * 64 - 24, 64)


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(baseline=False, timing=QUICK, timeout_s=120.0) as ev:
        yield ev


def test_every_case_is_a_valid_sampled_spec():
    assert len(CASES) >= 25
    for spec in CASES:
        assert spec.sampled and not spec.check(), (spec.name, spec.check())


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.name)
def test_sampled_weight_gradients_are_correct(evaluator, spec):
    for batch, fin, out, density in LAYERS:
        pattern = pattern_of(out, fin, spec.block, density)
        assert not pattern.mask()[0].any()
        problem = sparse.problem_for(batch, pattern, spec.dtype, spec.bias, GW)
        result, _ = evaluator.evaluate(spec, problem)
        assert result["status"] == "ok", f"{spec.name} on {problem.key}: {result['evidence']}"
        assert result["rel_error"] is not None and result["rel_error"] < spec.dtype.rel_tol


def test_a_pattern_with_every_block_row_empty_but_one(evaluator):
    spec = CASES[0]
    mask = np.zeros((16, 9), dtype=bool)
    mask[11, [0, 8]] = True
    pattern = sparse.Pattern.from_mask(mask, 250, 130, spec.block)
    result, _ = evaluator.evaluate(spec, sparse.problem_for(77, pattern, spec.dtype, spec.bias, GW))
    assert result["status"] == "ok", result["evidence"]


@pytest.mark.parametrize("spec", HOPPER_CASES, ids=lambda s: s.name)
def test_hopper_sampled_weight_gradients_are_correct(evaluator, spec):
    assert spec.sampled and not spec.check(), spec.check()
    for batch, fin, out, density in HOPPER_LAYERS:
        pattern = pattern_of(out, fin, spec.block, density)
        problem = sparse.problem_for(batch, pattern, spec.dtype, spec.bias, GW)
        result, _ = evaluator.evaluate(spec, problem)
        assert result["status"] == "ok", f"{spec.name} on {problem.key}: {result['evidence']}"
        assert result["rel_error"] is not None and result["rel_error"] < spec.dtype.rel_tol


@pytest.mark.parametrize("spec", [s for s in HOPPER_CASES if s.consumers == 2], ids=lambda s: s.name)
def test_hopper_two_consumer_tiles_at_every_fill(evaluator, spec):
    """Tiles of two consumer warpgroups holding 1 to 2 x GROUP kept blocks (a consumer without blocks still hands
    every stage back), on a ragged W at an odd batch and a batch of one row."""
    pattern = fills_pattern()
    assert [int(n) for n in np.diff(pattern.indptr)] == list(FILL_COUNTS) and pattern.mask()[-1, -1]
    for batch in (131, 1):
        problem = sparse.problem_for(batch, pattern, spec.dtype, spec.bias, GW)
        assert not spec.check(problem), spec.check(problem)
        result, _ = evaluator.evaluate(spec, problem)
        assert result["status"] == "ok", f"{spec.name} on {problem.key}: {result['evidence']}"
        assert result["rel_error"] is not None and result["rel_error"] < spec.dtype.rel_tol


@pytest.mark.parametrize("drop", ["_db", "main"])
def test_an_unwritten_output_is_caught(evaluator, monkeypatch, drop):
    """A plan without the db kernel leaves db as NaN poison; one without the GEMM leaves dW's blocks."""
    spec = TcSpec(layout=GW, block=64, bias=True, **tc_defaults(64))
    real = evaluate.plan

    def planted(s, p) -> LaunchPlan:
        full = real(s, p)
        keep = tuple(x for x in full.launches if x.symbol.endswith("_db") != (drop == "_db"))
        return LaunchPlan(launches=keep, workspace_bytes=full.workspace_bytes, zero_output=full.zero_output)

    monkeypatch.setattr(evaluate, "plan", planted)
    problem = sparse.problem_for(96, pattern_of(256, 192, 64, 0.5), spec.dtype, True, GW)
    result, _ = evaluator.evaluate(spec, problem)
    assert result["status"] == "nan_or_inf", result
    assert (" DB:" in result["evidence"]) == (drop == "_db") and (" DW:" in result["evidence"]) == (drop == "main")
