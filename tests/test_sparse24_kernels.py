"""CPU and compiler tiers of the sparse24 family (2:4 W on mma.sp m16n8k32): names and rules, the
search space and which families fit a 2:4 problem, launch plans and manifests, kernels run by the
CPU emulation (tests/cpu_cuda.py, mma.sp emulated as the PTX ISA describes it) against float64 on
odd shapes, an export run from its manifest alone, and NVRTC builds for sm_80 and sm_90 whose SASS
holds the sparse HMMA and no spills (these specs build spill-free under NVRTC 13.0, the GPU's, as
under the newer one the test environment may have).
The GPU tier runs the kernels for real: tests/gpu/test_sparse24.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from codegen import families, sass
from codegen.data import compare, output_shapes, random_inputs, references
from codegen.export import check_source, export_files
from codegen.families.sparse24 import Spec
from codegen.families.tensorcore import Spec as TcSpec
from codegen.launch import SP24_ARGS, KernelLaunch, LaunchPlan, grid_rule, plan
from codegen.problem import DType, Problem
from codegen.render import render
from codegen.spec import DeviceLimits
from search.fit import chosen, default_family, fitting
from search.space import point_of, seeds, space_for, to_spec
from tests import cpu_cuda
from tests.compiled import compile_all

P24 = Problem(130, 264, 136, DType.bf16, bias=True, sparsity="2:4")
SMALL = dict(bm=32, bn=32, bk=32, wm=16, wn=16, stages=2)


def p24(m: int, n: int, k: int, dtype=DType.bf16, bias: bool = False) -> Problem:
    return Problem(m, n, k, dtype, bias=bias, sparsity="2:4")


# ---- identity, rules, space, fit ----------------------------------------------------------------------
def test_the_name_is_the_identity_and_names_2_4():
    for spec in (Spec(), Spec(dtype=DType.fp16, bias=True, smem="pad", epilogue="direct", split_k=4,
                              reduce="two_pass", group_m=1, bm=16, bn=32, bk=256, wm=8, wn=16, stages=6)):
        assert spec.name.startswith("sp24_") and families.spec_from_name(spec.name) == spec
        assert families.spec_from_dict(spec.to_dict()) == spec and spec.to_dict()["family"] == "sparse24"
    assert Spec().name == "sp24_bf16_nobias_64x128x64_w32x32_s4x_es_g8_k1"
    assert families.variant_fields("sparse24")[0].name == "bm" and not families.takes_sparse("sparse24")
    assert families.takes_sparsity("sparse24", "2:4") and not families.takes_sparsity("sparse24", "")
    assert [f for f in families.names() if families.takes_sparsity(f, "2:4")] == ["hopper_sp24", "sparse24"]


@pytest.mark.parametrize("fields,needle", [
    (dict(dtype=DType.fp32), "takes bf16, fp16 inputs, not fp32"),
    (dict(bk=48), "bk must be one of (32, 64, 128, 256)"),
    (dict(wn=24), "its W rows (wn) of 16"),
    (dict(wm=12), "its X rows (wm) must be a multiple of 8"),
    (dict(bm=48, wm=32), "does not divide block tile"),
    (dict(stages=1), "stages must be 2 to 16"),
    (dict(split_k=2), "reduce is 'none' exactly when split_k is 1"),
    (dict(reduce="atomic", split_k=2), "reduce must be one of ('none', 'two_pass')"),
    (dict(bm=256, bn=256, wm=64, wn=64), "registers per thread"),
])
def test_rules_refuse_what_the_template_cannot_express(fields, needle):
    assert any(needle in why for why in Spec(**fields).check()), Spec(**fields).check()


def test_a_2_4_problem_and_its_family_go_together():
    assert Spec(bias=True).check(P24) == []
    assert any("computes a 2:4 sparse W only" in why for why in Spec(bias=True).check(Problem(130, 264, 136, DType.bf16,
                                                                                            bias=True)))
    assert any("has no 2:4 sparse variants" in why for why in TcSpec(bias=True).check(P24))
    assert any("split_k 8 > 5 k-tiles" in why for why in Spec(bias=True, bk=32, split_k=8, reduce="two_pass").check(P24))


def test_only_the_2_4_families_fit_a_2_4_problem():
    fits = fitting(P24, None)
    assert [f.family for f in chosen(fits)] == ["hopper_sp24", "sparse24"] and default_family(P24, None) == "hopper_sp24"
    assert [f.family for f in chosen(fitting(P24, DeviceLimits(sm=80)))] == ["sparse24"]
    why = {f.family: f.why for f in fits}
    assert why["tensorcore"] == ("the tensorcore family has no 2:4 sparse variants; choose --family hopper_sp24 or "
                                 "sparse24")
    dense = {f.family: f.why for f in fitting(Problem(130, 264, 136, DType.bf16), None)}
    assert dense["sparse24"] == ("the sparse24 family computes a 2:4 sparse W only: give --sparsity 2:4 or choose "
                                 "another --family")
    with pytest.raises(ValueError, match="not a block-sparse one"):
        space_for("sparse24", DType.bf16, block=32, sparsity="2:4")


def test_the_space_maps_points_onto_specs_and_back():
    space = space_for("sparse24", DType.bf16, sparsity="2:4")
    rng = np.random.default_rng(0)
    for _ in range(200):
        point = {k: v[rng.integers(len(v))] for k, v in space.dims.items()}
        assert point_of(to_spec("sparse24", point, P24)) == point
    assert space_for("sparse24", DType.fp16, restricted=True, sparsity="2:4").size < space.size
    layer = p24(32, 4096, 4096)
    assert all(to_spec("sparse24", p, layer).check(layer) == [] for p in seeds("sparse24"))


def test_the_plan_passes_the_compressed_w_and_its_metadata():
    spec = Spec(bias=True)
    (launch,) = plan(spec, P24).launches
    assert launch.args == SP24_ARGS == ("Y", "X", "WC", "B", "WS", "WE", "M", "N", "K")
    assert launch.grid == (3 * 3, 1, 1) and launch.block == (256, 1, 1) and launch.smem == spec.smem_bytes
    split = Spec(bias=True, split_k=3, reduce="two_pass")
    two = plan(split, P24)
    assert [x.symbol for x in two.launches] == [split.name, split.name + "_reduce"]
    assert two.workspace_bytes == 4 * 3 * 130 * 264 and two.launches[0].grid == (9, 3, 1)
    assert "WC[N][KP/2]" in grid_rule(spec) and "_reduce" in grid_rule(split)


def test_the_source_uses_the_sparse_instruction_and_its_operands():
    src = render(Spec(dtype=DType.fp16, bias=True))
    assert "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32" in src
    assert "%12, 0x0;" in src and "mma.sync" not in src  # sparsity selector 0
    assert "const T* __restrict__ WC" in src and "const unsigned* __restrict__ WE" in src
    assert "META_FILL = 0x44444444u" in src


# ---- the kernels on the CPU emulation ---------------------------------------------------------------------
EMULATED = [
    (SMALL, (1, 1, 1), DType.bf16, False),
    (SMALL, (3, 17, 5), DType.fp16, True),  # K = 5: one group past a multiple of four
    (SMALL, (5, 37, 37), DType.bf16, True),  # K = 37: rows that break 16-byte alignment
    (dict(SMALL, bk=64, stages=3, epilogue="direct", smem="pad"), (33, 50, 130), DType.fp16, True),
    (dict(bm=16, bn=32, bk=32, wm=8, wn=32, stages=2, split_k=2, reduce="two_pass"), (17, 40, 96), DType.bf16, True),
    (dict(SMALL, bk=128, split_k=3, reduce="two_pass", epilogue="direct"), (9, 33, 700), DType.bf16, False),
    (dict(bm=64, bn=64, bk=64, wm=32, wn=32, stages=3), (130, 264, 136), DType.bf16, True),
    (dict(bm=64, bn=64, bk=64, wm=32, wn=32, stages=3), (130, 264, 136), DType.fp16, False),
]


@pytest.mark.skipif(not cpu_cuda.available(), reason="g++ is not installed")
@pytest.mark.parametrize("fields,shape,dtype,bias", EMULATED,
                         ids=[f"{Spec(dtype=d, bias=b, **f).name}-{'x'.join(map(str, s))}" for f, s, d, b in EMULATED])
def test_the_kernel_computes_the_masked_product_on_the_cpu(fields, shape, dtype, bias, tmp_path):
    spec, problem = Spec(dtype=dtype, bias=bias, **fields), p24(*shape, dtype=dtype, bias=bias)
    assert spec.check(problem) == []
    inputs = random_inputs(problem, np.random.default_rng(7))
    out = cpu_cuda.run_plan(render(spec), plan(spec, problem), problem, inputs, output_shapes(problem), tmp_path)
    status, evidence, rel = compare(problem, out["Y"], references(problem, inputs)["Y"])
    assert status == "ok", evidence
    assert rel < problem.dtype.rel_tol / 4


@pytest.mark.skipif(not cpu_cuda.available(), reason="g++ is not installed")
def test_metadata_that_does_not_match_the_values_gives_another_product(tmp_path):
    """The kernel reads its metadata: the words of each k-step's two halves exchanged, it is wrong."""
    spec, problem = Spec(**SMALL), p24(16, 32, 64)
    inputs = random_inputs(problem, np.random.default_rng(3))
    inputs["WE"] = np.ascontiguousarray(inputs["WE"].reshape(-1, 8, 2)[:, :, ::-1].reshape(inputs["WE"].shape))
    out = cpu_cuda.run_plan(render(spec), plan(spec, problem), problem, inputs, output_shapes(problem), tmp_path)
    ok = random_inputs(problem, np.random.default_rng(3))
    assert compare(problem, out["Y"], references(problem, ok)["Y"])[0] == "wrong_result"


def _plan_of_manifest(doc: dict) -> LaunchPlan:
    """The launches an exported manifest spells, read back as a plan (the manifest alone)."""
    launches = tuple(KernelLaunch(symbol=k["symbol"], grid=tuple(k["grid_for_problem"]), block=tuple(k["block"]),
                                  smem=k["dynamic_smem_bytes"], args=tuple(a["name"] for a in k["args"]))
                     for k in doc["kernels"])
    return LaunchPlan(launches=launches, workspace_bytes=doc["workspace_bytes"], zero_output=doc["zero_output_first"])


@pytest.mark.skipif(not cpu_cuda.available(), reason="g++ is not installed")
@pytest.mark.parametrize("fields", [SMALL, dict(SMALL, split_k=2, reduce="two_pass")])
def test_an_export_describes_wc_and_we_and_runs_from_its_manifest_alone(fields, tmp_path):
    spec, problem = Spec(bias=True, **fields), p24(19, 45, 91, bias=True)
    cu, js = export_files(spec, problem, None, "sm_80")
    doc = json.loads(js)
    check_source(doc, cu)
    args = [(a["name"], a["type"]) for a in doc["kernels"][0]["args"]]
    assert ("WC", "const __nv_bfloat16*") in args and ("WE", "const unsigned*") in args and ("W", "const T*") not in args
    sp = doc["sparse"]
    assert sp["format"] == "2:4" and sp["density"] == 0.5 and "WE[ceil(N/16)][KP/32][16]" in sp["arguments"]
    assert sp["operands"] == {"WC": {"shape": [45, 48], "element_type": "the element type"},
                              "WE": {"shape": [3, 3, 16], "element_type": "uint32"}}
    assert doc["problem"]["sparsity"] == "2:4" and "WC and WE" in doc["arguments_note"]
    inputs = random_inputs(problem, np.random.default_rng(5))
    assert {k: list(inputs[k].shape) for k in ("WC", "WE")} == {k: v["shape"] for k, v in sp["operands"].items()}
    out = cpu_cuda.run_plan(cu, _plan_of_manifest(doc), problem, inputs, {"Y": (19, 45)}, tmp_path)
    assert compare(problem, out["Y"], references(problem, inputs)["Y"])[0] == "ok"


# ---- NVRTC for sm_80 and sm_90: the sparse HMMA, no spills ---------------------------------------------
COMPILED = [
    Spec(),
    Spec(dtype=DType.fp16, bias=True),
    Spec(bias=True, smem="pad", epilogue="direct", split_k=2, reduce="two_pass"),
    Spec(bm=128, bn=128, bk=64, wm=64, wn=32, stages=3),
    Spec(bm=64, bn=128, bk=32, wm=32, wn=64, stages=4, dtype=DType.fp16),
    Spec(bm=16, bn=64, bk=128, wm=8, wn=32, group_m=4),
    Spec(bm=16, bn=32, bk=128, wm=16, wn=16, split_k=4, reduce="two_pass", bias=True),
    Spec(**SMALL),
]


@pytest.fixture(scope="module")
def compiled():
    return compile_all(COMPILED, archs=("sm_80", "sm_90"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("spec", COMPILED, ids=[s.name for s in COMPILED])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_build_holds_the_sparse_mma_and_no_spills(compiled, spec, arch):
    result, text = compiled[(spec.name, arch)]
    report = result.report[spec.name]
    assert (report["spill_stores"], report["spill_loads"], report["stack"]) == (0, 0, 0), report
    hmma = sass.mnemonics(text, spec.name, "HMMA")
    kind = "HMMA.SP.16832.F32" + (".BF16" if spec.dtype is DType.bf16 else "")
    assert set(hmma) == {kind}, hmma  # every tensor-core instruction is the sparse m16n8k32
    per_tile = (spec.wn // 16) * (spec.wm // 8) * (spec.bk // 32)
    assert hmma[kind] >= per_tile  # the aligned and the unaligned pipeline each unroll a tile's
    ops = sass.opcodes(text, spec.name)
    assert ops["LDSM"] > 0 and ops["LDGSTS"] > 0
    if spec.reduce == "two_pass":
        assert f"{spec.name}_reduce" in result.report
