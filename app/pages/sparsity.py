"""Sparsity: speedup over dense cuBLAS against density, per block size, with break-even."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from app import ui
from app.sparsity import break_even_table, sparse_points
from store import Store

NO_SPARSE = """\
**No block-sparse results yet.** This page shows, for each block size, how much faster a
block-sparse kernel is than dense cuBLAS as the density of kept blocks falls, and the density
where it breaks even. It fills in once trials exist for problems with density below 1.
"""


def page(store: Store) -> None:
    st.title("Sparsity")
    points = sparse_points(store.best())
    if not points:
        st.markdown(NO_SPARSE)
        return
    frame = pd.DataFrame(points)
    shapes = sorted(frame["shape"].unique())
    shape = st.sidebar.selectbox("Shape", shapes, key="sparsity_shape")
    data = frame[frame["shape"] == shape]
    base = alt.Chart(data).encode(
        x=alt.X("density:Q", title="density of kept blocks", scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("speedup:Q", title="speedup over dense cuBLAS"),
        color=alt.Color("block:N", title="block"),
    )
    even = alt.Chart(pd.DataFrame({"speedup": [1.0]})).mark_rule(strokeDash=[4, 3]).encode(y="speedup:Q")
    chart = base.mark_line(point=True) + even
    st.altair_chart(chart.properties(title=shape), width="stretch")
    st.subheader("Break-even density")
    table = pd.DataFrame([t for t in break_even_table(points) if t["shape"] == shape])
    st.dataframe(table.drop(columns=["shape"]), hide_index=True, width="stretch")
    st.caption("Below the break-even density the block-sparse kernel beats dense cuBLAS measured in the same run.")
    st.dataframe(data, hide_index=True, width="stretch")


ui.guarded(page)
