"""Overview: problems and devices, the best kernel per problem, its roofline place and ratios."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from app import ui
from app.frames import device_label, family_wins, ratio_columns, trial_counts
from app.roofline import ceilings_for, place
from store import Store

BEST_COLUMNS = {
    "TFLOP/s": st.column_config.NumberColumn(format="%.2f"),
    "GB/s": st.column_config.NumberColumn(format="%.1f"),
    "median ms": st.column_config.NumberColumn(format="%.4f"),
    "kernel": st.column_config.TextColumn(width="large"),
    "family": st.column_config.TextColumn(help="The family of the fastest ok kernel for this problem and device"),
    "gpu": st.column_config.TextColumn(help="The device, short: the full name (with the recording replayed) is "
                                            "under 'device'"),
}


def best_table(best: list[dict]) -> pd.DataFrame:
    rows = []
    for b in best:
        where = place(b)
        rows.append({
            "problem": b["problem"], "kernel": b["kernel"], "family": b["family"], "gpu": device_label(b["device"]),
            "measured": "recording (replayed)" if b.get("recorded") else "live", "block": b.get("block"),
            "density": b.get("density"), "TFLOP/s": b["tflops"], "GB/s": b["gbps"],
            "of roofline": ui.pct(where["of_roofline"]), "bound": where["bound"] or "–",
            "of compute peak": ui.pct(where["of_compute"]), "of bandwidth": ui.pct(where["of_bandwidth"]),
            "median ms": b["median_ms"], "device": b["device"], "ceilings": where["ceilings"],
        })  # fmt: skip
    table = pd.DataFrame(rows)
    split = list(table.columns).index("of roofline") + 1  # the ratios to baselines follow the roofline place
    return pd.concat([table.iloc[:, :split], ratio_columns(best), table.iloc[:, split:]], axis=1)


def roofline_chart(best: list[dict], device: str) -> alt.LayerChart | None:
    """Log-log roofline of one device: the ceilings as lines, the best kernels as points."""
    limits = ceilings_for(device)
    points = [{**b, "intensity": place(b)["intensity"]} for b in best if b["device"] == device]
    points = [p for p in points if p["intensity"] and p["tflops"]]
    if limits is None or not points:
        return None
    xs = [0.5, 10_000.0]
    for dtype in sorted({p["dtype"] for p in points}):
        if dtype in limits.compute:
            ridge = limits.compute[dtype].value / limits.bandwidth.value
            xs.append(ridge)
    by_value: dict[float, list[str]] = {}
    for dtype, ceiling in limits.compute.items():
        by_value.setdefault(ceiling.value, []).append(dtype)
    lines = []
    for value, dtypes in by_value.items():
        for x in sorted(xs):
            lines.append({"ceiling": f"{'/'.join(dtypes)} peak", "intensity": x,
                          "TFLOP/s": min(value, x * limits.bandwidth.value)})  # fmt: skip
    log_x = alt.Scale(type="log")
    roof = (
        alt.Chart(pd.DataFrame(lines))
        .mark_line(strokeDash=[4, 3])
        .encode(x=alt.X("intensity", scale=log_x, title="FLOP per byte"), y=alt.Y("TFLOP/s", scale=alt.Scale(type="log")),
                color=alt.Color("ceiling", title="roofline"))
    )  # fmt: skip
    dots = (
        alt.Chart(pd.DataFrame([{k: p[k] for k in ("problem", "kernel", "intensity", "tflops", "dtype")} for p in points]))
        .mark_point(filled=True, size=90, color="black")
        .encode(x="intensity", y=alt.Y("tflops", title="TFLOP/s"), shape="dtype", tooltip=["problem", "kernel", "tflops"])
    )  # fmt: skip
    return roof + dots


def page(store: Store) -> None:
    st.title("Overview")
    problems, devices, runs, kernels = store.problems(), store.devices(), store.runs(), store.kernels()
    counts = trial_counts(kernels, store.trials(status="invalid"))
    cols = st.columns(6)
    for col, (label, value, why) in zip(
        cols, [("problems", len(problems), None), ("devices", len(devices), None),
               ("kernels", counts["kernels"], "Kernels with an evaluated trial (invalid points not counted)"),
               ("runs", len(runs), None),
               ("trials", counts["trials"], "Evaluated trials, as the CLI counts them: invalid points not counted"),
               ("invalid points", counts["invalid"], "Points the rules refused before compiling: never rendered, "
                                                     "compiled or measured, and no cost to a search's budget")],
        strict=True,
    ):  # fmt: skip
        col.metric(label, value, help=why)
    if counts["invalid"]:
        st.caption(f"{counts['trials']} trials (+{counts['invalid']} invalid points, refused before compiling)")

    st.subheader("Best kernel per problem")
    best = store.best()
    if not best:
        st.info("No trial has finished ok yet: see the Failures page for what went wrong.")
    else:
        st.dataframe(best_table(best), hide_index=True, width="stretch", column_config=BEST_COLUMNS)
        wins = family_wins(best)
        st.caption("Winning family (of the fastest ok kernel per problem and device): "
                   + " · ".join(f"{f} {n}" for f, n in zip(wins["family"], wins["wins"], strict=True)))
        st.caption("Roofline place: measured TFLOP/s against min(compute peak, FLOP/byte × bandwidth); a block-sparse "
                   "problem (block, density of kept blocks) counts the work and bytes of its kept blocks only. "
                   "`vs cublas` = cuBLAS median / ours, above 1 means we are faster (for a block-sparse problem: "
                   "dense cuBLAS on the full W).")  # fmt: skip
        for device in sorted({b["device"] for b in best}):
            chart = roofline_chart(best, device)
            if chart is None:
                st.caption(f"{device}: roofline ceilings unknown for this device.")
            else:
                st.markdown(f"**Roofline: {device}**")
                st.altair_chart(chart, width="stretch")

    left, right = st.columns(2)
    with left:
        st.subheader("Problems")
        first = ["key", "block", "density"]  # a block-sparse problem's sparsity beside its key
        frame = pd.DataFrame(problems).drop(columns=["id"])
        st.dataframe(frame[first + [c for c in frame.columns if c not in first]], hide_index=True)
    with right:
        st.subheader("Devices")
        st.dataframe(pd.DataFrame(devices).drop(columns=["id"]), hide_index=True)


ui.guarded(page)
