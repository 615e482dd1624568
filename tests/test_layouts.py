"""CPU tier: the linear layer's backward GEMMs (layouts grad_input and grad_weight) in the SIMT,
tensor-core and Hopper families: names, refusals, data and references, launch plans, the command line,
and NVRTC 13.0 builds (sm_80 and sm_90; sm_90a for Hopper) without spills. Numerics run on a GPU (tests/gpu/test_layouts.py)."""

from __future__ import annotations

import difflib
import hashlib

import numpy as np
import pytest

from codegen import cli, families, sass, sparse
from codegen.cli import options
from codegen.data import input_shapes, output_shapes, random_inputs, references, to_float64
from codegen.evaluate import probe_for
from codegen.families.hopper import Spec as HopperSpec
from codegen.families.hopper import template_values
from codegen.families.simt import Spec as SimtSpec
from codegen.families.tensorcore import Spec as TcSpec
from codegen.launch import LaunchPlan, grid_rule, plan, workspace_bytes
from codegen.problem import DType, Layout, Problem, linear_problems
from codegen.render import render
from tests.compiled import compile_all

GI, GW = Layout.grad_input, Layout.grad_weight

#: Forward sources as main rendered them before the backward layouts existed (sha256 of the text):
#: the backward layouts must not change a byte of any forward kernel.
FORWARD_PINS = {
    SimtSpec(): "8bee36bb50415940cb46904ad8db4a5cbd0b2e556fffc9f7b6878d7224e5cd3a",
    SimtSpec(dtype="bf16", bias=True, copy="async", pad=8, stages=3, bm=32, bn=128, bk=32, wm=16, wn=64, tm=4, tn=8,
             split_k=8, reduce="two_pass"): "469e8ad12dc6983ce90133c144b30e83887bfa6574a3efd618db858df142da59",
    SimtSpec(dtype="fp32", bias=True, split_k=4, reduce="atomic"):
        "4ea53f9fa97da8e7c9e52a8a0badabf31fcd30836e89e29d36d4e1f7bfa1f0e1",
    SimtSpec(bk=1, pad=0, vec=1, stages=0, bm=64, bn=64, wm=32, wn=32, tm=4, tn=8):
        "288c74ad609d62412811a41400af231657e9f71a782c4f0b059e185918c6e635",
    SimtSpec(dtype="fp16", block=64, bn=64, bk=16, wn=64, wm=32):
        "b22abffdd0316c4e7ce82ade7f69e418c202fabdf4a605c6232b9694ea698351",
    TcSpec(): "c9a1d7bc6f909091ffbc8d60d1620ca905421e232b97823bf1dcfab2f1519ac4",
    TcSpec(dtype="fp16", bias=True, mma="wmma", smem="pad", bm=64, bn=64, wm=32, wn=32):
        "e4a66f7abe7dc53dfcb5afa3471e5cfc27c53b46fe28f8ff47fb91e48ba84663",
    TcSpec(dtype="tf32", bias=True, prepass="pack", split_k=2, reduce="atomic", epilogue="direct"):
        "fd25581f970475fb6828cda524825664b103c7fefa6412ef37235b7c5fd118cf",
    TcSpec(dtype="bf16", bm=32, bn=16, bk=256, wm=16, wn=16, warps_k=4, split_k=2, reduce="two_pass"):
        "a1eb9dab8715e11e09a30c2bad5e91c41ba1e4f14cc1feac4cc824f5329d4f67",
    # re-pinned at 1af54e0, which gave the sparse tile a row offset within its block row (a block tile may
    # span part of one): the same kernel for bn == block (the offset is 0), run by the GPU tier there
    TcSpec(dtype="bf16", block=32, bn=32, wn=32, bm=128, wm=64):
        "e8b51a2c08e43ba150911cab9948b2aff7d2a389a330bf2c633de993b4ab1be5",
}

#: Backward SIMT kernels covering every load path: register copies (double-buffered and single),
#: cp.async (16-byte and fp32), no shared memory, and both split-K reductions.
SIMT_BACKWARD = [
    SimtSpec(layout=GI),
    SimtSpec(layout=GW, bias=True),
    SimtSpec(layout=GI, dtype="bf16", copy="async", pad=8, stages=3, bm=32, bn=128, bk=32, wm=16, wn=64, tm=4, tn=8,
             split_k=4, reduce="two_pass"),
    SimtSpec(layout=GW, dtype="bf16", bias=True, copy="async", pad=8, stages=3, bm=64, bn=128, bk=32, wm=32, wn=64,
             tm=8, tn=8),
    SimtSpec(layout=GW, dtype="fp32", copy="async", pad=4, stages=4, bm=64, bn=64, bk=16, wm=32, wn=32, tm=4, tn=8,
             split_k=2, reduce="atomic"),
    SimtSpec(layout=GW, dtype="fp16", stages=1, bias=True, bm=64, bn=64, wm=32, wn=32, tm=4, tn=8),
    SimtSpec(layout=GI, bk=1, pad=0, vec=1, stages=0, bm=64, bn=64, wm=32, wn=32, tm=4, tn=8),
]

#: Backward tensor-core kernels: ldmatrix.trans on swizzled and padded tiles, wmma, slice-K with a
#: two-pass split-K, and db.
TC_BACKWARD = [
    TcSpec(layout=GI),
    TcSpec(layout=GW, bias=True, dtype="fp16"),
    TcSpec(layout=GW, bm=64, bn=64, bk=32, wm=32, wn=32, epilogue="direct", smem="pad"),
    TcSpec(layout=GI, dtype="fp16", bm=32, bn=16, bk=256, wm=16, wn=16, warps_k=4, split_k=2, reduce="two_pass"),
    TcSpec(layout=GW, mma="wmma", smem="pad", bm=64, bn=64, wm=32, wn=32, bias=True),
]

#: Backward Hopper kernels: k-outer boxes for W (grad_input) and for both operands (grad_weight, db),
#: one and two consumer warpgroups, persistent, two blocks per multiprocessor, fp16.
#: dW sampled at a block-sparse W's kept blocks on Hopper: tiles of one to four kept blocks of a block row, and
#: (C2) two consumer warpgroups sharing dY's box, two to eight kept blocks a tile.
SAMPLED = dict(layout=GW, block=64, bm=64, consumers=1, persistent=True, group_m=1)
C2 = {**SAMPLED, "consumers": 2}
HOPPER_SAMPLED = [HopperSpec(bn=256, stages=4, **SAMPLED), HopperSpec(bn=128, stages=3, ctas=2, bias=True, **SAMPLED),
                  HopperSpec(bn=64, stages=6, ctas=2, dtype="fp16", **SAMPLED), HopperSpec(bn=256, stages=3, **C2),
                  HopperSpec(bn=192, stages=4, bias=True, dtype="fp16", **C2), HopperSpec(bn=64, stages=4, ctas=2, **C2)]
#: Sources of one consumer warpgroup per sampled tile as rendered before two could share one: unchanged since.
SAMPLED_PINS = {
    HopperSpec(bn=256, stages=4, **SAMPLED): "3ac2933591fae666e91109ff89e782bf8f897bd3b8716e5771bc69aba4790d7e",
    HopperSpec(bn=128, stages=3, ctas=2, bias=True, **SAMPLED):
        "093a253f34288b9f1bdf27e5faa99c997e98807387e5e2ddbeb380b2d72713fd",
    HopperSpec(bn=64, stages=6, ctas=2, dtype="fp16", **SAMPLED):
        "6607e33c8802d6a02e82e1d9a7f17e22b3b00dc51ad661123265eab3b747d93f",
}
HOPPER_BACKWARD = [
    HopperSpec(layout=GI),
    HopperSpec(layout=GW, bias=True),
    HopperSpec(layout=GW, dtype="fp16", bm=128, bn=128, consumers=1, stages=5, persistent=True),
    HopperSpec(layout=GI, bm=64, bn=64, consumers=1, ctas=2),
    HopperSpec(layout=GI, bm=64, bn=128, consumers=1, stages=6, split_k=4),
    HopperSpec(layout=GW, bias=True, bm=128, bn=128, split_k=2),
]


# ---- identity ------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", list(FORWARD_PINS), ids=lambda s: s.name)
def test_forward_sources_are_byte_identical_to_main(spec):
    assert spec.layout is Layout.forward and not spec.name.endswith(("_gi", "_gw"))
    assert hashlib.sha256(render(spec).encode()).hexdigest() == FORWARD_PINS[spec]


@pytest.mark.parametrize("spec", SIMT_BACKWARD, ids=lambda s: s.name)
def test_backward_names_round_trip(spec):
    suffix = {GI: "_gi", GW: "_gw"}[spec.layout]
    assert spec.name.endswith(suffix)
    assert families.spec_from_name(spec.name) == spec
    assert families.spec_from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["layout"] == spec.layout.value
    forward = SimtSpec.from_dict({**spec.to_dict(), "layout": "forward"})
    assert forward.name == spec.name[: -len(suffix)] and forward != spec


def test_tensorcore_backward_names_round_trip():
    for layout in (GI, GW):
        spec = TcSpec(layout=layout)
        assert spec.name == TcSpec().name + {GI: "_gi", GW: "_gw"}[layout]
        assert families.spec_from_name(spec.name) == spec == families.spec_from_dict(spec.to_dict())
    for spec in TC_BACKWARD:
        assert families.spec_from_name(spec.name) == spec


def test_layout_is_set_by_the_problem_not_a_variant_option():
    assert "layout" not in {f.name for f in families.variant_fields("simt")}
    assert "layout" not in {f.name for f in families.variant_fields("tensorcore")}
    assert families.takes_layouts("simt") and families.takes_layouts("tensorcore") and families.takes_layouts("hopper")


# ---- refusals ------------------------------------------------------------------------------------
def test_the_input_gradient_has_no_bias():
    with pytest.raises(ValueError, match="grad_input layout has no bias"):
        Problem(8, 8, 8, layout=GI, bias=True)
    assert any("grad_input layout has no bias" in r for r in SimtSpec(layout=GI, bias=True).check())
    assert any("grad_input layout has no bias" in r for r in TcSpec(layout=GI, bias=True).check())


def test_a_block_sparse_weight_gradient_is_sampled_where_generated_and_refused_clearly_elsewhere():
    """The SIMT and tensor-core families generate dW at the kept blocks (tests/test_sparse_grad_weight.py),
    the Hopper family for blocks of 64 and says so for others."""
    spec = SimtSpec(layout=GW, block=64, bn=64, bk=16, wn=64, wm=32, bm=64, group_m=1)
    assert not spec.check() and spec.sampled
    assert any("bm must divide the block" in r for r in TcSpec(layout=GW, block=32, bn=32).check())
    assert not SimtSpec(layout=GI, block=64, bn=64, bk=16, wn=64, wm=32).check()
    assert any("generated on Hopper for blocks of 64" in r and "tensorcore family generates it for any block" in r
               for r in HopperSpec(layout=GW, block=32, bm=32, bn=32, consumers=1, persistent=True, group_m=1).check())
    problem = sparse.problem_for(8, sparse.Pattern.random(64, 96, 32, 0.5), layout=GW)
    assert (problem.m, problem.n, problem.k, problem.layout) == (64, 96, 8, GW)


def test_spec_and_problem_must_agree_on_the_layout():
    problem = Problem(64, 64, 64, layout=GW)
    assert any("spec layout forward != problem layout grad_weight" in r for r in SimtSpec().check(problem))
    assert not SimtSpec(layout=GW).check(problem)
    assert any("layout" in r for r in TcSpec().check(Problem(64, 64, 64, DType.bf16, GI)))


def test_a_k_outer_operand_needs_vec_to_divide_its_tile_side():
    spec = SimtSpec(layout=GW, bm=2, bn=128, bk=8, wm=2, wn=128, tm=1, tn=8, vec=4, pad=4)  # 2x16 lanes: valid forward
    assert not SimtSpec.from_dict({**spec.to_dict(), "layout": "forward"}).check()
    assert any("vec 4 does not divide bm 2" in r for r in spec.check())
    odd_pad = SimtSpec(layout=GI, copy="async", stages=3, dtype="bf16", bk=32, pad=4, bm=64, bn=128, wm=32, wn=64)
    assert any("(bn + pad) * 2 B a multiple of 16" in r for r in odd_pad.check())


def test_tensorcore_refuses_what_its_backward_kernels_do_not_do():
    assert any("not tf32" in r for r in TcSpec(dtype="tf32", layout=GI).check())
    assert any("no pack prepass" in r for r in TcSpec(layout=GW, prepass="pack").check())
    assert not TcSpec(layout=GW).check(Problem(4097, 4095, 4093, DType.bf16, GW))
    ok = TcSpec(layout=GW, bm=64, bn=64, wm=32, wn=32)
    assert ok.pipeline_bytes == ok.stages * 32 * (64 + 64) * 2  # two [bk][64] k-outer bf16 tiles, swizzled (no pad)


def test_hopper_backward_names_round_trip_and_refusals():
    for spec in HOPPER_BACKWARD:
        assert spec.name.endswith(("_gi", "_gw")) and HopperSpec.from_name(spec.name) == spec
        assert families.spec_from_name(spec.name) == spec and HopperSpec.from_dict(spec.to_dict()) == spec
        assert not spec.check(Problem(4096, 4096, 4096, spec.dtype, spec.layout, spec.bias))
    assert HopperSpec(layout=GI).a_t is False and HopperSpec(layout=GI).w_t is True
    assert HopperSpec(layout=GW).a_t is True and HopperSpec(layout=GW).w_t is True
    assert any("spec layout forward != problem layout grad_input" in r
               for r in HopperSpec().check(Problem(256, 256, 256, DType.bf16, GI)))
    assert any("no bias" in r for r in HopperSpec(layout=GI, bias=True).check())
    assert any("multiple of 64" in r for r in HopperSpec(layout=GI, bn=96).check())
    assert any("cluster must be 1" in r for r in HopperSpec(layout=GW, cluster=2).check())
    assert any("no pack prepass" in r for r in HopperSpec(layout=GW, prepass="pack").check())
    assert any("bm must be the block (64)" in r for r in HopperSpec(layout=GW, block=64, bn=64).check())
    assert any("generated on Hopper for blocks of 64" in r for r in HopperSpec(layout=GW, block=32, bm=32, bn=32).check())
    # TMA's 16-byte row pitches: grad_input reads DY [M][K] and W [K][N]; grad_weight DY [K][M] and X [K][N]
    assert not HopperSpec(layout=GI).check(Problem(67, 72, 136, DType.bf16, GI))
    assert any("K=100" in r for r in HopperSpec(layout=GI).check(Problem(64, 64, 100, DType.bf16, GI)))
    assert any("N=60" in r for r in HopperSpec(layout=GI).check(Problem(64, 60, 64, DType.bf16, GI)))
    assert not HopperSpec(layout=GW).check(Problem(136, 72, 67, DType.bf16, GW))  # K (the batch) is free
    assert any("M=100" in r for r in HopperSpec(layout=GW).check(Problem(100, 64, 64, DType.bf16, GW)))


def test_hopper_sparse_grad_input_reads_w_s_blocks_in_place():
    """A block-sparse W's grad_input on Hopper walks Wᵀ's block rows with the forward's pipeline, reading W's own
    blocks through BI and transposing them in wgmma: the source differs from the forward's only there; its tensor
    maps view dY and W's blocks; blocks of 64 only, no swap; only dY's rows need 16-byte pitches."""
    from search.space import space_for

    pattern = sparse.Pattern.random(200, 136, 64, 0.5, seed=6)  # the layer's W [out, in]
    gi = sparse.problem_for(67, pattern, DType.bf16, layout=GI)
    kw = dict(bm=128, consumers=1, stages=4, ctas=2, persistent=True, grouped=True)
    fwd, spec = HopperSpec(block=64, bn=64, **kw), HopperSpec(block=64, bn=64, layout=GI, **kw)
    assert not spec.check(gi) and spec.in_place and spec.w_t and HopperSpec.from_name(spec.name) == spec
    changed = [line[0] + line[1:].strip() for line in difflib.unified_diff(render(fwd).replace(fwd.name, spec.name).splitlines(),
                                                                          render(spec).splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and line[:3] not in ("+++", "---") and not line[1:].strip().startswith("//")]
    assert any("const int* __restrict__ BI" in c for c in changed if c.startswith("+"))
    assert "+tma_load(dst + A_BYTES, TW, 0, __ldg(BI + kt) * BK, bar);" in changed
    assert any(c.startswith("+") and "p, 1, 1, 0, 1;" in c for c in changed)  # wgmma transposes B
    assert "+constexpr unsigned A_K_STEP_BYTES = 32, B_K_STEP_BYTES = 2048, A_LBO = 16, B_LBO = 8192;" in changed
    assert len([c for c in changed if c.startswith("+")]) == 6, changed  # those four, and the k-outer box constants
    plan = families.get("hopper").plan(spec, gi)
    assert plan.launches[0].args == ("DX", "TX", "TW", "B", "RP", "CI", "BI", "M", "N", "K")
    assert [(m.name, m.operand) for m in plan.tensor_maps] == [("TX", "DY"), ("TW", "W")]
    assert not [why for m in plan.tensor_maps for why in m.problems()]
    rule = families.get("hopper").grid_rule(spec)
    assert "TX over DY" in rule and "block array W " in rule and "BI[nnzb]" in rule
    assert "swap" not in space_for("hopper", DType.bf16, block=64, layout=GI).dims
    assert any("swap is generated for the forward layout" in r for r in HopperSpec(block=64, bn=64, layout=GI,
                                                                                    swap=True).check())
    assert any("blocks of 64" in r and "tensorcore" in r for r in HopperSpec(block=32, bn=32, layout=GI).check())
    odd_in = sparse.problem_for(64, sparse.Pattern.random(128, 60, 64, 0.5), DType.bf16, layout=GI)  # N = 60 is free
    assert not spec.check(odd_in)
    odd_out = sparse.problem_for(64, sparse.Pattern.random(100, 64, 64, 0.5), DType.bf16, layout=GI)  # K = 100 is not
    assert any("K=100" in r for r in spec.check(odd_out))
    assert any("cluster must be 1" in r for r in HopperSpec(block=64, bn=64, layout=GI, cluster=2).check())


def test_hopper_sampled_weight_gradient_walks_tiles_of_kept_blocks_of_a_row():
    """dW sampled at the kept blocks on Hopper: names, the rules that fix its tile and grid, the plan (a persistent
    grid of at most one block per kept block, dY and X read k-outer, W's index arrays, db after), the space and
    its seeds, and the built-in seed a layer takes."""
    from codegen.nn.bundle import SeedKernels
    from search.space import point_of, seeds, space_for

    pattern = sparse.Pattern.random(1024, 520, 64, 0.3, seed=2)  # the layer's W [out, in]
    gw = sparse.problem_for(333, pattern, DType.bf16, True, GW)  # M = out, N = in, K = the batch (free)
    for spec in HOPPER_SAMPLED:
        assert spec.sampled and not spec.check()
        assert HopperSpec.from_name(spec.name) == spec == families.spec_from_name(spec.name)
    spec = HOPPER_SAMPLED[1]
    assert spec.name == "hp_bf16_bias_64x128x64_c1_s3_g1_ps_bsr64_o2_gw" and not spec.check(gw)
    plan = families.get("hopper").plan(spec, gw)
    main, db = plan.launches
    assert main.grid == (pattern.nnzb, 1, 1) and main.persistent == 2 and db.symbol == spec.name + "_db"
    assert main.args == ("DW", "TX", "TW", "B", "RP", "CI", "M", "N", "K")
    assert [(m.name, m.operand, m.dims, m.box) for m in plan.tensor_maps] == [
        ("TX", "DY", (1024, 333), (64, 64)), ("TW", "X", (520, 333), (64, 64))]
    rule = families.get("hopper").grid_rule(spec)
    assert "min(max(1, nnzb), 2 x multiprocessor count)" in rule and "up to 2 kept blocks of one block row" in rule
    source = render(spec)
    assert "SampledTiles walk(RP, M)" in source and "store_sampled(Y, acc, first, count)" in source
    assert "GROUP = 2" in source and f"{spec.name}_db" in source
    for bad, why in ((dict(bm=128), "bm must be the block"), (dict(bn=96), "multiple of the block"),
                     (dict(consumers=2, bm=128), "bm must be the block"), (dict(persistent=False), "persistent must be True"),
                     (dict(group_m=8), "group_m must be 1"), (dict(block=32, bm=32, bn=32), "blocks of 64")):
        assert any(why in r for r in HopperSpec(**{**SAMPLED, "bn": 128, **bad}).check()), bad
    # __launch_bounds__(256, 2) caps an instruction at 128 registers when ptxas compiles: m64n256's 128 accumulators
    # do not fit (NVRTC 13.0 stops with "Insufficient registers"), m64n192's 96 do
    assert any("one wgmma of N 256 needs 154 registers" in r
               for r in HopperSpec(**{**SAMPLED, "bn": 256, "stages": 2, "ctas": 2}).check())
    assert not HopperSpec(**{**SAMPLED, "bn": 192, "stages": 3, "ctas": 2}).check()
    assert any("M=1020" in r for r in spec.check(sparse.problem_for(64, sparse.Pattern.random(1020, 512, 64, 0.3),
                                                                    DType.bf16, True, GW)))
    space = space_for("hopper", DType.bf16, block=64, layout=GW)
    assert set(space.dims) == {"bn", "stages", "ctas", "consumers"} and space.dims["consumers"] == (1, 2)
    for point in seeds("hopper", 64, GW):
        s = space.spec(point, gw)
        assert s.sampled and not s.check(gw) and point_of(s) == point
    assert [(p["consumers"], p["ctas"]) for p in seeds("hopper", 64, GW)[:3]] == [(1, 2), (2, 1), (1, 1)]
    big = sparse.problem_for(2048, sparse.Pattern.random(14336, 4096, 64, 0.25), DType.bf16, layout=GW)
    assert SeedKernels().spec_for(big).name == "hp_bf16_nobias_64x192x64_c1_s3_g1_ps_bsr64_o2_gw"


@pytest.mark.parametrize("spec", list(SAMPLED_PINS), ids=lambda s: s.name)
def test_hopper_sampled_sources_of_one_consumer_are_pinned(spec):
    assert hashlib.sha256(render(spec).encode()).hexdigest() == SAMPLED_PINS[spec]


def test_hopper_sampled_tiles_of_two_consumers_share_dy_s_box():
    """consumers=2 in dW sampled at the kept blocks: each consumer owns all 64 rows (dY's box, loaded once per
    stage) and GROUP kept blocks of a tile of 2 x GROUP; the ring, the rules, the name, the plan, the space and
    the source (against one consumer's, the same tile width)."""
    from search.space import point_of, space_for

    spec = HopperSpec(bn=256, stages=3, **C2)
    one = HopperSpec(bn=256, stages=3, **SAMPLED)
    assert spec.name == "hp_bf16_nobias_64x256x64_c2_s3_g1_ps_bsr64_gw" != one.name
    assert HopperSpec.from_name(spec.name) == spec == families.spec_from_name(spec.name) == HopperSpec.from_dict(
        spec.to_dict())
    assert (spec.wg_m, spec.frag_m, spec.wg_n, spec.acc_regs, spec.threads) == (64, 1, 256, 128, 384)
    assert spec.tx_bytes == spec.stage_bytes == (64 + 2 * 256) * 128 and one.tx_bytes == (64 + 256) * 128
    values = template_values(spec)
    assert (values["group"], values["tile_group"], values["empty_arrivals"]) == (4, 8, 8)  # every consumer warp
    assert not spec.check()
    # 4 stages of 72 KiB do not fit; nor do two blocks per multiprocessor of m64n128 (80 registers a wgmma)
    assert any("shared memory 296000 B > 232448 B" in r for r in HopperSpec(bn=256, stages=4, **C2).check())
    refused = HopperSpec(bn=128, stages=3, ctas=2, **C2).check()
    assert any("64 accumulators per consumer thread (+56) > the 96 registers a consumer gets: make bn smaller" in r
               for r in refused), refused
    assert any("one wgmma of N 128 needs 90 registers, over the 80" in r for r in refused), refused
    assert not HopperSpec(bn=64, stages=4, ctas=2, **C2).check() and HopperSpec(bn=64, stages=5, ctas=2, **C2).check()
    assert all("\n" not in r for r in refused)
    pattern = sparse.Pattern.random(1024, 520, 64, 0.3, seed=2)
    gw = sparse.problem_for(333, pattern, DType.bf16, False, GW)
    assert not spec.check(gw)
    (main,) = plan(spec, gw).launches
    assert main.grid == (pattern.nnzb, 1, 1) and main.block == (384, 1, 1) and main.smem == spec.smem_bytes
    assert "up to 8 kept blocks of one block row (4 per consumer warpgroup)" in grid_rule(spec)
    space = space_for("hopper", DType.bf16, block=64, layout=GW)
    assert point_of(spec) == dict(bn=256, stages=3, ctas=1, consumers=2) and space.spec(point_of(spec), gw) == spec
    assert space.spec(dict(bn=256, stages=4, ctas=1), gw) == HopperSpec(bn=256, stages=4, **SAMPLED)  # older points
    changed = [line[0] + line[1:].strip() for line in difflib.unified_diff(
        render(one).replace(one.name, spec.name).splitlines(), render(spec).splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and line[:3] not in ("+++", "---") and not line[1:].strip().startswith("//")]
    added = [c for c in changed if c.startswith("+") and c[1:] not in ("}", "#pragma unroll")]  # not the diff's shuffle
    assert "+constexpr int THREADS = 384, EMPTY_ARRIVALS = 8;  // one arrival per consumer warp" in added
    assert "+constexpr int BLOCK = 64, GROUP = 4, TILE_GROUP = 8;" in added
    assert "+count = min(TILE_GROUP, n - (j - p) * TILE_GROUP);" in added  # the walk groups 2 x GROUP blocks
    assert "+for (int b = 0; b < TILE_GROUP; ++b)" in added  # the producer loads them all after dY's box
    assert "+const unsigned a = ring + stage * STAGE_BYTES, b = a + A_BYTES + c * GROUP * BOX_BYTES;" in added
    assert "+store_sampled(Y, acc, first + c * GROUP, count - c * GROUP);  // consumer c's kept blocks of the tile" in added
    assert "const unsigned tx = (1 + count) * BOX_BYTES;" in render(spec)  # the producer's bytes: dY + count boxes
    assert "bar_init(empty + 8 * s, EMPTY_ARRIVALS);" in render(spec)
    assert len(added) == 12, added  # those, the ring's bytes, the walk's other two lines, the cols, setmaxnreg


def test_hopper_backward_plans_map_the_layout_s_arrays_k_outer():
    gi = HopperSpec(layout=GI)
    p = plan(gi, Problem(32, 1024, 4096, DType.bf16, GI))
    assert [s.args for s in p.launches] == [("DX", "TX", "TW", "B", "M", "N", "K")]
    tx, tw = p.tensor_maps
    assert (tx.operand, tx.dims, tx.pitch, tx.box) == ("DY", (4096, 32), 8192, (64, 128))  # K-major, as forward
    assert (tw.operand, tw.dims, tw.pitch, tw.box) == ("W", (1024, 4096), 2048, (64, 64))  # [K][N]: boxes along N
    gw = HopperSpec(layout=GW, bias=True)
    p = plan(gw, Problem(1024, 512, 32, DType.bf16, GW, bias=True))
    assert [s.symbol for s in p.launches] == [gw.name, gw.name + "_db"]
    assert p.launches[0].args[:3] == ("DW", "TX", "TW") and p.launches[1].args == ("DB", "DY", "M", "K")
    tx, tw = p.tensor_maps
    assert (tx.operand, tx.dims, tx.pitch, tx.box) == ("DY", (1024, 32), 2048, (64, 64))  # [K][M]: boxes along M
    assert (tw.operand, tw.dims, tw.pitch, tw.box) == ("X", (512, 32), 1024, (64, 64))
    assert not tx.problems() and not tw.problems()
    rule = families.get("hopper").grid_rule(gw)
    assert "TX over DY [K][M] with dims (M, K)" in rule and "Y is DW" in rule and "_db(DB, DY, M, K)" in rule


def test_hopper_backward_sources_read_k_outer_boxes_transposed():
    gi, gw = render(HopperSpec(layout=GI)), render(HopperSpec(layout=GW, bias=True))
    assert "p, 1, 1, 0, 1;" in gi and "p, 1, 1, 1, 1;" in gw and "p, 1, 1, 0, 0;" in render(HopperSpec())
    assert "A_LBO = 16, B_LBO = 8192;" in gi and "A_LBO = 8192, B_LBO = 8192;" in gw
    assert "A_K_STEP_BYTES = 32, B_K_STEP_BYTES = 2048" in gi and "A_K_STEP_BYTES = 2048, B_K_STEP_BYTES = 2048" in gw
    assert "for (int j = 0; j < b_boxes; ++j)" in gi and "for (int j = 0; j < a_boxes; ++j)" in gw
    assert "to_f(B[gc])" not in gw and "_db(T* __restrict__ DB" in gw


# ---- data and references ---------------------------------------------------------------------------
def test_linear_problems_name_the_gemm_dimensions():
    fw, gi, gw = linear_problems(32, 4096, 1024, "bf16", bias=True).values()
    assert (fw.m, fw.n, fw.k, fw.bias) == (32, 1024, 4096, True)
    assert (gi.m, gi.n, gi.k, gi.bias, gi.layout) == (32, 4096, 1024, False, GI)
    assert (gw.m, gw.n, gw.k, gw.bias, gw.layout) == (1024, 4096, 32, True, GW)


def test_inputs_outputs_and_float64_references_per_layout():
    batch, fin, fout = 5, 7, 3
    probs = linear_problems(batch, fin, fout, "fp32", bias=True)
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (batch, fin)).astype(np.float32)
    w = rng.uniform(-1, 1, (fout, fin)).astype(np.float32)
    dy = rng.uniform(-1, 1, (batch, fout)).astype(np.float32)
    gi, gw = probs[GI], probs[GW]
    assert input_shapes(gi) == {"DY": (batch, fout), "W": (fout, fin)}
    assert output_shapes(gi) == {"DX": (batch, fin)}
    assert input_shapes(gw) == {"DY": (batch, fout), "X": (batch, fin)}
    assert output_shapes(gw) == {"DW": (fout, fin), "DB": (fout,)}
    assert output_shapes(Problem(gw.m, gw.n, gw.k, layout=GW)) == {"DW": (fout, fin)}
    np.testing.assert_allclose(references(gi, {"DY": dy, "W": w})["DX"], dy.astype(np.float64) @ w)
    ref = references(gw, {"DY": dy, "X": x})
    np.testing.assert_allclose(ref["DW"], dy.T.astype(np.float64) @ x)
    np.testing.assert_allclose(ref["DB"], dy.astype(np.float64).sum(0))
    for p in (gi, gw):
        got = random_inputs(Problem(p.m, p.n, p.k, DType.bf16, p.layout, p.bias), rng)
        assert {k: v.shape for k, v in got.items()} == input_shapes(p)
        assert all(v.dtype == np.uint16 and np.all(to_float64(v, DType.bf16) != 0) for v in got.values())


def test_the_odd_shape_probe_keeps_the_layout():
    for p in (Problem(4096, 4096, 32, DType.bf16, GW, True), Problem(32, 4096, 4096, DType.fp32, GI)):
        probe = probe_for(p, SimtSpec(layout=p.layout, dtype=p.dtype, bias=p.bias))
        assert (probe.m, probe.n, probe.k, probe.layout, probe.bias) == (67, 45, 91, p.layout, p.bias)


def test_min_bytes_count_db_for_the_weight_gradient():
    gw = Problem(100, 10, 1000, DType.fp32, GW, bias=True)
    assert gw.min_bytes == 4 * (100 * 1000 + 10 * 1000 + 100 * 10 + 100)


# ---- launch plans ---------------------------------------------------------------------------------
def test_plans_name_the_arrays_of_the_layout():
    gi = plan(SimtSpec(layout=GI), Problem(67, 45, 91, layout=GI))
    assert [s.args for s in gi.launches] == [("DX", "DY", "W", "B", "WS", "M", "N", "K")]
    spec = SimtSpec(layout=GW, bias=True, split_k=2, reduce="two_pass")
    gw = plan(spec, Problem(67, 45, 91, layout=GW, bias=True))
    assert [s.symbol for s in gw.launches] == [spec.name, spec.name + "_reduce", spec.name + "_db"]
    assert gw.launches[0].args[:3] == ("DW", "DY", "X") and gw.launches[1].args[0] == "DW"
    db = gw.launches[2]
    assert db.args == ("DB", "DY", "M", "K") and db.grid == (3, 1, 1) and db.block[0] >= 32
    assert gw.workspace_bytes == 4 * 2 * 67 * 45
    rule = families.get("simt").grid_rule(spec)
    assert "DW, DY, X" in rule and "_db" in rule
    atomic = plan(SimtSpec(layout=GW, split_k=2, reduce="atomic"), Problem(64, 64, 64, layout=GW))
    assert atomic.zero_output and len(atomic.launches) == 1
    cluster = plan(SimtSpec(layout=GI, split_k=4, reduce="cluster"), Problem(64, 64, 64, layout=GI))
    assert len(cluster.launches) == 1 and cluster.launches[0].cluster == (1, 4, 1)
    assert cluster.launches[0].grid[1] == 4 and not cluster.zero_output and cluster.workspace_bytes == 0


def test_export_manifests_carry_the_layout_and_the_arrays():
    from codegen.export import manifest

    spec = TcSpec(layout=GW, bias=True, split_k=2, reduce="two_pass")
    doc = manifest(spec, Problem(4096, 4096, 32, DType.bf16, GW, bias=True), "sm_90")
    assert doc["problem"]["layout"] == "grad_weight" and doc["spec"]["layout"] == "grad_weight"
    assert [k["symbol"] for k in doc["kernels"]] == [spec.name, spec.name + "_reduce", spec.name + "_db"]
    assert [a["name"] for a in doc["kernels"][0]["args"]][:3] == ["DW", "DY", "X"]
    assert doc["kernels"][0]["args"][0]["type"] == "__nv_bfloat16*" and doc["kernels"][0]["args"][1]["type"] == \
        "const __nv_bfloat16*"
    assert doc["kernels"][2]["args"] == [{"name": "DB", "type": "__nv_bfloat16*"},
                                         {"name": "DY", "type": "const __nv_bfloat16*"},
                                         {"name": "M", "type": "int"}, {"name": "K", "type": "int"}]
    assert "DW[M,N] = DY[K,M]^T * X[K,N]" in doc["arguments_note"] and "_db" in doc["grid_rule"]


def test_backward_kernels_never_add_the_bias_to_the_gemm_output():
    source = render(SimtSpec(layout=GW, bias=True, split_k=2, reduce="two_pass"))
    assert "to_f(B[c])" not in source and "_db(T* __restrict__ DB" in source
    assert "to_f(B[c])" in render(SimtSpec(bias=True))
    fused = render(SimtSpec(layout=GW, bias=True))  # one split, staged: the main kernel sums db
    assert "to_f(B[c])" not in fused and "_db(" not in fused and "T* __restrict__ DB, float* __restrict__ WS" in fused


def test_one_split_weight_gradient_fuses_db_into_its_kernel():
    spec = SimtSpec(layout=GW, bias=True)
    assert spec.fused_db and spec.name.endswith("_k1_gw")
    p = plan(spec, Problem(67, 45, 91, layout=GW, bias=True))
    assert [s.symbol for s in p.launches] == [spec.name]
    assert p.launches[0].args == ("DW", "DY", "X", "DB", "WS", "M", "N", "K")
    assert "B is DB" in families.get("simt").grid_rule(spec) and "_db(" not in families.get("simt").grid_rule(spec)
    for other in (SimtSpec(layout=GW, bias=True, split_k=2, reduce="cluster"),  # split: db has its own kernel
                  SimtSpec(layout=GW, bias=True, bm=16, bn=16, bk=1, wm=4, wn=8, tm=1, tn=1, pad=0, vec=1, stages=0),
                  SimtSpec(layout=GW, bias=False), SimtSpec(layout=GI, bias=False), SimtSpec(bias=True)):
        assert not other.fused_db, other.name
    assert [s.symbol for s in plan(SimtSpec(layout=GW, bias=True, split_k=2, reduce="cluster"),
                                   Problem(64, 64, 64, layout=GW, bias=True)).launches][1:] == [
        SimtSpec(layout=GW, bias=True, split_k=2, reduce="cluster").name + "_db"]


# ---- search space and command line ----------------------------------------------------------------------
def test_spaces_map_points_to_specs_of_the_layout():
    from search.space import point_of, seeds, space_for

    for family, dtype in (("simt", DType.fp32), ("tensorcore", DType.bf16)):
        space = space_for(family, dtype, layout=GW)
        problem = Problem(256, 256, 64, dtype, GW, bias=True)
        point = seeds(family)[0]
        spec = space.spec(point, problem)
        assert spec.layout is GW and spec.bias
        assert space.spec(point_of(spec), problem) == spec
    assert "prepass" not in space_for("tensorcore", DType.bf16, layout=GI).dims
    gi = Problem(32, 4096, 4096, DType.bf16, GI)
    tc_seeds = [space_for("tensorcore", DType.bf16, layout=GI).spec(p, gi) for p in seeds("tensorcore")]
    assert all(s.prepass == "none" and s.layout is GI for s in tc_seeds) and any(not s.check(gi) for s in tc_seeds)
    hopper = space_for("hopper", DType.bf16, layout=GI)
    assert "cluster" not in hopper.dims and set(hopper.dims["bn"]) == {64, 128, 192, 256}
    assert hopper.dims["split_k"] == (1, 2, 4, 8, 16)  # dX of a small batch: few tiles, a long K
    hp = [hopper.spec(p, gi) for p in seeds("hopper") if p.get("cluster", 1) == 1]
    assert hp and all(s.layout is GI and not s.check(gi) for s in hp)
    assert all(hopper.spec(point_of(s), gi) == s for s in hp)


def _parse(argv):
    return cli.build_parser(cli.family_asked(argv)).parse_args(argv)


@pytest.mark.parametrize("command", ["compile", "bench", "search", "sweep", "export"])
def test_every_problem_command_takes_layout(command):
    extra = {"sweep": ["--out", "x.json"], "export": ["--out", "x", "--best"]}.get(command, [])
    args = _parse([command, "--m", "64", "--n", "48", "--k", "32", "--layout", "grad_weight", "--bias", *extra])
    problem = options.problem_from_args(args)
    assert (problem.layout, problem.bias, problem.key) == (GW, True, "64x48x32_fp32_grad_weight_bias")
    if command in ("compile", "bench", "export"):  # the commands that take a variant
        spec = options.spec_from_args(args, problem)
        assert spec.layout is GW and spec.name.endswith("_gw")
    # forward unless asked (search leaves it unset at parse time, for a --replay recording to give)
    assert options.problem_from_args(_parse([command, "--m", "1", "--n", "1", "--k", "1", *extra])).layout is Layout.forward


def test_layout_usage_errors_exit_2(capsys):
    base = ["compile", "--m", "64", "--n", "64", "--k", "64"]
    assert cli.main([*base, "--layout", "grad_input", "--bias"]) == 2
    assert "grad_input layout has no bias" in capsys.readouterr().err
    sampled = [*base, "--layout", "grad_weight", "--block", "32", "--density", "0.5"]  # dW at the kept blocks
    assert cli.main([*sampled, "--family", "hopper", "--dtype", "bf16"]) == 2
    assert "generated on Hopper for blocks of 64" in capsys.readouterr().err
    assert cli.main([*base, "--n", "60", "--layout", "grad_input", "--family", "hopper", "--dtype", "bf16"]) == 2
    assert "N=60" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        cli.main([*base, "--layout", "sideways"])
    assert stop.value.code == 2
    forward_kernel = SimtSpec().name
    assert cli.main(["bench", "--m", "64", "--n", "64", "--k", "64", "--layout", "grad_input",
                     "--kernel", forward_kernel, "--no-store"]) == 2
    assert "layout=forward" in capsys.readouterr().err


def test_compile_a_weight_gradient_with_db(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMSCAPE_CACHE", str(tmp_path))
    code = cli.main(["compile", "--m", "64", "--n", "48", "--k", "32", "--layout", "grad_weight", "--bias",
                     "--arch", "sm_90"])
    out = capsys.readouterr().out
    assert code == 0 and "_gw:" in out and "grad_weight" in out and "_gw_db:" not in out  # db fused (one split)


# ---- compiler tier ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compiled():
    built = compile_all(SIMT_BACKWARD + TC_BACKWARD, ("sm_80", "sm_90"), use_cache=False, workers=8)
    built |= compile_all(HOPPER_BACKWARD + HOPPER_SAMPLED, ("sm_90",), use_cache=False, workers=8)
    return {(name, arch): (result.report, sass.opcodes(text, name)) for (name, arch), (result, text) in built.items()}


def _assert_plan_functions_without_spills(spec, arch, report):
    """The cubin holds the kernel, its _reduce (two-pass) and its _db (bias, unless the kernel sums
    db itself), and none spills."""
    two_pass = getattr(spec, "reduce", "two_pass" if getattr(spec, "split_k", 1) > 1 else "none") == "two_pass"
    expected = {spec.name} | ({spec.name + "_reduce"} if two_pass else set()) | (
        {spec.name + "_db"} if spec.bias and not getattr(spec, "fused_db", False) else set())
    assert set(report) == expected, (arch, report)
    for fn, r in report.items():
        assert r.get("spill_stores", 0) == 0 and r.get("spill_loads", 0) == 0, (arch, fn, r)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("spec", SIMT_BACKWARD, ids=lambda s: s.name)
def test_simt_backward_kernels_compile_without_spills(compiled, spec):
    assert not spec.check(Problem(4097, 4095, 4093, spec.dtype, spec.layout, spec.bias))
    for arch in ("sm_80", "sm_90"):
        report, ops = compiled[(spec.name, arch)]
        _assert_plan_functions_without_spills(spec, arch, report)
        assert ops["FFMA"] > 0
        if spec.copy == "async":
            assert ops["LDGSTS"] > 0, (arch, "cp.async missing")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("spec", TC_BACKWARD, ids=lambda s: s.name)
def test_tensorcore_backward_kernels_compile_to_transposed_ldmatrix_without_spills(compiled, spec):
    assert not spec.check(Problem(4097, 4095, 4093, spec.dtype, spec.layout, spec.bias))
    source = render(spec)
    assert ("ldmatrix.sync.aligned.m8n8.x4.trans" in source) == (spec.mma == "mma")
    for arch in ("sm_80", "sm_90"):
        report, ops = compiled[(spec.name, arch)]
        _assert_plan_functions_without_spills(spec, arch, report)
        assert ops["HMMA"] > 0 and ops["LDGSTS"] > 0
        if spec.mma == "mma":
            assert ops["LDSM"] > 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("spec", HOPPER_BACKWARD + HOPPER_SAMPLED, ids=lambda s: s.name)
def test_hopper_backward_kernels_compile_to_wgmma_fed_by_tma_without_spills(compiled, spec):
    report, ops = compiled[(spec.name, "sm_90")]
    _assert_plan_functions_without_spills(spec, "sm_90", report)
    assert ops["HGMMA"] > 0 and ops["UTMALDG"] > 0


# ---- numerics on the CPU (tests/cpu_cuda.py: the kernel as C++, threads as fibers) ----------------------
#: Split-K summed by the last split to finish a tile (tile counters), in the emulation below.
LAST = [
    SimtSpec(bias=True, copy="async", pad=4, stages=3, bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, split_k=3,
             reduce="last"),
    SimtSpec(layout=GI, copy="async", pad=4, stages=4, bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, split_k=4,
             reduce="last"),
    SimtSpec(dtype="bf16", bias=True, bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, vec=8, pad=8, split_k=2,
             reduce="last"),
]
#: Kernels run through the CPU emulation: every load path of both families in both backward layouts.
EMULATED = [
    SimtSpec(layout=GI),
    SimtSpec(layout=GW, bias=True),
    SimtSpec(layout=GW, stages=1, bm=64, bn=64, wm=32, wn=32, tm=4, tn=8),
    SimtSpec(layout=GI, bk=1, pad=0, vec=1, stages=0, bm=64, bn=64, wm=32, wn=32, tm=4, tn=8),
    SimtSpec(layout=GW, dtype="bf16", bias=True, copy="async", pad=8, stages=3, bm=64, bn=128, bk=32, wm=32, wn=64,
             tm=8, tn=8),
    SimtSpec(layout=GI, dtype="bf16", copy="async", pad=8, stages=3, bm=32, bn=128, bk=32, wm=16, wn=64, tm=4, tn=8,
             split_k=4, reduce="two_pass"),
    SimtSpec(layout=GW, copy="async", pad=4, stages=4, bm=64, bn=64, bk=16, wm=32, wn=32, tm=4, tn=8, split_k=2,
             reduce="atomic"),
    TcSpec(layout=GI),
    TcSpec(layout=GW, bias=True, bm=64, bn=64, bk=32, wm=32, wn=32, epilogue="direct", smem="pad"),
    TcSpec(layout=GW, bm=32, bn=16, bk=64, wm=16, wn=16, warps_k=2, stages=3, split_k=2, reduce="two_pass"),
    TcSpec(layout=GI, dtype="fp16", bm=64, bn=128, wm=32, wn=64),
    TcSpec(layout=GW, mma="wmma", smem="pad", bm=64, bn=64, wm=32, wn=32, warps_k=2, bias=True),
    TcSpec(layout=GI, dtype="fp16", mma="wmma", smem="pad", bm=64, bn=64, wm=32, wn=32),
    SimtSpec(layout=GW, dtype="fp16", bias=True, bm=64, bn=64, bk=16, wm=32, wn=32, tm=4, tn=8, vec=8),
    # split-K summed by the last split of each tile to finish (forward with bias, grad_input, bf16)
    *LAST,
]
#: An odd shape (unaligned rows: the element-wise loads) and an aligned one (16-byte copies).
EMULATED_SHAPES = [(67, 45, 131), (72, 56, 136)]


def _emulate(spec, shape, tmp_path, source=None):
    from tests import cpu_cuda

    problem = Problem(*shape, spec.dtype, spec.layout, spec.bias)
    assert not spec.check(problem), spec.check(problem)
    inputs = random_inputs(problem, np.random.default_rng(7))
    got = cpu_cuda.run_plan(source or render(spec), plan(spec, problem), problem, inputs, output_shapes(problem),
                            tmp_path / f"{spec.name}_{problem.key}")
    ref = references(problem, inputs)
    from codegen.data import compare

    return {name: compare(problem, got[name], ref[name]) for name in ref}


needs_gxx = pytest.mark.skipif(not __import__("shutil").which("g++"), reason="the CPU emulation needs g++")


@needs_gxx
@pytest.mark.timeout(300)
@pytest.mark.parametrize("spec", EMULATED, ids=lambda s: s.name)
def test_backward_kernels_are_correct_in_cpu_emulation(spec, tmp_path):
    for shape in EMULATED_SHAPES:
        for name, (status, evidence, _) in _emulate(spec, shape, tmp_path).items():
            assert status == "ok", f"{spec.name} {shape} {name}: {evidence}"


@needs_gxx
@pytest.mark.timeout(300)
def test_the_cpu_emulation_catches_a_wrong_operand_read(tmp_path):
    """ldmatrix without .trans on a k-outer tile, and a dropped db kernel: the emulation must fail both."""
    spec = TcSpec(layout=GW, bias=True, bm=64, bn=64, bk=32, wm=32, wn=32, epilogue="direct", smem="pad")
    source = render(spec)
    assert "ldmatrix_x4_trans(r," in source
    result = _emulate(spec, EMULATED_SHAPES[1], tmp_path, source.replace("ldmatrix_x4_trans(r,", "ldmatrix_x4(r,"))
    assert result["DW"][0] == "wrong_result" and result["DB"][0] == "ok"
    dropped = source.replace("DB[c] = from_f(s);", "")
    assert _emulate(spec, EMULATED_SHAPES[0], tmp_path, dropped)["DB"][0] == "nan_or_inf"


@needs_gxx
@pytest.mark.timeout(300)
def test_the_cpu_emulation_catches_a_last_split_that_skips_a_step(tmp_path):
    """A split that does not store its partial, or a last split that leaves its tile counter set: both fail."""
    spec = LAST[0]
    source = render(spec)
    store = "if (c < N) WS[split * MN + (size_t)r * N + c] = acc[i][j];"
    assert store in source and "if (last) atomicExch(counter, 0);" in source
    unstored = _emulate(spec, EMULATED_SHAPES[0], tmp_path, source.replace(store, store.replace("c < N", "c < 0")))
    assert unstored["Y"][0] == "wrong_result"
    with pytest.raises(AssertionError, match="left tile counters non-zero"):
        _emulate(spec, EMULATED_SHAPES[1], tmp_path, source.replace("if (last) atomicExch(counter, 0);", ""))


def test_last_split_plans_take_tile_counters_and_no_reduce_kernel():
    p = Problem(67, 45, 131, bias=True)
    got = plan(LAST[0], p)
    assert [s.symbol for s in got.launches] == [LAST[0].name] and LAST[0].name.endswith("_k3l")
    assert got.launches[0].args == ("Y", "X", "W", "B", "WS", "CT", "M", "N", "K")
    assert got.counters == 3 * 1 == got.launches[0].grid[0] and got.workspace_bytes == workspace_bytes(3, p)
    assert not got.zero_output and LaunchPlan.from_dict(got.to_dict()) == got
    assert SimtSpec.from_name(LAST[1].name) == LAST[1] and "CT = ceil(M/32) * ceil(N/64) int32" in grid_rule(LAST[1])


# ---- block-sparse W in grad_input: dX = dY·W read as Wᵀ in BSR ----------------------------------------
def _sparse_gi(m=67, out=96, fin=80, block=32, density=0.5, seed=3, dtype="fp32"):
    """The grad_input problem of a layer with a block-sparse W [out, in] (N = in, K = out)."""
    return sparse.problem_for(m, sparse.Pattern.random(out, fin, block, density, seed), dtype, layout=GI)


def test_sparse_grad_input_problem_data_and_reference():
    p = _sparse_gi()
    assert (p.m, p.n, p.k, p.layout, p.block) == (67, 80, 96, GI, 32) and "_grad_input_bsr32" in p.key
    inputs = random_inputs(p, np.random.default_rng(0))
    pattern = sparse.lookup(p)
    pt = pattern.transpose()
    assert (pt.n, pt.k, pt.nnzb) == (80, 96, pattern.nnzb) and np.array_equal(pt.mask(), pattern.mask().T)
    assert {k: v.shape for k, v in inputs.items()} == input_shapes(p)
    np.testing.assert_array_equal(inputs["RP"], pt.indptr)
    w = pt.expand(inputs["WT"]).T  # the layer's W [out, in], zeros outside the kept blocks
    assert w.shape == (96, 80) and np.array_equal(w != 0, np.kron(pattern.mask(), np.ones((32, 32)))[:96, :80] != 0)
    np.testing.assert_allclose(references(p, inputs)["DX"], inputs["DY"].astype(np.float64) @ w)
    probe = probe_for(p)
    assert (probe.m, probe.n, probe.k, probe.layout, probe.block) == (67, 45, 91, GI, 32)
    assert sparse.lookup(probe).n == 91  # the probe's pattern is of W [out = K, in = N]


def test_sparse_grad_input_plans_read_wt_with_its_index_arrays():
    for spec in (SimtSpec(layout=GI, block=32, bn=32, bk=16, bm=64, wm=32, wn=32, tm=4, tn=8),
                 TcSpec(layout=GI, block=32, bn=32, wn=32, bm=128, wm=64)):
        p = _sparse_gi(dtype=spec.dtype)
        assert not spec.check(p) and spec.name.endswith("_bsr32_gi") and families.spec_from_name(spec.name) == spec
        assert plan(spec, p).launches[0].args == ("DX", "DY", "WT", "B", "WS", "RP", "CI", "M", "N", "K")
        assert "WT holds the kept blocks of Wᵀ[N,K]" in families.family_of(spec).grid_rule(spec)
        assert "ldmatrix_x4_trans" not in render(spec)  # Wᵀ's blocks are k-contiguous: the forward loads


def test_sparse_grad_input_from_the_command_line(tmp_path):
    args = _parse(["bench", "--m", "16", "--n", "80", "--k", "96", "--layout", "grad_input", "--block", "32",
                   "--density", "0.5"])
    problem = options.problem_from_args(args)
    assert (problem.n, problem.k, problem.layout) == (80, 96, GI) and sparse.lookup(problem).n == 96
    w = np.zeros((96, 80), dtype=np.float32)
    w[:32, 32:64] = 1.0
    np.save(tmp_path / "w.npy", w)
    args = _parse(["bench", "--m", "16", "--layout", "grad_input", "--block", "32", "--weights", str(tmp_path / "w.npy")])
    problem = options.problem_from_args(args)
    assert (problem.n, problem.k, problem.density) == (80, 96, 1 / 9)
    assert options.spec_from_args(args, problem).name.endswith("_bsr32_gi")


@needs_gxx
@pytest.mark.timeout(300)
@pytest.mark.parametrize("spec", [
    SimtSpec(layout=GI, block=32, bn=32, bk=16, bm=64, wm=32, wn=32, tm=4, tn=8),
    SimtSpec(layout=GI, block=32, bn=32, bk=16, bm=64, wm=32, wn=32, tm=4, tn=8, copy="async", stages=3, pad=4),
    SimtSpec(layout=GI, block=32, bn=32, bk=16, bm=64, wm=32, wn=32, tm=4, tn=8, split_k=2, reduce="last"),
    TcSpec(layout=GI, dtype="bf16", block=32, bn=32, wn=32, bm=64, wm=32),
    TcSpec(layout=GI, dtype="bf16", block=16, bn=16, bk=64, wn=16, bm=64, wm=32),
], ids=lambda s: s.name)
def test_sparse_grad_input_is_correct_in_cpu_emulation(spec, tmp_path):
    from tests import cpu_cuda

    for m, fin, out in ((67, 45, 91), (40, 96, 128)):
        p = _sparse_gi(m, out, fin, spec.block, 0.5, seed=5, dtype=spec.dtype)
        inputs = random_inputs(p, np.random.default_rng(2))
        got = cpu_cuda.run_plan(render(spec), plan(spec, p), p, inputs, output_shapes(p), tmp_path / p.key)
        from codegen.data import compare

        status, evidence, _ = compare(p, got["DX"], references(p, inputs)["DX"])
        assert status == "ok", f"{spec.name} {p.key}: {evidence}"


def test_the_odd_probe_aligns_only_the_sides_a_hopper_backward_kernel_reads_as_rows():
    gi = probe_for(Problem(4096, 4096, 4096, DType.bf16, GI), HopperSpec(layout=GI))
    assert (gi.m, gi.n, gi.k) == (67, 40, 88)  # dY [M][K] and W [K][N]: K and N aligned, M odd
    gw = probe_for(Problem(4096, 4096, 32, DType.bf16, GW, bias=True), HopperSpec(layout=GW, bias=True))
    assert (gw.m, gw.n, gw.k) == (72, 40, 91) and gw.bias  # dY [K][M] and X [K][N]: K (the batch) stays odd
    assert probe_for(Problem(64, 64, 64, DType.bf16, GI), SimtSpec(layout=GI, dtype="bf16")).n == 45


def test_cancelling_sums_are_held_to_their_terms_not_to_their_tiny_total():
    """A 1x1x1 tf32 forward whose x·w and b nearly cancel: tf32's rounding of x and w (2^-11 of each)
    is far past 2e-3 of the total, so only the terms' magnitude can judge it; a wrong sum still fails."""
    from codegen.data import absolute, compare, references

    p = Problem(1, 1, 1, DType.tf32, bias=True)
    inputs = {"X": np.array([[0.9]], np.float32), "W": np.array([[0.7]], np.float32),
              "B": np.array([-0.62], np.float32)}
    ref, scale = references(p, inputs)["Y"], references(p, absolute(p, inputs))["Y"]
    np.testing.assert_allclose(scale, [[0.9 * 0.7 + 0.62]], rtol=1e-6)
    rounded = np.float32(0.9 * 0.7 * (1 + 2 ** -11) - 0.62)  # one tf32 rounding of the product
    assert compare(p, np.array([[rounded]]), ref)[0] == "wrong_result"  # the bare total's bound
    assert compare(p, np.array([[rounded]]), ref, scale)[0] == "ok"
    assert compare(p, np.array([[np.float32(0.9 * 0.7 * 1.02 - 0.62)]]), ref, scale)[0] == "wrong_result"


def test_bf16_magnitudes_clear_the_sign_bit_and_keep_the_index_arrays():
    from codegen.data import absolute, to_float64

    p = Problem(2, 2, 2, DType.bf16)
    x = np.array([0xBF80, 0x3F80, 0xC000], np.uint16)  # -1, 1, -2
    got = absolute(p, {"X": x, "RP": np.array([0, 1], np.int32)})
    np.testing.assert_array_equal(to_float64(got["X"], DType.bf16), [1.0, 1.0, 2.0])
    np.testing.assert_array_equal(got["RP"], [0, 1])
