"""The direct family (block-sparse W at small batches): names, rules, plan, source and space, on the CPU.
Its kernels' results are checked on the GPU (tests/gpu/test_sparse.py)."""

from __future__ import annotations

import pytest

from codegen import sparse
from codegen.families import direct
from codegen.families.direct import Spec
from codegen.launch import SPARSE_ARGS
from codegen.problem import DType, Layout, Problem
from codegen.render import render
from search.space import point_of, space_for, to_spec

PATTERN = sparse.Pattern.random(200, 300, 32, 0.3, seed=5)
PROBLEM = sparse.problem_for(40, PATTERN, DType.bf16, True)


def test_the_name_is_the_identity():
    spec = Spec(bias=True, bm=32, bn=16, warps=4, depth=2, block=32)
    assert spec.name == "dr_bf16_bias_32x16_w4_d2_bsr32"
    assert Spec.from_name(spec.name) == spec
    with pytest.raises(ValueError, match="not a direct kernel name"):
        Spec.from_name("tc_bf16_nobias_mma_32x32x64_w16x16x1_s8x_ed_g8_k1_bsr64")
    with pytest.raises(ValueError, match="canonical"):
        Spec.from_name("dr_bf16_bias_032x16_w4_d2_bsr32")


@pytest.mark.parametrize("fields,needle", [
    (dict(block=0), "block-sparse W"),
    (dict(dtype=DType.fp32), "takes bf16, fp16"),
    (dict(bm=24), "bm must be a multiple of 16"),
    (dict(bn=48), "bn must be a multiple of 8 dividing the block"),
    (dict(bn=128), "dividing the block"),
    (dict(warps=0), "warps must be 1 to 32"),
    (dict(depth=5), "depth must be 1 to 4"),
    (dict(bm=64, bn=64, depth=4), "registers per thread"),
])
def test_check_names_each_broken_rule(fields, needle):
    why = Spec(**fields).check()
    assert any(needle in w for w in why), why


def test_check_against_the_problem():
    spec = Spec(bias=True, bm=32, bn=32, warps=8, block=32)
    assert spec.check(PROBLEM) == []
    dense = Problem(40, 200, 300, DType.bf16, bias=True)
    assert any("needs a block-sparse one" in w for w in spec.check(dense))
    backward = Problem(40, 200, 300, DType.bf16, Layout.grad_input, False, 32, 0.3, PATTERN.hash)
    assert any("forward layout only" in w for w in Spec(bm=32, bn=32, block=32).check(backward))


def test_plan_covers_the_output_in_cta_tiles():
    spec = Spec(bias=True, bm=32, bn=16, warps=4, block=32)
    (launch,) = direct.plan(spec, PROBLEM).launches
    assert launch.grid == (-(-200 // 16), -(-40 // 32), 1) and launch.block == (128, 1, 1)
    assert launch.args == SPARSE_ARGS and launch.smem == 32 * (16 + direct.C_PAD) * 4
    assert direct.plan(Spec(warps=1, block=32, bn=32), PROBLEM).launches[0].smem == 0  # one warp: no shared tile
    assert "grid = (ceil(N/16), ceil(M/32), 1)" in direct.grid_rule(spec) and "RP[ceil(N/32)+1]" in direct.grid_rule(spec)


def test_source_feeds_mma_from_memory_with_one_loop_per_alignment_case():
    src = render(Spec(bias=True, bm=32, bn=32, warps=8, depth=2, block=64))
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in src
    assert "mainloop<true>" in src and "mainloop<false>" in src and "ldmatrix" not in src
    assert "atomicAdd(C +" in src and "to_f(B[gc + q])" in src
    one_warp = render(Spec(bm=32, bn=16, warps=1, block=16))
    assert "atomicAdd" not in one_warp and "__syncthreads" not in one_warp and "uint2" in one_warp


def test_the_space_is_sparse_only_and_maps_both_ways():
    with pytest.raises(ValueError, match="block-sparse W only; give --block"):
        space_for("direct", DType.bf16)
    space = space_for("direct", DType.bf16, block=32)
    assert space.dims["bn"] == (8, 16, 32)
    spec = Spec(bias=True, bm=16, bn=8, warps=2, depth=2, block=32)
    assert to_spec("direct", point_of(spec), PROBLEM) == spec
    assert space_for("direct", DType.fp16, restricted=True, block=32).size < space.size
    with pytest.raises(ValueError, match="takes bf16, fp16"):
        space_for("direct", DType.fp32, block=32)
