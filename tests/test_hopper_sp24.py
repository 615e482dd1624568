"""The Hopper 2:4 family (wgmma.mma_async.sp) on the CPU: spec identity and rules, space and seeds,
launch plans (tensor maps over X or its packed copy and over WC, the metadata WE as a plain argument),
and the compiler tier (NVRTC 13 for sm_90a): sparse HGMMA (.SP) of N = bm, two TMA loads per k-tile,
no spills; cluster pairs (``cluster=2``): names, rules, plans with the cluster shape and WC's half box,
and a multicast TMA load with cluster barriers in their SASS. The metadata layout itself is checked against a numpy model of the instruction in
tests/test_wgmma_sp_model.py; what the instruction computes is for the GPU tier
(tests/gpu/test_hopper_sp24.py)."""

from __future__ import annotations

import json
import random

import pytest

from codegen import families, sass
from codegen.export import export_files
from codegen.families import compile_target
from codegen.families.hopper_sp24 import ARGS, CONSUMER_REGS, PRODUCER_REGS, Spec, grid_rule, plan
from codegen.launch import LaunchPlan, TensorMapArg
from codegen.problem import DType, Problem
from codegen.render import render
from codegen.spec import DeviceLimits
from search.space import point_of, seeds, space_for, to_spec
from tests.compiled import compile_all


def _p24(m, n, k, dtype=DType.bf16, bias=False):
    return Problem(m, n, k, dtype, bias=bias, sparsity="2:4")


def test_the_name_is_the_identity():
    for spec in (Spec(), Spec(dtype=DType.fp16, bias=True, bm=16, bn=64, stages=8, consumers=1, group_m=1,
                              persistent=True, prepass="pack"), Spec(bk=128, stages=3),
                 Spec(bk=128, stages=3, meta="global", prepass="pack", persistent=True), Spec(meta="global"),
                 Spec(epilogue="smem"), Spec(bk=128, stages=2, meta="global", epilogue="smem", prepass="pack")):
        assert families.spec_from_name(spec.name) == spec and families.spec_from_dict(spec.to_dict()) == spec
    assert Spec().name == "hsp24_bf16_nobias_128x256x64_s4_c2_g8"
    assert Spec(bk=128, stages=3).name == "hsp24_bf16_nobias_128x256x128_s3_c2_g8"
    assert Spec(meta="global", prepass="pack").name == "hsp24_bf16_nobias_128x256x64_s4_c2_g8_pk_mg"
    assert Spec(epilogue="smem", meta="global").name == "hsp24_bf16_nobias_128x256x64_s4_c2_g8_mg_es"
    with pytest.raises(ValueError):
        families.spec_from_name("hsp24_bf16_nobias_128x256x64_s4_c2_g8_mg_pk")  # not canonical
    assert families.takes_sparsity("hopper_sp24", "2:4") and not families.takes_sparsity("hopper_sp24", "")
    assert compile_target(Spec(), "sm_90") == "sm_90a"


def test_cluster_names_round_trip_and_one_is_today_s_name():
    pair = Spec(cluster=2, stages=5, persistent=True, epilogue="smem")
    assert pair.name == "hsp24_bf16_nobias_128x256x64_s5_c2_g8_p_es_cl2"
    assert Spec(cluster=1, stages=5, persistent=True, epilogue="smem").name == "hsp24_bf16_nobias_128x256x64_s5_c2_g8_p_es"
    for spec in (pair, Spec(cluster=2), Spec(cluster=2, dtype=DType.fp16, bias=True, bk=128, stages=3, prepass="pack",
                                             meta="global"), Spec(cluster=2, bm=16, bn=64, consumers=1)):
        assert families.spec_from_name(spec.name) == spec and families.spec_from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="not a canonical"):
        Spec.from_name("hsp24_bf16_nobias_128x256x64_s4_c2_g8_cl1")  # cluster 1 has no suffix
    with pytest.raises(ValueError):
        families.spec_from_name("hsp24_bf16_nobias_128x256x64_s4_c2_g8_cl2_es")  # not canonical: _cl2 comes last


@pytest.mark.parametrize("fields,needle", [
    (dict(dtype=DType.fp32), "takes bf16, fp16 inputs, not fp32"),
    (dict(bn=96), "takes whole m64 blocks of W"),
    (dict(bn=64, consumers=2), "takes whole m64 blocks of W"),
    (dict(bm=24), "multiple of 16 from 16 to 256"),
    (dict(bm=256, bn=256, consumers=1), "registers a consumer gets"),
    (dict(stages=9), "stages must be 2 to 8"),
    (dict(consumers=3), "consumers must be 1 or 2"),
    (dict(bk=96), "bk must be one of (64, 128)"),
    (dict(meta="smem"), "meta must be one of"),
    (dict(bk=128, stages=4), "shared memory"),  # 4 x (32 + 32 + 4) KB
    (dict(bk=128, stages=3, epilogue="smem"), "shared memory"),  # 3 x 68 KB + 2 x 128 x 72 x 2 B
    (dict(epilogue="registers"), "epilogue must be one of"),
    (dict(cluster=3), "cluster must be one of (1, 2)"),
    (dict(cluster=0), "cluster must be one of (1, 2)"),
    (dict(cluster=2, bn=96), "takes whole m64 blocks of W"),
])
def test_invalid_specs_say_why(fields, needle):
    assert any(needle in why for why in Spec(**fields).check()), Spec(**fields).check()


def test_problem_rules():
    assert Spec().check(_p24(4096, 4096, 4096)) == []
    assert any("sm_90" in w for w in Spec().check(limits=DeviceLimits(sm=80)))
    assert any("pack prepass" in w for w in Spec().check(_p24(1, 1, 5)))
    assert Spec(prepass="pack").check(_p24(1, 1, 5)) == []
    assert Spec().check(Problem(64, 64, 64, DType.bf16))  # a dense W is not this family's


def test_plan_maps_x_and_wc():
    p = _p24(130, 264, 136, bias=True)
    lp = plan(Spec(bias=True), p)
    (launch,) = lp.launches
    assert launch.args == ARGS == ("Y", "TX", "TWC", "B", "WS", "WE", "M", "N", "K")
    assert launch.grid == (2 * 2, 1, 1) and launch.block == (384, 1, 1) and lp.workspace_bytes == 0
    tx, twc = lp.tensor_maps
    assert tx == TensorMapArg("TX", "X", "bf16", dims=(136, 130), pitch=272, box=(64, 128), swizzle=128)
    assert twc == TensorMapArg("TWC", "WC", "bf16", dims=(80, 264), pitch=160, box=(32, 256), swizzle=64)
    assert not tx.problems() and not twc.problems()
    # K = 37: X is packed to rows of 40; WC's rows are KP/2 = 32 elements.
    lp = plan(Spec(prepass="pack", bm=64, bn=128, consumers=1), _p24(5, 7, 37))
    pack, main = lp.launches
    assert pack.symbol.endswith("_pack") and pack.args == ("WS", "X", "M", "K") and lp.workspace_bytes == 5 * 40 * 2
    tx, twc = lp.tensor_maps
    assert tx.operand == "WS" and tx.pitch == 80 and tx.dims == (37, 5) and twc.dims == (32, 7) and twc.pitch == 64
    assert not tx.problems() and not twc.problems()
    assert "64-byte swizzle" in grid_rule(Spec()) and "_pack" in grid_rule(Spec(prepass="pack"))
    # bk = 128: X still in boxes of 64 columns (two per stage), WC's rows of 64 kept columns, 128-byte swizzle
    tx, twc = plan(Spec(bk=128, stages=3), p).tensor_maps
    assert tx.box == (64, 128) and tx.swizzle == 128
    assert twc == TensorMapArg("TWC", "WC", "bf16", dims=(80, 264), pitch=160, box=(64, 256), swizzle=128)
    assert not twc.problems() and "128-byte swizzle; WE" in grid_rule(Spec(bk=128, stages=3))


def test_a_pair_plan_counts_blocks_in_whole_clusters_and_halves_wc_s_box():
    pair = Spec(cluster=2, bias=True)
    lp = plan(pair, _p24(130, 264, 136, bias=True))  # 2 m-tiles (one pair), 2 n-tiles
    (launch,) = lp.launches
    assert launch.grid == (2 * 2, 1, 1) and launch.cluster == (2, 1, 1) and launch.block == (384, 1, 1)
    assert not launch.persistent
    tx, twc = lp.tensor_maps
    assert tx.box == (64, 128) and twc.box == (32, 128) and twc.dims == (80, 264)  # each block loads half of 256 rows
    assert not tx.problems() and not twc.problems()
    # 3 m-tiles round up to 2 pairs (the last pair's second block is past M); M = 1: one pair, its second block idle
    assert plan(pair, _p24(384, 300, 64)).launches[0].grid == (2 * 2 * 2, 1, 1)
    assert plan(pair, _p24(1, 1, 1)).launches[0].grid == (2, 1, 1)
    assert plan(Spec(cluster=2, persistent=True), _p24(4096, 4096, 4096)).launches[0].grid == (32 * 16, 1, 1)
    assert plan(Spec(cluster=2, persistent=True), _p24(4096, 4096, 4096)).launches[0].grid_on(133) == (132, 1, 1)
    assert plan(Spec(cluster=2, bk=128, stages=3), _p24(64, 64, 64)).tensor_maps[1].box == (64, 128)
    assert plan(Spec(), _p24(130, 264, 136)).launches[0].cluster == (1, 1, 1)
    packed = plan(Spec(cluster=2, prepass="pack"), _p24(5, 7, 37))
    assert [launch.cluster for launch in packed.launches] == [(1, 1, 1), (2, 1, 1)]  # the pack prepass is plain
    assert LaunchPlan.from_dict(json.loads(json.dumps(lp.to_dict()))) == lp
    rule = grid_rule(Spec(cluster=2, persistent=True))
    assert "ceil(M/256)*2 * ceil(N/256)" in rule and "rounded down to a multiple of 2" in rule
    assert "cuLaunchKernelEx" in rule and "(2, 1, 1)" in rule and "box (32, 128)" in rule
    assert "cuLaunchKernelEx" not in grid_rule(Spec())


def test_a_pair_s_source_multicasts_wc_and_loads_no_box_outside_its_tensor():
    source = render(Spec(cluster=2))
    assert "if (m0 < M) {" in source  # the second block of a last, odd pair loads no X
    assert "const int slices = min(CLUSTER, (N - n0 + WC_SLICE_ROWS - 1) / WC_SLICE_ROWS);" in source
    assert "const unsigned tx = (m0 < M ? X_BYTES : 0u) + slices * WC_SLICE_BYTES;" in source
    assert "WC_SLICE_ROWS = 128;" in source and "WC_SLICE_BYTES = 8192;" in source
    assert "EMPTY_ARRIVALS = 16;" in source and source.count("cluster_sync();") == 2
    assert source.count("bar_arrive_cluster(empty + 8 * used, lane)") == 2
    for spec in SAMPLE:
        if spec.cluster == 1:
            assert "cluster" not in render(spec).replace("shared::cluster", "").replace("release.cluster", "")


def test_shared_memory_counts_the_metadata_ring():
    ring, glob = Spec(), Spec(meta="global")
    assert glob.smem_bytes == 4 * (128 * 64 * 2 + 256 * 32 * 2) + 16 * 4 + 1024
    assert ring.smem_bytes - glob.smem_bytes == 4 * (256 // 16) * 2 * 16 * 4  # [BN/16][K_STEPS][16] words a stage
    big = Spec(bk=128, stages=3)
    assert big.meta_bytes == 16 * 4 * 64 and big.stage_bytes == 128 * 128 * 2 + 256 * 64 * 2
    assert big.smem_bytes == 3 * (big.stage_bytes + big.meta_bytes) + 16 * 3 + 1024 <= DeviceLimits().max_smem
    staged = Spec(epilogue="smem")
    assert staged.smem_bytes - ring.smem_bytes == 2 * 128 * 72 * 2  # a [bm][64 + 8] tile per consumer


def test_an_export_describes_its_operands_and_tensor_maps():
    spec, problem = Spec(bias=True, bm=64, bn=128, consumers=1, prepass="pack"), _p24(67, 45, 91, bias=True)
    cu, js = export_files(spec, problem, None, "sm_90")
    manifest = json.loads(js)
    assert 'extern "C" __global__' in cu and spec.name in cu
    assert manifest["sparse"]["operands"] == {"WC": {"shape": [45, 48], "element_type": "the element type"},
                                              "WE": {"shape": [3, 3, 16], "element_type": "uint32"}}
    assert "TWC" in manifest["sparse"]["arguments"]
    maps = {a["name"]: a["tensor_map"] for launch in manifest["kernels"] for a in launch["args"] if "tensor_map" in a}
    assert maps["TX"]["operand"] == "WS" and maps["TWC"]["operand"] == "WC"
    assert maps["TWC"]["swizzle"] == "CU_TENSOR_MAP_SWIZZLE_64B" and maps["TWC"]["box_dim"] == [32, 128]


def test_the_space_maps_points_onto_specs_and_back():
    space = space_for("hopper_sp24", DType.bf16, sparsity="2:4")
    rng = random.Random(0)
    p = _p24(4096, 4096, 4096)
    for _ in range(200):
        point = {k: rng.choice(v) for k, v in space.dims.items()}
        spec = to_spec("hopper_sp24", point, p)
        assert point_of(spec) == point
    assert to_spec("hopper_sp24", seeds("hopper_sp24")[0], _p24(1, 1, 5)).prepass == "pack"
    for seed in seeds("hopper_sp24"):
        assert to_spec("hopper_sp24", seed, p).check(p) == [], seed


def test_existing_families_are_unchanged_by_the_new_operand():
    from codegen.families.hopper import Spec as Dense
    from codegen.families.sparse24 import Spec as Sp24
    assert "HGMMA" not in render(Sp24()) and "wgmma.mma_async.sp" not in render(Dense())


SAMPLE = [Spec(), Spec(bias=True, dtype=DType.fp16), Spec(bm=64, bn=128, consumers=1, stages=6),
          Spec(bm=256, bn=128, consumers=2, prepass="pack", persistent=True), Spec(bm=16, bn=64, consumers=1, bias=True),
          Spec(bm=128, bn=128, consumers=2, stages=5, persistent=True, dtype=DType.fp16),
          Spec(bk=128, stages=3), Spec(bk=128, stages=3, bias=True, dtype=DType.fp16, persistent=True, prepass="pack"),
          Spec(bm=256, bn=128, bk=128, stages=2, persistent=True), Spec(bm=16, bn=64, bk=128, consumers=1, stages=4),
          Spec(meta="global"), Spec(bk=128, stages=3, meta="global"),
          Spec(epilogue="smem"), Spec(bk=128, stages=2, epilogue="smem", bias=True, persistent=True),
          Spec(bm=16, bn=64, consumers=1, epilogue="smem", bias=True, dtype=DType.fp16, prepass="pack"),
          Spec(bm=256, bn=128, stages=3, epilogue="smem", meta="global"),
          # cluster pairs along M, WC's box multicast
          Spec(cluster=2, stages=5, persistent=True, epilogue="smem"), Spec(cluster=2, stages=4, epilogue="smem"),
          Spec(cluster=2, bk=128, stages=3, bias=True, dtype=DType.fp16, prepass="pack"),
          Spec(cluster=2, bm=64, bn=128, consumers=1, stages=6, meta="global", persistent=True),
          Spec(cluster=2, bm=16, bn=64, consumers=1, bias=True)]


@pytest.mark.timeout(600)
def test_every_sample_compiles_to_sparse_wgmma_fed_by_tma():
    built = compile_all(SAMPLE)
    for spec in SAMPLE:
        result, text = built[(spec.name, "sm_90")]
        assert "-arch=sm_90a" in result.options
        code = sass.functions(text)
        assert set(code) == {spec.name} | ({spec.name + "_pack"} if spec.prepass == "pack" else set())
        ops = sass.mnemonics(text, spec.name, "HGMMA")
        shape = f"HGMMA.SP.64X{spec.bm}X32.F32" + (".BF16" if spec.dtype is DType.bf16 else "")
        # k-tiles run two at a time (two metadata register sets), bk/32 k-steps of FRAG_M m64 blocks each
        assert ops == {shape: 2 * spec.k_steps * spec.frag_m}, (spec.name, ops)
        others = sass.opcodes(text, spec.name)
        # X's boxes of 64 columns (one or two) and WC's; the metadata ring's 16-byte cp.async, bn/16 blocks x
        # bk/32 k-steps x 4 chunks over the 32 loader threads
        assert others["UTMALDG"] == 1 + spec.bk // 64 and others["USETMAXREG"] == 2, spec.name
        # a pair: WC's half box multicast to both blocks, the cluster barriers at start and end, the stages
        # released to both blocks (remote arrivals)
        assert code[spec.name].count("UTMALDG.2D.MULTICAST") == (spec.cluster > 1), spec.name
        assert others.get("UCGABAR_ARV", 0) == others.get("UCGABAR_WAIT", 0) == (2 if spec.cluster > 1 else 0), spec.name
        remote = ".RED" in "".join(line for line in code[spec.name].splitlines() if "SYNCS.ARRIVE" in line)
        assert remote == (spec.cluster > 1) and code[spec.name].count("MEMBAR.ALL.GPU") <= 2, spec.name
        assert others["LDGSTS"] == (spec.bn * spec.k_steps // 128 if spec.meta == "ring" else 0), (spec.name, others)
        assert others["LDL"] == 0 and others["STL"] == 0, spec.name
        report = result.report[spec.name]
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0 and report["stack"] == 0, (spec.name, report)
        need = (PRODUCER_REGS + spec.consumers * CONSUMER_REGS[spec.consumers]) * 128
        assert need <= report["registers"] * spec.threads, (spec.name, report)
        # ptxas would serialize the wgmma (C7508 and the like) where accumulators or metadata were touched
        # between them and their wait
        assert "serializ" not in result.log.lower() and "C7508" not in result.log, result.log
