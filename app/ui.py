"""Shared page pieces: opening the store read-only, guidance, errors, sidebar pickers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from store import DatabaseMissing, Store, StoreError, default_url

GUIDANCE = """\
**No results to show yet.** The dashboard reads the gemmscape database read-only.

- Run a search to fill it: `codegen search --m 4096 --n 4096 --k 4096 --dtype fp32 --budget 200`
- or point the app at another database: `codegen app --db sqlite:////path/to/gemmscape.db`
  (or set `GEMMSCAPE_DB`).
"""


RECORDED_NOTE = ("**Recorded results.** These devices hold trials replayed from a recording "
                 "(`codegen search --replay`), not live measurements of this run: ")


@st.cache_resource(show_spinner=False)
def _open(url: str) -> Store:
    return Store(url, read_only=True)


def open_store() -> Store:
    """The read-only store, or guidance on the page and a stop when there is nothing to read."""
    url = default_url()
    try:
        store = _open(url)
        ready = store.ready and bool(store.trials(limit=1))
    except DatabaseMissing as err:
        st.info(str(err))
        st.markdown(GUIDANCE)
        st.stop()
    except (StoreError, SQLAlchemyError) as err:
        st.error(f"Could not read the database: {err}")
        st.markdown(GUIDANCE)
        st.stop()
    st.sidebar.caption(f"Database (read-only): `{store.location}`")
    recorded = [d["name"] for d in store.devices() if d.get("recorded")]
    if recorded:
        st.sidebar.warning(RECORDED_NOTE + " ".join(f"`{name}`" for name in recorded))
    if not ready:
        st.info("The database exists but holds no trials.")
        st.markdown(GUIDANCE)
        st.stop()
    return store


def guarded(page: Callable[[Store], None]) -> None:
    """Run a page; a database error becomes a message, never a traceback."""
    store = open_store()
    try:
        page(store)
    except (StoreError, SQLAlchemyError) as err:
        st.error(f"Could not read the database: {err}")


def pick_many(label: str, options: list[Any], key: str, help: str | None = None) -> list[Any]:
    """A sidebar multiselect where nothing chosen means everything."""
    chosen = st.sidebar.multiselect(label, options, key=key, help=help, placeholder="all")
    return chosen or list(options)


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100.0 * value:.1f}%"
