"""Kernel variants as data: a frozen spec whose generated name is its identity."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

from codegen.problem import DType, Problem

REDUCES = ("none", "atomic", "two_pass")
COPIES = ("reg", "async")


@dataclass(frozen=True)
class DeviceLimits:
    """What a point must fit into. Defaults are the sm_90 (H100/H200) limits."""

    sm: int = 90
    max_threads: int = 1024
    max_smem: int = 232448  # opt-in dynamic shared memory per block, bytes
    max_regs_per_thread: int = 255
    regs_per_block: int = 65536

    @classmethod
    def for_arch(cls, sm: int | str) -> DeviceLimits:
        """Limits of an architecture given as 90 or "sm_90" ("sm_90a" too)."""
        if isinstance(sm, str):
            match = re.fullmatch(r"sm_(\d+)a?", sm)
            if not match:
                raise ValueError(f"not an architecture: {sm!r}")
            sm = int(match.group(1))
        smem = {80: 166912, 86: 101376, 89: 101376, 90: 232448}.get(sm, 232448 if sm >= 90 else 101376)
        return cls(sm=sm, max_smem=smem)


@dataclass(frozen=True)
class SimtSpec:
    """CUDA-core GEMM: block tile, warp tile, thread tile (register blocking) and staging.

    ``stages`` = 0 reads both operands straight from global memory (the naive kernel);
    1 stages tiles through shared memory; 2 double-buffers shared memory with a register
    prefetch of the next tile. With ``copy="reg"`` tiles travel through registers and are
    stored k-major ("transposed") so the inner loop reads ``tm``/``tn`` fragments with vector
    loads; lanes own strided 4-wide chunks of the warp tile. With ``copy="async"`` tiles go
    global -> shared with ``cp.async`` (sm_80+) into ``stages`` (2-4) buffers kept in the input
    type and k-contiguous; the inner loop reads 4-wide k fragments and lanes own rows strided by
    the lane count (conflict-free with ``pad``). Lanes of a warp form a ``(wm/tm) × (wn/tn)`` grid.
    """

    dtype: DType = DType.fp32
    bias: bool = False
    bm: int = 128
    bn: int = 128
    bk: int = 8
    wm: int = 32
    wn: int = 64
    tm: int = 8
    tn: int = 8
    pad: int = 4
    vec: int = 4
    stages: int = 2
    copy: str = "reg"
    group_m: int = 1
    split_k: int = 1
    reduce: str = "none"

    family = "simt"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DType(self.dtype))
        object.__setattr__(self, "bias", bool(self.bias))
        for f in fields(self):
            if f.type == "int" and not isinstance(getattr(self, f.name), int):
                raise TypeError(f"{f.name} must be an int, got {getattr(self, f.name)!r}")

    # ---- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        red = {"none": "", "atomic": "a", "two_pass": "r"}[self.reduce]
        return (
            f"simt_{self.dtype.value}_{'bias' if self.bias else 'nobias'}"
            f"_{self.bm}x{self.bn}x{self.bk}_w{self.wm}x{self.wn}_t{self.tm}x{self.tn}"
            f"_p{self.pad}_v{self.vec}_s{self.stages}{'c' if self.copy == 'async' else ''}"
            f"_g{self.group_m}_k{self.split_k}{red}"
        )

    _NAME = re.compile(
        r"simt_(?P<dtype>fp32|fp16|bf16)_(?P<bias>bias|nobias)_(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)"
        r"_w(?P<wm>\d+)x(?P<wn>\d+)_t(?P<tm>\d+)x(?P<tn>\d+)_p(?P<pad>\d+)_v(?P<vec>\d+)"
        r"_s(?P<stages>\d+)(?P<copy>c?)_g(?P<group_m>\d+)_k(?P<split_k>\d+)(?P<reduce>[ar]?)"
    )

    @classmethod
    def from_name(cls, name: str) -> SimtSpec:
        match = cls._NAME.fullmatch(name)
        if not match:
            raise ValueError(f"not a SIMT kernel name: {name!r}")
        g = match.groupdict()
        spec = cls(
            dtype=DType(g.pop("dtype")),
            bias=g.pop("bias") == "bias",
            reduce={"": "none", "a": "atomic", "r": "two_pass"}[g.pop("reduce")],
            copy="async" if g.pop("copy") else "reg",
            **{k: int(v) for k, v in g.items()},
        )
        assert spec.name == name
        return spec

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dtype"] = self.dtype.value
        d["family"] = self.family
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SimtSpec:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    # ---- derived geometry -----------------------------------------------------------------
    @property
    def lanes_m(self) -> int:
        return self.wm // self.tm

    @property
    def lanes_n(self) -> int:
        return self.wn // self.tn

    @property
    def warps_m(self) -> int:
        return self.bm // self.wm

    @property
    def warps_n(self) -> int:
        return self.bn // self.wn

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    @property
    def rm(self) -> int:
        """Consecutive rows a lane owns: its fragment width along m (1, 2 or 4)."""
        if self.copy == "async":
            return 1
        return 4 if self.tm % 4 == 0 else (2 if self.tm % 2 == 0 else 1)

    @property
    def rn(self) -> int:
        if self.copy == "async":
            return 1
        return 4 if self.tn % 4 == 0 else (2 if self.tn % 2 == 0 else 1)

    @property
    def kv(self) -> int:
        """k values per shared-memory fragment read on the async path (16 or 8 bytes)."""
        return 4

    @property
    def a_loads(self) -> int:
        """Global vector loads of the X tile per thread per k-step."""
        return -(-self.bm * self.bk // self.vec // max(self.threads, 1))

    @property
    def w_loads(self) -> int:
        return -(-self.bn * self.bk // self.vec // max(self.threads, 1))

    @property
    def smem_bytes(self) -> int:
        if self.stages == 0:
            return 0
        if self.copy == "async":
            return self.dtype.itemsize * self.stages * (self.bm + self.bn) * (self.bk + self.pad)
        return 4 * self.stages * self.bk * ((self.bm + self.pad) + (self.bn + self.pad))

    @property
    def regs_estimate(self) -> int:
        if self.copy == "async":
            # fragments of two k-steps live, and an address per unrolled tile load
            return self.tm * self.tn + 2 * self.kv * (self.tm + self.tn) + 2 * (self.a_loads + self.w_loads) + 32
        staged = (self.a_loads + self.w_loads) * self.vec if self.stages == 2 else 0
        return self.tm * self.tn + self.tm + self.tn + staged + 28

    # ---- validity ---------------------------------------------------------------------------
    def check(self, problem: Problem | None = None, limits: DeviceLimits | None = None) -> list[str]:
        """Why this point is invalid (empty when it is valid). Costs no compile."""
        limits = limits or DeviceLimits()
        why: list[str] = []
        positive = ("bm", "bn", "bk", "wm", "wn", "tm", "tn", "vec", "group_m", "split_k")
        for name in positive:
            if getattr(self, name) < 1:
                why.append(f"{name} must be >= 1")
        if self.pad < 0:
            why.append("pad must be >= 0")
        if why:
            return why
        if self.copy not in COPIES:
            why.append(f"copy must be one of {COPIES}")
        elif self.copy == "reg" and self.stages not in (0, 1, 2):
            why.append(f"stages must be 0, 1 or 2 with register copies, got {self.stages}")
        elif self.copy == "async" and self.stages not in (2, 3, 4):
            why.append(f"stages must be 2, 3 or 4 with async copies, got {self.stages}")
        if self.bm % self.wm or self.bn % self.wn:
            why.append(f"warp tile {self.wm}x{self.wn} does not divide block tile {self.bm}x{self.bn}")
        if self.wm % self.tm or self.wn % self.tn:
            why.append(f"thread tile {self.tm}x{self.tn} does not divide warp tile {self.wm}x{self.wn}")
        elif self.lanes_m * self.lanes_n != 32:
            why.append(
                f"warp tile {self.wm}x{self.wn} / thread tile {self.tm}x{self.tn} gives "
                f"{self.lanes_m * self.lanes_n} lanes, a warp has 32"
            )
        if any((side not in (1, 2) and side % 4) or side > 16 for side in (self.tm, self.tn)):
            why.append("thread tile sides must be 1, 2 or a multiple of 4 up to 16")
        if why:
            return why
        if self.threads > limits.max_threads:
            why.append(f"{self.threads} threads per block > {limits.max_threads}")
        max_vec = 4 if self.dtype is DType.fp32 else 8
        if self.vec not in (1, 2, 4, 8) or self.vec > max_vec:
            why.append(f"vec must be a power of two up to {max_vec} for {self.dtype.value}")
        if self.stages == 0:
            if (self.bk, self.pad, self.vec) != (1, 0, 1):
                why.append("stages=0 (no shared memory) takes bk=1, pad=0, vec=1")
        else:
            if self.bk % self.vec:
                why.append(f"vec {self.vec} does not divide bk {self.bk}")
            if self.copy == "async":
                row_bytes = (self.bk + self.pad) * self.dtype.itemsize
                if self.vec * self.dtype.itemsize not in (4, 8, 16):
                    why.append("async copies move 4, 8 or 16 bytes: vec * element size must be one of them")
                if row_bytes % 16 or self.bk % self.kv:
                    why.append(f"async tiles need (bk + pad) * {self.dtype.itemsize} B a multiple of 16 "
                               f"and bk a multiple of {self.kv}")
                if limits.sm < 80:
                    why.append("async copies (cp.async) need sm_80 or newer")
            elif (self.bm + self.pad) % self.rm or (self.bn + self.pad) % self.rn:
                why.append(f"pad {self.pad} breaks the {self.rm}/{self.rn}-wide fragment alignment")
            if self.smem_bytes > limits.max_smem:
                why.append(f"shared memory {self.smem_bytes} B > {limits.max_smem} B")
        if self.regs_estimate > limits.max_regs_per_thread:
            why.append(f"about {self.regs_estimate} registers per thread > {limits.max_regs_per_thread}")
        elif self.regs_estimate * self.threads > limits.regs_per_block:
            why.append(f"about {self.regs_estimate * self.threads} registers per block > {limits.regs_per_block}")
        if self.reduce not in REDUCES:
            why.append(f"reduce must be one of {REDUCES}")
        elif (self.split_k == 1) != (self.reduce == "none"):
            why.append("reduce is 'none' exactly when split_k is 1")
        elif self.reduce == "atomic" and self.dtype is not DType.fp32:
            why.append("atomic split-K reduction needs fp32 output")
        if problem is not None:
            if problem.dtype is not self.dtype:
                why.append(f"spec dtype {self.dtype.value} != problem dtype {problem.dtype.value}")
            if problem.bias != self.bias:
                why.append("spec and problem disagree on bias")
            step = max(self.bk, 1)
            k_tiles = -(-problem.k // step)
            if self.split_k > k_tiles:
                why.append(f"split_k {self.split_k} > {k_tiles} k-tiles of K={problem.k}")
        return why
