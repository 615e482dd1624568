"""Hopper with swapped operands (``swap``) on the CPU: names, rules, the register count and the SASS.
Whether the kernels compute the right thing is for the GPU tier (tests/gpu/test_hopper.py and
test_hopper_sparse.py, ``-k _sw``); that sources without swap are unchanged is pinned in
test_hopper_aregs.py."""

from __future__ import annotations

import pytest

from codegen import sass
from codegen.families import spec_from_name
from codegen.families.hopper import Spec
from codegen.problem import DType, Layout
from tests.compiled import compile_all

SPARSE = Spec(block=64, bn=64, bm=128, consumers=1, stages=4, ctas=2, persistent=True, grouped=True, swap=True)
SMALL_M = Spec(bm=32, bn=128, consumers=1, stages=6, bias=True, swap=True)
WIDE = Spec(block=64, bn=64, bm=256, consumers=1, stages=4, bias=True, swap=True)


def test_names_round_trip():
    assert SPARSE.name == "hp_bf16_nobias_128x64x64_c1_s4_g8_psg_bsr64_o2_sw"
    for spec in (SPARSE, SMALL_M, WIDE, Spec()):
        assert spec_from_name(spec.name) == spec
    assert Spec.from_dict({k: v for k, v in Spec().to_dict().items() if k != "swap"}) == Spec()  # older records


def test_wgmma_n_is_the_consumers_rows_of_x():
    assert (SPARSE.wg_n, SPARSE.frag_m, SPARSE.acc_regs) == (128, 1, 64)
    assert (SMALL_M.wg_n, SMALL_M.frag_m, SMALL_M.acc_regs) == (32, 2, 32)
    assert (WIDE.wg_n, WIDE.frag_m, WIDE.acc_regs) == (256, 1, 128)
    assert (Spec().wg_n, Spec().frag_m) == (256, 1)  # without swap: W's tile is N


@pytest.mark.parametrize("fields,reason", [
    (dict(block=32, bn=32, bm=128), "multiple of 64 with swap"),
    (dict(bm=40, bn=64, consumers=1), "multiple of 16"),
    (dict(bm=48, bn=64, consumers=2), "multiple of 16 x 2"),
    (dict(layout=Layout.grad_input, bn=128), "layout is grad_input"),
    (dict(split_k=4, bm=64, bn=128, consumers=1), "split_k is 4"),
    (dict(cluster=2), "cluster is 2"),
    (dict(a_regs=True), "a_regs is True"),
])
def test_check_names_what_swap_refuses(fields, reason):
    why = Spec(swap=True, **fields).check()
    assert any(reason in w for w in why), why


def test_swap_allows_narrow_x_tiles_that_the_plain_layout_refuses():
    assert not SMALL_M.check() and Spec(bm=32, bn=128, consumers=1).check()


@pytest.mark.timeout(600)
def test_swapped_kernels_run_wgmma_of_x_width_and_transpose_with_movmatrix():
    specs = [SPARSE, SMALL_M, WIDE, Spec(block=64, bn=64, bm=256, stages=4, dtype=DType.fp16, swap=True)]
    built = {name: text for (name, _), (_, text) in compile_all(specs).items()}
    for spec in specs:
        text = built[spec.name]
        code, ops = sass.functions(text)[spec.name], sass.opcodes(text, spec.name)
        assert code.count(f"HGMMA.64x{spec.wg_n}x16.F32") == ops["HGMMA"] == 4 * spec.frag_m, spec.name
        assert ops["MOVM"] > 0 and ops["SHFL"] > 0, spec.name  # movmatrix, then the quad exchange
        assert ops["UTMALDG"] == 2 and ops["LDL"] == 0 and ops["STL"] == 0, spec.name
