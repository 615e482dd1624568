"""The Streamlit dashboard: browse, compare and explain stored results (read-only).

Started by ``codegen app`` through ``app.launch.run``; pages live in ``app/pages``.
"""
