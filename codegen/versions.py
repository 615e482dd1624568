"""Versions that go with every stored run and benchmark result."""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path


def gemmscape_version() -> str:
    try:
        return metadata.version("gemmscape")
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        for line in pyproject.read_text().splitlines() if pyproject.is_file() else []:
            if line.startswith("version"):
                return line.split("=")[1].strip().strip('"') + " (source tree)"
        return "source tree"


def versions() -> dict:
    out = {"gemmscape": gemmscape_version(), "python": platform.python_version()}
    for dist in ("cuda-bindings", "optuna", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out
