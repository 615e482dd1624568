"""Failures: counts by status and the evidence of each failed trial."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import ui
from store import Store


def first_line(text: str, width: int = 160) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def page(store: Store) -> None:
    st.title("Failures")
    problems = ui.pick_many("Problem", [p["key"] for p in store.problems()], key="failures_problem")
    rows = store.trials(problem=problems)
    failed = [r for r in rows if r["status"] != "ok"]
    ok_col, failed_col = st.columns(2)
    ok_col.metric("ok trials", len(rows) - len(failed))
    failed_col.metric("failed trials", len(failed))
    if not failed:
        st.success("No failed trial for these problems.")
        return
    st.subheader("Failed trials by status")
    counts = pd.Series([r["status"] for r in failed], dtype="object").value_counts()
    st.bar_chart(counts.rename_axis("status").reset_index(name="trials"), x="status", y="trials", sort="-trials")
    statuses = sorted({r["status"] for r in failed})
    chosen = ui.pick_many("Failure status", statuses, key="failures_status")
    failed = [r for r in failed if r["status"] in chosen]
    table = pd.DataFrame(
        [{"id": r["id"], "status": r["status"], "evidence": first_line(r["evidence"]), "problem": r["problem"],
          "kernel": r["kernel"], "run": r["run_id"]} for r in failed]
    )  # fmt: skip
    st.subheader(f"Evidence ({len(failed)} failed trials)")
    st.dataframe(table, hide_index=True, width="stretch")

    by_id = {r["id"]: r for r in failed}
    pick = st.selectbox(
        "Full evidence of trial", list(by_id), key="failures_trial",
        format_func=lambda i: f"#{i} {by_id[i]['status']} · {by_id[i]['kernel']}",
    )  # fmt: skip
    if pick is not None:
        st.code(by_id[pick]["evidence"] or "(no evidence recorded)", language="text")


ui.guarded(page)
