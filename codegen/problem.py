"""The tuning key: what the user wants computed.

A linear layer ``Y[M,N] = X[M,K] · W[N,K]ᵀ (+ b[N])``, all row-major (``nn.Linear`` layout), and
its two backward GEMMs. M, N and K always name the GEMM's output rows, output columns and reduction;
``linear_problems`` maps a layer's batch, in and out features onto them for each layout.
W is dense, or block-sparse: ``block`` > 0 names the size of its square blocks, ``density`` the
fraction kept and ``pattern`` the hash of which ones (codegen.sparse holds the pattern itself). The
weight gradient of a block-sparse W is sampled at its pattern: dW only at the kept blocks, written
as the values array of W's BSR form (``codegen.sparse``), since the other blocks stay zero.
Or W is 2:4 structured-sparse (``sparsity="2:4"``): in each group of four along K two elements are
kept (density 0.5), which sparse tensor cores multiply at twice the rate; the kernels take W as its
kept halves and their 2-bit positions (codegen.sparse24). Which two are kept does not change the
time, so the problem names no pattern.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass


class DType(str, enum.Enum):
    """Input and output element type. ``tf32`` is fp32 data multiplied on tensor cores with
    inputs rounded to tf32 (10-bit mantissa): its own problem, with its own error bound, never
    a silent substitute for fp32."""

    fp32 = "fp32"
    tf32 = "tf32"
    fp16 = "fp16"
    bf16 = "bf16"

    @property
    def itemsize(self) -> int:
        return 4 if self in (DType.fp32, DType.tf32) else 2

    @property
    def rel_tol(self) -> float:
        """Relative Frobenius error bound against a float64 reference (fp32 accumulation)."""
        return {DType.fp32: 5e-5, DType.tf32: 2e-3, DType.fp16: 2e-3, DType.bf16: 1e-2}[self]


#: Structured sparsities of W a problem may name ("" : none), with what the key adds for each.
SPARSITIES = {"": "", "2:4": "_sp24"}
#: The fraction of W each structured sparsity keeps.
SPARSITY_DENSITY = {"2:4": 0.5}


class Layout(str, enum.Enum):
    """Which GEMM of the linear layer, and so how its operands are stored (all row-major)."""

    forward = "forward"  # Y[batch,out] = X[batch,in]·W[out,in]ᵀ: M=batch, N=out, K=in
    grad_input = "grad_input"  # dX[batch,in] = dY[batch,out]·W[out,in]: M=batch, N=in, K=out
    grad_weight = "grad_weight"  # dW[out,in] = dY[batch,out]ᵀ·X[batch,in]: M=out, N=in, K=batch


@dataclass(frozen=True)
class Problem:
    m: int
    n: int
    k: int
    dtype: DType = DType.fp32
    layout: Layout = Layout.forward
    bias: bool = False
    block: int = 0  # 0: dense W; else the side of W's square blocks (BSR)
    density: float = 1.0  # fraction of W's blocks kept
    pattern: str = ""  # hash of the kept blocks (codegen.sparse.Pattern.hash)
    sparsity: str = ""  # "2:4": W keeps two of each four along K (codegen.sparse24); "": no structure

    def __post_init__(self) -> None:
        for field in ("m", "n", "k"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field} must be an integer >= 1, got {value!r}")
        object.__setattr__(self, "dtype", DType(self.dtype))
        object.__setattr__(self, "layout", Layout(self.layout))
        object.__setattr__(self, "bias", bool(self.bias))
        if not isinstance(self.block, int) or isinstance(self.block, bool) or self.block < 0:
            raise ValueError(f"block must be an integer >= 0 (0: dense W), got {self.block!r}")
        if self.layout is Layout.grad_input and self.bias:
            raise ValueError("the grad_input layout has no bias (db = sum of dY comes with grad_weight)")
        object.__setattr__(self, "density", float(self.density))
        if self.sparsity:
            self._check_sparsity()
        elif self.block == 0 and (self.density != 1.0 or self.pattern):
            raise ValueError("a dense problem (block 0) has density 1 and no pattern")
        if self.block and not (0.0 <= self.density <= 1.0 and self.pattern):
            raise ValueError(f"a block-sparse problem needs a density in [0, 1] and a pattern hash, got "
                             f"density={self.density!r}, pattern={self.pattern!r}")

    def _check_sparsity(self) -> None:
        """A structured-sparse W: fp16 or bf16 (the sparse tensor cores' types), the forward GEMM, no
        blocks, no pattern; its density is the sparsity's (given as 1 it is set)."""
        if self.sparsity not in SPARSITIES:
            raise ValueError(f"sparsity must be one of {', '.join(s for s in SPARSITIES if s)} (or none), "
                             f"got {self.sparsity!r}")
        if self.dtype not in (DType.fp16, DType.bf16):
            raise ValueError(f"{self.sparsity} sparsity runs on sparse tensor cores in fp16 or bf16, not "
                             f"{self.dtype.value}: choose --dtype bf16 or fp16")
        if self.block or self.pattern:
            raise ValueError(f"a W is either {self.sparsity} sparse or block-sparse, not both: drop --block or "
                             f"--sparsity")
        if self.layout is not Layout.forward:
            raise ValueError(f"{self.sparsity} sparsity is generated for the forward layout only, not "
                             f"{self.layout.value} (the backward GEMMs of a {self.sparsity} layer are dense or need "
                             f"a transposable mask)")
        density = SPARSITY_DENSITY[self.sparsity]
        if self.density not in (1.0, density):
            raise ValueError(f"{self.sparsity} sparsity keeps {density:g} of W, not {self.density:g}")
        object.__setattr__(self, "density", density)

    @property
    def sparse(self) -> bool:
        """Whether W is block-sparse (a BSR pattern; ``structured`` says whether it is 2:4)."""
        return self.block > 0

    @property
    def structured(self) -> bool:
        """Whether W has a structured sparsity (``sparsity``, e.g. 2:4)."""
        return bool(self.sparsity)

    @property
    def w_shape(self) -> tuple[int, int]:
        """The layer's W [out, in] in this GEMM's M, N, K: [N, K] forward, [K, N] in grad_input,
        [M, N] in grad_weight (codegen.problem.Layout)."""
        return {Layout.forward: (self.n, self.k), Layout.grad_input: (self.k, self.n),
                Layout.grad_weight: (self.m, self.n)}[self.layout]

    @property
    def nnzb(self) -> int:
        """How many blocks of a block-sparse W are kept: ``round(density x blocks)``, exact for a
        density that is a pattern's (codegen.sparse.Pattern.density); 0 for a dense W."""
        if not self.sparse:
            return 0
        out, fin = self.w_shape
        return round(self.density * -(-out // self.block) * -(-fin // self.block))

    @property
    def key(self) -> str:
        """Stable text identity, used by the store and file names."""
        bias = "_bias" if self.bias else ""
        sparse = f"_bsr{self.block}_d{self.density:.4g}_{self.pattern[:8]}" if self.sparse else ""
        return (f"{self.m}x{self.n}x{self.k}_{self.dtype.value}_{self.layout.value}{bias}{sparse}"
                f"{SPARSITIES[self.sparsity]}")

    @property
    def flops(self) -> float:
        """The useful work: 2·M·N·K, times the density of kept blocks for a block-sparse W (or of kept
        elements for a 2:4 W)."""
        return 2.0 * self.m * self.n * self.k * self.density

    @property
    def min_bytes(self) -> float:
        """Each input read once (W's kept blocks only, with their 4-byte column indices), the output
        written once; the bias is b[N] read (forward) or db[M] written (grad_weight). A weight
        gradient sampled at a block-sparse W reads dY and X whole and writes the kept blocks. A 2:4
        W is read as its kept half with 2 bits of position per kept element."""
        bias = (self.m if self.layout is Layout.grad_weight else self.n) if self.bias else 0
        if self.sparse and self.layout is Layout.grad_weight:
            w = self.m * self.n * self.density
            elems = self.m * self.k + self.n * self.k + w + bias
        else:
            w = self.n * self.k * self.density
            elems = self.m * self.k + w + self.m * self.n + bias
        index = 4 * w / (self.block * self.block) if self.sparse else w / 4 if self.structured else 0.0
        return float(elems * self.dtype.itemsize + index)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dtype"] = self.dtype.value
        d["layout"] = self.layout.value
        if not self.sparsity:  # the dict of a problem without one is as it was before sparsities existed
            del d["sparsity"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Problem:
        names = ("m", "n", "k", "dtype", "layout", "bias", "block", "density", "pattern", "sparsity")
        return cls(**{k: d[k] for k in names if k in d and d[k] is not None})


def linear_problems(batch: int, in_features: int, out_features: int, dtype: DType | str = DType.fp32,
                    bias: bool = False) -> dict[Layout, Problem]:
    """The three GEMMs of one ``nn.Linear`` step. ``bias`` adds b to the forward output and asks the
    weight gradient for db = Σ_batch dY as well; the input gradient never has a bias."""
    return {
        Layout.forward: Problem(batch, out_features, in_features, dtype, Layout.forward, bias),
        Layout.grad_input: Problem(batch, in_features, out_features, dtype, Layout.grad_input, False),
        Layout.grad_weight: Problem(out_features, in_features, batch, dtype, Layout.grad_weight, bias),
    }
