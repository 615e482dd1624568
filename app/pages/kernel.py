"""Kernel: spec, ptxas report, source, compile log, timing spread, and the exported files."""

from __future__ import annotations

import json

import altair as alt
import pandas as pd
import streamlit as st

from app import ui
from app.frames import kernel_source
from codegen.export import export_kernel
from store import Store


def choose_kernel(store: Store) -> str | None:
    kernels = store.kernels()
    if not kernels:
        return None
    names = sorted({k["name"] for k in kernels})
    best = store.best(limit=1)
    wanted = st.query_params.get("kernel") or (best[0]["kernel"] if best else names[0])
    index = names.index(wanted) if wanted in names else 0
    return st.sidebar.selectbox("Kernel", names, index=index, key="kernel_name")


def export_downloads(store: Store, name: str, arch: str, source_hash: str | None) -> None:
    """What ``codegen export --kernel NAME`` writes: the measured source as stored, else today's render
    of the spec (its manifest says whether that render is what was measured), with the manifest."""
    try:
        cu, manifest = export_kernel(store, name, arch=arch, source_hash=source_hash, unmeasured_render=True)
    except Exception as err:  # noqa: BLE001 - export says why it refuses; show it, never a traceback
        st.warning(f"Could not export {name}: {err}")
        return
    doc = json.loads(manifest)
    if doc.get("measured_other_source"):
        st.caption(f"The export is today's render, not measured: {doc['measured_other_source']['note']}.")
    elif doc.get("source_rerendered"):
        st.caption("The export is today's render of the spec (no source is stored); its hash is the measured source's.")
    left, right = st.columns(2)
    left.download_button(f"Download {name}.cu", cu, file_name=f"{name}.cu", mime="text/plain", key="kernel_cu")
    right.download_button(f"Download {name}.json", manifest, file_name=f"{name}.json", mime="application/json",
                          key="kernel_json")  # fmt: skip


def timing_spread(store: Store, name: str, source_hash: str | None) -> None:
    ok = store.trials(kernel_name=name, status="ok", source_hash=source_hash)
    if not ok:
        st.info("No ok measurement of this kernel.")
        return
    samples = [{"problem": t["problem"], "trial": t["id"], "ms": ms} for t in ok for ms in t["times_ms"]]
    if samples:
        chart = (
            alt.Chart(pd.DataFrame(samples))
            .mark_boxplot(extent="min-max")
            .encode(x=alt.X("problem:N"), y=alt.Y("ms:Q", title="time per repetition (ms)", scale=alt.Scale(zero=False)))
        )  # fmt: skip
        st.altair_chart(chart, width="stretch")
    columns = [
        "id",
        "problem",
        "block",
        "density",
        "device",
        "median_ms",
        "p20_ms",
        "p80_ms",
        "tflops",
        "gbps",
        "rel_error",
        "ratio_cublas",
    ]
    table = pd.DataFrame([{c: t[c] for c in columns} | {"repetitions": len(t["times_ms"])} for t in ok])
    st.dataframe(table, hide_index=True, width="stretch")


def page(store: Store) -> None:
    st.title("Kernel")
    name = choose_kernel(store)
    if name is None:
        st.info("No kernels recorded yet.")
        return
    versions = [k for k in store.kernels() if k["name"] == name]
    arches = sorted({k["arch"] for k in versions})
    arch = st.sidebar.selectbox("Arch", arches, key="kernel_arch") if len(arches) > 1 else arches[0]
    # A kernel name built from other template source is another kernel: newest source first.
    sources = [k["source_hash"] for k in reversed(versions) if k["arch"] == arch]
    source_hash = (st.sidebar.selectbox("Source", sources, key="kernel_source", format_func=lambda h: (h or "none")[:12])
                   if len(sources) > 1 else sources[0])
    record = store.kernel_record(name, arch, source_hash)
    trials = [t for t in store.trials(kernel_name=name, source_hash=source_hash) if t["kernel_id"] == record["id"]]
    shown = kernel_source(record, trials)
    st.code(name, language=None)
    st.caption(f"family {record['family']} · {record['arch']} · source hash {record['source_hash'] or '–'}"
               + (f" · {len(sources)} sources recorded for this name" if len(sources) > 1 else ""))

    spec_col, report_col = st.columns(2)
    with spec_col:
        st.subheader("Spec")
        st.json(record["spec"], expanded=True)
    with report_col:
        st.subheader("ptxas report")
        if record["report"]:
            st.dataframe(pd.DataFrame.from_dict(record["report"], orient="columns"), width="stretch")
        elif shown.kind == "never_compiled":
            st.info("No ptxas report: this kernel was never compiled.")
        elif any(t["recorded"] for t in trials):
            st.info("No ptxas report stored: this kernel's trials were replayed from a recording, which keeps none.")
        else:
            st.info("No ptxas report stored for this kernel.")
        st.markdown("**Compile options**")
        st.code(" ".join(record["options"]) or "–", language=None)

    st.subheader("Timing spread")
    timing_spread(store, name, source_hash)

    st.subheader("Source")
    if shown.kind in ("render_differs", "render_unhashed"):
        st.warning(shown.note)
    elif shown.kind != "stored":
        st.info(shown.note)
    if shown.text is not None:
        st.code(shown.text, language="cpp", line_numbers=True)
    with st.expander("Compile log", expanded=False):
        st.code(record["log"] or "(empty)", language="text")

    st.subheader("Export")
    export_downloads(store, name, arch, source_hash)


ui.guarded(page)
