"""Hopper family on the CPU: spec identity and rules, space and seeds, launch plans with tensor-map
arguments, export manifests, and the compiler tier (NVRTC 13 for sm_90a): HGMMA of the spec's N,
TMA loads, both setmaxnreg, no spills, no serialized wgmma, a register budget that fits."""

from __future__ import annotations

import json
import random

import pytest

from codegen import sass
from codegen.compile import CompileError, compile_source
from codegen.export import export_files
from codegen.families import compile_target, family_of, spec_from_name
from codegen.families.hopper import CONSUMER_REGS, PRODUCER_REGS, Spec, plan
from codegen.launch import LaunchPlan, TensorMapArg
from codegen.problem import DType, Problem
from codegen.render import render
from codegen.spec import DeviceLimits
from search.space import point_of, seeds, space_for, to_spec
from tests.compiled import compile_all

BIG = Problem(4096, 4096, 4096, DType.bf16)
ODD = Problem(4097, 4095, 4093, DType.bf16)  # K * 2 = 8186 bytes: not a 16-byte pitch


def grid() -> list[Spec]:
    """Valid specs over every dimension: both consumer counts, both dtypes, bias, pack, persistent."""
    return [
        Spec(),
        Spec(bias=True, prepass="pack"),
        Spec(dtype=DType.fp16, bm=128, bn=128, consumers=1, stages=5, persistent=True),
        Spec(dtype=DType.fp16, bias=True, bm=64, bn=64, consumers=1, stages=2, group_m=1),
        Spec(bm=256, bn=128, consumers=2, stages=4, persistent=True, group_m=16),
        Spec(bm=128, bn=192, consumers=2, stages=4, bias=True),
        Spec(bm=128, bn=96, consumers=1, stages=6, persistent=True, prepass="pack"),
        Spec(bm=64, bn=256, consumers=1, stages=3),
        Spec(dtype=DType.fp16, bm=128, bn=160, consumers=1, stages=4, bias=True, persistent=True),
        Spec(bm=128, bn=8, consumers=2, stages=8),
        Spec(bm=64, bn=128, consumers=1, stages=6, group_m=4, split_k=4),
        Spec(dtype=DType.fp16, bias=True, bm=64, bn=256, consumers=1, stages=4, split_k=8),
        Spec(bias=True, bm=128, bn=256, prepass="pack", split_k=16),
        Spec(bm=64, bn=64, consumers=1, stages=3, split_k=2),
    ]


GRID = grid()


# ---- spec --------------------------------------------------------------------------------------
def test_grid_is_valid_distinct_and_covers_every_choice():
    assert all(not s.check() for s in GRID), [(s.name, s.check()) for s in GRID if s.check()]
    assert len({s.name for s in GRID}) == len(GRID)
    for dim in ("dtype", "bias", "consumers", "persistent", "prepass", "bm", "bn", "stages", "split_k"):
        assert len({getattr(s, dim) for s in GRID}) > 1, dim


@pytest.mark.parametrize("spec", GRID, ids=lambda s: s.name)
def test_name_and_dict_round_trip(spec):
    assert Spec.from_name(spec.name) == spec
    assert Spec.from_dict(spec.to_dict()) == spec
    assert spec_from_name(spec.name) == spec
    assert spec.to_dict()["family"] == "hopper" and spec.bk == 64


def test_names_of_other_families_and_bad_values_are_refused():
    with pytest.raises(ValueError, match="not a hopper kernel name"):
        Spec.from_name("tc_bf16_nobias_mma_128x128x32_w64x32x1_s4x_es_g8_k1")
    with pytest.raises(ValueError, match="not a canonical hopper kernel name"):
        Spec.from_name("hp_bf16_nobias_128x256x32_c2_s4_g8")  # the k-tile is always 64
    with pytest.raises(ValueError, match="not a canonical hopper kernel name"):
        Spec.from_name("hp_bf16_nobias_128x256x64_c2_s4_g8_k1")  # no split: no suffix
    with pytest.raises(ValueError, match="is not a 'hopper' spec"):
        Spec.from_dict({"family": "simt", "bm": 64})
    with pytest.raises(TypeError, match="persistent must be true or false"):
        Spec(persistent="yes")


@pytest.mark.parametrize(
    "fields,reason",
    [
        (dict(dtype=DType.fp32), "takes bf16, fp16 inputs"),
        (dict(dtype=DType.tf32), "takes bf16, fp16 inputs"),
        (dict(consumers=3), "consumers must be one of"),
        (dict(prepass="zero"), "prepass must be one of"),
        (dict(bm=96), "multiple of 64 x 2 consumer"),
        (dict(bm=64), "multiple of 64 x 2 consumer"),
        (dict(bn=100), "multiple of 8 from 8 to 256"),
        (dict(bn=264), "multiple of 8 from 8 to 256"),
        (dict(bm=512, consumers=2, bn=64), "TMA box rows"),
        (dict(stages=1), "stages must be 2 to 8"),
        (dict(stages=5), "shared memory"),
        (dict(bm=256, bn=256), "accumulators per consumer thread"),
        (dict(bm=128, bn=256, consumers=1), "accumulators per consumer thread"),
        (dict(group_m=0), "group_m must be >= 1"),
        (dict(split_k=0), "split_k must be >= 1"),
        (dict(split_k=4, persistent=True), "plain grid: persistent must be false"),
        (dict(split_k=4, cluster=2), "split_k > 1 is generated without clusters"),
        (dict(split_k=4, block=64, bn=64, bm=128), "split_k > 1 is generated for a dense W only"),
    ],
)
def test_check_names_each_broken_rule(fields, reason):
    assert any(reason in r for r in Spec(**fields).check()), Spec(**fields).check()


def test_check_against_a_problem_and_the_device():
    spec = Spec(bias=True)
    assert any("dtype" in r for r in spec.check(Problem(64, 64, 64, DType.fp16, bias=True)))
    assert any("bias" in r for r in spec.check(Problem(64, 64, 64, DType.bf16)))
    assert not Spec().check(BIG)
    # K whose rows break TMA's 16-byte pitch: refused with the reason and the way out, unless packed.
    (reason,) = Spec().check(ODD)
    assert "K=4093" in reason and "8186 bytes" in reason and "prepass='pack'" in reason and "tensorcore" in reason
    assert not Spec(prepass="pack").check(ODD)
    assert not Spec().check(Problem(7, 9, 72, DType.bf16))  # any M, N; K a multiple of 8
    assert Spec().check(Problem(7, 9, 12, DType.fp16))
    for sm in ("sm_80", "sm_89", "sm_100"):
        assert any("needs sm_90" in r for r in Spec().check(limits=DeviceLimits.for_arch(sm))), sm
    small = DeviceLimits(max_smem=101376)
    assert any("shared memory" in r for r in Spec().check(limits=small))


def test_shared_memory_and_register_budgets():
    spec = Spec()  # 128 x 256, 4 stages
    assert spec.smem_bytes == 4 * (128 + 256) * 128 + 2 * 8 * 4 + 1024
    assert spec.threads == 384 and spec.acc_regs == 128 and spec.frag_m == 1
    assert Spec(bm=128, bn=128, consumers=1).frag_m == 2
    for consumers, regs in CONSUMER_REGS.items():  # setmaxnreg moves registers within the block's allocation
        launch = min(255, 65536 // (128 * (consumers + 1)) // 8 * 8)
        assert (PRODUCER_REGS + consumers * regs) * 128 <= launch * 128 * (consumers + 1)
        assert regs % 8 == 0 and PRODUCER_REGS % 8 == 0 and 24 <= PRODUCER_REGS <= regs <= 256


# ---- space -------------------------------------------------------------------------------------
def test_space_maps_points_to_specs_and_back():
    space = space_for("hopper", DType.bf16)
    assert space.size == 3 * 7 * 5 * 2 * 2 * 4 * 2 * 5
    rng = random.Random(0)
    points = list(space.points())
    for point in rng.sample(points, 60):
        for problem in (BIG, ODD, Problem(130, 250, 72, DType.bf16, bias=True)):
            spec = to_spec("hopper", point, problem)
            assert point_of(spec) == point
            assert spec.prepass == ("pack" if problem is ODD else "none")
            assert (spec.dtype, spec.bias) == (problem.dtype, problem.bias)
    with pytest.raises(ValueError, match="takes bf16, fp16 problems"):
        space_for("hopper", DType.fp32)


def test_restricted_space_and_seeds_are_valid_where_they_should_be():
    restricted = space_for("hopper", DType.bf16, restricted=True)
    valid = [s for s in (restricted.spec(p, BIG) for p in restricted.points()) if not s.check(BIG)]
    assert 8 <= len(valid) <= restricted.size
    found = seeds("hopper")
    assert len(found) >= 4 and seeds("hopper", block=32) != found  # sparse seeds: tests/test_hopper_sparse.py
    space = space_for("hopper", DType.fp16)
    for point in found:
        assert space.indices(point) is not None, point
        for problem in (BIG, ODD, Problem(4096, 11008, 4096, DType.fp16, bias=True)):
            p = Problem(problem.m, problem.n, problem.k, DType.fp16, bias=problem.bias)
            assert not to_spec("hopper", point, p).check(p), (point, to_spec("hopper", point, p).check(p))


# ---- launch plans and tensor maps ----------------------------------------------------------------
def test_plan_of_an_aligned_problem_reads_x_and_w_through_tensor_maps():
    spec = Spec(bm=128, bn=256)
    p = plan(spec, Problem(130, 250, 72, DType.bf16, bias=True))
    (main,) = p.launches
    assert main.symbol == spec.name and main.args == ("Y", "TX", "TW", "B", "M", "N", "K")
    assert main.grid == (2 * 1, 1, 1) and main.block == (384, 1, 1) and main.smem == spec.smem_bytes
    assert not main.persistent and p.workspace_bytes == 0 and not p.zero_output
    tx, tw = p.tensor_maps
    assert tx == TensorMapArg("TX", "X", "bf16", dims=(72, 130), pitch=144, box=(64, 128), swizzle=128, offset=0)
    assert tw == TensorMapArg("TW", "W", "bf16", dims=(72, 250), pitch=144, box=(64, 256), swizzle=128, offset=0)
    assert p.tensor_map("TW") is tw and p.tensor_map("X") is None
    assert not tx.problems() and not tw.problems()
    assert LaunchPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_plan_of_a_misaligned_k_packs_first_and_maps_the_workspace():
    spec = Spec(prepass="pack", persistent=True)
    p = plan(spec, ODD)
    pack, main = p.launches
    assert pack.symbol == spec.name + "_pack" and pack.args == ("WS", "X", "W", "M", "N", "K")
    assert pack.grid[0] * 256 * 8 >= (4097 + 4095) * 4096
    assert main.persistent and main.grid == (33 * 16, 1, 1)
    tx, tw = p.tensor_maps
    assert (tx.operand, tx.offset, tx.dims, tx.pitch) == ("WS", 0, (4093, 4097), 4096 * 2)
    assert (tw.operand, tw.offset, tw.dims, tw.pitch) == ("WS", 4097 * 4096 * 2, (4093, 4095), 4096 * 2)
    assert p.workspace_bytes == (4097 + 4095) * 4096 * 2
    assert not tx.problems() and not tw.problems()
    assert LaunchPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_names_without_a_split_keep_their_identity_and_a_split_is_a_suffix():
    assert Spec().name == "hp_bf16_nobias_128x256x64_c2_s4_g8"
    split = Spec(bias=True, bm=64, bn=128, consumers=1, stages=6, group_m=4, split_k=8, prepass="pack")
    assert split.name == "hp_bf16_bias_64x128x64_c1_s6_g4_pk_k8" and Spec.from_name(split.name) == split


def test_plan_of_a_split_writes_partial_sums_then_reduces():
    spec = Spec(bias=True, bm=64, bn=128, consumers=1, stages=6, group_m=4, split_k=4)
    problem = Problem(130, 250, 200, DType.bf16, bias=True)
    p = plan(spec, problem)
    main, reduce = p.launches
    assert main.args == ("Y", "TX", "TW", "B", "WS", "M", "N", "K")
    assert main.grid == (3 * 2, 4, 1) and not main.persistent and main.cluster == (1, 1, 1)
    assert reduce.symbol == spec.name + "_reduce" and reduce.args == ("Y", "B", "WS", "M", "N")
    assert reduce.grid == (-(-130 * 250 // 256), 1, 1) and reduce.block == (256, 1, 1)
    assert p.workspace_bytes == 4 * 4 * 130 * 250 and not p.zero_output  # a multiple of 16 already
    assert [t.operand for t in p.tensor_maps] == ["X", "W"]
    assert LaunchPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_plan_of_a_split_with_pack_puts_the_packed_rows_after_the_partial_sums():
    spec = Spec(prepass="pack", split_k=2)
    problem = Problem(3, 5, 75, DType.bf16)  # 4 * 2 * 15 = 120 bytes of partial sums, 128 rounded
    p = plan(spec, problem)
    pack, main, reduce = p.launches
    assert (pack.symbol, main.symbol, reduce.symbol) == (spec.name + "_pack", spec.name, spec.name + "_reduce")
    tx, tw = p.tensor_maps
    assert (tx.operand, tx.offset, tw.offset) == ("WS", 128, 128 + 3 * 80 * 2)
    assert p.workspace_bytes == 128 + (3 + 5) * 80 * 2
    assert not tx.problems() and not tw.problems()
    manifest = json.loads(export_files(spec, problem, None, "sm_90")[1])
    assert [k["symbol"] for k in manifest["kernels"]] == [spec.name + "_pack", spec.name, spec.name + "_reduce"]
    assert manifest["workspace_bytes"] == p.workspace_bytes
    assert "at byte ceil16(4*2*M*N)" in manifest["grid_rule"] and "grid = (ceil(M/128) * ceil(N/256), 2, 1)" in \
        manifest["grid_rule"] and f"{spec.name}_reduce: grid = (ceil(M*N/256), 1, 1)" in manifest["grid_rule"]


def test_tensor_map_rules_and_encoding():
    good = TensorMapArg("TX", "X", "fp16", dims=(4096, 4096), pitch=8192, box=(64, 128))
    enc = good.encoding()
    assert enc == {
        "encode": "cuTensorMapEncodeTiled", "operand": "X", "offset_bytes": 0,
        "data_type": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16", "rank": 2, "global_dim": [4096, 4096],
        "global_strides_bytes": [8192], "box_dim": [64, 128], "element_strides": [1, 1],
        "interleave": "CU_TENSOR_MAP_INTERLEAVE_NONE", "swizzle": "CU_TENSOR_MAP_SWIZZLE_128B",
        "l2_promotion": "CU_TENSOR_MAP_L2_PROMOTION_L2_256B", "oob_fill": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",
    }
    for bad, reason in [
        (dict(pitch=8186, dims=(4093, 4097)), "multiples of 16"),
        (dict(offset=8), "multiples of 16"),
        (dict(pitch=4096), "shorter than a row"),
        (dict(box=(128, 128)), "exceeds the 128-byte swizzle"),
        (dict(box=(64, 512)), "1..256 per side"),
        (dict(box=(4, 64), swizzle=0), "multiples of 16 bytes"),
        (dict(swizzle=256), "swizzle 256 is not one of"),
        (dict(operand="Y"), "operand 'Y'"),
    ]:
        fields = {**good.__dict__, **bad}
        assert any(reason in r for r in TensorMapArg(**fields).problems()), (bad, TensorMapArg(**fields).problems())


def test_the_engine_refuses_arguments_the_plan_cannot_supply():
    from codegen.engine import Engine

    bad = TensorMapArg("TX", "X", "bf16", dims=(4093, 4097), pitch=8186, box=(64, 128))
    p = LaunchPlan(launches=(), tensor_maps=(bad,))
    with pytest.raises(RuntimeError, match="cannot be encoded: tensor map TX: row pitch 8186"):
        Engine._argument("TX", p, None, {"M": 1, "N": 1, "K": 1})
    with pytest.raises(RuntimeError, match="'TQ' is neither an operand"):
        Engine._argument("TQ", p, None, {"M": 1, "N": 1, "K": 1})
    assert Engine._argument("K", p, None, {"M": 1, "N": 1, "K": 7}).value == 7


# ---- export ----------------------------------------------------------------------------------------
def test_manifest_says_how_to_build_every_argument():
    problem = Problem(130, 250, 75, DType.bf16, bias=True)
    spec = Spec(bias=True, prepass="pack", persistent=True)
    cu, js = export_files(spec, problem, None, "sm_90")
    manifest = json.loads(js)
    assert manifest["family"] == "hopper" and manifest["compile"]["options"] == ["-arch=sm_90a", "-std=c++17"]
    pack, main = manifest["kernels"]
    assert pack["symbol"] == spec.name + "_pack" and [a["name"] for a in pack["args"]] == ["WS", "X", "W", "M", "N", "K"]
    assert [a["name"] for a in main["args"]] == ["Y", "TX", "TW", "B", "M", "N", "K"]
    tx, tw = main["args"][1], main["args"][2]
    assert tx["type"] == tw["type"] == "const __grid_constant__ CUtensorMap"
    assert tx["tensor_map"] == plan(spec, problem).tensor_maps[0].encoding()
    assert tw["tensor_map"]["offset_bytes"] == 130 * 80 * 2 and tw["tensor_map"]["global_dim"] == [75, 250]
    assert main["persistent"] and "multiprocessor count" in main["grid_note"]
    assert main["grid_for_problem"] == [2, 1, 1] and main["block"] == [384, 1, 1]
    assert main["dynamic_smem_bytes"] == spec.smem_bytes
    assert manifest["workspace_bytes"] == (130 + 250) * 80 * 2
    assert "CUtensorMap" in manifest["arguments_note"] and "cuTensorMapEncodeTiled" in manifest["arguments_note"]
    assert "min(ceil(M/128) * ceil(N/256), multiprocessor count)" in manifest["grid_rule"]
    assert "KP = ceil(K/8)*8" in manifest["grid_rule"] and "128-byte swizzle" in manifest["grid_rule"]
    assert f"{spec.name}_pack(" in cu and f"{spec.name}(" in cu
    plain = json.loads(export_files(Spec(), BIG, None, "sm_90")[1])
    assert [k["symbol"] for k in plain["kernels"]] == [Spec().name] and "persistent" not in plain["kernels"][0]
    assert plain["kernels"][0]["args"][1]["tensor_map"]["operand"] == "X"


def test_other_families_compile_for_the_device_arch_itself():
    from codegen.families.tensorcore import Spec as TcSpec

    assert compile_target(Spec(), "sm_90") == "sm_90a"
    assert compile_target(TcSpec(), "sm_90") == "sm_90" and compile_target(TcSpec(), "sm_80") == "sm_80"
    assert family_of(Spec()).compile_target("sm_90a") == "sm_90a"


# ---- compiler tier ---------------------------------------------------------------------------------
def _sample() -> list[Spec]:
    """Every seed for both dtypes with and without bias, the grid, and every tile shape of the space
    (bm x bn x consumers: the accumulators, the register budget) with the other dimensions drawn."""
    specs = list(GRID)
    for dtype in (DType.bf16, DType.fp16):
        for bias in (False, True):
            problem = Problem(4096, 4096, 4096, dtype, bias=bias)
            specs += [to_spec("hopper", p, problem) for p in seeds("hopper")]
    dims = space_for("hopper", DType.bf16).dims
    rng = random.Random(7)
    for bm in dims["bm"]:
        for bn in dims["bn"]:
            for consumers in dims["consumers"]:
                problem = rng.choice([BIG, ODD, Problem(130, 250, 72, DType.fp16, bias=True)])
                point = dict(bm=bm, bn=bn, consumers=consumers, persistent=rng.random() < 0.5,
                             group_m=rng.choice(dims["group_m"]), stages=2)
                spec = to_spec("hopper", point, problem)
                if spec.check(problem):
                    continue
                fits = [st for st in dims["stages"] if not Spec(**{**spec.__dict__, "stages": st}).check(problem)]
                specs.append(Spec(**{**spec.__dict__, "stages": rng.choice(fits)}))
    return list({s.name: s for s in specs}.values())


SAMPLE = _sample()


@pytest.fixture(scope="module")
def compiled():
    return {name: built for (name, _), built in compile_all(SAMPLE).items()}


def test_sample_is_broad():
    assert len(SAMPLE) >= 40
    assert len({(s.bm, s.bn, s.consumers) for s in SAMPLE}) >= 23
    assert {s.consumers for s in SAMPLE} == {1, 2} and {s.persistent for s in SAMPLE} == {False, True}
    assert {s.prepass for s in SAMPLE} == {"none", "pack"} and {s.dtype for s in SAMPLE} == {DType.bf16, DType.fp16}
    assert {(s.split_k > 1, s.prepass, s.bias) for s in SAMPLE} >= {(True, "pack", True), (True, "none", False)}
    assert max(s.acc_regs for s in SAMPLE) == 160


@pytest.mark.timeout(900)
def test_every_sampled_spec_compiles_to_wgmma_fed_by_tma(compiled):
    for spec in SAMPLE:
        result, text = compiled[spec.name]
        assert result.arch == "sm_90" and "-arch=sm_90a" in result.options
        code = sass.functions(text)
        assert set(code) == ({spec.name} | ({spec.name + "_pack"} if spec.prepass == "pack" else set())
                             | ({spec.name + "_reduce"} if spec.split_k > 1 else set()))
        ops = sass.opcodes(text, spec.name)
        shape = f"HGMMA.64x{spec.bn}x16.F32" + (".BF16" if spec.dtype is DType.bf16 else " ")
        assert ops["HGMMA"] == 4 * spec.frag_m and code[spec.name].count(shape) == 4 * spec.frag_m, spec.name
        assert ops["UTMALDG"] == 2, spec.name  # X's box and W's box
        assert ops["USETMAXREG"] == 2, spec.name
        assert ops["LDL"] == 0 and ops["STL"] == 0, spec.name
        report = result.report[spec.name]
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0 and report["stack"] == 0, (spec.name, report)
        # The block's allocation at launch covers what setmaxnreg hands out afterwards.
        need = (PRODUCER_REGS + spec.consumers * CONSUMER_REGS[spec.consumers]) * 128
        assert need <= report["registers"] * spec.threads, (spec.name, report)
        assert "serializ" not in result.log.lower() and "C7508" not in result.log, result.log


def test_plain_sm_90_cannot_take_wgmma():
    spec = Spec(bn=64, consumers=1, bm=64)
    with pytest.raises(CompileError, match="not supported on .target 'sm_90'"):
        compile_source(render(spec), spec.name, "sm_90", use_cache=False)


def test_rendered_source_spells_only_what_is_on():
    plain = render(Spec())
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in plain
    assert "cp.async.bulk.tensor.2d" in plain and "setmaxnreg.dec.sync.aligned.u32 40" in plain
    assert "setmaxnreg.inc.sync.aligned.u32 232" in plain and "_pack" not in plain and "B[gc]" not in plain
    assert "%127" in plain and "%128, %129" in plain  # 128 accumulators, then the two descriptors
    fp16 = render(Spec(dtype=DType.fp16, bias=True, consumers=1, bn=128, prepass="pack"))
    assert "m64n128k16.f32.f16.f16" in fp16 and "B[gc]" in fp16 and "_pack(" in fp16
    assert "setmaxnreg.inc.sync.aligned.u32 240" in fp16
    assert plain.count("split_range(") == 1 and "_reduce" not in plain and "WS" not in plain  # defined, not used
    split = render(Spec(bias=True, bm=64, bn=128, consumers=1, split_k=4))
    assert "split_range(blockIdx.y, K, BK, SPLIT_K, k_lo, k_hi);" in split and "SPLIT_K = 4;" in split
    assert "float* __restrict__ WS, int M, int N, int K)" in split
    assert "store_partial<false, true>(WS, acc, blockIdx.y" in split and "store_tile<false, true>(Y" not in split
    assert "_k4_reduce(T* __restrict__ Y" in split and "v += to_f(B[idx % N]);" in split


def test_the_odd_probe_keeps_a_partial_k_tile_for_kernels_that_need_16_byte_rows():
    from codegen.evaluate import probe_for
    from codegen.families.tensorcore import Spec as TcSpec

    assert probe_for(BIG, Spec()) == Problem(67, 45, 88, DType.bf16)  # 91 breaks TMA's pitch; 88 = 64 + 24
    assert probe_for(BIG, Spec(prepass="pack")) == Problem(67, 45, 91, DType.bf16)
    assert probe_for(BIG, TcSpec()) == probe_for(BIG) == Problem(67, 45, 91, DType.bf16)


def test_interior_tiles_store_whole_16_byte_row_chunks():
    """Tiles of BN a multiple of 32 render store_rows (quad shuffles, then one 16-byte store per lane
    and 8 columns) beside the pairwise stores edge tiles keep; the SASS has the 16-byte stores. Tiles
    of 16 columns (blocks of 16) keep only the pairwise stores. The GPU tier checks both paths'
    results (interior tiles of N % 8 == 0, and N = 250 or 45 for the other)."""
    import re

    for spec in (Spec(), Spec(bm=64, bn=96, consumers=1, stages=4), Spec(block=32, bn=32, bm=128, stages=4)):
        src = render(spec)
        assert "store_rows(Y, B, acc, row0, col0, N)" in src and src.count("__shfl_xor_sync") == 4, spec.name
    assert "store_rows" not in render(Spec(block=16, bn=16, bm=128, stages=16, persistent=True, grouped=True))
    spec = Spec()
    ((_, text),) = compile_all([spec]).values()
    code = sass.functions(text)[spec.name]
    assert len(re.findall(r"STG\.E\.128", code)) == spec.frag_m * 2 * spec.bn // 32  # per thread and tile
    assert sass.opcodes(text, spec.name)["SHFL"] == 4 * spec.frag_m * 2 * spec.bn // 32
