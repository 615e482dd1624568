"""The tuning key: what the user wants computed.

A linear layer ``Y[M,N] = X[M,K] · W[N,K]ᵀ (+ b[N])``, all row-major (``nn.Linear`` layout).
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


class Layout(str, enum.Enum):
    forward = "forward"  # Y = X·Wᵀ: X [M,K], W [N,K], both K-contiguous


@dataclass(frozen=True)
class Problem:
    m: int
    n: int
    k: int
    dtype: DType = DType.fp32
    layout: Layout = Layout.forward
    bias: bool = False

    def __post_init__(self) -> None:
        for field in ("m", "n", "k"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field} must be an integer >= 1, got {value!r}")
        object.__setattr__(self, "dtype", DType(self.dtype))
        object.__setattr__(self, "layout", Layout(self.layout))
        object.__setattr__(self, "bias", bool(self.bias))

    @property
    def key(self) -> str:
        """Stable text identity, used by the store and file names."""
        bias = "_bias" if self.bias else ""
        return f"{self.m}x{self.n}x{self.k}_{self.dtype.value}_{self.layout.value}{bias}"

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def min_bytes(self) -> float:
        """Each input read once, the output written once."""
        elems = self.m * self.k + self.n * self.k + self.m * self.n + (self.n if self.bias else 0)
        return float(elems * self.dtype.itemsize)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dtype"] = self.dtype.value
        d["layout"] = self.layout.value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Problem:
        return cls(**{k: d[k] for k in ("m", "n", "k", "dtype", "layout", "bias") if k in d})
