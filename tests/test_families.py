"""CPU tier: the family registry, the seam every other module goes through."""

from __future__ import annotations

import dataclasses
import re

import pytest

import templates
from codegen import families
from codegen.families.simt import Spec as SimtSpec
from codegen.launch import REDUCE_ARGS, grid_rule, plan, reduce_launch, reduce_symbol, workspace_bytes
from codegen.problem import DType, Problem
from codegen.render import environment, render
from codegen.spec import DeviceLimits, KernelSpec


def test_registry_discovers_the_family_modules():
    assert "simt" in families.names() and families.names() == sorted(families.names())
    simt = families.get("simt")
    assert simt.NAME == "simt" and simt.Spec.family == "simt"
    for name in families.names():
        module = families.get(name)
        assert module.NAME == name and module.Spec.family == name
        for part in ("template_values", "plan", "grid_rule"):
            assert callable(getattr(module, part)), (name, part)
        assert (templates.DIR / f"{name}.cu.j2").is_file(), name
        spec = module.Spec()
        assert isinstance(spec, KernelSpec)
        assert families.family_of(spec) is module
        assert {f.name for f in dataclasses.fields(module.Spec)} >= {"dtype", "bias"}


def test_unknown_family_is_a_clear_error_listing_the_known():
    with pytest.raises(ValueError, match=r"unknown kernel family 'wmma'; known families: .*simt"):
        families.get("wmma")
    with pytest.raises(ValueError, match="simt"):
        families.spec_from_dict({"family": "wmma", "bm": 64})
    with pytest.raises(ValueError, match="names its family"):
        families.spec_from_dict({"bm": 64})
    with pytest.raises(ValueError, match=r"not a kernel name of any family \(.*simt"):
        families.spec_from_name("wmma_fp32_64x64")


def test_dispatch_by_dict_and_name():
    spec = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, split_k=2, reduce="two_pass")
    assert families.spec_from_dict(spec.to_dict()) == spec
    assert families.spec_from_name(spec.name) == spec


def test_a_family_refuses_another_family_s_dict_and_name(toy_family):
    toy = toy_family.Spec(tile=32, mode="fancy")
    with pytest.raises(ValueError, match="is not a 'simt' spec"):
        SimtSpec.from_dict(toy.to_dict())
    with pytest.raises(ValueError, match="not a SIMT kernel name"):
        SimtSpec.from_name(toy.name)
    with pytest.raises(ValueError, match="not a 'toy' spec"):
        toy_family.Spec.from_dict(SimtSpec().to_dict())
    with pytest.raises(ValueError, match="not a toy kernel name"):
        toy_family.Spec.from_name(SimtSpec().name)
    assert SimtSpec.from_dict({k: v for k, v in SimtSpec().to_dict().items() if k != "family"}) == SimtSpec()


def test_a_new_family_module_is_found_without_being_named(toy_family):
    assert families.names() == sorted(["toy", *[n for n in families.names() if n != "toy"]])
    toy = toy_family.Spec(dtype="bf16", tile=16, swizzle=True)
    assert families.spec_from_dict(toy.to_dict()) == toy
    assert families.spec_from_name(toy.name) == toy
    assert families.family_of(toy) is toy_family
    assert [f.name for f in families.variant_fields("toy")] == ["tile", "mode", "swizzle"]
    p = Problem(100, 70, 9)
    assert plan(toy, p).launches[0].grid == (35, 1, 1) and grid_rule(toy).startswith(toy.name)


def test_a_family_module_must_name_itself(tmp_path, monkeypatch):
    (tmp_path / "mislabelled.py").write_text("NAME = 'other'\nclass Spec:\n    family = 'other'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    families._families.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="must set NAME = 'mislabelled'"):
            families.names()
    finally:
        monkeypatch.undo()
        families._families.cache_clear()


# ---- what families share -----------------------------------------------------------------------------
def test_two_pass_reduce_launch_is_shared():
    p = Problem(67, 45, 91)
    step = reduce_launch("k", 3, p)
    assert step.symbol == reduce_symbol("k") == "k_reduce"
    assert step.grid == (-(-67 * 45 // 256), 1, 1) and step.block == (256, 1, 1) and step.args == REDUCE_ARGS
    assert workspace_bytes(3, p) == 4 * 3 * 67 * 45
    with pytest.raises(ValueError, match="split_k >= 2"):
        reduce_launch("k", 1, p)
    spec = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, split_k=3, reduce="two_pass")
    launch = plan(spec, p)
    assert launch.launches[1] == reduce_launch(spec.name, 3, p) and launch.workspace_bytes == workspace_bytes(3, p)


def test_common_pieces_are_written_once_and_used_by_simt():
    spec = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, split_k=2, reduce="two_pass", bias=True)
    source = render(spec)
    common = (templates.DIR / "common.cuh.j2").read_text()
    for piece in ("void block_origin(int bid, int M, int N, int BM, int BN, int GROUP_M, int& m0, int& n0)",
                  "void split_range(int split, int K, int BK, int SPLIT_K, int& k_begin, int& k_end)"):
        assert piece in common and source.count(piece) == 1
    assert "macro reduce_kernel(name, split_k, bias)" in common and "macro store_element(reduce, bias)" in common
    assert "macro last_to_arrive()" in common and "last_to_arrive" not in source
    last = render(SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, split_k=2, reduce="last", bias=True))
    assert last.count("bool last_to_arrive(int* counter, int splits)") == 1 and "_reduce(" not in last
    assert (f'extern "C" __global__ void __launch_bounds__(256)\n{spec.name}_reduce(T* __restrict__ Y, '
            f"const T* __restrict__ B, const float* __restrict__ WS, int M, int N)") in source
    simt = (templates.DIR / "simt.cu.j2").read_text()
    assert "_reduce(" not in simt and "atomicAdd" not in simt and "per_group" not in simt


def test_common_macros_can_be_imported_without_context():
    macros = environment().get_template("common.cuh.j2").make_module()
    text = str(macros.store_element("atomic", True))
    assert "if (split == 0) v += to_f(B[c]);" in text and "atomicAdd(&Y[(size_t)r * N + c], v);" in text
    assert "WS[(size_t)split * M * N" in str(macros.store_element("two_pass", False))
    assert "v += to_f(B[c]);" not in str(macros.store_element("none", False))
    assert "for (int s = 0; s < 4; ++s)" in str(macros.reduce_kernel("k", 4, False))


def test_the_simt_template_does_no_arithmetic():
    """Every derived number comes from template_values: no Jinja expression computes one, and the
    constants the template used to derive (A_VECS, SA, SK, stage offsets, ...) arrive as numbers."""
    text = (templates.DIR / "simt.cu.j2").read_text()
    expressions = re.findall(r"\{\{(.*?)\}\}", text)
    assert expressions
    for expr in expressions:
        assert not re.search(r"[-+*/%]", re.sub(r'"[^"]*"', '""', expr)), expr  # string literals aside
    for derived in ("BM * BK / VEC", "BM + PAD", "BK + PAD", "STAGES * BM", "STAGES - 1", "STAGES - 2",
                    "BK / VEC", "TM / RM", "LANES_M * RM", "VEC * sizeof(T)", "% THREADS"):
        assert derived not in text, derived


@pytest.mark.parametrize("copy,stages", [("reg", 0), ("reg", 1), ("reg", 2), ("async", 3)])
def test_template_values_hold_the_derived_numbers(copy, stages):
    params = dict(bm=96, bn=128, bk=16, wm=32, wn=32, tm=8, tn=4, pad=4, vec=4, stages=stages, copy=copy)
    if stages == 0:
        params.update(bk=1, pad=0, vec=1)
    spec = SimtSpec(**params)
    values = families.get("simt").template_values(spec)
    assert values["a_vecs"] == spec.bm * spec.bk // spec.vec and values["k_vecs"] == spec.bk // spec.vec
    assert values["a_uneven"] == bool(values["a_vecs"] % spec.threads)
    assert values["m_step"] == spec.lanes_m * spec.rm and values["m_frags"] == spec.tm // spec.rm
    if copy == "async":
        sk = spec.bk + spec.pad
        assert (values["sk"], values["a_stage"], values["w_offset"]) == (sk, spec.bm * sk, stages * spec.bm * sk)
        assert (values["prefetch"], values["wait_groups"]) == (stages - 1, stages - 2)
    else:
        sa = spec.bm + spec.pad
        assert (values["sa"], values["a_stage"], values["w_offset"]) == (sa, spec.bk * sa, stages * spec.bk * sa)
    source = render(spec)
    assert f"constexpr int A_VECS = {values['a_vecs']}" in source


def test_element_spelling_covers_every_dtype():
    from codegen.render import DTYPE_CUDA

    assert set(DTYPE_CUDA) == set(DType)
    assert DTYPE_CUDA[DType.bf16]["ctype"] == "__nv_bfloat16" and DTYPE_CUDA[DType.fp32]["header"] == ""


def test_a_cluster_split_k_is_one_cluster_of_splits_on_sm_90():
    spec = SimtSpec(bm=32, bn=128, bk=32, wm=16, wn=64, tm=4, tn=8, stages=3, copy="async", split_k=8, reduce="cluster")
    assert spec.name.endswith("_k8d") and SimtSpec.from_name(spec.name) == spec and not spec.check()
    assert spec.smem_bytes >= 4 * 32 * 128  # the partial tile, after the pipeline
    assert any("sm_90" in w for w in spec.check(limits=DeviceLimits.for_arch("sm_80")))
    replace = dataclasses.replace
    assert any("<= 8" in w for w in replace(spec, split_k=16).check())
    assert any("multiples of 4" in w for w in replace(spec, split_k=3).check())
    assert any("exactly when split_k is 1" in w for w in replace(spec, split_k=1).check())
    launch = plan(spec, Problem(32, 4096, 4096)).launches
    assert len(launch) == 1 and launch[0].cluster == (1, 8, 1) and launch[0].grid == (32, 8, 1)
    assert "cluster dimension (1, 8, 1)" in families.get("simt").grid_rule(spec)
