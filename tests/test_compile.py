"""Compiler tier (CPU, no GPU): render and NVRTC-compile a grid of SIMT specs for sm_80 and sm_90.

Checks what each spec promises in the ptxas report and the SASS: one entry function per kernel
(plus ``<name>_reduce`` for two-pass split-K) with registers, no spills on default-ish specs, and
global loads exactly as wide as the spec's vector width.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
from pathlib import Path

import pytest

from codegen import sass
from codegen.compile import CompileError, CompileResult, compile_source
from codegen.families.simt import Spec as SimtSpec
from codegen.render import render
from codegen.spec import DeviceLimits

pytestmark = pytest.mark.timeout(180)

ARCHS = ("sm_80", "sm_90")


def geometry(bm: int, bn: int, wm: int, wn: int, tm: int, tn: int) -> dict[str, int]:
    return {"bm": bm, "bn": bn, "wm": wm, "wn": wn, "tm": tm, "tn": tn}


#: Block/warp/thread geometries (bm, bn, wm, wn, tm, tn) that give 32 lanes per warp.
NAIVE = geometry(16, 16, 4, 8, 1, 1)
SMALL = geometry(16, 64, 16, 16, 4, 2)  # 4 warps, skinny M
T2X2 = geometry(32, 32, 16, 8, 2, 2)  # 8 warps, 2-wide fragments
T2X4 = geometry(32, 32, 16, 16, 2, 4)  # 4 warps
T4X4 = geometry(64, 64, 16, 32, 4, 4)  # 8 warps
T4X8 = geometry(128, 64, 32, 32, 4, 8)  # 8 warps, rectangular
T8X4 = geometry(64, 128, 32, 32, 8, 4)
T8X2 = geometry(128, 32, 32, 16, 8, 2)
T8X8 = geometry(128, 128, 32, 64, 8, 8)  # 8 warps, 64 accumulators
T8X8_BIG = geometry(256, 128, 64, 32, 8, 8)  # 16 warps


def _spec(shape: dict[str, int], **fields) -> SimtSpec:
    return SimtSpec(**{"pad": 4, "vec": 4, "stages": 2, **shape, **fields})


def simt_grid() -> list[SimtSpec]:
    """A deterministic grid of valid SIMT specs covering every parameter of the family."""
    specs = [
        # The seed article: naive (no shared memory) and 16/32 shared-memory tiled kernels.
        _spec(NAIVE, bk=1, pad=0, vec=1, stages=0),
        _spec(NAIVE, bk=1, pad=0, vec=1, stages=0, bias=True),
        _spec(NAIVE, bk=1, pad=0, vec=1, stages=0, dtype="fp16"),
        _spec(T4X4, bk=1, pad=0, vec=1, stages=0),
        _spec(T4X4, bk=1, pad=0, vec=1, stages=0, split_k=2, reduce="atomic"),
        _spec(T8X8, bk=1, pad=0, vec=1, stages=0, dtype="bf16", bias=True),
        _spec(NAIVE, bk=16, pad=0, vec=1, stages=1),
        _spec(NAIVE, bk=16, pad=1, vec=1, stages=1, bias=True),
        _spec(NAIVE, bk=16, pad=0, vec=1, stages=2),
        _spec({**NAIVE, "bm": 32, "bn": 32}, bk=32, pad=0, vec=1, stages=1),
        _spec({**NAIVE, "bm": 32, "bn": 32}, bk=32, pad=1, vec=2, stages=1),
        _spec({**NAIVE, "bm": 32, "bn": 32}, bk=32, pad=0, vec=4, stages=2, bias=True),
        # Register-blocked kernels over tiles, fragments, padding, vector widths and staging.
        _spec(SMALL, bk=32, pad=0),
        _spec(SMALL, bk=32, vec=2, stages=1, bias=True),
        _spec(T2X2, bk=8, pad=0, vec=1),
        _spec(T2X2, bk=8, pad=2, vec=1, stages=1),
        _spec(T2X2, bk=16, pad=2, vec=2, group_m=4),
        _spec(T2X4, bk=8, vec=2),
        _spec(T2X4, bk=16, stages=1, bias=True),
        _spec(T4X4, bk=8, pad=0, vec=1),
        _spec(T4X4, bk=8, vec=2),
        _spec(T4X4, bk=16),
        _spec(T4X4, bk=16, pad=0, stages=1),
        _spec(T4X4, bk=16, pad=8, vec=2, bias=True),
        _spec(T4X4, bk=32, group_m=8),
        _spec(T4X8, bk=16),
        _spec(T4X8, bk=16, vec=2, stages=1, bias=True),
        _spec(T8X4, bk=16, pad=0),
        _spec(T8X4, bk=16, vec=1, group_m=4),
        _spec(T8X2, bk=16, vec=2),
        _spec(T8X2, bk=16, pad=0, vec=1, stages=1),
        _spec(T8X8, bk=8),
        _spec(T8X8, bk=8, pad=0, stages=1),
        _spec(T8X8, bk=8, vec=1, bias=True),
        _spec(T8X8, bk=16, group_m=8, bias=True),
        _spec(T8X8_BIG, bk=16),
        # Tiles whose vector loads are not a multiple of the thread count.
        _spec(NAIVE, bk=16, pad=0, vec=4, stages=1),
        _spec(T4X4, bk=8, pad=0, stages=1),
        _spec(T8X8_BIG, bk=8, bias=True),
        _spec({**T8X4, "bm": 96}, bk=16),
        _spec({**T8X4, "bm": 96}, bk=8, vec=2, stages=1, split_k=2, reduce="atomic"),
        # Split-K: atomic (fp32 only) and two-pass with its reduce kernel.
        _spec(T4X4, bk=16, split_k=2, reduce="atomic"),
        _spec(T4X4, bk=16, split_k=4, reduce="atomic", bias=True),
        _spec(T8X8, bk=8, split_k=3, reduce="atomic", group_m=8),
        _spec(T4X4, bk=16, split_k=2, reduce="two_pass"),
        _spec(T4X4, bk=16, split_k=4, reduce="two_pass", bias=True, vec=2),
        _spec(T8X8, bk=8, split_k=8, reduce="two_pass", stages=1),
        _spec(NAIVE, bk=16, pad=0, vec=1, stages=1, split_k=2, reduce="two_pass"),
    ]
    # cp.async multi-stage tiles (sm_80+).
    specs += [
        _spec(T4X8, bk=32, stages=3, copy="async"),
        _spec(SMALL, bk=64, vec=2, stages=2, copy="async", split_k=4, reduce="two_pass"),
        _spec(T4X4, dtype="bf16", bk=32, pad=8, vec=8, stages=4, copy="async", bias=True),
    ]
    # Half types: fp32 accumulation, vector loads of 1..8 elements, two-pass split-K.
    for dtype in ("fp16", "bf16"):
        specs += [
            _spec(T4X4, dtype=dtype, bk=16, vec=1),
            _spec(T4X4, dtype=dtype, bk=16, vec=2, bias=True),
            _spec(T4X4, dtype=dtype, bk=16, vec=4),
            _spec(T4X4, dtype=dtype, bk=32, vec=8, stages=1),
            _spec(T8X8, dtype=dtype, bk=16, vec=8, bias=True),
            _spec(T8X8, dtype=dtype, bk=8, vec=4, split_k=2, reduce="two_pass"),
            _spec(SMALL, dtype=dtype, bk=32, vec=4, group_m=4),
        ]
    return specs


GRID = simt_grid()
#: Split-K in one thread-block cluster, reduced through distributed shared memory (sm_90 only).
CLUSTER = [_spec(T4X4, bk=16, split_k=2, reduce="cluster", bias=True), _spec(T8X8, bk=8, split_k=8, reduce="cluster",
           stages=1), _spec(SMALL, bk=64, vec=2, stages=3, copy="async", split_k=4, reduce="cluster", bias=True),
           _spec(T4X4, dtype="bf16", bk=32, pad=8, vec=8, stages=4, copy="async", split_k=4, reduce="cluster")]
#: Specs close to the defaults, which must compile without spilling.
DEFAULTISH = [SimtSpec(), _spec(T4X4, bk=16), _spec(T8X8, bk=8), _spec(T8X8, bk=16, bias=True), GRID[0], GRID[9]]


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory) -> Path:
    """Every compile of this session goes to a fresh cache folder, never to $HOME."""
    folder = tmp_path_factory.mktemp("gemmscape-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GEMMSCAPE_CACHE", str(folder))
        yield folder


_compiled: dict[tuple[str, str], CompileResult] = {}


def compiled(spec: SimtSpec, arch: str) -> CompileResult:
    """Compile once per (spec, arch) in this session."""
    key = (spec.name, arch)
    if key not in _compiled:
        _compiled[key] = compile_source(render(spec), spec.name, arch=arch)
    return _compiled[key]


def entry_functions(spec: SimtSpec) -> set[str]:
    return {spec.name, spec.name + "_reduce"} if spec.reduce == "two_pass" else {spec.name}


# ---- the grid itself --------------------------------------------------------------------------------
def test_grid_is_large_valid_distinct_and_covers_the_family():
    assert len(GRID) >= 50
    assert len({s.name for s in GRID}) == len(GRID)
    for spec in GRID:
        assert spec.check(limits=DeviceLimits.for_arch(80)) == [], spec.name
    seen = collections.defaultdict(set)
    for spec in GRID:
        for field, value in spec.to_dict().items():
            seen[field].add(value)
    assert seen["vec"] >= {1, 2, 4, 8}
    assert seen["stages"] == {0, 1, 2, 3, 4}
    assert seen["copy"] == {"reg", "async"}
    assert seen["dtype"] == {"fp32", "fp16", "bf16"}  # every dtype SIMT takes (tf32 is a tensor-core mode)
    assert seen["bias"] == {False, True}
    assert seen["reduce"] == {"none", "atomic", "two_pass"}
    assert seen["pad"] >= {0, 1, 2, 4, 8}
    assert seen["group_m"] >= {1, 4, 8}
    assert seen["tm"] >= {1, 2, 4, 8} and seen["tn"] >= {1, 2, 4, 8}
    uneven = [s for s in GRID if s.stages and (s.bm * s.bk // s.vec) % s.threads]
    assert any(s.bm * s.bk // s.vec < s.threads for s in uneven)
    assert any(s.bn * s.bk // s.vec > s.threads and (s.bn * s.bk // s.vec) % s.threads for s in GRID if s.stages)
    assert any(s.threads % 256 for s in GRID)


@pytest.mark.parametrize("spec", CLUSTER, ids=lambda s: s.name)
def test_a_cluster_split_k_compiles_for_sm_90_without_spills_and_reads_its_peers(spec):
    assert spec.check() == [] and spec.check(limits=DeviceLimits.for_arch(80)) != []
    result = compiled(spec, "sm_90")
    assert set(result.report) == {spec.name}, result.log  # no second pass
    entry = result.report[spec.name]
    assert entry["spill_stores"] == entry["spill_loads"] == entry["stack"] == 0, entry
    text = sass.disassemble(result.cubin)
    assert "UCGABAR_ARV" in text and "UCGABAR_WAIT" in text, "no cluster barrier"


# ---- render and compile ------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", GRID, ids=lambda s: s.name)
def test_grid_compiles_with_a_parsed_ptxas_report(spec, arch):
    result = compiled(spec, arch)
    assert result.arch == arch and f"-arch={arch}" in result.options
    assert result.cubin[:4] == b"\x7fELF"
    assert set(result.report) == entry_functions(spec), result.log
    for function, entry in result.report.items():
        assert 0 < entry["registers"] <= 255, (function, entry)
        assert entry["registers"] * (spec.threads if function == spec.name else 256) <= 65536
        assert {"stack", "spill_stores", "spill_loads", "barriers", "smem_static"} <= set(entry)
    main = result.report[spec.name]
    assert main["barriers"] == (1 if spec.smem_bytes > 0 else 0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", DEFAULTISH, ids=lambda s: s.name)
def test_default_ish_specs_do_not_spill(spec, arch):
    for function, entry in compiled(spec, arch).report.items():
        assert entry["spill_stores"] == entry["spill_loads"] == 0, (function, entry)
        assert entry["stack"] == 0, (function, entry)


def test_rendered_source_names_the_kernel_and_omits_what_is_off():
    plain = render(_spec(T4X4, bk=16))
    biased = render(_spec(T4X4, bk=16, bias=True))
    assert "_nobias_" in plain and "B[c]" not in plain
    assert "B[c]" in biased
    two_pass = render(_spec(T4X4, bk=16, split_k=2, reduce="two_pass"))
    assert "_reduce(" in two_pass and "_reduce(" not in plain
    assert "atomicAdd" in render(_spec(T4X4, bk=16, split_k=2, reduce="atomic"))
    cluster = render(_spec(T4X4, bk=16, split_k=2, reduce="cluster"))
    assert "ld.shared::cluster" in cluster and "_reduce(" not in cluster and "WS[" not in cluster
    assert "barrier.cluster" not in two_pass
    assert "extern __shared__" not in render(GRID[0])


def test_render_refuses_an_invalid_spec():
    with pytest.raises(ValueError, match="lanes, a warp has 32"):
        render(_spec(T4X4, wn=16, bk=16))


# ---- SASS ----------------------------------------------------------------------------------------------
def expected_load_bits(spec: SimtSpec) -> int:
    return spec.vec * spec.dtype.itemsize * 8


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "spec",
    [
        _spec(T4X4, bk=16),
        _spec(T8X8, bk=8),
        _spec(T4X8, bk=16, stages=1, bias=True),
        _spec(T4X4, bk=16, split_k=2, reduce="two_pass"),
    ],
    ids=lambda s: s.name,
)
def test_vec4_fp32_spec_has_128_bit_global_loads(spec, arch):
    widths = sass.global_load_widths(sass.disassemble(compiled(spec, arch).cubin), spec.name)
    assert widths[128] > 0, widths


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "spec",
    [_spec(T4X4, bk=8, pad=0, vec=1), _spec(T8X8, bk=8, vec=1, bias=True), GRID[0], GRID[9]],
    ids=lambda s: s.name,
)
def test_vec1_fp32_spec_has_only_32_bit_global_loads(spec, arch):
    text = sass.disassemble(compiled(spec, arch).cubin)
    widths = sass.global_load_widths(text, spec.name)
    assert widths[32] > 0 and widths[128] == 0 and set(widths) == {32}, widths


def test_every_grid_spec_loads_exactly_its_vector_width():
    """The widest global load of each main kernel is vec elements wide, never wider.

    Async specs are left out: their tiles travel by cp.async (LDGSTS), not LDG.

    Each spec is disassembled for one architecture, alternating, to keep nvdisasm's time down.
    """
    cases = [(spec, ARCHS[i % len(ARCHS)]) for i, spec in enumerate(GRID) if spec.copy != "async"]  # cp.async is no LDG
    cubins = [compiled(spec, arch).cubin for spec, arch in cases]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        texts = list(pool.map(sass.disassemble, cubins))
    wrong = {}
    for (spec, arch), text in zip(cases, texts, strict=True):
        widths = sass.global_load_widths(text, spec.name)
        if max(widths) != expected_load_bits(spec):
            wrong[f"{spec.name} {arch}"] = dict(widths)
    assert not wrong, wrong


def test_sass_names_each_kernel_of_a_two_pass_spec():
    spec = _spec(T4X4, bk=16, split_k=2, reduce="two_pass")
    text = sass.disassemble(compiled(spec, "sm_90").cubin)
    assert set(sass.functions(text)) == entry_functions(spec)
    assert sass.global_load_widths(text, spec.name + "_reduce")[128] == 0
    with pytest.raises(KeyError, match="no function"):
        sass.global_load_widths(text, "nope")


def test_global_load_widths_reads_every_spelling():
    lines = [
        '        .section\t.text.k,"ax",@progbits',
        "        /*0910*/                   LDG.E.128.CONSTANT R12, desc[UR10][R12.64] ;",
        "        /*0920*/              @!P3 LDG.E R12, desc[UR10][R8.64] ;",
        "        /*0930*/              @P0 LDG.E.64.CONSTANT R4, [R2.64] ;",
        "        /*0940*/                   LDG.E.U16 R4, [R12.64+0x2] ;",
        "        /*0950*/                   LDG.E.S8.STRONG.GPU R4, [R12.64] ;",
        "        /*0960*/                   LDG.E.EF.128 R4, [R12.64] ;",
        "        /*0970*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;",
        "        /*0980*/                   LDGDEPBAR ;",
        "        /*0990*/                   LDS.128 R4, [R1] ;",
        "        /*09a0*/                   STG.E.128 desc[UR4][R2.64], R4 ;",
    ]
    text = "\n".join(lines)
    assert sass.global_load_widths(text) == collections.Counter({128: 2, 32: 1, 64: 1, 16: 1, 8: 1})
    assert sass.global_load_widths(text, "k") == sass.global_load_widths(text)


def test_nvdisasm_is_found_and_refuses_garbage():
    assert sass.nvdisasm_path().is_file()
    spec = GRID[0]
    with_targets = sass.disassemble(compiled(spec, "sm_90").cubin, branch_targets=True)
    assert sass.global_load_widths(with_targets) == sass.global_load_widths(
        sass.disassemble(compiled(spec, "sm_90").cubin)
    )
    with pytest.raises(sass.SassError, match="nvdisasm failed"):
        sass.disassemble(b"not a cubin")


def test_missing_nvdisasm_says_how_to_install_it(monkeypatch, tmp_path):
    import nvidia

    monkeypatch.setattr(nvidia, "__path__", [str(tmp_path)])
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sass, "TOOLKIT", tmp_path)
    with pytest.raises(sass.SassError, match="pip package nvidia-cuda-nvdisasm"):
        sass.nvdisasm_path()


# ---- errors and the cache ----------------------------------------------------------------------------------
BROKEN = """extern "C" __global__ void broken_kernel(float* y) {
    y[threadIdx.x] = undefined_thing + 1.0f;
}
"""


@pytest.mark.parametrize("arch", ARCHS)
def test_compile_error_carries_the_nvrtc_log(arch):
    with pytest.raises(CompileError) as info:
        compile_source(BROKEN, "broken_kernel", arch=arch)
    err = info.value
    assert err.name == "broken_kernel"
    assert "undefined_thing" in err.log and "error" in err.log
    assert "undefined_thing" in str(err) and "line 2" in str(err)
    with pytest.raises(CompileError):  # errors are never cached
        compile_source(BROKEN, "broken_kernel", arch=arch)


def test_bad_arch_is_refused():
    with pytest.raises(ValueError, match="sm_90"):
        compile_source(BROKEN, "broken_kernel", arch="compute_90")


def test_second_compile_of_the_same_source_comes_from_the_cache(compile_cache):
    spec = _spec(T2X4, bk=16, bias=True, group_m=2)
    source = render(spec)
    first = compile_source(source, spec.name, arch="sm_80")
    again = compile_source(source, spec.name, arch="sm_80")
    assert not first.cached and again.cached
    assert again.cubin == first.cubin
    assert again.report == first.report and again.log == first.log
    assert any(compile_cache.rglob("*.cubin"))
    other_arch = compile_source(source, spec.name, arch="sm_90")
    assert not other_arch.cached and other_arch.cubin != first.cubin
    fresh = compile_source(source, spec.name, arch="sm_80", use_cache=False)
    assert not fresh.cached and fresh.cubin == first.cubin
