"""Block-sparse variants on the CPU: spec identity and rules, search spaces, plans, inputs and the
float64 reference (the GPU tier runs the kernels: tests/gpu/test_sparse.py)."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import sparse
from codegen.data import random_inputs, reference, to_float64
from codegen.evaluate import patterns, probe_for
from codegen.families import spec_from_name
from codegen.families.simt import Spec as SimtSpec
from codegen.families.tensorcore import Spec as TcSpec
from codegen.launch import SPARSE_ARGS, grid_rule, plan
from codegen.problem import DType, Problem
from codegen.render import render
from search.space import point_of, space_for, to_spec

PATTERN = sparse.Pattern.random(200, 333, 32, 0.4, seed=2)
PROBLEM = sparse.problem_for(67, PATTERN, DType.bf16, bias=True)


def test_a_sparse_problem_says_what_it_is():
    assert PROBLEM.sparse and PROBLEM.block == 32 and PROBLEM.pattern == PATTERN.hash
    assert PROBLEM.key.endswith(f"_bsr32_d{PATTERN.density:.4g}_{PATTERN.hash[:8]}")
    assert PROBLEM.flops == pytest.approx(2 * 67 * 200 * 333 * PATTERN.density)
    assert Problem.from_dict(PROBLEM.to_dict()) == PROBLEM
    with pytest.raises(ValueError, match="pattern"):
        Problem(4, 4, 4, block=16, density=0.5)
    with pytest.raises(ValueError, match="dense"):
        Problem(4, 4, 4, density=0.5)


@pytest.mark.parametrize("spec", [
    TcSpec(bn=32, bk=32, wm=32, wn=32, block=32, bias=True),
    SimtSpec(dtype=DType.bf16, bias=True, bm=64, bn=32, bk=32, wm=32, wn=32, tm=4, tn=8, vec=8, pad=8, stages=3,
             copy="async", block=32),
])
def test_sparse_specs_are_named_checked_and_planned(spec):
    assert spec.name.endswith("_bsr32") and spec_from_name(spec.name) == spec
    assert spec.check(PROBLEM) == []
    dense = Problem(67, 200, 333, DType.bf16, bias=True)
    assert any("block" in why for why in spec.check(dense))
    launch = plan(spec, PROBLEM).launches[0]
    assert launch.args == SPARSE_ARGS
    assert launch.grid[0] == -(-67 // spec.bm) * PATTERN.block_rows
    assert "RP[ceil(N/32)+1]" in grid_rule(spec)
    assert "const int* __restrict__ RP" in render(spec)


def test_sparse_rules_refuse_tiles_across_block_rows():
    assert any("bn must divide the block" in w for w in TcSpec(bn=64, bk=32, wm=32, wn=32, block=32).check())
    assert TcSpec(bm=32, bn=32, bk=64, wm=32, wn=16, block=64).check() == []  # half of each block's rows
    assert any("bn must equal the block" in w for w in SimtSpec(bm=64, bn=16, bk=16, wm=32, wn=16, tm=4, tn=4,
                                                                  block=32).check())
    assert any("must divide the block" in w for w in SimtSpec(bm=64, bn=16, bk=32, wm=32, wn=16, tm=4, tn=4,
                                                               block=16).check())
    assert TcSpec(bn=16, bk=64, wm=32, wn=16, block=16).check() == []  # four whole blocks per k-tile
    assert any("prepass" in w for w in TcSpec(bn=32, bk=32, wm=32, wn=32, block=32, prepass="pack").check())
    assert any("stages" in w for w in SimtSpec(bm=16, bn=16, bk=1, wm=4, wn=8, tm=1, tn=1, pad=0, vec=1, stages=0,
                                               block=16).check())
    assert any("block must be one of" in w for w in TcSpec(bn=48, bk=16, wm=16, wn=16, block=48).check())


@pytest.mark.parametrize("family", ["simt", "tensorcore"])
def test_the_sparse_space_fixes_the_block_row(family):
    space = space_for(family, DType.bf16, block=32)
    # a SIMT block tile is one block row; a tensor-core one may be an equal part of it
    assert space.dims.get("bn") == {"simt": None, "tensorcore": (16, 32)}[family]
    # SIMT k-tiles divide the block; tensor-core k-tiles may also hold several whole blocks
    assert all(32 % v == 0 or (family == "tensorcore" and v % 32 == 0) for v in space.dims["bk"])
    assert (64 in space.dims["bk"]) == (family == "tensorcore")
    point = next(iter(space.points()))
    spec = to_spec(family, point, PROBLEM)
    assert (spec.bn, spec.block) == ((32 if family == "simt" else point["bn"]), 32)
    if family == "tensorcore":  # a point found at a larger block, or a built-in seed (bn None), takes the block
        assert to_spec(family, dict(point, bn=64), PROBLEM).bn == 32 == to_spec(family, dict(point, bn=None), PROBLEM).bn
    valid = {"tensorcore": TcSpec(bias=True, bn=32, bk=32, wm=32, wn=32, block=32),
             "simt": SimtSpec(dtype=DType.bf16, bias=True, bm=64, bn=32, bk=16, wm=32, wn=32, tm=4, tn=8, block=32)}
    assert to_spec(family, point_of(valid[family]), PROBLEM) == valid[family]
    assert space_for(family, DType.bf16, restricted=True, block=32).size < space.size


def test_inputs_and_reference_follow_the_pattern():
    inputs = random_inputs(PROBLEM, np.random.default_rng(0))
    assert inputs["W"].shape == (PATTERN.nnzb, 32, 32)
    np.testing.assert_array_equal(inputs["RP"], PATTERN.indptr)
    np.testing.assert_array_equal(inputs["CI"], PATTERN.indices)
    w = to_float64(PATTERN.expand(inputs["W"]), DType.bf16)
    x, b = to_float64(inputs["X"], DType.bf16), to_float64(inputs["B"], DType.bf16)
    np.testing.assert_allclose(reference(PROBLEM, inputs), x @ w.T + b)
    # padding past N and K is zero in the stored blocks: the kernels multiply it
    last = PATTERN.block_rows - 1
    kept = PATTERN.indices[PATTERN.indptr[last]:PATTERN.indptr[last + 1]]
    assert kept.size and not to_float64(inputs["W"][PATTERN.indptr[last]], DType.bf16)[200 - last * 32:].any()


def test_the_probe_of_a_sparse_problem_is_sparse_and_shipped_to_the_worker():
    probe = probe_for(PROBLEM)
    assert probe.sparse and probe.block == 32 and (probe.m, probe.n, probe.k) == (67, 45, 91)
    shipped = patterns(PROBLEM, probe, Problem(1, 2, 3))
    assert set(shipped) == {PROBLEM.pattern, probe.pattern}
    assert sparse.Pattern.from_dict(shipped[probe.pattern]).hash == probe.pattern


def test_an_exported_sparse_kernel_describes_its_bsr_arguments():
    from codegen.export import manifest

    spec = TcSpec(bias=True, bn=32, bk=32, wm=32, wn=32, block=32)
    doc = manifest(spec, PROBLEM, "sm_90")
    args = [(a["name"], a["type"]) for a in doc["kernels"][0]["args"]]
    assert ("RP", "const int*") in args and ("CI", "const int*") in args and ("W", "const __nv_bfloat16*") in args
    assert doc["sparse"]["block"] == 32 and doc["sparse"]["pattern"] == PATTERN.hash
    assert "[nnzb][32][32]" in doc["sparse"]["arguments"] and "RP[ceil(N/32)+1]" in doc["grid_rule"]
    assert "sparse" not in manifest(TcSpec(bias=True), Problem(64, 64, 64, DType.bf16, bias=True), "sm_90")
