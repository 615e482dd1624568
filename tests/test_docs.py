"""CPU tier: README.md and docs/ match what gemmscape does, and their figures match the committed results.

- The tables of figures (docs/measurements.md, README's headline) are what ``python3 -m
  benchmarks.measurements`` makes from benchmarks/results/, byte for byte.
- Every result file, recording or store they name exists, and every relative link resolves.
- Every ``codegen`` command in their shell blocks parses with today's command line.
- The README's no-GPU block runs as written (a replay of recorded H200 measurements, no GPU).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from benchmarks import measurements

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: Where a result file named without a folder is looked for.
FOLDERS = (ROOT / "benchmarks" / "results", ROOT / "search" / "recordings", ROOT / "tests" / "fixtures")
#: A committed result file, recording or store: dated, named after a device, or a replay recording.
RESULT_NAME = re.compile(r"[\w./-]*?(?:NVIDIA_|\d{4}-\d{2}-\d{2}T?|replay-)[\w.-]*?\.(?:json|db\.gz|tgz)\b")
REPLAY_BEGIN, REPLAY_END = "<!-- readme:replay begin", "<!-- readme:replay end -->"


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def commands(block: str) -> list[list[str]]:
    """The command lines of a shell block as argument lists (continuations joined, comments dropped)."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


def codegen_commands(page: Path) -> list[list[str]]:
    return [words[1:] for block in shell_blocks(page.read_text()) for words in commands(block) if words[0] == "codegen"]


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings, and its explicit ``<a id>``s."""
    text = page.read_text()
    found = set(re.findall(r'<a id="([^"]+)">', text))
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


# ---- the figures -----------------------------------------------------------------------------------
def test_the_committed_figures_are_what_the_result_files_give(tmp_path):
    for rel in measurements.TARGETS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    assert measurements.main(["--root", str(tmp_path)]) == 0
    for rel in measurements.TARGETS:
        assert (tmp_path / rel).read_bytes() == (ROOT / rel).read_bytes(), (
            f"{rel} is out of date with benchmarks/results/: run python3 -m benchmarks.measurements")
    assert measurements.main(["--check"]) == 0


def test_every_table_is_placed_and_every_row_names_its_file_device_date_and_timing():
    placed = [m.group(1) for rel in measurements.TARGETS for m in measurements.BEGIN.finditer((ROOT / rel).read_text())]
    tables = measurements.tables(measurements.RESULTS)  # a WHEN_MEASURED table once its files are committed
    assert set(placed) == set(tables), "a table the generator makes is placed nowhere, or one twice"
    assert "headline" in [m.group(1) for m in measurements.BEGIN.finditer(README.read_text())]
    for name, make in tables.items():
        if name == "search-quality":
            continue  # a replay on the CPU: no device timing; its file is named above its tables
        rows = [line for line in make(measurements.RESULTS, "x").splitlines()
                if line.startswith("| ") and not line.startswith("| ---")][1:]
        for row in rows:
            assert re.search(r"\| (cold_single|engine|(eager|graph) \((whole model|one layer|decoder layers)\)|quality \(held-out bits/byte\))[^|]* \| "
                             r"[^|]+, \d{4}-\d{2}-\d{2}[^|]* \| \[`[\w.-]+\.json`\]", row), (name, row)


def test_old_records_without_a_method_read_as_cold_single():
    assert measurements.timing_of({"timing": {"reps_min": 20}}, {}) == "cold_single"
    assert measurements.timing_of({}, {"timing": "engine"}) == "engine"
    assert measurements.timing_of({"timing": {"method": "engine"}}, {}) == "engine"
    assert measurements.timing_of({}, {"timing": "cuda_graph"}) == "cold_single (CUDA graph)"
    assert measurements.timing_of({"suite": "model"}, {"timing": "eager"}) == "eager (whole model)"


def test_a_table_naming_a_missing_file_or_an_unknown_table_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        measurements.headline(tmp_path, "x")
    with pytest.raises(KeyError):
        measurements.fill("<!-- measurements:nope begin -->\n<!-- measurements:nope end -->\n", "x")


# ---- what the pages name ---------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_result_file_a_page_names_exists(page):
    missing = []
    for name in sorted(set(RESULT_NAME.findall(page.read_text()))):
        here = [page.parent / name, ROOT / name, *(folder / Path(name).name for folder in FOLDERS)]
        if not any(p.is_file() for p in here):
            missing.append(name)
    assert not missing, f"{page.name} names files that are not in the tree: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(target)
    assert not broken, f"{page.name}: links that lead nowhere: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_codegen_command_in_a_page_parses(page):
    from codegen import cli

    for argv in codegen_commands(page):
        try:
            args = cli.build_parser(cli.family_asked(argv)).parse_args(argv)
        except SystemExit as e:
            if e.code == 0 and "--help" in argv:
                continue
            pytest.fail(f"{page.name}: `codegen {shlex.join(argv)}` does not parse (exit {e.code})")
        assert callable(args.func)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_modules_and_extras_a_page_names_exist(page):
    import importlib.util

    text = page.read_text()
    for module in sorted(set(re.findall(r"python3? -m ((?:benchmarks|codegen)[\w.]*)", text))):
        assert importlib.util.find_spec(module) is not None, f"{page.name} names python -m {module}"
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for group in re.findall(r'\.\[([\w,]+)\]"', text):
        assert set(group.split(",")) <= extras, f"{page.name} names pip extras {group}"


def test_the_readme_set_up_is_the_two_commands_ci_runs():
    setup = README.read_text().split("## Set-up", 1)[1].split("\n## ", 1)[0]
    assert commands(shell_blocks(setup)[0]) == [["pip", "install", "-e", ".[test]"], ["python", "-m", "pytest", "-q"]]
    assert "python -m pytest -q" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_stays_a_guide():
    text = README.read_text()
    assert len(text.splitlines()) <= 250, "README.md is a user guide: move detail to docs/"
    for page in PAGES:
        body = page.read_text()
        for pattern in (r"\bissues? #?\d", r"\bsessions?\b", r"\breverted\b"):
            assert not re.search(pattern, body, flags=re.I), f"{page.name}: development history ({pattern})"


# ---- the README's no-GPU block, run ------------------------------------------------------------------
def test_the_readme_no_gpu_block_runs_as_written(tmp_path):
    text = README.read_text()
    block = text.split(REPLAY_BEGIN, 1)[1].split(REPLAY_END, 1)[0]
    lines = [words for b in shell_blocks(block) for words in commands(b)]
    assert [w[:2] for w in lines] == [["codegen", "search"], ["codegen", "results"], ["codegen", "export"],
                                      ["codegen", "app"]]
    assert "--replay" in lines[0]
    (tmp_path / "search").symlink_to(ROOT / "search")  # the block names search/recordings/... from the tree's root
    env = {**os.environ, "GEMMSCAPE_DB": f"sqlite:///{tmp_path / 'gemmscape.db'}", "PYTHONPATH": str(ROOT)}
    for words in lines[:-1]:  # the app serves until stopped: tests/test_cli_quickstart.py opens it through AppTest
        out = subprocess.run([sys.executable, "-m", "codegen", *words[1:]], capture_output=True, text=True,
                             timeout=600, env=env, cwd=tmp_path)
        assert out.returncode == 0, (words, out.stderr)
        if words[1] == "results":
            assert "(recorded 2026-11-30, replay-simt-4096x4096x4096-fp32.json)" in out.stdout
    assert list((tmp_path / "exported").glob("*.cu")) and list((tmp_path / "exported").glob("*.json"))
