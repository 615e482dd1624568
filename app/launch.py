"""Start the dashboard: ``streamlit run app/main.py`` bound to loopback, database read-only.

The database URL reaches the app through ``GEMMSCAPE_DB`` (``store.ENV_VAR``), the same
variable the store itself reads, so the app needs no argument parsing of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from store import ENV_VAR

ENTRY = Path(__file__).with_name("main.py")


def command(port: int) -> list[str]:
    """The streamlit command line for ``port`` on 127.0.0.1."""
    return [
        sys.executable, "-m", "streamlit", "run", str(ENTRY),
        "--server.address", "127.0.0.1", "--server.port", str(port), "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer",
    ]  # fmt: skip


def environment(db_url: str | None) -> dict[str, str]:
    """This process's environment with the database URL set when one is given."""
    env = dict(os.environ)
    if db_url:
        env[ENV_VAR] = db_url
    return env


def run(db_url: str | None, port: int) -> int:
    """Serve the dashboard until interrupted; returns streamlit's exit code."""
    try:
        return subprocess.call(command(port), env=environment(db_url))
    except KeyboardInterrupt:
        return 130
