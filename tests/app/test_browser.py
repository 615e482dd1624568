"""A real browser (Debian's Chromium, driven by Playwright) visits every page of a served app."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
SHOTS = Path(__file__).resolve().parents[2] / "test-output"
# url path, title, text that must be visible
VISITS = [
    ("", "Overview", ["Best kernel per problem", "Roofline: NVIDIA H200"]),
    ("trials", "Trials", ["Trials matching the filters: 35", "Parameter importances"]),
    ("history", "Search history", ["Runs"]),
    ("kernel", "Kernel", ["ptxas report", "<b>not html</b>", "Export"]),
    ("failures", "Failures", ["Failed trials by status", "Evidence (4 failed trials)"]),
    ("sparsity", "Sparsity", ["Time against density", "Speedup over dense cuBLAS", "Break-even density"]),
]

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Chromium is not installed (apt-get install chromium)"),
    pytest.mark.timeout(300),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, proc: subprocess.Popen, seconds: float = 90.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the app exited with {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"the app did not answer at {base} within {seconds:.0f} s")


@pytest.fixture
def served_app(fixture_db: str) -> Iterator[str]:
    """``codegen app`` in a child process (its own session, so streamlit under it stops too)."""
    port = free_port()
    cmd = [sys.executable, "-m", "codegen", "app", "--db", fixture_db, "--port", str(port)]
    proc = subprocess.Popen(cmd, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def settle(page) -> None:  # type: ignore[no-untyped-def]
    """Wait until the script run is over and every chart and table has drawn."""
    page.wait_for_load_state("networkidle")
    page.locator("[data-testid='stStatusWidget']").wait_for(state="detached", timeout=60_000)
    for testid, drawn in (("stVegaLiteChart", "canvas, svg"), ("stDataFrame", "canvas")):
        blocks = page.locator(f"[data-testid='{testid}']")
        for i in range(blocks.count()):
            blocks.nth(i).locator(drawn).first.wait_for(state="attached", timeout=30_000)
    page.wait_for_timeout(500)


def test_every_page_in_chromium(served_app: str) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    SHOTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2000})
            for path, title, wanted in VISITS:
                page.goto(f"{served_app}/{path}")
                heading = page.locator("h1").filter(has_text=title)
                sync_api.expect(heading.first).to_be_visible(timeout=60_000)
                for text in wanted:
                    sync_api.expect(page.get_by_text(text, exact=False).first).to_be_visible(timeout=30_000)
                settle(page)
                assert page.locator("[data-testid='stException']").count() == 0, f"{title} shows an exception"
                assert "Traceback" not in page.inner_text("body")
                page.screenshot(path=str(SHOTS / f"{title.lower().replace(' ', '-')}.png"), full_page=True)
        finally:
            browser.close()
