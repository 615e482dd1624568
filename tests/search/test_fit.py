"""The one rule for which families a problem's search takes, on an arch."""

from __future__ import annotations

from codegen.problem import DType, Layout, Problem
from codegen.sparse import Pattern, problem_for
from codegen.spec import DeviceLimits
from search.fit import chosen, fitting, ranked

SM90, SM80 = DeviceLimits.for_arch("sm_90"), DeviceLimits.for_arch("sm_80")


def names(problem, limits, asked=None):
    return [f.family for f in chosen(fitting(problem, limits, asked))]


def test_16_bit_takes_the_tensor_core_families_fastest_first():
    dense = Problem(2048, 6144, 4096, DType.bf16)
    assert names(dense, SM90) == ["hopper", "tensorcore"]
    assert names(Problem(2048, 6144, 4096, DType.fp16), SM90) == ["hopper", "tensorcore"]
    assert names(dense, SM80) == ["tensorcore"]  # Hopper needs sm_90
    why = {f.family: f.why for f in fitting(dense, SM80)}
    assert "sm_90" in why["hopper"] and "--family simt" in why["simt"] and "block-sparse" in why["direct"]


def test_a_block_sparse_w_adds_the_direct_family():
    sparse = problem_for(32, Pattern.random(4096, 4096, 64, 0.1, 0), DType.bf16)
    assert names(sparse, SM90) == ["hopper", "tensorcore", "direct"]


def test_fp32_takes_simt_and_tf32_only_when_asked():
    assert names(Problem(4096, 4096, 4096, DType.fp32), SM90) == ["simt"]
    assert names(Problem(4096, 4096, 4096, DType.tf32), SM90) == ["tensorcore"]


def test_alignment_leaves_out_a_family_that_cannot_read_the_rows():
    odd = Problem(33, 4095, 4097, DType.bf16, Layout.grad_weight)
    assert names(odd, SM90) == ["tensorcore"]


def test_asked_families_keep_their_order_and_simt_computes_16_bit_when_asked():
    dense = Problem(256, 256, 256, DType.bf16)
    assert names(dense, SM90, ["simt", "hopper"]) == ["simt", "hopper"]


def test_every_family_is_ranked():
    assert ranked() == ["hopper", "hopper_sp24", "sparse24", "tensorcore", "direct", "simt"]
