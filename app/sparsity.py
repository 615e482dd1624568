"""Speedup of block-sparse kernels against dense cuBLAS, and where it breaks even."""

from __future__ import annotations

import itertools
from typing import Any


def sparse_points(best_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per sparse problem: density, block, speedup over dense cuBLAS (ratio > 1 = faster)."""
    points = []
    for row in best_rows:
        density, block, speedup = row.get("density"), row.get("block"), row.get("ratio_cublas")
        if density is None or density >= 1.0 or block is None or speedup is None:
            continue
        shape = f"{row['m']}x{row['n']}x{row['k']} {row['dtype']}"
        points.append({"shape": shape, "block": int(block), "density": float(density), "speedup": float(speedup),
                       "kernel": row["kernel"], "device": row["device"]})  # fmt: skip
    return points


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
    groups: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for p in points:
        groups.setdefault((p["shape"], p["block"]), []).append((p["density"], p["speedup"]))
    table = []
    for (shape, block), pts in sorted(groups.items()):
        density, note = break_even(pts)
        table.append({"shape": shape, "block": block, "break_even_density": density, "note": note,
                      "points": len(pts)})  # fmt: skip
    return table
