"""Hopper thread-block clusters on the CPU: a pair of blocks along M sharing W's tile by TMA
multicast (``cluster=2``, dense W). Names, rules, the unclustered source pinned byte for byte, launch
plans and manifests that carry the cluster, the launch configuration handed to cuLaunchKernelEx
(the driver call replaced by a recorder), codegen.nn's cluster launch (recorded), and the SASS of
NVRTC 13 for sm_90a: HGMMA, one plain and one multicast TMA load, the cluster barriers at start and
end, remote mbarrier arrivals, no spills. Nothing here runs a kernel: tests/gpu/test_hopper_cluster.py
does, on the device."""

from __future__ import annotations

import ctypes
import json

import pytest

from codegen import sass
from codegen.export import export_files
from codegen.families import spec_from_name
from codegen.families.hopper import Spec, plan
from codegen.launch import KernelLaunch, LaunchPlan, launched_grid
from codegen.problem import DType, Problem
from codegen.render import render
from search.space import point_of, seeds, space_for, to_spec
from tests.compiled import compile_all
from tests.test_hopper import GRID

BIG = Problem(4096, 4096, 4096, DType.bf16)
ODD = Problem(4097, 4095, 4093, DType.bf16)
PAIR = Spec(cluster=2)  # 128 x 256, two consumer warpgroups, 4 stages, a pair of blocks along M


# ---- identity and rules ----------------------------------------------------------------------------
def test_cluster_names_round_trip_and_one_is_today_s_name():
    assert PAIR.name == "hp_bf16_nobias_128x256x64_c2_s4_g8_cl2"
    assert Spec(cluster=1).name == Spec().name == "hp_bf16_nobias_128x256x64_c2_s4_g8"
    for spec in (PAIR, Spec(cluster=2, persistent=True, prepass="pack", bias=True, dtype=DType.fp16),
                 Spec(cluster=2, bm=256, bn=128, group_m=16)):
        assert Spec.from_name(spec.name) == spec == spec_from_name(spec.name) == Spec.from_dict(spec.to_dict())
    assert Spec.from_name("hp_bf16_nobias_128x256x64_c2_s4_g8_ps_pk_cl2") == Spec(cluster=2, persistent=True,
                                                                                    prepass="pack")
    with pytest.raises(ValueError, match="not a canonical hopper kernel name"):
        Spec.from_name("hp_bf16_nobias_128x256x64_c2_s4_g8_cl1")  # cluster 1 has no suffix


def test_unclustered_sources_spell_no_cluster():
    for spec in GRID:
        assert spec.cluster == 1
        assert "cluster" not in render(spec).replace("shared::cluster", "").replace("release.cluster", "")


def test_no_block_of_a_pair_loads_a_box_wholly_outside_its_tensor():
    source = render(PAIR)
    assert "if (m0 < M) tma_load(dst, TX" in source  # the second block of a last, odd pair
    assert "const int slices = min(CLUSTER, (N - n0 + W_SLICE_ROWS - 1) / W_SLICE_ROWS);" in source
    assert "if (rank < slices)\n                        tma_load_multicast(" in source
    assert "const unsigned tx = (m0 < M ? A_BYTES : 0u) + slices * W_SLICE_BYTES;" in source
    assert "W_SLICE_ROWS = 128;" in source and "W_SLICE_BYTES = 16384;" in source


@pytest.mark.parametrize(
    "fields,reason",
    [
        (dict(cluster=3), "cluster must be one of (1, 2)"),
        (dict(cluster=0), "cluster must be one of (1, 2)"),
        (dict(cluster=2, bn=64, block=64), "generated for a dense W only"),
        (dict(cluster=2, bn=64, bm=128, ctas=2, stages=3), "ctas must be 1"),
        (dict(cluster=2, bn=8), "bn 8 must be a multiple of 8 x cluster 2"),
        (dict(cluster=2, bn=120, consumers=1), "bn 120 must be a multiple of 8 x cluster 2"),
    ],
)
def test_check_refuses_what_clusters_do_not_generate(fields, reason):
    why = Spec(**fields).check()
    assert any(reason in r for r in why), why


def test_check_accepts_pairs_persistent_packed_and_any_shape():
    for spec in (PAIR, Spec(cluster=2, persistent=True), Spec(cluster=2, prepass="pack"),
                 Spec(cluster=2, bm=64, bn=128, consumers=1, stages=6), Spec(cluster=2, bn=16, stages=8)):
        assert not spec.check(), (spec.name, spec.check())
    assert not PAIR.check(BIG) and not Spec(cluster=2, prepass="pack").check(ODD)
    assert not PAIR.check(Problem(1, 8, 64, DType.bf16))  # one m-tile: the pair's second block is past M
    assert any("prepass='pack'" in r for r in PAIR.check(ODD))


# ---- space -----------------------------------------------------------------------------------------
def test_cluster_is_a_dense_space_dimension_with_inverse_maps():
    dense = space_for("hopper", DType.bf16)
    assert dense.dims["cluster"] == (1, 2)
    assert "cluster" not in space_for("hopper", DType.bf16, block=32).dims
    for problem in (BIG, ODD, Problem(130, 250, 72, DType.fp16, bias=True)):
        for persistent in (False, True):
            point = dict(bm=128, bn=256, stages=4, consumers=2, persistent=persistent, group_m=8, cluster=2, split_k=1)
            spec = to_spec("hopper", point, problem)
            assert spec.cluster == 2 and point_of(spec) == point and not spec.check(problem)
    assert any(p["cluster"] == 2 for p in seeds("hopper"))
    assert dense.indices(point_of(PAIR)) is not None


# ---- launch plans ----------------------------------------------------------------------------------
def test_plan_counts_blocks_in_whole_pairs_and_halves_w_s_box():
    p = plan(PAIR, Problem(130, 250, 72, DType.bf16, bias=True))  # 2 m-tiles, 1 n-tile: one pair
    (main,) = p.launches
    assert main.grid == (2, 1, 1) and main.cluster == (2, 1, 1) and main.block == (384, 1, 1)
    tx, tw = p.tensor_maps
    assert tx.box == (64, 128) and tw.box == (64, 128) and tw.dims == (72, 250)  # each block loads half of W's 256 rows
    assert not tx.problems() and not tw.problems()
    # 3 m-tiles round up to 2 pairs (the last pair's second block is past M), 2 n-tiles.
    assert plan(PAIR, Problem(384, 300, 64, DType.bf16)).launches[0].grid == (8, 1, 1)
    assert plan(PAIR, BIG).launches[0].grid == (32 * 16, 1, 1)
    assert plan(Spec(), BIG).launches[0].cluster == (1, 1, 1) and plan(Spec(), BIG).tensor_maps[1].box == (64, 256)
    packed = plan(Spec(cluster=2, prepass="pack"), ODD)
    assert [launch.cluster for launch in packed.launches] == [(1, 1, 1), (2, 1, 1)]  # the pack prepass is plain
    assert packed.tensor_maps[1].operand == "WS" and packed.tensor_maps[1].box == (64, 128)
    assert LaunchPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_a_persistent_grid_launches_whole_clusters():
    assert launched_grid((512, 1, 1), True, (2, 1, 1), 132) == (132, 1, 1)
    assert launched_grid((512, 1, 1), True, (2, 1, 1), 133) == (132, 1, 1)  # never half a pair
    assert launched_grid((6, 1, 1), True, (2, 1, 1), 132) == (6, 1, 1)
    assert launched_grid((512, 1, 1), True, (1, 1, 1), 133) == (133, 1, 1)
    assert launched_grid((512, 1, 1), False, (2, 1, 1), 132) == (512, 1, 1)
    step = KernelLaunch("k", (40, 1, 1), (384, 1, 1), 0, (), persistent=True, cluster=[2, 1, 1])
    assert step.cluster == (2, 1, 1) and step.grid_on(7) == (6, 1, 1)


# ---- export manifest -------------------------------------------------------------------------------
def test_manifest_carries_the_cluster_and_says_how_to_launch_it():
    spec = Spec(cluster=2, persistent=True, bias=True)
    manifest = json.loads(export_files(spec, Problem(130, 250, 72, DType.bf16, bias=True), None, "sm_90")[1])
    (main,) = manifest["kernels"]
    assert main["cluster"] == [2, 1, 1] and main["grid_for_problem"] == [2, 1, 1]
    assert "cuLaunchKernelEx" in main["cluster_note"] and "CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION" in main["cluster_note"]
    assert "rounded down to a multiple of 2" in main["grid_note"]
    assert main["args"][2]["tensor_map"]["box_dim"] == [64, 128]
    rule = manifest["grid_rule"]
    assert "ceil(M/256)*2 * ceil(N/256)" in rule and "cuLaunchKernelEx" in rule and "(2, 1, 1)" in rule
    assert "boxes (64, 128) and (64, 128)" in rule
    plain = json.loads(export_files(Spec(), BIG, None, "sm_90")[1])
    assert "cluster" not in plain["kernels"][0] and "cuLaunchKernelEx" not in plain["grid_rule"]


# ---- launching: the driver call recorded -----------------------------------------------------------
def _recorder(monkeypatch):
    """codegen.cuda with cuLaunchKernel and cuLaunchKernelEx replaced by recorders that succeed."""
    from codegen import cuda

    calls = []
    ok = (cuda.driver.CUresult.CUDA_SUCCESS,)
    monkeypatch.setattr(cuda.driver, "cuLaunchKernel", lambda *a: calls.append(("cuLaunchKernel", a)) or ok)
    monkeypatch.setattr(cuda.driver, "cuLaunchKernelEx", lambda *a: calls.append(("cuLaunchKernelEx", a)) or ok)
    return cuda, calls


def test_cuda_launch_builds_the_cluster_config_for_cuLaunchKernelEx(monkeypatch):  # recorded, not run
    cuda, calls = _recorder(monkeypatch)
    stream = cuda.driver.CUstream(0)
    args = [ctypes.c_void_p(0x1000), ctypes.c_int(7)]
    cuda.launch("f", (8, 1, 1), (384, 1, 1), 197664, stream, args, (2, 1, 1))
    (what, (config, func, params, extra)), = calls
    assert what == "cuLaunchKernelEx" and func == "f" and extra == 0 and isinstance(params, int)
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (8, 1, 1)
    assert (config.blockDimX, config.blockDimY, config.blockDimZ) == (384, 1, 1)
    assert config.sharedMemBytes == 197664 and config.numAttrs == 1
    (attr,) = config.attrs
    assert attr.id == cuda.driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert (attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z) == (2, 1, 1)
    calls.clear()
    cuda.launch("f", (8, 1, 1), (384, 1, 1), 0, stream, args)  # no cluster: the plain launch, as before
    cuda.launch("f", (8, 1, 1), (384, 1, 1), 0, stream, args, [1, 1, 1])
    assert [c[0] for c in calls] == ["cuLaunchKernel", "cuLaunchKernel"] and calls[0][1][1:7] == (8, 1, 1, 384, 1, 1)
    with pytest.raises(ValueError, match=r"grid \(7, 1, 1\) is not a multiple of the cluster \(2, 1, 1\)"):
        cuda.launch("f", (7, 1, 1), (384, 1, 1), 0, stream, args, (2, 1, 1))


def test_engine_run_plan_launches_the_plan_s_cluster(monkeypatch):  # recorded, not run
    from codegen import engine

    launches = []
    monkeypatch.setattr(engine.cuda, "launch", lambda func, grid, block, smem, stream, args, cluster=(1, 1, 1):
                        launches.append((func, tuple(grid), cluster)))
    eng = engine.Engine.__new__(engine.Engine)
    eng.ctx = type("Ctx", (), {"info": type("Info", (), {"sms": 133})()})()
    eng.stream = None
    monkeypatch.setattr(engine.Engine, "_argument", staticmethod(lambda name, plan, ops, dims: ctypes.c_int(0)))
    module = type("Module", (), {"function": lambda self, symbol, smem: symbol})()
    ops = type("Ops", (), {"problem": BIG})()
    eng.run_plan(module, plan(Spec(cluster=2, persistent=True, prepass="pack"), Problem(4096, 4096, 4092,
                                                                                        DType.bf16)), ops)
    eng.run_plan(module, plan(PAIR, BIG), ops)
    name = Spec(cluster=2, persistent=True, prepass="pack").name
    assert launches == [(name + "_pack", plan(Spec(cluster=2, persistent=True, prepass="pack"),
                                              Problem(4096, 4096, 4092, DType.bf16)).launches[0].grid, (1, 1, 1)),
                        (name, (132, 1, 1), (2, 1, 1)), (PAIR.name, (512, 1, 1), (2, 1, 1))]


def test_nn_launches_a_cluster_manifest_with_its_cluster(monkeypatch):  # recorded, not run
    torch = pytest.importorskip("torch", reason="codegen.nn needs the torch extra")
    from codegen import cuda
    from codegen.nn import layer as nn

    problem = Problem(300, 250, 72, DType.bf16, bias=True)
    spec = Spec(cluster=2, persistent=True, bias=True)
    manifest = json.loads(export_files(spec, problem, None, "sm_90")[1])
    launches = []
    monkeypatch.setattr(cuda, "launch_prepared", lambda func, grid, block, smem, stream, params, cluster=(1, 1, 1):
                        launches.append((func, tuple(grid), cluster)))
    monkeypatch.setattr(cuda, "encode_tensor_map", lambda enc, address: (ctypes.c_ubyte * 128)())
    monkeypatch.setattr(nn, "_make_current", lambda ctx: None)
    monkeypatch.setattr(nn, "_current_stream", lambda index: 0)
    k = nn._Compiled.__new__(nn._Compiled)
    k.cuda, k.manifest, k.problem, k.device, k.ctx, k.sms = cuda, manifest, problem, torch.device("cpu"), None, 3
    k.functions, k.workspace, k.zero_first, k.maps = ["fn"], 0, False, {}
    k.prepare()
    t = {"y": torch.empty(300, 250, dtype=torch.bfloat16), "x": torch.zeros(300, 72, dtype=torch.bfloat16),
         "weight": torch.zeros(250, 72, dtype=torch.bfloat16), "bias": torch.zeros(250, dtype=torch.bfloat16)}
    k(t)
    # 3 m-tiles -> 2 pairs = 4 blocks; 3 multiprocessors take one whole pair.
    assert manifest["kernels"][0]["grid_for_problem"] == [4, 1, 1]
    assert launches == [("fn", (2, 1, 1), (2, 1, 1))]


def test_cuda_launch_prepared_takes_the_cluster_too(monkeypatch):  # recorded, not run
    cuda, calls = _recorder(monkeypatch)
    stream = cuda.driver.CUstream(0)
    cuda.launch_prepared("f", (4, 2, 1), (384, 1, 1), 0, stream, 1234, (2, 1, 1))
    cuda.launch_prepared("f", (4, 2, 1), (384, 1, 1), 0, stream, 1234)
    (ex, (config, func, params, extra)), (plain, args) = calls
    assert (ex, func, params, extra, plain) == ("cuLaunchKernelEx", "f", 1234, 0, "cuLaunchKernel")
    assert (config.gridDimX, config.gridDimY) == (4, 2) and config.attrs[0].value.clusterDim.x == 2
    assert args[:7] == ("f", 4, 2, 1, 384, 1, 1) and args[-2:] == (1234, 0)


# ---- compiler tier ---------------------------------------------------------------------------------
SAMPLE = [
    PAIR,
    Spec(cluster=2, persistent=True),
    Spec(cluster=2, dtype=DType.fp16, bias=True, prepass="pack"),
    Spec(cluster=2, bm=256, bn=128, persistent=True, group_m=16),
    Spec(cluster=2, bm=128, bn=128, consumers=1, stages=6, dtype=DType.fp16),
    Spec(cluster=2, bm=64, bn=96, consumers=1, stages=5, bias=True, group_m=1),
    Spec(cluster=2, bm=128, bn=192, stages=4, bias=True, persistent=True),
    Spec(cluster=2, bn=16, stages=8),
]


@pytest.fixture(scope="module")
def compiled():
    return {name: built for (name, _), built in compile_all(SAMPLE + [Spec()]).items()}


@pytest.mark.timeout(600)
def test_pairs_compile_to_wgmma_fed_by_a_multicast_tma(compiled):
    assert all(not s.check() for s in SAMPLE), [(s.name, s.check()) for s in SAMPLE if s.check()]
    for spec in SAMPLE:
        result, text = compiled[spec.name]
        assert "-arch=sm_90a" in result.options
        code = sass.functions(text)[spec.name]
        ops = sass.opcodes(text, spec.name)
        assert ops["HGMMA"] == 4 * spec.frag_m and code.count(f"HGMMA.64x{spec.bn}x16.F32") == 4 * spec.frag_m, spec.name
        # X's box (skipped past M) and W's half box, multicast to both blocks of the pair.
        assert ops["UTMALDG"] == 2 and code.count("UTMALDG.2D.MULTICAST") == 1, spec.name
        assert ops["UCGABAR_ARV"] == 2 and ops["UCGABAR_WAIT"] == 2, spec.name  # start and end of the kernel
        assert ".RED" in "".join(line for line in code.splitlines() if "SYNCS.ARRIVE" in line), spec.name
        assert ops["USETMAXREG"] == 2 and ops["LDL"] == 0 and ops["STL"] == 0, spec.name
        # The arrivals released at cluster scope would fence the whole GPU every k-tile: only the two
        # cluster barriers may.
        assert code.count("MEMBAR.ALL.GPU") <= 2, spec.name
        report = result.report[spec.name]
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0 and report["stack"] == 0, (spec.name, report)
    plain_result, plain = compiled[Spec().name]
    code = sass.functions(plain)[Spec().name]
    assert "MULTICAST" not in code and "UCGABAR" not in code and ".RED" not in code
