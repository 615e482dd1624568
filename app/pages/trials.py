"""Trials: filter by problem, family, status, kernel name and any spec parameter; sort; chart;
parameter importances."""

from __future__ import annotations

import json

import altair as alt
import pandas as pd
import streamlit as st

from app import ui
from app.frames import SPEC_PREFIX, choice_order, filter_param, spec_columns, trials_frame
from app.importance import param_importances
from store import Store

STATUSES = ["ok", "invalid", "compile_error", "compile_timeout", "launch_out_of_resources", "runtime_error",
            "context_lost", "timeout", "worker_crash", "wrong_result", "nan_or_inf", "load_error"]  # fmt: skip


@st.cache_data(ttl=60, show_spinner="Computing parameter importances…")
def importances(rows_json: str) -> tuple[dict[str, float] | None, str]:
    return param_importances(json.loads(rows_json))


def sidebar_filters(store: Store) -> dict:
    problems = [p["key"] for p in store.problems()]
    families = sorted({k["family"] for k in store.kernels()})
    return {
        "problem": ui.pick_many("Problem", problems, key="trials_problem"),
        "family": ui.pick_many("Family", families, key="trials_family"),
        "status": ui.pick_many("Status", STATUSES, key="trials_status"),
        "name_contains": st.sidebar.text_input("Kernel name contains", key="trials_name") or None,
    }


def param_filter(frame: pd.DataFrame) -> pd.DataFrame:
    params = [c.removeprefix(SPEC_PREFIX) for c in spec_columns(frame)]
    param = st.sidebar.selectbox("Spec parameter", ["(none)", *params], key="trials_param")
    if param == "(none)":
        return frame
    column = SPEC_PREFIX + param
    values = choice_order(frame[column].dropna())
    chosen = st.sidebar.multiselect(f"{param} is one of", values, key="trials_param_values", placeholder="any")
    return filter_param(frame, column, chosen)


def page(store: Store) -> None:
    st.title("Trials")
    rows = store.trials(**sidebar_filters(store))
    frame = param_filter(trials_frame(rows))
    if frame.empty:
        st.info("No trials match these filters.")
        return
    st.caption(f"Trials matching the filters: {len(frame)}")

    sortable = [c for c in frame.columns if c not in ("evidence",)]
    left, right = st.columns([3, 1])
    sort_by = left.selectbox("Sort by", sortable, index=sortable.index("tflops"), key="trials_sort")
    descending = right.toggle("Descending", value=True, key="trials_desc")
    shown = frame.sort_values(sort_by, ascending=not descending, na_position="last")
    st.dataframe(shown, hide_index=True, width="stretch")

    st.subheader("TFLOP/s against a parameter")
    params = spec_columns(frame)
    ok = frame[frame["status"] == "ok"]
    if ok.empty or not params:
        st.info("No ok trial among the matches to chart.")
    else:
        varying = [c for c in params if ok[c].astype(str).nunique() > 1] or params
        x = st.selectbox("Parameter", varying, format_func=lambda c: c.removeprefix(SPEC_PREFIX), key="trials_x")
        data = ok[[x, "tflops", "problem", "kernel"]].rename(columns={x: "value"}).astype({"value": str})
        chart = (
            alt.Chart(data)
            .mark_circle(size=70, opacity=0.7)
            .encode(x=alt.X("value:O", title=x.removeprefix(SPEC_PREFIX), sort=choice_order(data["value"])),
                    y=alt.Y("tflops:Q", title="TFLOP/s"), color="problem:N", tooltip=["kernel", "tflops", "problem"])
        )  # fmt: skip
        st.altair_chart(chart, width="stretch")

    st.subheader("Parameter importances")
    importance_section(frame, rows)


def importance_section(frame: pd.DataFrame, rows: list[dict]) -> None:
    """Importances within one problem (speeds of different problems do not compare)."""
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        st.info("Parameter importances need ok trials.")
        return
    problems = ok["problem"].value_counts()
    problem = st.selectbox("For problem", list(problems.index), key="trials_importance_problem")
    keep = set(frame["id"])
    chosen = [{k: r[k] for k in ("status", "tflops", "params")} for r in rows
              if r["id"] in keep and r["problem"] == problem]  # fmt: skip
    found, note = importances(json.dumps(chosen, sort_keys=True))
    if found is None:
        st.info(note)
        return
    table = pd.DataFrame({"parameter": list(found), "importance": list(found.values())})
    st.bar_chart(table, x="parameter", y="importance", horizontal=True, sort="-importance")
    st.caption(note)


ui.guarded(page)
