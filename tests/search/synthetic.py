"""A measurer for tests that answers every family on any problem from a formula (no GPU, no
recording): the rate of a kernel is its family's ``rates`` entry times a factor in [0.5, 1) drawn
from its name. Test data, not a measurement."""

from __future__ import annotations

import hashlib
from collections import deque

from codegen.evaluate import blank_result
from codegen.spec import DeviceLimits
from search.measure import Done


def factor(name: str) -> float:
    return 0.5 + 0.5 * int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 2**32


class Synthetic:
    def __init__(self, rates: dict[str, float], device: str = "synthetic GPU") -> None:
        self.rates = rates
        self.device = {"name": device, "sm": "sm_90"}
        self.arch = "sm_90"
        self.limits = DeviceLimits.for_arch("sm_90")
        self.pending: deque = deque()
        self.measured: list[str] = []

    def source_hash(self, spec) -> str:
        return "synthetic-" + spec.name

    def submit(self, tag, spec) -> None:
        self.pending.append((tag, spec))

    def __len__(self) -> int:
        return len(self.pending)

    def next_done(self) -> Done:
        tag, spec = self.pending.popleft()
        self.measured.append(spec.name)
        tflops = self.rates[spec.family] * factor(spec.name)
        result = {**blank_result("ok", ""), "median_ms": 1.0 / tflops, "p20_ms": 1.0 / tflops, "p80_ms": 1.0 / tflops,
                  "times_ms": [1.0 / tflops], "tflops": tflops, "gbps": 1.0, "rel_error": 0.0}
        kernel = {"name": spec.name, "family": spec.family, "spec": spec.to_dict(), "arch": self.arch,
                  "source_hash": self.source_hash(spec)}
        return Done(tag, spec, result, kernel)

    def close(self) -> None:
        pass
