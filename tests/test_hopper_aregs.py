"""Hopper A fragments from registers (``a_regs``) on the CPU. The sources of specs without it are
pinned byte for byte (sha256 of the text as rendered before the option existed)."""

from __future__ import annotations

import hashlib

import pytest

from codegen.families.hopper import Spec
from codegen.problem import DType, Layout
from codegen.render import render

#: Sources without a_regs over every branch of the template (plain, pack, persistent, split-K, cluster,
#: block-sparse 64/32/16 with ctas and grouped, both backward layouts), as main rendered them before
#: a_regs: the option must not change a byte of them. A deliberate change to these sources updates
#: the pins.
PINS = {
    Spec(): "55153582cb825dc3525244b14ac602048c764ec715a4d79faf7de8deee57b352",
    Spec(bias=True, prepass="pack", persistent=True):
        "2a35ad4b7b8a75ced7a98804d03a65c13f527409db6c0d69c3989f3483febe20",
    Spec(dtype=DType.fp16, bm=128, bn=128, consumers=1, stages=5, persistent=True):
        "252cfcb86a35cba412b750dcd5f640736493f3b2533e1d72396e92a5ff1c45fd",
    Spec(bm=256, bn=128, stages=4, persistent=True, group_m=16):
        "508d43665f65800d030332210be17d9ba6b371e1f67abb31a61691778dd42766",
    Spec(bm=64, bn=64, consumers=1, stages=2, group_m=1, bias=True, dtype=DType.fp16):
        "69c78bd829f0a0e7d3620cede5cd62ccb6a02ea3bb567da917f043c9d5816f68",
    Spec(bm=64, bn=128, consumers=1, stages=6, group_m=4, split_k=4, bias=True, prepass="pack"):
        "d2aec53ce7257a593898d6d037a7d390ef4c13fa944986ba0d7041637c3ee605",
    Spec(cluster=2, persistent=True): "3409bff0919b15382ece4d6f652d585dd4d9de254b9dd9b0243e79bfa9bb12ed",
    Spec(block=64, bn=64, bm=128, stages=8, persistent=True):
        "614c22bd0b1c333316ead8eabad871f053b666229362a7a4e126b0da389aa6fc",
    Spec(block=32, bn=32, bm=128, consumers=1, stages=4, ctas=2, dtype=DType.fp16, bias=True):
        "1f99534145428087bb1096fe1e70e7fb46a5b6ab427aa4144935961f7e88d180",
    Spec(block=16, bn=16, bm=128, stages=16, persistent=True, grouped=True):
        "154a15c5820c3a206168815ee9a6b36dff3e79161fb82f9e872adfc0decb9722",
    Spec(layout=Layout.grad_input): "902a51e589016cf4e50dd81106bab4d26ffeac5046a2521e2fce5249dfeb8de8",
    Spec(layout=Layout.grad_weight, bias=True, bm=128, bn=128, consumers=1, stages=5):
        "75573d278b7f3e8d72070ef99f9a78f259e2d4d1cbea87821b3a22250d7962d3",
}


@pytest.mark.parametrize("spec", list(PINS), ids=lambda s: s.name)
def test_sources_without_a_regs_are_unchanged(spec):
    assert hashlib.sha256(render(spec).encode()).hexdigest() == PINS[spec]
