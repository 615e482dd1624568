"""CPU tier: codegen's core stands below everything that uses it ("floors").

The core (``CORE``: the problem, spec, families, render, compile, CUDA, data, launch, worker, engine,
evaluate, export, SASS, sparse, sparse24 and versions modules) imports nothing from the search, the store, the
app, the command line or the layer tools (``ABOVE``), neither at the top of a module nor inside a
function: those import the core, never the other way round. The imports are read from the source
with ``ast`` (nothing is imported here)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ("problem", "spec", "families", "render", "compile", "cuda", "data", "launch", "worker", "engine",
        "evaluate", "export", "sass", "sparse", "sparse24", "versions")
ABOVE = ("search", "store", "app", "codegen.cli", "codegen.nn")


def core_files(root: Path = ROOT, names=CORE) -> list[Path]:
    """The source files of the core modules ``names`` under ``root``/codegen (a package: all its files)."""
    files = []
    for name in names:
        folder, module = root / "codegen" / name, root / "codegen" / f"{name}.py"
        assert folder.is_dir() or module.is_file(), f"core module codegen.{name} is not in {root / 'codegen'}"
        files += sorted(folder.rglob("*.py")) if folder.is_dir() else [module]
    return files


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """Every module ``path`` imports, as (line, dotted name), wherever in the file the import stands;
    ``from a import b`` counts as both ``a`` and ``a.b`` (b may be a module), a relative import is
    resolved against the file's package."""
    package = list(path.relative_to(root).parts[:-1])  # a.b for a/b/c.py and for a/b/__init__.py
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] if node.level else [])
            base = ".".join(filter(None, (base, node.module)))
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def upward(files: list[Path], root: Path = ROOT) -> list[str]:
    """Each import of ``files`` of a module in ``ABOVE`` (or under one), as "file:line imports name"."""
    return [f"{path.relative_to(root)}:{line} imports {name}" for path in files for line, name in imports(path, root)
            if any(name == top or name.startswith(f"{top}.") for top in ABOVE)]


def test_the_core_imports_nothing_above_it():
    assert upward(core_files()) == []


def test_an_upward_import_is_named_wherever_it_stands(tmp_path):
    """A made-up core module with upward imports at the top, in a function and relative; the
    harmless ones (the core itself, a name that only starts like one above) are not named."""
    (tmp_path / "codegen" / "families").mkdir(parents=True)
    for name in CORE:
        if name != "families":
            (tmp_path / "codegen" / f"{name}.py").write_text("")
    (tmp_path / "codegen" / "families" / "__init__.py").write_text(
        "import store.db\nfrom codegen import nn, sparse\nimport searchlight\n\n"
        "def f():\n    from search.space import seeds\n    from ..cli import main\n    from . import simt\n")
    assert upward(core_files(tmp_path), tmp_path) == [
        "codegen/families/__init__.py:1 imports store.db",
        "codegen/families/__init__.py:2 imports codegen.nn",
        "codegen/families/__init__.py:6 imports search.space",
        "codegen/families/__init__.py:6 imports search.space.seeds",
        "codegen/families/__init__.py:7 imports codegen.cli",
        "codegen/families/__init__.py:7 imports codegen.cli.main"]


def test_the_layer_tools_would_not_pass_as_core():
    """codegen.nn.tune searches (it sat in the core as codegen/tune.py before it moved up) and reads the
    block-sparse layer: listed as a core module, its imports of search and codegen.nn are named."""
    found = upward([ROOT / "codegen" / "nn" / "tune.py"])
    assert any(" imports search" in line for line in found)
    assert all(" imports search" in line or " imports codegen.nn" in line for line in found)


#: Every room and the rooms it may import besides itself: each floor uses only what stands below it.
#: The core is codegen minus its two orchestrating sub-packages; the app reads through the store.
BELOW = {
    "core": (),
    "store": ("core",),
    "search": ("core", "store"),
    "app": ("core", "store"),
    "codegen.nn": ("core", "store", "search"),
    "codegen.cli": ("core", "store", "search", "app", "codegen.nn"),
    "benchmarks": ("core", "store", "search", "app", "codegen.nn", "codegen.cli"),
}


def room(name: str) -> str | None:
    """The room a dotted module name belongs to (None: not the project's). ``python -m codegen``
    (codegen/__main__.py) is the command line's."""
    if name == "codegen.__main__":
        return "codegen.cli"
    for top in ("codegen.nn", "codegen.cli"):
        if name == top or name.startswith(f"{top}."):
            return top
    first = name.split(".")[0]
    if first == "codegen":
        return "core"
    return first if first in BELOW else None


def test_each_room_imports_only_the_rooms_below_it():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in (".venv", "tests", "templates", "build") or "site-packages" in rel.parts:
            continue
        mine = room(".".join(rel.with_suffix("").parts))
        if mine is None:
            continue
        for line, name in imports(path):
            theirs = room(name)
            if theirs is not None and theirs != mine and theirs not in BELOW[mine]:
                wrong.append(f"{rel}:{line} ({mine}) imports {name} ({theirs})")
    assert wrong == []


def test_rooms_are_read_from_dotted_names():
    assert [room(n) for n in ("codegen.spec", "codegen.nn.layer", "codegen.cli", "search.space", "app.main",
                              "store", "numpy", "codegen", "codegen.__main__")] == [
        "core", "codegen.nn", "codegen.cli", "search", "app", "store", None, "core", "codegen.cli"]
