"""Hopper A fragments from registers (``a_regs``) on the CPU: names, rules and the register budget,
the space's dimension (recordings without it still read), the CLI flag, the source (ldmatrix and the
register form of wgmma), the ldmatrix addresses checked against a model of TMA's swizzle (each lane
reads the rows and k-chunks of mma.m16n8k16's A layout, without bank conflicts), and the SASS of
NVRTC for sm_90a: HGMMA with a register A, one LDSM per HGMMA, no local memory, no spills, no
serialized wgmma. The sources of specs without it are pinned byte for byte (sha256 of the text as
rendered before the option existed). Nothing here runs a kernel: tests/gpu/test_hopper.py,
test_hopper_sparse.py and test_layouts.py (``-k a_regs``) do, on the device."""

from __future__ import annotations

import hashlib
import itertools
import random
import re

import pytest

from codegen import cli, sass
from codegen.cli import options
from codegen.families import spec_from_name
from codegen.families.hopper import CONSUMER_OVERHEAD, Spec, template_values
from codegen.problem import DType, Layout, Problem
from codegen.render import render
from search.space import seeds, space_for, to_spec
from tests.compiled import compile_all

#: Sources without a_regs over every branch of the template (plain, pack, persistent, split-K, cluster,
#: block-sparse 64/32/16 with ctas and grouped, both backward layouts), as rendered before a_regs and
#: then with the 16-byte row stores of interior tiles (store_rows), then with their quad transpose a
#: function of its own (the same SASS under NVRTC 13.0): the option must not change a byte of them. A deliberate change to these sources updates the pins.
PINS = {
    Spec(): "18c58db8a36cfe265c4b4aa437111e8a2de33e9f1da380fa7fa29e37ad03fdd1",
    Spec(bias=True, prepass="pack", persistent=True):
        "81284d46a530c753e42f9f58a98323938a80a4e2b2bb6337514591ce0fe39cea",
    Spec(dtype=DType.fp16, bm=128, bn=128, consumers=1, stages=5, persistent=True):
        "b1e97f06a89bfb610d1cabf57ba56fa8ad676c1cc6078810902748ca8251578f",
    Spec(bm=256, bn=128, stages=4, persistent=True, group_m=16):
        "09905d631251174734fbd59bc2dc789755d2f98482bee7f9e1f17c3d2230d01b",
    Spec(bm=64, bn=64, consumers=1, stages=2, group_m=1, bias=True, dtype=DType.fp16):
        "b39fba154d90a4d9150cb9b9e77ce3f76e7bd567694039f3be79b115e22a3d90",
    Spec(bm=64, bn=128, consumers=1, stages=6, group_m=4, split_k=4, bias=True, prepass="pack"):
        "0d7f9d2db90839452f838d6cd23d84a30d78c55468ba92f9f7c87c253d1482da",
    Spec(cluster=2, persistent=True): "5cbca3e315f051ea9dbea8c9564bc82a0d69d3d8dea4cea136ee68363fd346bb",
    Spec(block=64, bn=64, bm=128, stages=8, persistent=True):
        "a9d1f6ed575384c8738815efc47881bace4b68fbd593252623b8b06454c12277",
    Spec(block=32, bn=32, bm=128, consumers=1, stages=4, ctas=2, dtype=DType.fp16, bias=True):
        "8180e1401892c66cfcc9a75c14d480369e0d605ca5ad88716b3f439230f68006",
    Spec(block=16, bn=16, bm=128, stages=16, persistent=True, grouped=True):
        "07ae71a026ae95a694d21c321a07a7bd3373e1ba01598e065f91e666dec1c1ea",
    Spec(layout=Layout.grad_input): "35d36fefd91fed5118a69a2deb07dcc56e335a75e0ed102cef148ee6de977071",
    Spec(layout=Layout.grad_weight, bias=True, bm=128, bn=128, consumers=1, stages=5):
        "64a0bf9da4dfb1f9772393273d008e6ce2c15d33198ff5a18e0101e78cdba790",
}


@pytest.mark.parametrize("spec", list(PINS), ids=lambda s: s.name)
def test_sources_without_a_regs_are_unchanged(spec):
    assert hashlib.sha256(render(spec).encode()).hexdigest() == PINS[spec]


# ---- identity ----------------------------------------------------------------------------------------
def test_the_suffix_comes_before_the_layout_and_names_round_trip_for_every_combination():
    assert Spec(a_regs=True).name == "hp_bf16_nobias_128x256x64_c2_s4_g8_ar"
    assert Spec(a_regs=True, split_k=4, layout=Layout.grad_input).name == "hp_bf16_nobias_128x256x64_c2_s4_g8_k4_ar_gi"
    options = dict(persistent=(False, True), grouped=(False, True), prepass=("none", "pack"), block=(0, 32, 64),
                   ctas=(1, 2), cluster=(1, 2), split_k=(1, 4), layout=tuple(Layout), a_regs=(False, True))
    for values in itertools.product(*options.values()):
        spec = Spec(**dict(zip(options, values, strict=True)))
        assert Spec.from_name(spec.name) == spec == spec_from_name(spec.name) == Spec.from_dict(spec.to_dict())
    assert Spec.from_dict({k: v for k, v in Spec().to_dict().items() if k != "a_regs"}) == Spec()  # older records


@pytest.mark.parametrize("name", ["hp_bf16_nobias_128x256x64_c2_s4_g8_gi_ar", "hp_bf16_nobias_128x256x64_c2_s4_g8_ar_k4",
                                  "hp_bf16_nobias_128x256x64_c2_s4_g8_ar_ar", "hp_bf16_nobias_128x256x64_c2_s4_g8_ar_cl2"])
def test_misplaced_suffixes_are_refused(name):
    with pytest.raises(ValueError, match="not a hopper kernel name"):
        Spec.from_name(name)


def test_the_cli_flag_sets_it():
    argv = ["compile", "--family", "hopper", "--dtype", "bf16", "--a-regs", "--bn", "128"]
    args = cli.build_parser(cli.family_asked(argv)).parse_args(argv)
    assert options.spec_from_args(args) == Spec(a_regs=True, bn=128)


# ---- rules ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields,reason",
    [
        (dict(layout=Layout.grad_weight), "the grad_weight layout stores X k-outer"),
        (dict(block=16, bn=16), "a k-tile of 16 is one k-step"),
        (dict(bm=256, bn=168), "accumulators per consumer thread (+56, +16 for A's fragments)"),
        (dict(bm=128, bn=184, consumers=1), "accumulators per consumer thread (+56, +16 for A's fragments)"),
    ],
)
def test_check_names_what_a_regs_refuses(fields, reason):
    assert not Spec(**fields).check(), Spec(**fields).check()  # a_regs is what breaks the rule
    why = Spec(a_regs=True, **fields).check()
    assert any(reason in r for r in why), why


def test_a_regs_costs_two_fragment_sets_of_registers_and_takes_every_other_variant():
    assert Spec(a_regs=True).a_frag_regs == 8 and Spec().a_frag_regs == 0
    assert Spec(a_regs=True, bm=128, consumers=1, bn=64).a_frag_regs == 16
    assert Spec(a_regs=True, bm=256, consumers=1, bn=64).a_frag_regs == 32
    big = Spec(bm=256, bn=160)  # the largest two-consumer tile fits, exactly
    assert big.acc_regs + CONSUMER_OVERHEAD + Spec(a_regs=True, bm=256, bn=160).a_frag_regs == big.consumer_regs
    for fields in (dict(), dict(persistent=True, bias=True, prepass="pack"), dict(cluster=2), dict(split_k=4),
                   dict(layout=Layout.grad_input), dict(block=64, bn=64, ctas=2, stages=4), dict(block=32, bn=32),
                   dict(bm=64, bn=256, consumers=1, dtype=DType.fp16), dict(bm=256, bn=160)):
        assert not Spec(a_regs=True, **fields).check(), (fields, Spec(a_regs=True, **fields).check())


# ---- space ---------------------------------------------------------------------------------------------
def test_a_regs_is_not_searched_until_it_has_run_on_a_gpu():
    """The option is a spec field (names, CLI, probes) but not a dimension of any hopper space: a search
    would spend half its trials on a variant no GPU has checked yet."""
    for dtype, block, layout in [(DType.bf16, 0, Layout.forward), (DType.fp16, 0, Layout.grad_input),
                                 (DType.bf16, 64, Layout.forward), (DType.bf16, 0, Layout.grad_weight)]:
        assert "a_regs" not in space_for("hopper", dtype, block=block, layout=layout).dims
    space = space_for("hopper", DType.bf16)
    problem = Problem(4096, 4096, 4096, DType.bf16)
    for point in random.Random(1).sample(list(space.points()), 40):
        assert not to_spec("hopper", point, problem).a_regs
    assert all("a_regs" not in p for p in seeds("hopper") + seeds("hopper", block=64))


# ---- source and addresses ---------------------------------------------------------------------------
def test_the_source_loads_fragments_and_issues_the_register_form():
    source = render(Spec(a_regs=True))
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];" in source
    assert "{%128, %129, %130, %131}, %132, p, 1, 1, 0;" in source and "setp.ne.b32 p, %133, 0;" in source
    assert "A_LBO" not in source and "smem_desc(a +" not in source  # A has no descriptor
    assert source.count("wgmma_fence();") == 1 and source.count("wgmma_commit();") == 1
    assert "if (s > 0) continue;" in source and "wgmma_wait<1>();" in source
    gi = render(Spec(a_regs=True, layout=Layout.grad_input, bm=128, bn=128, consumers=1))
    assert "{%64, %65, %66, %67}, %68, p, 1, 1, 1;" in gi  # W k-outer: wgmma's transpose of B
    assert "ROW_BYTES = 64, SWIZZLE_MASK = 3;" in render(Spec(a_regs=True, block=32, bn=32))


def _swizzled(offset: int, span: int) -> int:
    """Where TMA's swizzle of a ``span``-byte mode puts byte ``offset`` of a box (from a 1024-byte
    aligned start): the 16-byte chunk bits [4, 4 + log2(span/16)) XOR the bits from 7 up."""
    bits = (span // 16).bit_length() - 1
    return offset ^ (((offset >> 7) & ((1 << bits) - 1)) << 4)


@pytest.mark.parametrize("spec", [Spec(a_regs=True), Spec(a_regs=True, bm=128, bn=128, consumers=1),
                                  Spec(a_regs=True, block=64, bn=64), Spec(a_regs=True, block=32, bn=32)],
                         ids=lambda s: s.name)
def test_every_lane_reads_its_fragment_where_tma_put_it_without_bank_conflicts(spec):
    """The template's lane addresses (its expression evaluated with its constants) against TMA's
    swizzle: lane l of warp w at k-step s and m64 block f reads row 64f + 16w + l%16, k-chunk
    2s + l/16 (ldmatrix x4's matrices in mma.m16n8k16's A order), each 8-lane phase on 8 distinct
    16-byte bank groups."""
    source = render(spec)
    assert "const unsigned a_row = (warp * 16 + lane % 16) * ROW_BYTES, a_chunk = (lane / 16) * 16;" in source
    assert "const unsigned a_xor = ((a_row >> 7) & SWIZZLE_MASK) << 4;" in source
    assert "a + f * FRAG_A_BYTES + ((s * A_K_STEP_BYTES + a_chunk) ^ a_xor)" in source
    v = template_values(spec)
    row_bytes, mask = (int(x) for x in re.search(r"ROW_BYTES = (\d+), SWIZZLE_MASK = (\d+);", source).groups())
    assert (row_bytes, mask, v["a_k_step_bytes"]) == (spec.row_bytes, spec.row_bytes // 16 - 1, 32)
    logical = {_swizzled(o, row_bytes): o for o in range(spec.wg_m * row_bytes)}
    assert len(logical) == spec.wg_m * row_bytes  # the swizzle permutes the tile
    for f, w, s in itertools.product(range(spec.frag_m), range(4), range(spec.bk // 16)):
        banks = []
        for lane in range(32):
            a_row = (w * 16 + lane % 16) * row_bytes
            a_xor = ((a_row >> 7) & mask) << 4
            physical = f * v["frag_a_bytes"] + a_row + ((s * 32 + (lane // 16) * 16) ^ a_xor)
            row, byte = divmod(logical[physical], row_bytes)
            assert (row, byte // 16) == (64 * f + 16 * w + lane % 16, 2 * s + lane // 16), (lane, f, w, s)
            banks.append(physical // 16 % 8)
        for phase in range(4):
            assert len(set(banks[8 * phase:8 * phase + 8])) == 8, (f, w, s, phase)


def test_without_a_regs_the_source_never_mentions_it():
    for spec in PINS:
        source = render(spec)
        assert "ldmatrix" not in source and "a_xor" not in source and "SWIZZLE_MASK" not in source


# ---- compiler tier --------------------------------------------------------------------------------
def _sample() -> list[Spec]:
    """Every tile shape of the space that a_regs fits (the register budget), the other dimensions
    drawn, and every kind of variant: pack, cluster, split-K, two blocks per SM, grad_input, blocks 64 and 32."""
    rng = random.Random(11)
    dims = space_for("hopper", DType.bf16).dims
    specs = []
    for bm, bn, consumers in itertools.product(dims["bm"], dims["bn"], dims["consumers"]):
        spec = Spec(bm=bm, bn=bn, consumers=consumers, a_regs=True, bias=rng.random() < 0.5,
                    persistent=rng.random() < 0.5, dtype=rng.choice([DType.bf16, DType.fp16]), stages=2)
        fits = [st for st in dims["stages"] if not Spec(**{**spec.__dict__, "stages": st}).check()]
        if fits:
            specs.append(Spec(**{**spec.__dict__, "stages": rng.choice(fits)}))
    specs += [
        Spec(a_regs=True, bias=True, prepass="pack"),
        Spec(a_regs=True, cluster=2, persistent=True),
        Spec(a_regs=True, bm=64, bn=128, consumers=1, stages=6, group_m=4, split_k=4, bias=True),
        Spec(a_regs=True, bm=128, bn=128, consumers=1, ctas=2, stages=3),
        Spec(a_regs=True, layout=Layout.grad_input),
        Spec(a_regs=True, layout=Layout.grad_input, bm=128, bn=128, consumers=1, stages=5, persistent=True,
             dtype=DType.fp16),
        Spec(a_regs=True, block=64, bn=64, bm=128, stages=8, persistent=True),
        Spec(a_regs=True, block=64, bn=64, bm=256, stages=4, bias=True),
        Spec(a_regs=True, block=64, bn=64, bm=128, stages=4, ctas=2, dtype=DType.fp16, bias=True),
        Spec(a_regs=True, block=32, bn=32, bm=128, stages=12, persistent=True, bias=True),
        Spec(a_regs=True, block=32, bn=32, bm=128, consumers=1, stages=4, ctas=2, dtype=DType.fp16),
    ]
    return list({s.name: s for s in specs}.values())


SAMPLE = _sample()


def test_sample_is_broad():
    assert len(SAMPLE) >= 30 and all(s.a_regs and not s.check() for s in SAMPLE)
    assert {s.consumers for s in SAMPLE} == {1, 2} and {s.bm for s in SAMPLE} == {64, 128, 256}
    assert {s.block for s in SAMPLE} == {0, 32, 64} and {s.layout for s in SAMPLE} == {Layout.forward, Layout.grad_input}
    assert max(s.frag_m for s in SAMPLE) == 4 and {s.ctas for s in SAMPLE} == {1, 2}


@pytest.fixture(scope="module")
def compiled():
    return {name: built for (name, _), built in compile_all(SAMPLE).items()}


@pytest.mark.timeout(900)
def test_every_sampled_spec_compiles_to_hgmma_with_a_register_a(compiled):
    for spec in SAMPLE:
        result, text = compiled[spec.name]
        code = sass.functions(text)[spec.name]
        ops = sass.opcodes(text, spec.name)
        wgmma = spec.bk // 16 * spec.frag_m  # per k-tile
        hgmma = [line for line in code.splitlines() if "HGMMA" in line]
        assert len(hgmma) == ops["HGMMA"] == wgmma, spec.name
        shape = f"HGMMA.64x{spec.bn}x16.F32" + (".BF16" if spec.dtype is DType.bf16 else "")
        # The register form: the accumulators, then A's first register, then B's descriptor.
        assert all(re.search(re.escape(shape) + r"\s+R\d+, R\d+, gdesc\[", line) for line in hgmma), (spec.name, hgmma)
        assert ops["LDSM"] == wgmma, spec.name  # one ldmatrix x4 per wgmma, in the consumer's k-loop
        assert all("LDSM.16.M88.4" in line for line in code.splitlines() if "LDSM" in line)
        assert ops["UTMALDG"] >= 1 and ops["USETMAXREG"] == 2, spec.name
        assert ops["LDL"] == 0 and ops["STL"] == 0, spec.name
        report = result.report[spec.name]
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0 and report["stack"] == 0, (spec.name, report)
        assert "serializ" not in result.log.lower() and "C7508" not in result.log and "C7510" not in result.log, \
            result.log


def test_the_default_issues_hgmma_from_a_shared_memory_a():
    """What the register form is told apart from: the same shape with A's descriptor."""
    spec = Spec()
    ((_, text),) = compile_all([spec]).values()
    hgmma = [line for line in sass.functions(text)[spec.name].splitlines() if "HGMMA" in line]
    assert hgmma and all(re.search(r"HGMMA\.64x256x16\.F32\.BF16\s+R\d+, gdesc\[", line) for line in hgmma)
    assert sass.opcodes(text, spec.name)["LDSM"] == 0
