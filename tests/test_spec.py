"""CPU tier: problems and SIMT specs as data; names as identities; check() reasons."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from codegen.families.simt import Spec as SimtSpec
from codegen.problem import DType, Layout, Problem
from codegen.spec import DeviceLimits

#: The seed article's kernels: naive (straight from global memory) and 16/32 shared-memory tiled.
NAIVE = SimtSpec(stages=0, bm=16, bn=16, bk=1, wm=4, wn=8, tm=1, tn=1, pad=0, vec=1)
TILED16 = SimtSpec(stages=1, bm=16, bn=16, bk=16, wm=4, wn=8, tm=1, tn=1, pad=0, vec=1)
TILED32 = SimtSpec(stages=1, bm=32, bn=32, bk=32, wm=4, wn=8, tm=1, tn=1, pad=0, vec=1)
#: A register-blocked, double-buffered point that is valid everywhere below.
BLOCKED = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, pad=4, vec=4, stages=2)


def varied_specs() -> list[SimtSpec]:
    """Many specs differing in every field (validity does not matter for identity)."""
    axes = {
        "dtype": list(DType),
        "bias": [False, True],
        "bm": [16, 64, 128],
        "bk": [1, 8, 16],
        "tm": [1, 4, 8],
        "tn": [2, 4],
        "pad": [0, 1, 4],
        "vec": [1, 2, 4],
        "stages": [0, 1, 2],
        "group_m": [1, 8],
        "split_k": [1, 3],
    }
    names = list(axes)
    # Every value of every axis against the base, then every pair of values of every two axes.
    out = [SimtSpec(**{**_fields(BLOCKED), name: value}) for name in names for value in axes[name]]
    for a, b in itertools.combinations(names, 2):
        for va, vb in itertools.product(axes[a], axes[b]):
            out.append(SimtSpec(**{**_fields(BLOCKED), a: va, b: vb}))
    for red in ("atomic", "two_pass"):
        out.append(SimtSpec(**{**_fields(BLOCKED), "split_k": 4, "reduce": red}))
    out += [SimtSpec(wm=32, wn=16), SimtSpec(wm=16, wn=32), SimtSpec(bn=128), SimtSpec(bn=32), NAIVE, TILED16]
    return out


def _fields(spec: SimtSpec) -> dict:
    d = spec.to_dict()
    d.pop("family")
    return d


# ---- Problem ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, 1.5, 2.0, "3", None, True])
@pytest.mark.parametrize("field", ["m", "n", "k"])
def test_problem_rejects_non_positive_or_non_int_sizes(field, bad):
    sizes = {"m": 4, "n": 5, "k": 6, field: bad}
    with pytest.raises(ValueError, match=field):
        Problem(**sizes)


def test_problem_accepts_every_size_from_one():
    for m, n, k in [(1, 1, 1), (67, 45, 91), (4097, 4095, 4093), (32, 4096, 4096)]:
        p = Problem(m, n, k)
        assert (p.m, p.n, p.k) == (m, n, k)
        assert p.flops == 2.0 * m * n * k


def test_problem_coerces_enums_and_rejects_unknown_dtype():
    p = Problem(2, 3, 4, dtype="bf16", layout="forward", bias=1)
    assert p.dtype is DType.bf16 and p.layout is Layout.forward and p.bias is True
    with pytest.raises(ValueError):
        Problem(2, 3, 4, dtype="fp64")


def test_problem_dict_round_trip_and_key():
    p = Problem(67, 45, 91, dtype=DType.fp16, bias=True)
    d = json.loads(json.dumps(p.to_dict()))
    assert Problem.from_dict(d) == p
    assert p.key == "67x45x91_fp16_forward_bias"
    assert Problem(67, 45, 91).key != p.key
    assert p.min_bytes == 2 * (67 * 91 + 45 * 91 + 67 * 45 + 45)


# ---- names are identities -------------------------------------------------------------------------
def test_name_round_trips_for_many_specs():
    for spec in varied_specs():
        assert SimtSpec.from_name(spec.name) == spec, spec.name


def test_distinct_specs_have_distinct_names():
    specs = set(varied_specs())
    assert len(specs) > 150
    names = {s.name for s in specs}
    assert len(names) == len(specs)


def test_name_is_a_c_identifier_and_stable():
    for spec in varied_specs():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", spec.name), spec.name
    assert BLOCKED.name == "simt_fp32_nobias_64x64x16_w16x32_t4x4_p4_v4_s2_g1_k1"
    assert SimtSpec(dtype="bf16", bias=True, split_k=2, reduce="two_pass").name.endswith("_k2r")


def test_dict_round_trip_through_json():
    for spec in varied_specs():
        d = json.loads(json.dumps(spec.to_dict()))
        assert d["family"] == "simt"
        assert SimtSpec.from_dict(d) == spec


def test_equal_specs_hash_equal():
    a = SimtSpec(dtype="fp16", bias=1)
    b = SimtSpec(dtype=DType.fp16, bias=True)
    assert a == b and hash(a) == hash(b) and a.name == b.name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "simt",
        "wmma_fp32_nobias_64x64x16_w16x32_t4x4_p4_v4_s2_g1_k1",
        "simt_fp64_nobias_64x64x16_w16x32_t4x4_p4_v4_s2_g1_k1",
        "simt_fp32_nobias_64x64x16_w16x32_t4x4_p4_v4_s2_g1_k1x",
        "simt_fp32_nobias_64x64_w16x32_t4x4_p4_v4_s2_g1_k1",
    ],
)
def test_from_name_rejects_foreign_names(name):
    with pytest.raises(ValueError, match="not a SIMT kernel name"):
        SimtSpec.from_name(name)


@pytest.mark.parametrize("name", ["simt_fp32_nobias_064x64x16_w16x32_t4x4_p4_v4_s2_g1_k1",
                                  "simt_fp32_nobias_64x64x16_w16x32_t4x4_p4_v4_s2_g1_k1_bsr0"])
def test_from_name_rejects_non_canonical_names(name):
    with pytest.raises(ValueError, match="not a canonical SIMT kernel name"):
        SimtSpec.from_name(name)


def test_spec_is_frozen_and_typed():
    with pytest.raises(AttributeError):
        BLOCKED.bm = 128  # type: ignore[misc]
    with pytest.raises(TypeError, match="bm"):
        SimtSpec(bm=64.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SimtSpec(dtype="fp64")


# ---- valid points ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [NAIVE, TILED16, TILED32, BLOCKED], ids=lambda s: s.name)
@pytest.mark.parametrize("sm", [80, 90])
def test_seed_article_kernels_and_blocked_kernel_are_valid(spec, sm):
    limits = DeviceLimits.for_arch(sm)
    assert spec.check(limits=limits) == []
    for problem in (Problem(1, 1, 1), Problem(67, 45, 91), Problem(4096, 4096, 4096)):
        assert spec.check(problem, limits) == []


def test_seed_article_geometry():
    assert NAIVE.threads == 256 and NAIVE.smem_bytes == 0
    assert TILED16.threads == 256 and TILED16.smem_bytes == 4 * 16 * (16 + 16)
    assert TILED32.threads == 1024 and TILED32.smem_bytes == 4 * 32 * (32 + 32)
    assert TILED16.a_loads == TILED16.w_loads == 1


@pytest.mark.parametrize("sm", [80, 90])
def test_default_spec_is_a_valid_point(sm):
    assert SimtSpec().check(Problem(4096, 4096, 4096), DeviceLimits.for_arch(sm)) == []


def test_split_k_variants_are_valid():
    for spec in (
        SimtSpec(**{**_fields(BLOCKED), "split_k": 4, "reduce": "atomic"}),
        SimtSpec(**{**_fields(BLOCKED), "split_k": 4, "reduce": "two_pass"}),
        SimtSpec(**{**_fields(BLOCKED), "dtype": "bf16", "split_k": 2, "reduce": "two_pass"}),
    ):
        assert spec.check() == [], spec.name


# ---- invalid points, with reasons --------------------------------------------------------------
def reasons(spec: SimtSpec, problem: Problem | None = None, limits: DeviceLimits | None = None) -> str:
    why = spec.check(problem, limits)
    assert why, f"{spec.name} should be invalid"
    assert all(isinstance(r, str) and r.strip() for r in why)
    return " | ".join(why)


def with_(**changes) -> SimtSpec:
    return SimtSpec(**{**_fields(BLOCKED), **changes})


def test_rejects_too_many_threads():
    # 32 x 32 warps of 32 lanes.
    spec = SimtSpec(bm=128, bn=256, bk=8, wm=4, wn=8, tm=1, tn=1, pad=0, vec=1, stages=1)
    assert spec.threads == 32768
    assert re.search(r"32768 threads per block > 1024", reasons(spec))


def test_rejects_shared_memory_over_the_limit():
    assert BLOCKED.smem_bytes == 4 * 2 * 16 * (68 + 68)
    text = reasons(BLOCKED, limits=DeviceLimits(max_smem=BLOCKED.smem_bytes - 1))
    assert f"shared memory {BLOCKED.smem_bytes} B > {BLOCKED.smem_bytes - 1} B" in text
    assert BLOCKED.check(limits=DeviceLimits(max_smem=BLOCKED.smem_bytes)) == []


def test_shared_memory_limit_depends_on_the_architecture():
    big = with_(bm=128, bn=128, bk=96, wm=32, wn=64, tm=8, tn=8)  # 4*2*96*264 = 202752 B
    assert 166912 < big.smem_bytes <= 232448
    assert big.check(limits=DeviceLimits.for_arch(90)) == []
    assert "shared memory" in reasons(big, limits=DeviceLimits.for_arch(80))


def test_rejects_warp_tile_not_dividing_block_tile():
    assert "does not divide block tile 48x64" in reasons(with_(bm=48, wm=32, wn=16, tm=4, tn=4))


def test_rejects_thread_tile_not_dividing_warp_tile():
    assert "thread tile 3x4 does not divide warp tile 16x32" in reasons(with_(tm=3))


def test_rejects_lanes_other_than_32():
    text = reasons(with_(wm=16, wn=16))
    assert "gives 16 lanes, a warp has 32" in text
    assert "gives 64 lanes" in reasons(with_(wm=32, wn=32, bm=64, bn=64))


def test_rejects_thread_tile_sides_over_16():
    text = reasons(SimtSpec(bm=128, bn=64, wm=128, wn=8, tm=32, tn=1, bk=16))
    assert "thread tile sides must be 1, 2 or a multiple of 4 up to 16" in text


@pytest.mark.parametrize("tm, wm, bm", [(3, 12, 48), (6, 24, 96)])
def test_rejects_thread_tile_sides_outside_1_2_or_multiple_of_4(tm, wm, bm):
    spec = SimtSpec(bm=bm, bn=64, bk=16, wm=wm, wn=64, tm=tm, tn=8, pad=4, vec=4, stages=2)
    assert spec.lanes_m * spec.lanes_n == 32
    assert "thread tile sides" in reasons(spec)


def test_rejects_vec_not_dividing_bk():
    text = reasons(with_(bk=6, vec=4))
    assert "vec 4 does not divide bk 6" in text


def test_tiles_not_shared_evenly_by_the_threads_are_valid_with_loads_rounded_up():
    spec = with_(bk=8, vec=4)  # 64x8 tile = 128 float4 loads for 256 threads
    assert spec.check() == []
    assert spec.a_loads == spec.w_loads == 1
    odd = with_(bm=96, bn=128, wm=32, wn=32, tm=8, tn=4, bk=16)  # 12 warps; W: 512 loads for 384
    assert odd.threads == 384 and odd.check() == []
    assert (odd.a_loads, odd.w_loads) == (1, 2)


def test_rejects_bad_vec_for_dtype():
    assert "vec must be a power of two up to 4 for fp32" in reasons(with_(vec=8, bk=16))
    assert "vec must be" in reasons(with_(vec=3, bk=12))
    assert with_(dtype="fp16", vec=8, bk=32).check() == []


def test_rejects_bad_stages_and_naive_with_tiles():
    assert "stages must be 0, 1 or 2 with register copies, got 3" in reasons(with_(stages=3))
    assert "stages must be 2, 3 or 4 with async copies, got 1" in reasons(with_(stages=1, copy="async"))
    assert "copy must be one of" in reasons(with_(copy="tma"))
    assert "stages=0 (no shared memory) takes bk=1, pad=0, vec=1" in reasons(with_(stages=0))


def test_async_copy_rules():
    assert not with_(copy="async", stages=3, bk=16).check()
    assert "need sm_80 or newer" in " ".join(SimtSpec(copy="async", stages=3).check(None, DeviceLimits.for_arch(75)))
    assert "multiple of 16" in reasons(with_(copy="async", stages=3, pad=2))
    half = SimtSpec(dtype=DType.bf16, copy="async", stages=3, bk=16, vec=8, pad=4)
    assert "multiple of 16" in " ".join(half.check())  # 20 bf16 = 40 B rows break 16-byte cp.async
    assert not SimtSpec(dtype=DType.bf16, copy="async", stages=3, bk=16, vec=8, pad=8).check()


def test_rejects_pad_breaking_fragment_alignment():
    assert "pad 1 breaks the 4/4-wide fragment alignment" in reasons(with_(pad=1))
    assert SimtSpec(**{**_fields(TILED16), "pad": 1}).check() == []  # 1-wide fragments


def test_rejects_non_positive_sizes():
    assert "bm must be >= 1" in reasons(with_(bm=0))
    assert "split_k must be >= 1" in reasons(with_(split_k=0))
    assert "pad must be >= 0" in reasons(with_(pad=-1))


def test_rejects_register_estimate_over_the_limit():
    spec = SimtSpec(bm=64, bn=128, bk=16, wm=64, wn=128, tm=16, tn=16, pad=0, vec=4, stages=2)
    assert spec.threads == 32
    assert "registers per thread > 255" in reasons(spec)


def test_rejects_split_k_and_reduce_mismatch():
    assert "reduce is 'none' exactly when split_k is 1" in reasons(with_(split_k=2))
    assert "reduce is 'none' exactly when split_k is 1" in reasons(with_(reduce="atomic"))
    assert "reduce must be one of" in reasons(with_(split_k=2, reduce="tree"))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_rejects_atomic_reduce_for_half_types(dtype):
    assert "atomic split-K reduction needs fp32 output" in reasons(with_(dtype=dtype, split_k=2, reduce="atomic"))
    assert with_(dtype=dtype, split_k=2, reduce="two_pass").check() == []


def test_rejects_dtype_and_bias_mismatch_with_problem():
    assert "spec dtype fp32 != problem dtype fp16" in reasons(BLOCKED, Problem(64, 64, 64, dtype="fp16"))
    assert "disagree on bias" in reasons(BLOCKED, Problem(64, 64, 64, bias=True))
    assert "disagree on bias" in reasons(with_(bias=True), Problem(64, 64, 64))
    assert with_(bias=True, dtype="bf16").check(Problem(64, 64, 64, dtype="bf16", bias=True)) == []


def test_rejects_split_k_larger_than_k_tiles():
    spec = with_(split_k=4, reduce="two_pass")  # bk = 16
    assert "split_k 4 > 2 k-tiles of K=32" in reasons(spec, Problem(64, 64, 32))
    assert spec.check(Problem(64, 64, 49)) == []  # 4 k-tiles, the last one partial
    assert "split_k 2 > 1 k-tiles of K=1" in reasons(with_(split_k=2, reduce="atomic"), Problem(8, 8, 1))


def test_invalid_points_list_every_reason_at_once():
    spec = with_(dtype="fp16", bias=True, split_k=8, reduce="atomic")
    why = spec.check(Problem(64, 64, 16, dtype="fp16"))
    text = " | ".join(why)
    assert "atomic split-K" in text
    assert "disagree on bias" in text
    assert "split_k 8 > 1 k-tiles" in text
    assert len(why) == 3
