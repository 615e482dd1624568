"""Start the dashboard: ``streamlit run app/main.py`` bound to loopback, database read-only.

The database URL reaches the app through ``GEMMSCAPE_DB`` (``store.ENV_VAR``), the same
variable the store itself reads, so the app needs no argument parsing of its own.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from store import ENV_VAR

ENTRY = Path(__file__).with_name("main.py")
#: The address the dashboard listens on: loopback only.
HOST = "127.0.0.1"


def command(port: int) -> list[str]:
    """The streamlit command line for ``port`` on 127.0.0.1."""
    return [
        sys.executable, "-m", "streamlit", "run", str(ENTRY),
        "--server.address", HOST, "--server.port", str(port), "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer",
    ]  # fmt: skip


def port_problem(port: int, host: str = HOST) -> str | None:
    """Why the dashboard could not listen on ``host:port`` (None: it can), found by binding it as
    the server will (with SO_REUSEADDR, as tornado does, so a port left in TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use (another dashboard?): stop what holds it, or choose another " \
                       f"with --port N"
            return f"cannot listen on {host}:{port} ({e.strerror or e}): choose another port with --port N"
    return None


def environment(db_url: str | None) -> dict[str, str]:
    """This process's environment with the database URL set when one is given."""
    env = dict(os.environ)
    if db_url:
        env[ENV_VAR] = db_url
    return env


#: Seconds the server gets to stop after SIGTERM before it is killed.
STOP_GRACE_S = 10.0


def run(db_url: str | None, port: int, cmd: list[str] | None = None) -> int:
    """Serve the dashboard until it exits or this process gets SIGTERM or SIGINT (Ctrl-C): then
    the server is stopped (SIGTERM, SIGKILL after STOP_GRACE_S) before returning, so no server
    outlives ``codegen app``. Returns the server's exit code, or 128 + the signal's number."""
    got: list[int] = []
    proc: subprocess.Popen | None = None

    def on_signal(signum, _frame) -> None:
        got.append(signum)
        if proc is not None and proc.poll() is None:
            proc.terminate()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}  # before the server starts
    try:
        proc = subprocess.Popen(cmd or command(port), env=environment(db_url))
        if got:  # a signal came while it was starting
            proc.terminate()
        deadline = None
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if got:
                    deadline = deadline or time.monotonic() + STOP_GRACE_S
                    if time.monotonic() > deadline:
                        proc.kill()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    return 128 + got[0] if got else code
