"""CPU tier: the weight gradient of a block-sparse W, sampled at its kept blocks (layout grad_weight
with a block): the problem, its data and float64 reference, specs and their rules, plans, spaces, the
command line, the kernels run in the CPU emulation on ragged shapes with empty block rows, and NVRTC
builds (sm_80 and sm_90) without spills. The GPU tier runs them: tests/gpu/test_sparse_grad_weight.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from codegen import cli, families, sass, sparse
from codegen.cli import options
from codegen.data import compare, input_shapes, output_shapes, random_inputs, references
from codegen.evaluate import patterns, probe_for
from codegen.families.direct import Spec as DirectSpec
from codegen.families.hopper import Spec as HopperSpec
from codegen.families.simt import Spec as SimtSpec
from codegen.families.simt import sampled_defaults as simt_defaults
from codegen.families.tensorcore import Spec as TcSpec
from codegen.families.tensorcore import sampled_defaults as tc_defaults
from codegen.launch import BSR_GW_ARGS, LaunchPlan, grid_rule, plan
from codegen.problem import DType, Layout, Problem
from codegen.render import render
from codegen.spec import DeviceLimits
from search.fit import default_family
from search.space import point_of, seeds, space_for, to_spec
from tests.compiled import compile_all

GW = Layout.grad_weight


def ragged_pattern(out: int, fin: int, block: int, seed: int = 0) -> sparse.Pattern:
    """About half the blocks of W [out, in] kept, the first block row empty (and the second, where
    there are more than two), the padded corner block (last row and column) kept."""
    rows, cols = -(-out // block), -(-fin // block)
    mask = np.random.default_rng(seed).random((rows, cols)) < 0.5
    mask[0] = False
    if rows > 2:
        mask[1] = False
    mask[-1, -1] = True
    return sparse.Pattern.from_mask(mask, out, fin, block)


def sampled(batch: int, out: int, fin: int, block: int, dtype="bf16", bias=False, seed: int = 0) -> Problem:
    """The weight gradient of a layer [fin -> out] at ``batch`` rows, its W block-sparse."""
    return sparse.problem_for(batch, ragged_pattern(out, fin, block, seed), dtype, bias, GW)


# ---- the problem, its data and reference ------------------------------------------------------------
def test_the_sampled_problem_is_the_layer_s_weight_gradient():
    pattern = ragged_pattern(130, 100, 32, seed=1)
    p = sparse.problem_for(7, pattern, "bf16", True, GW)
    assert (p.m, p.n, p.k, p.layout, p.block, p.bias) == (130, 100, 7, GW, 32, True)  # M out, N in, K the batch
    assert p.w_shape == (130, 100) and p.nnzb == pattern.nnzb
    assert p.key == f"130x100x7_bf16_grad_weight_bias_bsr32_d{pattern.density:.4g}_{pattern.hash[:8]}"
    assert Problem.from_dict(p.to_dict()) == p and Problem.from_dict(p.to_dict()).nnzb == pattern.nnzb
    assert p.flops == pytest.approx(2 * 130 * 100 * 7 * pattern.density)
    # dY and X read whole, the kept blocks of dW written, db written
    elems = 130 * 7 + 100 * 7 + 130 * 100 * pattern.density + 130
    assert p.min_bytes == pytest.approx(elems * 2 + 4 * 130 * 100 * pattern.density / 32 ** 2)
    forward = sparse.problem_for(7, pattern, "bf16", True)
    assert forward.w_shape == (130, 100) == sparse.problem_for(7, pattern, layout="grad_input").w_shape
    assert Problem(4, 5, 6).nnzb == 0


def test_inputs_outputs_and_the_reference_are_dw_at_the_kept_blocks():
    p = sampled(9, 67, 45, 16, "fp32", bias=True, seed=2)
    pattern = sparse.lookup(p)
    assert not pattern.mask()[0].any() and pattern.mask()[-1, -1]
    inputs = random_inputs(p, np.random.default_rng(0))
    assert {k: v.shape for k, v in inputs.items()} == input_shapes(p) == {
        "DY": (9, 67), "X": (9, 45), "RP": (6,), "CI": (pattern.nnzb,)}
    np.testing.assert_array_equal(inputs["RP"], pattern.indptr)
    np.testing.assert_array_equal(inputs["CI"], pattern.indices)
    assert output_shapes(p) == {"DW": (pattern.nnzb, 16, 16), "DB": (67,)}
    ref = references(p, inputs)
    dw = inputs["DY"].astype(np.float64).T @ inputs["X"].astype(np.float64)
    np.testing.assert_allclose(pattern.expand(ref["DW"]), np.where(np.kron(pattern.mask(), np.ones((16, 16)))[:67, :45],
                                                                    dw, 0.0))
    assert not ref["DW"][-1][67 - 64:].any() and not ref["DW"][-1][:, 45 - 32:].any()  # the padding is zero
    np.testing.assert_allclose(ref["DB"], inputs["DY"].astype(np.float64).sum(axis=0))


def test_the_probe_is_a_sampled_weight_gradient_of_an_odd_layer():
    p = sampled(4096, 4096, 4096, 64, bias=True)
    probe = probe_for(p)
    assert (probe.m, probe.n, probe.k, probe.layout, probe.block, probe.bias) == (67, 45, 91, GW, 64, True)
    assert (sparse.lookup(probe).n, sparse.lookup(probe).k) == (67, 45)  # the probe's W [out, in] = [M, N]
    assert set(patterns(p, probe)) == {p.pattern, probe.pattern}


# ---- specs, rules and plans ---------------------------------------------------------------------------
SPECS = [
    TcSpec(layout=GW, block=64, **tc_defaults(64), bias=True),
    TcSpec(layout=GW, block=64, bm=32, bn=16, bk=32, wm=16, wn=16, group_m=1, epilogue="direct"),
    SimtSpec(layout=GW, block=64, **simt_defaults(64), bias=True),
    SimtSpec(dtype="bf16", layout=GW, block=32, bm=32, bn=16, wm=16, wn=16, tm=2, tn=4, bk=16, copy="async", stages=2,
             pad=8, vec=8, group_m=1),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_sampled_specs_are_named_checked_and_planned(spec):
    assert spec.sampled and spec.name.endswith(f"_bsr{spec.block}_gw")
    assert families.spec_from_name(spec.name) == spec == families.spec_from_dict(spec.to_dict())
    p = sampled(33, 200, 130, spec.block, spec.dtype, spec.bias)
    assert spec.check(p) == []
    got = plan(spec, p)
    main = got.launches[0]
    assert main.args == ("DW", "DY", "X", "B", "WS", "RP", "CI", "M", "N", "K")
    assert main.grid == (p.nnzb * (spec.block // spec.bm) * (spec.block // spec.bn), 1, 1)
    assert [x.symbol for x in got.launches[1:]] == ([spec.name + "_db"] if spec.bias else [])
    assert not got.zero_output and got.workspace_bytes == 0 and LaunchPlan.from_dict(got.to_dict()) == got
    rule = grid_rule(spec)
    assert "max(1, nnzb)" in rule and BSR_GW_ARGS.format(block=spec.block) in rule
    source = render(spec)
    assert "sampled_tile(blockIdx.x, RP, CI, M, kept, m0, n0)" in source and "block_origin(blockIdx.x" not in source


def test_a_pattern_with_no_kept_block_still_launches_one_block_s_tiles():
    p = sparse.problem_for(5, sparse.Pattern.from_mask(np.zeros((2, 3), bool), 100, 150, 64), "bf16", layout=GW)
    assert p.nnzb == 0 and output_shapes(p)["DW"] == (0, 64, 64)
    assert plan(SPECS[1], p).launches[0].grid == (8, 1, 1)


def test_sampled_rules():
    base = dict(layout=GW, block=64, group_m=1)
    assert any("bm must divide the block (64), got 128" in w for w in TcSpec(**base, bm=128, bn=64).check())
    assert any("bn must divide the block (32), got 64" in w
               for w in SimtSpec(**{**base, "block": 32}, bm=32, bn=64, wm=16, wn=64, tm=4, tn=8).check())
    assert any("split_k and group_m must be 1" in w for w in TcSpec(layout=GW, block=64, bm=64, bn=64, wm=32, wn=32).check())
    assert any("split_k and group_m must be 1" in w for w in TcSpec(**base, bm=64, bn=64, wm=32, wn=32, split_k=2,
                                                                      reduce="two_pass").check())
    assert TcSpec(**base, bm=64, bn=32, bk=128, wm=32, wn=16, warps_k=2).check() == []  # bk is free: K is the batch
    assert not SimtSpec(layout=GW, block=64, bias=True, **simt_defaults(64)).fused_db  # db is a kernel of its own
    assert SimtSpec(layout=GW, bias=True, bm=64, bn=64, wm=32, wn=64).fused_db  # as it is fused for a dense W
    p = sampled(64, 128, 128, 64, "bf16")
    assert any("grad_weight" in w for w in DirectSpec(block=64).check(p)), DirectSpec(block=64).check(p)
    assert any("blocks of 64" in w for w in HopperSpec(layout=GW, block=32, bm=32, bn=32, consumers=1, persistent=True,
                                                        group_m=1).check())


def test_an_exported_sampled_kernel_says_where_dw_goes():
    from codegen.export import manifest

    spec = SPECS[0]
    p = sampled(33, 200, 130, 64, spec.dtype, spec.bias)
    doc = manifest(spec, p, "sm_90")
    assert doc["sparse"]["arguments"] == BSR_GW_ARGS.format(block=64) and doc["sparse"]["pattern"] == p.pattern
    assert "kept blocks only" in doc["arguments_note"] and doc["problem"]["layout"] == "grad_weight"
    assert doc["kernels"][0]["grid_for_problem"] == [p.nnzb, 1, 1]
    assert [a["name"] for a in doc["kernels"][1]["args"]] == ["DB", "DY", "M", "K"]
    from codegen.export import export_files

    for each in SPECS:  # the rendered source takes what the plan passes (codegen.export.check_source)
        cu, js = export_files(each, sampled(33, 200, 130, each.block, each.dtype, each.bias), None, "sm_90")
        assert each.name in cu and json.loads(js)["grid_rule"] == grid_rule(each)


# ---- spaces and the families that fit -----------------------------------------------------------------
@pytest.mark.parametrize("family", ["tensorcore", "simt"])
@pytest.mark.parametrize("block", [16, 32, 64])
def test_the_sampled_space_tiles_parts_of_a_block(family, block):
    p = sampled(256, 300, 200, block, "bf16")
    space = space_for(family, DType.bf16, block=block, layout=GW)
    assert "split" not in space.dims and "group_m" not in space.dims
    assert all(block % v == 0 for v in space.dims["bm"] + space.dims["bn"])
    valid = 0
    for point in [*seeds(family, block, GW), *space.points()][:400]:
        spec = to_spec(family, point, p)
        assert spec.sampled and block % spec.bm == 0 and block % spec.bn == 0 and (spec.split_k, spec.group_m) == (1, 1)
        if not spec.check(p):
            valid += 1
            assert to_spec(family, point_of(spec), p) == spec
    assert valid
    assert seeds(family, block, GW) != seeds(family, block)


def test_forward_sparse_seeds_map_onto_sampled_kernels():
    """The layer tools look seeds up by block only: mapped onto a sampled problem, they still make kernels."""
    p = sampled(256, 300, 200, 64, "bf16")
    specs = [to_spec("tensorcore", point, p) for point in seeds("tensorcore", 64)]
    assert {(s.bm, s.bn, s.split_k, s.group_m) for s in specs} >= {(64, 64, 1, 1)}
    assert sum(not s.check(p) for s in specs) >= 3


def test_the_default_family_of_a_sampled_problem():
    for dtype, arch, family in (("bf16", "sm_80", "tensorcore"), ("fp16", "sm_80", "tensorcore"), ("bf16", "sm_90", "hopper"),
                                ("fp16", "sm_90", "hopper"), ("fp32", "sm_80", "simt"), ("fp32", "sm_90", "simt")):
        assert default_family(sampled(64, 256, 256, 64, dtype), DeviceLimits.for_arch(arch)) == family
    # Hopper's TMA reads dY's and X's rows in whole 16-byte units: in = 130 does not make them
    assert default_family(sampled(64, 256, 130, 64, "bf16"), DeviceLimits.for_arch("sm_90")) == "tensorcore"


# ---- the command line -----------------------------------------------------------------------------------
def _parse(argv):
    return cli.build_parser(cli.family_asked(argv)).parse_args(argv)


def test_a_sampled_problem_from_the_command_line(tmp_path):
    args = _parse(["compile", "--layout", "grad_weight", "--block", "64", "--density", "0.1", "--m", "200",
                   "--n", "130", "--k", "33", "--dtype", "bf16", "--bias"])
    assert args.variant_family == "tensorcore"  # not Hopper: rows of X of 130 elements are not whole 16 bytes
    problem = options.problem_from_args(args)
    assert (problem.m, problem.n, problem.k, problem.layout, problem.bias) == (200, 130, 33, GW, True)
    assert (sparse.lookup(problem).n, sparse.lookup(problem).k) == (200, 130)
    spec = options.spec_from_args(args, problem)
    assert spec == TcSpec(dtype="bf16", bias=True, layout=GW, block=64, **tc_defaults(64)) and not spec.check(problem)
    args = _parse(["compile", "--layout", "grad_weight", "--block", "32", "--density", "0.5", "--m", "64", "--n", "64",
                   "--k", "8", "--bm", "16", "--family", "tensorcore", "--dtype", "fp16"])
    spec = options.spec_from_args(args, options.problem_from_args(args))
    assert (spec.bm, spec.bn, spec.group_m) == (16, 32, 1) and not spec.check()
    for block in (16, 32, 64):
        args = _parse(["compile", "--layout", "grad_weight", "--block", str(block), "--density", "0.3", "--m", "100",
                       "--n", "90", "--k", "5"])
        problem = options.problem_from_args(args)
        spec = options.spec_from_args(args, problem)
        assert spec.family == "simt" and not spec.check(problem), spec.check(problem)


def test_a_sampled_problem_of_your_own_w(tmp_path):
    w = np.zeros((96, 80), dtype=np.float32)  # the layer's W [out, in]
    w[32:64, :32] = 1.0
    np.save(tmp_path / "w.npy", w)
    for command, dims in (("compile", []), ("bench", ["--m", "96"])):  # bench's --m is required: W's out features
        args = _parse([command, "--k", "16", *dims, "--layout", "grad_weight", "--block", "32", "--weights",
                       str(tmp_path / "w.npy")])
        problem = options.problem_from_args(args)
        assert (problem.m, problem.n, problem.k, problem.density) == (96, 80, 16, 1 / 9)
    for argv, needle in (
            (["--m", "96"], "needs --k, the batch"),
            (["--k", "16", "--m", "97"], "--m 97 does not match W in .*which is 96x80 \\(M x N, out x in"),
    ):
        args = _parse(["compile", "--layout", "grad_weight", "--block", "32", "--weights", str(tmp_path / "w.npy"), *argv])
        with pytest.raises(cli.UsageError, match=needle):
            options.problem_from_args(args)


# ---- numerics on the CPU (tests/cpu_cuda.py: the kernel as C++, threads as fibers) ----------------------
#: Kernels of both families: a tile per block and parts of one, staged and direct stores, wmma, slice-K,
#: cp.async and register copies, no shared memory, each dtype.
EMULATED = [
    TcSpec(layout=GW, block=64, **tc_defaults(64), bias=True),
    TcSpec(layout=GW, block=64, bm=32, bn=16, bk=32, wm=16, wn=16, group_m=1, epilogue="direct"),
    TcSpec(dtype="fp16", layout=GW, block=32, bm=32, bn=32, bk=64, wm=16, wn=16, warps_k=2, group_m=1, smem="pad",
           bias=True),
    TcSpec(layout=GW, block=16, **tc_defaults(16), stages=3),
    TcSpec(layout=GW, block=32, bm=32, bn=32, wm=16, wn=16, group_m=1, mma="wmma", smem="pad", bias=True),
    SimtSpec(layout=GW, block=64, **simt_defaults(64), bias=True),
    SimtSpec(layout=GW, block=32, **{**simt_defaults(32), "bk": 16}, copy="async", stages=3, pad=4),
    SimtSpec(dtype="bf16", layout=GW, block=16, **simt_defaults(16), pad=8, bias=True),
    SimtSpec(layout=GW, block=64, bm=32, bn=64, wm=32, wn=32, tm=4, tn=8, bk=1, pad=0, vec=1, stages=0, group_m=1),
    SimtSpec(dtype="bf16", layout=GW, block=32, bm=32, bn=16, wm=16, wn=16, tm=2, tn=4, bk=16, copy="async", stages=2,
             pad=8, vec=8, group_m=1, bias=True),
    SimtSpec(dtype="fp16", layout=GW, block=64, **simt_defaults(64), stages=1),
]
#: (batch, out, in): ragged N and K (padded last block row and column) with element-wise loads; one
#: row of batch; rows of whole 16-byte chunks (the cp.async path).
EMULATED_SHAPES = [(91, 67, 45), (1, 130, 100), (40, 128, 96)]


def _emulate(spec, batch, out, fin, tmp_path, source=None, seed=0):
    from tests import cpu_cuda

    p = sampled(batch, out, fin, spec.block, spec.dtype, spec.bias, seed)
    assert not spec.check(p), spec.check(p)
    inputs = random_inputs(p, np.random.default_rng(seed))
    got = cpu_cuda.run_plan(source or render(spec), plan(spec, p), p, inputs, output_shapes(p), tmp_path / p.key)
    ref = references(p, inputs)
    return {name: compare(p, got[name], ref[name]) for name in ref}, got, p


needs_gxx = pytest.mark.skipif(not __import__("shutil").which("g++"), reason="the CPU emulation needs g++")


@needs_gxx
@pytest.mark.timeout(300)
@pytest.mark.parametrize("spec", EMULATED, ids=lambda s: s.name)
def test_sampled_weight_gradients_are_correct_in_cpu_emulation(spec, tmp_path):
    for shape in EMULATED_SHAPES:
        results, got, p = _emulate(spec, *shape, tmp_path)
        for name, (status, evidence, _) in results.items():
            assert status == "ok", f"{spec.name} {p.key} {name}: {evidence}"
        assert got["DW"].shape == (sparse.lookup(p).nnzb, spec.block, spec.block)


@needs_gxx
@pytest.mark.timeout(300)
def test_the_cpu_emulation_catches_a_tile_in_the_wrong_block_row(tmp_path):
    """A bisection that takes the block row after an empty one's end for the kept block's row: dW of
    a block row's first kept block comes from the wrong rows of dY."""
    spec = EMULATED[0]
    source = render(spec)
    line = "if (__ldg(RP + mid) <= j) lo = mid; else hi = mid;"
    assert line in source
    results, _, _ = _emulate(spec, 91, 200, 130, tmp_path, source.replace(line, line.replace("<=", "<")))
    assert results["DW"][0] in ("wrong_result", "nan_or_inf")


# ---- compiler tier: NVRTC builds without spills, tensor cores where promised ----------------------------
#: The default variant of each block and family (what `codegen compile` takes) and the emulated ones.
COMPILED = [TcSpec(dtype=dt, layout=GW, block=b, bias=True, **tc_defaults(b)) for b in (16, 32, 64)
            for dt in ("bf16", "fp16")] + [SimtSpec(dtype=dt, layout=GW, block=b, bias=True, **simt_defaults(b))
                                           for b in (16, 32, 64) for dt in ("fp32", "bf16")]
DEFAULTS = {s.name for s in COMPILED}
COMPILED += [s for s in EMULATED if s.name not in DEFAULTS]


@pytest.fixture(scope="module")
def compiled():
    built = compile_all(COMPILED, ("sm_80", "sm_90"), use_cache=False, workers=2)
    return {(name, arch): (result.report, sass.opcodes(text, name)) for (name, arch), (result, text) in built.items()}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("spec", COMPILED, ids=lambda s: s.name)
def test_sampled_kernels_compile_without_spills(compiled, spec):
    for arch in ("sm_80", "sm_90"):
        report, ops = compiled[(spec.name, arch)]
        assert set(report) == {spec.name} | ({spec.name + "_db"} if spec.bias else set()), (arch, report)
        spills = {fn: (r.get("spill_stores", 0), r.get("spill_loads", 0)) for fn, r in report.items()}
        if spec.name in DEFAULTS:
            assert all(s == (0, 0) for s in spills.values()), (arch, spills)
        if spec.family == "tensorcore":
            assert ops["HMMA"] > 0, (arch, "no tensor-core instruction")
            if spec.mma == "mma":
                assert ops["LDSM"] > 0
        else:
            assert ops["FFMA"] > 0 and not ops.get("HMMA")
        if getattr(spec, "copy", "async") == "async" and spec.family == "tensorcore":
            assert ops["LDGSTS"] > 0
