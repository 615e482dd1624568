"""Shared test set-up: the `gpu` tier skips where no NVIDIA GPU is visible."""

from __future__ import annotations

import functools
import shutil
import subprocess

import pytest


@functools.cache
def gpu_visible() -> bool:
    """Asked of nvidia-smi, so the test process itself never initializes CUDA."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def pytest_collection_modifyitems(config, items):
    if gpu_visible():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU visible (nvidia-smi -L)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def toy_family():
    """A second kernel family (tests/plugins/toy.py) put where the registry looks for families."""
    import sys
    from pathlib import Path

    import codegen.families as registry

    folder = str(Path(__file__).resolve().parent / "plugins")
    registry.__path__.append(folder)
    registry._families.cache_clear()
    try:
        yield registry.get("toy")
    finally:
        registry.__path__.remove(folder)
        registry._families.cache_clear()
        sys.modules.pop("codegen.families.toy", None)


@pytest.fixture
def gpu_said_present(monkeypatch):
    """nvidia-smi REPLACED by a stand-in that lists a GPU: for tests that replace the measuring too
    (a recorder or a recording where the GPU would be), so the commands' no-GPU check passes."""
    monkeypatch.setattr("codegen.worker.why_no_gpu", lambda: None)


@pytest.fixture(autouse=True)
def _private_store(tmp_path_factory, monkeypatch):
    """A test that names no store writes to a throw-away one, never to ~/.local/share/gemmscape."""
    folder = tmp_path_factory.mktemp("default-store")
    monkeypatch.setenv("GEMMSCAPE_DB", f"sqlite:///{folder / 'gemmscape.db'}")


# ---- stores for the command-line tests (tests/test_cli_errors.py, tests/test_cli_sparse.py) ----------
@pytest.fixture
def db(tmp_path):
    """A store with one ok trial (closed, so the file alone holds it); its URL and path."""
    from codegen.families.simt import Spec as SimtSpec
    from codegen.problem import Problem
    from store import Store
    from tests.test_cli_errors import DEVICE, add_ok

    path = tmp_path / "g.db"
    with Store(f"sqlite:///{path}") as store:
        add_ok(store, SimtSpec(), Problem(64, 64, 64), DEVICE, 0.01)
    return f"sqlite:///{path}", path


@pytest.fixture
def default_store(tmp_path, monkeypatch):
    """Where the default store would be; tests assert it is never created by a mistake."""
    path = tmp_path / "default" / "gemmscape.db"
    monkeypatch.setenv("GEMMSCAPE_DB", f"sqlite:///{path}")
    return path
