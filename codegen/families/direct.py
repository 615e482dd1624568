"""Direct family: block-sparse W at small batches, tensor-core fragments loaded straight from memory.

For a block-sparse W (BSR, see codegen.sparse) at a batch of a few dozen rows, a layer's time is
a short chain of dependent memory reads (the block row's pointers, its block columns, then the
blocks and X's columns under them), not arithmetic, and every instruction and synchronisation on
that chain counts. This family keeps it short: no shared-memory pipeline and no barrier in the
main loop. Each of ``warps`` warps takes every ``warps``-th kept block of the CTA's block row and
loads its operands with 16-byte reads straight into ``mma.sync`` (m16n8k16) fragments: inside a
block, the k order is permuted the same way for X and W (a dot product does not depend on it), so
that a lane's k values of all the block's k-steps are contiguous in memory. ``depth`` blocks per
warp are loaded before any is multiplied. The warps' fp32 sums meet in shared memory; the bias is
added there and 16-byte rows go out. A CTA covers ``bm`` rows of X and ``bn`` rows (a divisor of
the block) of one block row, so a narrow layer still spreads over the GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from codegen.launch import BSR_ARGS, SPARSE_ARGS, KernelLaunch, LaunchPlan
from codegen.problem import DType, Problem
from codegen.spec import (
    SPARSE_BLOCKS,
    DeviceLimits,
    SpecData,
    arch_rules,
    dtype_rules,
    problem_rules,
    resource_rules,
)

NAME = "direct"
DTYPES = (DType.bf16, DType.fp16)
#: Place among the families that fit a problem, fastest first (search.fit).
RANK = 2
C_PAD = 4  # floats of padding per row of the shared fp32 tile
MMA_PTX = {
    DType.bf16: "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    DType.fp16: "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
}


@dataclass(frozen=True)
class Spec(SpecData):
    """One direct-family variant (block-sparse W only); its generated ``name`` is its identity."""

    dtype: DType = DType.bf16
    bias: bool = False
    bm: int = field(default=32, metadata={"help": "rows of X per CTA (a multiple of 16, at most 64)"})
    bn: int = field(default=32, metadata={"help": "rows of the block row per CTA (a multiple of 8 dividing the block)"})
    warps: int = field(default=8, metadata={"help": "warps sharing out the block row's kept blocks"})
    depth: int = field(default=1, metadata={"help": "kept blocks each warp loads before multiplying"})
    block: int = field(default=64, metadata={"help": "W block-sparse in block x block blocks (BSR); required"})

    family: ClassVar[str] = NAME

    # ---- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return (f"dr_{self.dtype.value}_{'bias' if self.bias else 'nobias'}_{self.bm}x{self.bn}"
                f"_w{self.warps}_d{self.depth}_bsr{self.block}")

    _NAME = re.compile(r"dr_(?P<dtype>bf16|fp16)_(?P<bias>bias|nobias)_(?P<bm>\d+)x(?P<bn>\d+)_w(?P<warps>\d+)"
                       r"_d(?P<depth>\d+)_bsr(?P<block>\d+)")

    # ---- derived geometry -----------------------------------------------------------------
    @property
    def k_steps(self) -> int:
        """mma.sync k-steps (16 deep) per block."""
        return self.block // 16

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def smem_bytes(self) -> int:
        """The shared fp32 tile the warps' sums meet in (none for one warp)."""
        return self.bm * (self.bn + C_PAD) * 4 if self.warps > 1 else 0

    @property
    def regs_estimate(self) -> int:
        acc = (self.bm // 16) * (self.bn // 8) * 4
        operands = self.depth * ((self.bm // 16) * 2 + self.bn // 8) * 2 * max(1, self.k_steps)
        return acc + operands + 40

    # ---- validity ---------------------------------------------------------------------------
    def check(self, problem: Problem | None = None, limits: DeviceLimits | None = None) -> list[str]:
        """Why this point is invalid (empty when it is valid). Costs no compile."""
        limits = limits or DeviceLimits()
        why = dtype_rules(self, DTYPES)
        if self.block not in SPARSE_BLOCKS:
            why.append(f"the {NAME} family is generated for a block-sparse W: block must be one of {SPARSE_BLOCKS}, "
                       f"got {self.block}")
        if self.bm not in (16, 32, 48, 64):
            why.append(f"bm must be a multiple of 16 from 16 to 64, got {self.bm}")
        if self.bn < 8 or self.bn % 8 or (self.block in SPARSE_BLOCKS and self.block % self.bn):
            why.append(f"bn must be a multiple of 8 dividing the block ({self.block}), got {self.bn}")
        if not 1 <= self.warps <= 32:
            why.append(f"warps must be 1 to 32, got {self.warps}")
        if not 1 <= self.depth <= 4:
            why.append(f"depth must be 1 to 4, got {self.depth}")
        if why:
            return why
        return (arch_rules(self, limits, 80, "mma.sync bf16") + resource_rules(self, limits)
                + problem_rules(self, problem, sparse_only=True))


# ---- template values and launch plan --------------------------------------------------------
def template_values(spec: Spec) -> dict:
    """Every number the template uses, computed here once."""
    values = spec.to_dict()
    values.update(name=spec.name, threads=spec.threads, frag_m=spec.bm // 16,
                  frag_n=spec.bn // 8, k_steps=spec.k_steps, c_stride=spec.bn + C_PAD, mma_ptx=MMA_PTX[spec.dtype],
                  out_vecs_per_row=spec.bn // 8)
    return values


def plan(spec: Spec, problem: Problem) -> LaunchPlan:
    grid = (-(-problem.n // spec.bn), -(-problem.m // spec.bm), 1)
    launch = KernelLaunch(symbol=spec.name, grid=grid, block=(spec.threads, 1, 1), smem=spec.smem_bytes,
                          args=SPARSE_ARGS)
    return LaunchPlan(launches=(launch,), workspace_bytes=0, zero_output=False)


def headers(spec: Spec) -> list[str]:
    """Toolkit headers the source includes beyond the element type's (none)."""
    return []


def grid_rule(spec: Spec) -> str:
    """How to launch this variant on any M, N, K, in words (export manifests carry it)."""
    return (f"{spec.name}: grid = (ceil(N/{spec.bn}), ceil(M/{spec.bm}), 1), block = ({spec.threads}, 1, 1), "
            f"dynamic shared memory {spec.smem_bytes} B; " + BSR_ARGS.format(block=spec.block))
