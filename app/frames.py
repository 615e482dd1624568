"""Store rows to pandas frames, and the small transforms the pages share."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pandas as pd

from store.records import RECORDED_MARK, is_recorded, measured_on

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


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def choice_order(values: Any) -> list[str]:
    """The distinct values of a parameter as text (what widgets and charts get), numbers in numeric
    order (64, 128, 256: never 128, 256, 64), then any other text in text order."""
    texts = dict.fromkeys(str(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v)))
    return sorted(texts, key=lambda t: (0, n, t) if (n := _number(t)) is not None else (1, 0.0, t))


def device_label(name: str) -> str:
    """A short name for a device: a recorded one's GPU and recording date, without the file it was
    replayed from (``NVIDIA H200 · recorded 2026-11-30``); a live one's name as it is."""
    if not is_recorded(name):
        return name
    note = name[len(measured_on(name)) + len(RECORDED_MARK):-1]  # "2026-11-30, replay-....json"
    return f"{measured_on(name)} · recorded {note.split(',', 1)[0].strip()}"


def trial_counts(kernels: list[dict[str, Any]], invalid: list[dict[str, Any]]) -> dict[str, int]:
    """What the CLI counts: ``trials``, the evaluated trials (every trial but the ``invalid`` points,
    which the rules refused before compiling and which cost no budget); ``kernels``, the kernels with an
    evaluated trial; ``invalid``, the invalid points. ``kernels`` as ``Store.kernels`` gives them (with
    their trial counts), ``invalid`` the trial rows of status invalid."""
    refused = Counter(r["kernel_id"] for r in invalid)
    return {
        "trials": sum(k["trials"] for k in kernels) - len(invalid),
        "kernels": sum(1 for k in kernels if k["trials"] > refused[k["id"]]),
        "invalid": len(invalid),
    }


def run_counts(runs: list[dict[str, Any]], invalid: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs (``Store.runs``) with ``trials`` the evaluated trials, as the CLI counts them, and
    ``invalid`` their invalid points apart."""
    refused = Counter(r["run_id"] for r in invalid if r["run_id"] is not None)
    return [r | {"trials": r["trials"] - refused[r["id"]], "invalid": refused[r["id"]]} for r in runs]


def family_wins(best: list[dict[str, Any]]) -> pd.DataFrame:
    """How many (problem, device) pairs each family wins: the family of the fastest ok kernel of
    each, as ``Store.best`` gives them (rank 1 rows), most wins first."""
    wins = Counter(b["family"] for b in best if b.get("rank", 1) == 1)
    ordered = sorted(wins.items(), key=lambda fw: (-fw[1], fw[0]))
    return pd.DataFrame(ordered, columns=["family", "wins"])


@dataclass(frozen=True)
class SourceView:
    """What the Kernel page shows as a kernel's source: ``text`` (None: nothing to show), ``kind``
    (stored, render_matches, render_differs, render_unhashed, never_compiled, unrenderable) and a
    ``note`` saying what the text is."""

    text: str | None
    kind: str
    note: str


def kernel_source(record: dict[str, Any], trials: list[dict[str, Any]]) -> SourceView:
    """The source to show for a kernel record (``Store.kernel_record``) with its trial rows: the
    stored source when there is one; else, for a kernel that was evaluated (a trial other than an
    invalid point) or whose measured source hash is known, today's render of its spec from the
    templates, said to be a render and whether it matches the measured source's hash (what
    ``codegen export --kernel NAME`` exports); else nothing: a point refused before rendering."""
    from codegen.families import spec_from_dict
    from codegen.render import render, source_hash

    if record.get("source"):
        return SourceView(record["source"], "stored", "The stored source: the text that was compiled and measured.")
    measured = record.get("source_hash") or None
    if measured is None and all(t["status"] == "invalid" for t in trials):
        return SourceView(None, "never_compiled",
                          "No source stored: the point was rejected before it was rendered and compiled.")
    why = ("its trials were replayed from a recording, which keeps results and source hashes, not sources"
           if any(t.get("recorded") for t in trials) else "none was stored with it")
    try:
        text = render(spec_from_dict(record["spec"]))
    except (LookupError, TypeError, ValueError) as err:
        return SourceView(None, "unrenderable", f"No source stored ({why}), and today's templates cannot render "
                                                f"its spec: {err}")
    rendered = source_hash(text)
    if measured is None:
        return SourceView(text, "render_unhashed",
                          f"Today's render of the spec from the templates (source hash {rendered[:12]}…), not the "
                          f"stored source: {why}, and the hash of the source measured was not recorded, so this "
                          "may not be what was measured.")
    if rendered == measured:
        return SourceView(text, "render_matches",
                          f"Today's render of the spec from the templates: no source is stored ({why}), but this "
                          f"render's hash matches the measured source's ({measured[:12]}…), so it is what was "
                          "measured.")
    return SourceView(text, "render_differs",
                      f"Not the measured source. The source measured ({measured[:12]}…) is not stored ({why}); shown "
                      f"is today's render of the spec from the templates ({rendered[:12]}…), which does not match it "
                      "and was never measured. `codegen export --kernel NAME` exports this render the same way.")
