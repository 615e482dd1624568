"""CPU tier: the test suite collects on a machine with only the README's set-up (no torch).

A test module may use an optional package (one that ``pip install -e ".[test]"`` does not install)
only after ``pytest.importorskip`` of it, or inside a function: an import of it at the top of a
module stops the whole collection where the package is missing. Read with ``ast``; nothing is
imported here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Packages the test extra does not install (the torch and gp extras, and what benchmarks use on the device).
OPTIONAL = ("torch", "transformers", "scipy", "triton", "cupy")


def _skipped(node: ast.stmt) -> set[str]:
    """The packages a top-level statement skips the module for (``pytest.importorskip("x")``)."""
    names = set()
    for call in ast.walk(node):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "importorskip"
                and call.args and isinstance(call.args[0], ast.Constant)):
            names.add(str(call.args[0].value).split(".")[0])
    return names


def unguarded(path: Path) -> list[str]:
    """Top-level imports of an optional package in ``path`` that no earlier importorskip guards."""
    guarded: set[str] = set()
    found = []
    for node in ast.parse(path.read_text(), str(path)).body:
        guarded |= _skipped(node)
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        found += [f"{where}:{node.lineno} imports {name}" for name in names
                  if name.split(".")[0] in OPTIONAL and name.split(".")[0] not in guarded]
    return found


def test_no_test_module_imports_an_optional_package_unguarded():
    assert [line for path in sorted((ROOT / "tests").rglob("*.py")) for line in unguarded(path)] == []


def test_an_unguarded_import_is_named(tmp_path):
    (tmp_path / "tests").mkdir()
    bad = tmp_path / "tests" / "test_x.py"
    bad.write_text("import pytest\nimport torch\n")
    good = tmp_path / "tests" / "test_y.py"
    good.write_text("import pytest\ntorch = pytest.importorskip('torch')\nimport torch.nn\n\ndef f():\n    import scipy\n")
    assert [line.split(":", 1)[1] for line in unguarded(bad)] == ["2 imports torch"]
    assert unguarded(good) == []
