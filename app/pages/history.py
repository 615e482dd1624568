"""Search history: best-so-far TFLOP/s against trial number, per run and sampler."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from app import ui
from app.frames import best_so_far, run_counts
from store import Store

RUN_COLUMNS = ["id", "problem", "device", "family", "sampler", "seed", "budget", "trials", "invalid", "ok", "best_ms",
               "study_name", "started", "ended", "command"]  # fmt: skip


def run_label(run: dict) -> str:
    seed = "" if run["seed"] is None else f" seed {run['seed']}"
    return f"#{run['id']} {run['sampler']}{seed}"


def page(store: Store) -> None:
    st.title("Search history")
    runs = store.runs()
    if not runs:
        st.info("No search runs recorded yet (trials from `codegen bench` belong to no run).")
        return
    problems = sorted({r["problem"] for r in runs})
    problem = st.sidebar.selectbox("Problem", problems, key="history_problem")
    of_problem = [r for r in runs if r["problem"] == problem]
    samplers = ui.pick_many("Sampler", sorted({r["sampler"] for r in of_problem}), key="history_sampler")
    chosen = [r for r in of_problem if r["sampler"] in samplers]

    curves = pd.concat([best_so_far(store.trials(run_id=r["id"]), run_label(r)) for r in chosen], ignore_index=True)
    curves = curves.dropna(subset=["best_tflops"])
    if curves.empty:
        st.info("None of these runs has an ok trial yet.")
    else:
        chart = (
            alt.Chart(curves)
            .mark_line(interpolate="step-after", point=True)
            .encode(x=alt.X("trial:Q", title="trial number", axis=alt.Axis(format="d", tickMinStep=1)), y=alt.Y("best_tflops:Q", title="best TFLOP/s so far"),
                    color=alt.Color("run:N", title="run"), tooltip=["run", "trial", "best_tflops"])
        )  # fmt: skip
        st.altair_chart(chart, width="stretch")
    st.subheader("Runs")
    counted = run_counts(chosen, store.trials(status="invalid"))
    st.dataframe(pd.DataFrame(counted, columns=RUN_COLUMNS), hide_index=True, width="stretch")
    st.caption("trials: the evaluated trials, as the CLI counts them; invalid: points the rules refused before "
               "compiling, apart (no cost to the budget).")


ui.guarded(page)
