"""What a search run reports: its summary (trials, best, failures, proposals, hand-overs), the
time buckets it fills, and its progress bar."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from tqdm import tqdm

__all__ = ["TIME_BUCKETS", "Summary", "Timer", "progress_bar"]

#: Time buckets of a run (seconds), in Summary.times.
TIME_BUCKETS = ("sample", "check", "store", "compile_wait", "gpu")


@dataclass
class Summary:
    study: str
    budget: int
    evaluated: int  # in the study, all runs (all processes)
    evaluated_now: int
    proposals: int  # points asked of the study this run (the sampler's, seeds and replacements)
    best: dict | None
    failures: collections.Counter = field(default_factory=collections.Counter)
    wall_s: float = 0.0
    gpu_wait_s: float = 0.0
    stopped: str = ""
    history: list[float] = field(default_factory=list)  # best-so-far TFLOP/s per evaluated trial
    run_id: int | None = None
    sampler_proposals: int = 0  # proposals the sampler made (not seeds, not replacements)
    valid_proposals: int = 0  # of those, valid points (measured, known or duplicate)
    new_proposals: int = 0  # of those, kernels not measured before (what the sampler added)
    replaced: int = 0  # invalid or repeated proposals replaced by an unmeasured valid point
    seeded: int = 0  # seeds tried first (0: an unseeded search)
    handover: str = ""  # a converged sampler that restarted or handed over to another, and when
    times: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIME_BUCKETS, 0.0))
    families: dict[str, Summary] = field(default_factory=dict)  # a search across families: each one's run

    @property
    def valid_fraction(self) -> float | None:
        """The share of the sampler's proposals that were valid points (None: it proposed none)."""
        return self.valid_proposals / self.sampler_proposals if self.sampler_proposals else None

    def describe(self) -> list[str]:
        """Lines for the end of a run: proposals, replacements, hand-over, where the time went."""
        lines = []
        if self.sampler_proposals:
            lines.append(f"proposals: {self.sampler_proposals} by the sampler, {self.valid_fraction:.0%} valid, "
                         f"{self.new_proposals} new; {self.replaced} replaced by an unmeasured valid point; "
                         + (f"{self.seeded} seeds tried first" if self.seeded else "unseeded"))
        if self.handover:
            lines.append(self.handover)
        if len(self.families) > 1:
            won = self.best.get("family") if self.best else None
            for family, member in self.families.items():
                best = member.best
                rate = "no ok kernel" if not best else f"best {best['kernel']} {best['tflops']:.2f} TFLOP/s" + (
                    f" ({best['ratio']['cublas']:.3f}x cuBLAS)" if best.get("ratio", {}).get("cublas") else "")
                lines.append(f"{family}: {member.evaluated} trials, {rate}" + (" (won)" if family == won else "")
                             + ("" if member.stopped in ("", "budget reached") else f"; {member.stopped}"))
        total = sum(self.times.values())
        other = max(0.0, self.wall_s - total)
        lines.append("time: " + ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in self.times.items())
                     + f", other {other:.1f} s")
        return lines

    def record(self, kernel: str, status: str, value: float, result: dict) -> None:
        """Count one evaluated trial: its failure, or a new best."""
        self.evaluated += 1
        self.evaluated_now += 1
        if status != "ok":
            self.failures[status] += 1
        elif self.best is None or value > self.best["tflops"]:
            self.best = {"kernel": kernel, "tflops": value,
                         **{k: result.get(k) for k in ("median_ms", "p20_ms", "p80_ms", "gbps", "baselines")},
                         "ratio": result.get("ratio", {})}
        self.history.append(self.best["tflops"] if self.best else 0.0)

    def settle_times(self, gpu_wait_s: float) -> None:
        """At the end of a run: the part of the GPU bucket spent waiting for compiles is compile wait."""
        self.gpu_wait_s = gpu_wait_s
        self.times["compile_wait"] = min(gpu_wait_s, self.times["gpu"])
        self.times["gpu"] -= self.times["compile_wait"]

    def postfix(self) -> str:
        """The progress bar's tail: the best so far and the failures."""
        parts = []
        if self.best:
            parts.append(f"best {self.best['tflops']:.2f} TFLOP/s")
            if self.best.get("ratio", {}).get("cublas"):
                parts.append(f"{self.best['ratio']['cublas']:.2f}x cuBLAS")
        if self.failures:
            parts.append("fail " + ",".join(f"{k}:{v}" for k, v in sorted(self.failures.items())))
        return " ".join(parts)


class Timer:
    """Adds the seconds spent inside ``with timer(bucket):`` to the summary's bucket."""

    def __init__(self, times: dict[str, float]) -> None:
        self.times = times
        self.bucket = ""
        self.t0 = 0.0

    def __call__(self, bucket: str) -> Timer:
        self.bucket = bucket
        return self

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.times[self.bucket] += time.perf_counter() - self.t0


def progress_bar(summary: Summary, description: str, shown: bool) -> tqdm:
    """The bar of evaluated trials out of the budget (hidden unless ``shown``)."""
    return tqdm(total=summary.budget, initial=min(summary.evaluated, summary.budget), desc=description,
                unit="trial", disable=not shown, dynamic_ncols=True)
