"""Dashboard entry: ``streamlit run app/main.py`` (``codegen app`` does this for you)."""

import streamlit as st

st.set_page_config(page_title="gemmscape", page_icon="▦", layout="wide")

PAGES = [
    st.Page("pages/overview.py", title="Overview", default=True),
    st.Page("pages/trials.py", title="Trials"),
    st.Page("pages/history.py", title="Search history"),
    st.Page("pages/kernel.py", title="Kernel"),
    st.Page("pages/failures.py", title="Failures"),
    st.Page("pages/sparsity.py", title="Sparsity"),
]

st.navigation(PAGES).run()
