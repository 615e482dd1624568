"""Sparsity: time and speedup against density per block size, dense cuBLAS as the baseline, and
the break-even density per block size and dtype."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from app import ui
from app.sparsity import (
    LABELS,
    OURS,
    TORCH_BSR,
    break_even_table,
    case_of,
    references,
    sparse_points,
    speedup_series,
    time_series,
)
from store import Store

NO_SPARSE = """\
**No block-sparse results yet.** This page shows, for each shape and dtype, the time of the best
block-sparse kernel against the density of kept blocks (a line per block size) with dense cuBLAS,
measured in the same runs, as the baseline; the speedup over dense; and the density where the two
break even. It fills in once trials exist for block-sparse problems (`block` > 0).
"""

DENSITY = alt.X("density:Q", title="density of kept blocks", scale=alt.Scale(domain=[0, 1]))
SERIES_DASH = alt.StrokeDash("series:N", title="kernel",
                             scale=alt.Scale(domain=[OURS, LABELS[TORCH_BSR]], range=[[1, 0], [5, 3]]))  # fmt: skip


def time_chart(points: list[dict]) -> alt.LayerChart:
    lines = (
        alt.Chart(pd.DataFrame(time_series(points)))
        .mark_line(point=True)
        .encode(x=DENSITY, y=alt.Y("ms:Q", title="median time (ms)"), color=alt.Color("block:N", title="block"),
                strokeDash=SERIES_DASH, tooltip=["series", "block", "density", "ms"])
    )  # fmt: skip
    layers = [lines]
    refs = references(points)
    dense = [r for r in refs if r["density"] is None]
    if dense:
        frame = pd.DataFrame(dense).assign(label=lambda f: f["baseline"] + " " + f["ms"].map("{:.4g} ms".format))
        layers.append(alt.Chart(frame).mark_rule(color="black", strokeDash=[2, 2]).encode(y="ms:Q"))
        layers.append(alt.Chart(frame).mark_text(align="right", dx=-4, dy=-7)
                      .encode(x=alt.datum(1.0), y="ms:Q", text="label:N"))  # fmt: skip
    semi = [r for r in refs if r["density"] is not None]
    if semi:
        at = alt.Chart(pd.DataFrame(semi)).encode(x="density:Q", y="ms:Q")
        layers.append(at.mark_point(shape="diamond", size=140, filled=True, color="gray")
                      .encode(tooltip=["baseline", "ms", "measurements"]))  # fmt: skip
        layers.append(at.mark_text(align="left", dx=9, color="gray").encode(text="baseline:N"))
    return alt.layer(*layers)


def speedup_chart(points: list[dict]) -> alt.LayerChart:
    lines = (
        alt.Chart(pd.DataFrame(speedup_series(points)))
        .mark_line(point=True)
        .encode(x=DENSITY, y=alt.Y("speedup:Q", title="speedup over dense cuBLAS"),
                color=alt.Color("block:N", title="block"), strokeDash=SERIES_DASH,
                tooltip=["series", "block", "density", "speedup"])
    )  # fmt: skip
    even = alt.Chart(pd.DataFrame({"speedup": [1.0]})).mark_rule(strokeDash=[4, 3]).encode(y="speedup:Q")
    return lines + even


def page(store: Store) -> None:
    st.title("Sparsity")
    points = sparse_points(store.best())
    if not points:
        st.markdown(NO_SPARSE)
        return
    devices = sorted({p["device"] for p in points})
    device = st.sidebar.selectbox("Device", devices, key="sparsity_device") if len(devices) > 1 else devices[0]
    on_device = [p for p in points if p["device"] == device]
    cases = sorted({case_of(p) for p in on_device})
    case = st.sidebar.selectbox("Shape and dtype", cases, key="sparsity_case")
    chosen = [p for p in on_device if case_of(p) == case]
    st.caption(f"{case} on {device}: the best kernel of each block-sparse problem. Baselines were timed in the "
               "same runs as the kernels; dense cuBLAS computes the full W.")  # fmt: skip

    st.subheader("Time against density")
    st.altair_chart(time_chart(chosen).properties(title=f"{case}: median time"), width="stretch")
    refs = references(chosen)
    if refs:
        st.dataframe(pd.DataFrame(refs), hide_index=True, width="stretch")

    st.subheader("Speedup over dense cuBLAS")
    st.altair_chart(speedup_chart(chosen).properties(title=f"{case}: speedup"), width="stretch")

    st.subheader("Break-even density")
    table = pd.DataFrame(break_even_table(on_device))
    st.dataframe(table.drop(columns=["device"]), hide_index=True, width="stretch")
    st.caption("Per block size and dtype: below the break-even density the block-sparse kernel beats dense "
               "cuBLAS measured in the same run (interpolated between the measured densities).")  # fmt: skip

    st.subheader("Points")
    st.dataframe(pd.DataFrame(chosen).drop(columns=["device"]), hide_index=True, width="stretch")


ui.guarded(page)
