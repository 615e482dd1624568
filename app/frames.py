"""Store rows to pandas frames, and the small transforms the pages share."""

from __future__ import annotations

from typing import Any

import pandas as pd

SPEC_PREFIX = "spec."
TRIAL_COLUMNS = [
    "id", "problem", "block", "density", "status", "tflops", "median_ms", "gbps", "ratio_cublas", "rel_error", "p20_ms", "p80_ms",
    "kernel", "device", "recorded", "family", "run_id", "number", "evidence", "created",
]  # fmt: skip


def trials_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per trial; spec parameters become ``spec.<name>`` columns."""
    if not rows:
        return pd.DataFrame(columns=TRIAL_COLUMNS)
    base = pd.DataFrame([{c: r.get(c) for c in TRIAL_COLUMNS} for r in rows])
    specs = pd.DataFrame([{SPEC_PREFIX + k: v for k, v in r["params"].items() if k != "family"} for r in rows])
    return pd.concat([base, specs], axis=1)


def spec_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith(SPEC_PREFIX)]


def filter_param(frame: pd.DataFrame, column: str, values: list[str]) -> pd.DataFrame:
    """Rows whose ``column`` equals one of ``values``, compared as text (widgets hand back text)."""
    if not values or column not in frame.columns:
        return frame
    return frame[frame[column].astype(str).isin([str(v) for v in values])]


def best_so_far(rows: list[dict[str, Any]], label: str) -> pd.DataFrame:
    """Best TFLOP/s found up to each trial of one run (failed trials keep the previous best)."""
    ordered = sorted(rows, key=lambda r: (r["number"] if r["number"] is not None else r["id"], r["id"]))
    best, points = None, []
    for i, row in enumerate(ordered):
        if row["status"] == "ok" and row["tflops"] is not None:
            best = row["tflops"] if best is None else max(best, row["tflops"])
        number = row["number"] if row["number"] is not None else i
        points.append({"run": label, "trial": number, "best_tflops": best})
    return pd.DataFrame(points, columns=["run", "trial", "best_tflops"])


def ratio_columns(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``vs <baseline>`` columns from each row's ratio dict (baseline median / ours)."""
    return pd.DataFrame([{f"vs {name}": value for name, value in (r.get("ratio") or {}).items()} for r in rows])
