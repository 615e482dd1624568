"""``codegen app`` stops its server when it gets SIGTERM or SIGINT: no server outlives it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_until(what, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(step)
    return None


def launcher(server: str, grace: float = 10.0) -> subprocess.Popen:
    """app.launch.run with a stand-in server command (a Python process)."""
    code = ("import sys; from app import launch; launch.STOP_GRACE_S = float(sys.argv[2]);"
            "sys.exit(launch.run(None, 0, cmd=[sys.executable, '-c', sys.argv[1]]))")
    return subprocess.Popen([sys.executable, "-c", code, server, str(grace)], cwd=ROOT, start_new_session=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_server_is_stopped_when_the_launcher_is_signalled(sig: int) -> None:
    proc = launcher("import time; time.sleep(120)")
    try:
        (server,) = wait_until(lambda: children(proc.pid), 30) or pytest.fail("no server started")
        proc.send_signal(sig)  # to the launcher only: it must stop the server itself
        assert proc.wait(timeout=20) == 128 + sig
        assert wait_until(lambda: gone(server), 10), "the server outlived codegen app"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    proc = launcher(stubborn, grace=1.0)
    try:
        (server,) = wait_until(lambda: children(proc.pid), 30) or pytest.fail("no server started")
        time.sleep(1.0)  # let it install its handler
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
        assert time.monotonic() - started < 10 and wait_until(lambda: gone(server), 5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_codegen_app_stops_streamlit_on_sigterm(tmp_path: Path) -> None:
    """The real thing: `codegen app` serving Streamlit, then SIGTERM to `codegen app` alone."""
    from store import Store

    db = f"sqlite:///{tmp_path / 'a.db'}"
    Store(db).close()  # the dashboard reads an existing store
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "codegen", "app", "--db", db,
                             "--port", str(port)], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: _listening(port), 90, 0.25), "streamlit did not start listening"
        server = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert all(wait_until(lambda p=p: gone(p), 10) for p in server)
        assert wait_until(lambda: not _listening(port), 10), "the port is still served"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
