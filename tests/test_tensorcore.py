"""Tensor-core family on the CPU: spec identity and rules, space, launch plans, and the compiler
tier (NVRTC for sm_80 and sm_90): HMMA in every kernel, LDSM in the mma.sync variants, no spills
in the defaults."""

from __future__ import annotations

import pytest

from codegen import sass
from codegen.compile import compile_source
from codegen.families.tensorcore import Spec, plan
from codegen.launch import packed_k
from codegen.problem import DType, Problem
from codegen.render import render
from codegen.spec import DeviceLimits
from search.space import point_of, space_for, to_spec
from tests.compiled import compile_all

SQUARE = dict(bm=128, bn=128, bk=32, wm=64, wn=64, stages=4, epilogue="direct")
SKINNY = dict(bm=32, bn=16, bk=256, wm=16, wn=16, warps_k=4, stages=4, epilogue="smem")
GEMV = dict(bm=16, bn=16, bk=256, wm=16, wn=16, warps_k=4, stages=5, epilogue="smem", group_m=4)
WMMA = dict(mma="wmma", smem="pad", epilogue="smem", bm=128, bn=128, wm=64, wn=32)


def grid() -> list[Spec]:
    """Valid specs that cover every dimension of the family."""
    specs = []
    for dtype in (DType.bf16, DType.fp16, DType.tf32):
        bk = 16 if dtype is DType.tf32 else 32
        specs += [
            Spec(dtype=dtype, **dict(SQUARE, bk=bk)),
            Spec(dtype=dtype, bias=True, **dict(SQUARE, bk=bk, smem="pad", epilogue="smem", group_m=1)),
            Spec(dtype=dtype, **SKINNY),
            Spec(dtype=dtype, bias=True, **dict(WMMA, bk=bk)),
            Spec(dtype=dtype, **dict(WMMA, bm=64, bn=64, wm=32, wn=32, warps_k=2)),
            Spec(dtype=dtype, bias=True, bm=64, bn=64, bk=bk, wm=32, wn=32, split_k=4, reduce="two_pass"),
            Spec(dtype=dtype, bias=True, prepass="pack", **dict(SQUARE, bk=bk, stages=3)),
        ]
    specs += [
        Spec(dtype=DType.tf32, bias=True, bm=64, bn=64, bk=16, wm=32, wn=32, split_k=2, reduce="atomic"),
        Spec(**GEMV),
        Spec(bm=128, bn=256, bk=64, wm=64, wn=64, stages=3, prepass="pack", split_k=2, reduce="two_pass"),
        Spec(bm=256, bn=128, bk=64, wm=64, wn=64, stages=2, group_m=16),
    ]
    return specs


GRID = grid()
#: The family's defaults per dtype and its skinny and GEMV seeds (search/spaces/tensorcore.py).
DEFAULTS = [
    Spec(), Spec(bias=True), Spec(dtype=DType.fp16, bias=True), Spec(**SKINNY), Spec(**GEMV), Spec(bias=True, **GEMV),
    Spec(dtype=DType.tf32, bk=16, prepass="pack"), Spec(dtype=DType.tf32, bk=16, prepass="pack", bias=True),
]


# ---- spec --------------------------------------------------------------------------------------
def test_grid_is_valid_distinct_and_covers_every_choice():
    assert all(not s.check() for s in GRID), [(s.name, s.check()) for s in GRID if s.check()]
    assert len({s.name for s in GRID}) == len(GRID)
    for dim in ("mma", "smem", "epilogue", "reduce", "prepass", "dtype"):
        assert len({getattr(s, dim) for s in GRID}) > 1, dim


@pytest.mark.parametrize("spec", GRID, ids=lambda s: s.name)
def test_name_and_dict_round_trip(spec):
    assert Spec.from_name(spec.name) == spec
    assert Spec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["family"] == "tensorcore"


def test_another_familys_dict_or_name_is_refused():
    with pytest.raises(ValueError, match="is not a 'tensorcore' spec"):
        Spec.from_dict({"family": "simt", "bm": 64})
    with pytest.raises(ValueError, match="not a tensorcore kernel name"):
        Spec.from_name("simt_fp32_nobias_128x128x8_w32x64_t8x8_p4_v4_s2_g1_k1")
    with pytest.raises(TypeError, match="bm must be an int"):
        Spec(bm="64")


@pytest.mark.parametrize(
    "fields,reason",
    [
        (dict(dtype=DType.fp32), "fp32 on tensor cores is the tf32 problem dtype"),
        (dict(mma="wmma"), "smem must be 'pad'"),
        (dict(mma="wmma", smem="pad", epilogue="direct"), "the epilogue must be 'smem'"),
        (dict(warps_k=2, epilogue="direct"), "slice-K"),
        (dict(split_k=2, reduce="atomic"), "atomic split-K needs an fp32 output"),
        (dict(split_k=2), "reduce is 'none' exactly when split_k is 1"),
        (dict(wm=8), "multiples of 16"),
        (dict(bk=24), "power-of-two number"),
        (dict(stages=17), "stages must be 2 to 16"),
        (dict(bm=256, bn=256, wm=32, wn=32), "threads per block"),
        (dict(bm=256, bn=256, bk=256, wm=64, wn=64, stages=5), "shared memory"),
        (dict(smem="diagonal"), "smem must be one of"),
    ],
)
def test_check_names_each_broken_rule(fields, reason):
    assert any(reason in r for r in Spec(**fields).check()), Spec(**fields).check()


def test_check_against_a_problem_and_an_older_gpu():
    spec = Spec(bias=True)
    assert any("dtype" in r for r in spec.check(Problem(64, 64, 64, DType.fp16, bias=True)))
    assert any("bias" in r for r in spec.check(Problem(64, 64, 64, DType.bf16)))
    assert any("k-tiles" in r for r in Spec(**dict(SQUARE, split_k=4, reduce="two_pass")).check(Problem(64, 64, 64)))
    assert any("sm_80" in r for r in Spec().check(limits=DeviceLimits.for_arch("sm_75")))
    assert not Spec().check(Problem(4097, 4095, 4093, DType.bf16), DeviceLimits.for_arch("sm_80"))


# ---- launch plan ----------------------------------------------------------------------------
def test_plan_grids_workspace_and_kernels():
    problem = Problem(4097, 4095, 4093, DType.bf16)
    p = plan(Spec(**SQUARE), problem)
    assert [x.symbol for x in p.launches] == [Spec(**SQUARE).name]
    assert p.launches[0].grid == (33 * 32, 1, 1) and p.workspace_bytes == 0 and not p.zero_output

    spec = Spec(**dict(SQUARE, prepass="pack", split_k=2, reduce="two_pass"))
    p = plan(spec, problem)
    assert [x.symbol for x in p.launches] == [spec.name + "_pack", spec.name, spec.name + "_reduce"]
    assert packed_k(spec.chunk_elems, 4093) == 4096
    partials = -(-(4 * 2 * 4097 * 4095) // 16) * 16
    assert p.workspace_bytes == partials + (4097 + 4095) * 4096 * 2
    assert p.launches[0].grid[0] * 256 >= (4097 + 4095) * 4096 // 8

    atomic = plan(Spec(dtype=DType.tf32, bm=64, bn=64, bk=16, wm=32, wn=32, split_k=2, reduce="atomic"),
                  Problem(64, 64, 64, DType.tf32))
    assert atomic.zero_output and atomic.launches[0].grid == (1, 2, 1)


# ---- space ----------------------------------------------------------------------------------
def test_space_points_map_to_specs_and_back():
    space = space_for("tensorcore", DType.bf16)
    problem = Problem(32, 4096, 4096, DType.bf16, bias=True)
    for spec in (Spec(bias=True, **SKINNY), Spec(bias=True, **dict(SQUARE, split_k=2, reduce="two_pass"))):
        assert to_spec("tensorcore", point_of(spec), problem) == spec
    point = dict(point_of(Spec(**SQUARE)), mma="wmma", warps_k=2, split="k4r")
    derived = to_spec("tensorcore", point, problem)  # rules fix what they can instead of failing
    assert (derived.smem, derived.epilogue, derived.split_k, derived.reduce) == ("pad", "smem", 4, "two_pass")
    # split-K and its reduction are one dimension: atomics only where the output is fp32 (tf32)
    assert space.dims["split"] == ("k1", "k2r", "k4r", "k8r")
    assert space_for("tensorcore", DType.tf32).dims["split"] == ("k1", "k2a", "k2r", "k4a", "k4r", "k8a", "k8r")
    assert space.size > 100_000
    restricted = space_for("tensorcore", DType.bf16, restricted=True)
    valid = [s for s in (restricted.spec(pt, Problem(4096, 4096, 4096, DType.bf16)) for pt in restricted.points()) if not s.check()]
    assert 8 <= len(valid) <= restricted.size


# ---- compiler tier --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compiled():
    return compile_all(GRID, ("sm_80", "sm_90"))


@pytest.mark.timeout(900)
def test_every_spec_compiles_with_tensor_core_instructions(compiled):
    for spec in GRID:
        for arch in ("sm_80", "sm_90"):
            result, text = compiled[(spec.name, arch)]
            ops = sass.opcodes(text, spec.name)
            assert ops["HMMA"] > 0, f"{spec.name} {arch}: no HMMA"
            assert ops["LDGSTS"] > 0, f"{spec.name} {arch}: no cp.async"
            if spec.mma == "mma":
                assert ops["LDSM"] > 0, f"{spec.name} {arch}: mma.sync without ldmatrix"
            assert result.report[spec.name]["registers"] > 0
            expected = {spec.name} | ({spec.name + "_pack"} if spec.prepass == "pack" else set()) | (
                {spec.name + "_reduce"} if spec.reduce == "two_pass" else set())
            assert set(sass.functions(text)) == expected


@pytest.mark.timeout(900)
@pytest.mark.parametrize("spec", DEFAULTS, ids=lambda s: s.name)
def test_default_specs_do_not_spill(compiled, spec):
    for arch in ("sm_80", "sm_90"):
        result = compiled.get((spec.name, arch)) or (compile_source(render(spec), spec.name, arch), None)
        report = result[0].report[spec.name]
        assert report.get("spill_stores", 0) == 0 and report.get("spill_loads", 0) == 0, (arch, report)


def test_rendered_source_spells_only_what_is_on():
    plain = render(Spec(**SQUARE))
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in plain and "ldmatrix" in plain
    assert "_pack" not in plain and "_reduce" not in plain and "wmma::" not in plain and "B[gc]" not in plain
    tf32 = render(Spec(dtype=DType.tf32, bias=True, **dict(SQUARE, bk=16)))
    assert "m16n8k8" in tf32 and "cvt.rna.tf32.f32" in tf32 and "B[gc]" in tf32
    packed = render(Spec(dtype=DType.tf32, prepass="pack", **dict(SQUARE, bk=16)))
    assert packed.count("to_tf32(") == 5  # the definition and four in the prepass; none in the loop
    wmma = render(Spec(**WMMA))
    assert "wmma::mma_sync" in wmma and "ldmatrix" not in wmma
