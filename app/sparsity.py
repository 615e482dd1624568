"""Block-sparse W against dense: time and speedup over density per block size, and break-even.

Every point is the best kernel of one block-sparse problem on one device. Each of its trials also
timed the baselines in the same run (the trial's ``baselines``: name -> median/p20/p80 ms):
``cublas`` is the dense GEMM of the same shape, ``torch_bsr`` torch's BSR matmul on the same
pattern, ``cusparselt`` a 2:4 semi-structured W (half the elements kept, whatever the pattern).
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

#: Baseline names as the trials store them, and how the pages call them.
DENSE, TORCH_BSR, CUSPARSELT = "cublas", "torch_bsr", "cusparselt"
LABELS = {DENSE: "dense cuBLAS", TORCH_BSR: "torch BSR", CUSPARSELT: "cuSPARSELt 2:4"}
OURS = "gemmscape"
#: The density a 2:4 semi-structured W stands at (two of every four elements kept).
SEMI_STRUCTURED_DENSITY = 0.5


def baseline_ms(row: dict[str, Any], name: str) -> float | None:
    """The median time of a baseline measured with a trial (None: not measured)."""
    found = (row.get("baselines") or {}).get(name) or {}
    value = found.get("median_ms") if isinstance(found, dict) else None
    return float(value) if value is not None else None


def _ratio(base: float | None, ours: float | None) -> float | None:
    return base / ours if base is not None and ours else None


def shape_of(row: dict[str, Any]) -> str:
    """The problem's shape, and its layout where it is a backward GEMM (whose M, N, K mean other sides)."""
    layout = getattr(row.get("layout"), "value", row.get("layout")) or "forward"
    return (f"{row['m']}x{row['n']}x{row['k']}" + (" +bias" if row.get("bias") else "")
            + (f" {layout}" if layout != "forward" else ""))


def sparse_points(best_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per block-sparse problem and device (its best kernel): density (0 included),
    block, our median ms, the baselines' median ms, and speedups over dense cuBLAS (> 1: faster).
    Dense problems (no block) are left out; so is a point without a time."""
    points = []
    for row in best_rows:
        block, density, ms = row.get("block"), row.get("density"), row.get("median_ms")
        if not block or density is None or ms is None:
            continue
        dense, torch_bsr = baseline_ms(row, DENSE), baseline_ms(row, TORCH_BSR)
        speedup = _ratio(dense, ms)
        if speedup is None and row.get("ratio_cublas") is not None:
            speedup = float(row["ratio_cublas"])
        points.append({
            "device": row["device"], "shape": shape_of(row), "dtype": row["dtype"], "block": int(block),
            "density": float(density), "ms": float(ms), "cublas_ms": dense, "torch_bsr_ms": torch_bsr,
            "cusparselt_ms": baseline_ms(row, CUSPARSELT), "speedup": speedup,
            "torch_bsr_speedup": _ratio(dense, torch_bsr), "vs_torch_bsr": _ratio(torch_bsr, ms),
            "kernel": row["kernel"], "problem": row["problem"], "pattern": row.get("pattern"),
        })  # fmt: skip
    return sorted(points, key=lambda p: (p["device"], p["shape"], p["dtype"], p["block"], p["density"]))


def case_of(point: dict[str, Any]) -> str:
    """What one chart shows: a shape in a dtype (times of other shapes or dtypes do not compare)."""
    return f"{point['shape']} · {point['dtype']}"


def time_series(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the time chart of one case: ours and torch BSR, a line per block size each."""
    rows = []
    for p in sorted(points, key=lambda p: (p["block"], p["density"])):
        rows.append({"series": OURS, "block": p["block"], "density": p["density"], "ms": p["ms"]})
        if p["torch_bsr_ms"] is not None:
            rows.append({"series": LABELS[TORCH_BSR], "block": p["block"], "density": p["density"],
                         "ms": p["torch_bsr_ms"]})  # fmt: skip
    return rows


def speedup_series(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the speedup chart of one case: ours and torch BSR over dense cuBLAS, per block size."""
    rows = []
    for p in sorted(points, key=lambda p: (p["block"], p["density"])):
        for series, value in ((OURS, p["speedup"]), (LABELS[TORCH_BSR], p["torch_bsr_speedup"])):
            if value is not None:
                rows.append({"series": series, "block": p["block"], "density": p["density"], "speedup": value})
    return rows


def references(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The baselines that do not depend on the pattern, for one case: dense cuBLAS (a horizontal
    line) and cuSPARSELt 2:4 (a point at density 0.5). Each trial measured them again in its own
    run: the median of those measurements, with their count and spread."""
    out = []
    for name, density in ((DENSE, None), (CUSPARSELT, SEMI_STRUCTURED_DENSITY)):
        times = [p[f"{name}_ms"] for p in points if p[f"{name}_ms"] is not None]
        if times:
            out.append({"baseline": LABELS[name], "density": density, "ms": statistics.median(times),
                        "min_ms": min(times), "max_ms": max(times), "measurements": len(times)})  # fmt: skip
    return out


def break_even(points: list[tuple[float, float]]) -> tuple[float | None, str]:
    """The density below which sparse beats dense, from (density, speedup) points.

    Interpolates linearly between the densest point that still wins and the next one; says
    so when every point wins or none does.
    """
    pts = sorted(points)
    if not pts:
        return None, "no points"
    if all(s >= 1.0 for _, s in pts):
        return pts[-1][0], f"faster at every measured density (up to {pts[-1][0]:g})"
    if all(s < 1.0 for _, s in pts):
        return None, f"slower than dense at every measured density (down to {pts[0][0]:g})"
    for (d0, s0), (d1, s1) in itertools.pairwise(pts):
        if s0 >= 1.0 > s1:
            return d0 + (s0 - 1.0) * (d1 - d0) / (s0 - s1), "interpolated"
    return None, "no crossing"  # wins at higher density only: no single break-even


def break_even_table(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Break-even density per device, shape, dtype and block size: ours against dense cuBLAS, and
    torch BSR's where it was measured."""
    groups: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    for p in points:
        groups.setdefault((p["device"], p["shape"], p["dtype"], p["block"]), []).append(p)
    table = []
    for (device, shape, dtype, block), pts in sorted(groups.items()):
        density, note = break_even([(p["density"], p["speedup"]) for p in pts if p["speedup"] is not None])
        torch_pts = [(p["density"], p["torch_bsr_speedup"]) for p in pts if p["torch_bsr_speedup"] is not None]
        torch_density, torch_note = break_even(torch_pts) if torch_pts else (None, "not measured")
        table.append({"device": device, "shape": shape, "dtype": dtype, "block": block,
                      "break_even_density": density, "note": note, "torch_bsr_break_even": torch_density,
                      "torch_bsr_note": torch_note, "points": len(pts)})  # fmt: skip
    return table
